"""A CPU trainer computes the same bits at every x86-64 level netc compiles it for (--cpu).

    cpu_levels.py NETC WORKDIR

netc compiles a CPU trainer and links the runtime for one level: x86-64, x86-64-v3 (AVX2, FMA)
or x86-64-v4 (AVX-512), by default the highest this machine runs (runtime/rt_cpu.c). The level
may change how wide the vector loops are, never a value: the trainer's C and the runtime are
compiled with -ffp-contract=off (no multiply-add fused at one level and not at another), no loop
may reassociate a float sum (no -ffast-math), and the sums that vector lanes share (attention's
softmax, layer and RMS norm, cross-entropy) add 16 lanes in a fixed order (rt_internal.h). So, guaranteed by construction, for
each model below at each level:
  - a level this CPU runs: a few training steps from the same weights and data save the same
    bytes as the x86-64 trainer's, and the trainer's --help names its level;
  - a level it does not: the trainer stops before main with exit status 5 and names the
    instructions this CPU lacks, and the level to compile for instead.
The matrix products and convolutions are oneDNN's or OpenBLAS's, which pick their kernels by the
CPU, not by the level, so they give the same bits at every level on one machine.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from train_pair import train_and_save, write_data  # noqa: E402  (64 samples shaped like the model's inputs)

LEVELS = ("x86-64", "x86-64-v3", "x86-64-v4")
# the models' kernels between them: attention (causal, grouped-query), layer and RMS norm, rotary
# embeddings, exact and tanh GELU, SiLU, cross-entropy with ignored labels, AdamW with clipping;
# convolutions, batch norm with add and ReLU, pooling, channels-last layouts, SGD
MODELS = [
    ("gpt2", "models/gpt2.net", ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=2", "-D", "n_head=2",
                                 "-D", "n_embd=64"]),
    ("llama", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32"]),
    ("geglu", "tests/fusion/geglu.net", []),
    ("bert", "models/bert.net", ["-D", "vocab=128", "-D", "seq=32", "-D", "n_layer=1", "-D", "n_head=2",
                                 "-D", "hidden=64", "-D", "intermediate=128", "-D", "batch=4"]),
    ("resnet18", "models/resnet18_cifar.net", ["-D", "batch=8", "-D", "width=8"]),
]


def host_level(netc):
    out = subprocess.run([netc, "--print-toolchain"], capture_output=True, text=True).stdout
    m = re.search(r"^CPU level +(\S+) \(this machine's", out, re.M)
    assert m, f"--print-toolchain names no CPU level:\n{out}"
    return m.group(1)


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    host = host_level(netc)
    runs = LEVELS[:LEVELS.index(host) + 1]
    print(f"this CPU runs {', '.join(runs)}")
    for name, src, opts in MODELS:
        saved, data = {}, None
        for level in LEVELS:
            exe = os.path.join(work, f"{name}-{level}")
            subprocess.run([netc, os.path.join(ROOT, src), *opts, "--cpu", level, "-o", exe], check=True)
            if level not in runs:
                r = subprocess.run([exe, "--help"], capture_output=True, text=True)
                assert r.returncode == 5, f"{name} {level}: exit status {r.returncode} on a CPU without it, want 5"
                assert f"compiled for {level} CPUs, and this CPU lacks " in r.stderr and \
                    f"netc --cpu {host}" in r.stderr, f"{name} {level}: no clear message:\n{r.stderr}"
                print(f"{name} {level}: refused on this CPU: {r.stderr.splitlines()[0]}")
                continue
            helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
            assert f"for {level} CPUs" in helptext, f"{name} {level}: --help does not name its level"
            data = data or write_data(exe, work)
            out = exe + ".safetensors"
            train_and_save(exe, data, 3, out)
            saved[level] = open(out, "rb").read()
            assert saved[level] == saved["x86-64"], f"{name}: {level} saved other bytes than x86-64"
        print(f"{name}: the same bytes at {', '.join(saved)}")


if __name__ == "__main__":
    main()
