"""SiLU, GELU and dropout values computed again in the backward pass (compiler/passes/remat.c):
that frees memory and never changes a bit.

    remat.py NETC WORKDIR

For each model below: compile it as it is and with --no-remat, and require
  - the activations computed again: in the backward pass (--dump=fused, after the forward part),
    one copy per activation the pass should take, each SiLU or GELU fused into a loop
    (`internal`; a dropout a product reads has a loop of its own), and none with --no-remat;
  - the memory plan's arena smaller than with --no-remat, by at least the bytes of the forward
    values no longer kept, or equal where nothing is computed again (GPT-2: its GELU output is
    read by c_proj's weight gradient, a product);
  - a few training steps from the same weights and data to save the same bytes both ways. That
    equality is guaranteed by construction: the copy applies the same function to the same
    stored float (a dropout's mask is a hash of the step's seed, the mask and the element), and the
    rest of the step is unchanged.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from train_pair import train_and_save, write_data  # noqa: E402  (64 samples shaped like the model's inputs)

# name, source, netc options, the activations computed again (operator: count)
MODELS = [
    ("geglu", "tests/fusion/geglu.net", [], {"gelu": 1, "gelu_tanh": 1, "silu": 1}),
    ("llama", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32"], {"silu": 2}),
    # the adapters on q, k and v drop the same normed input, each with its own mask (dropout 0.1, the
    # model's default): the input is kept, the three dropped copies computed again; o_proj's
    # dropout, the only one of its input, stays kept
    ("llama_lora", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32", "-D", "lora_r=4"],
     {"silu": 2, "dropout": 6}),
    ("llama_lora_p0", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32", "-D", "lora_r=4", "-D",
                                           "lora_dropout=0"], {"silu": 2}),
    ("gpt2", "models/gpt2.net", ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=2", "-D", "n_head=2",
                                 "-D", "n_embd=64"], {}),
]
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "dropout")


def netc_out(netc, src, opts, *extra):
    return subprocess.run([netc, os.path.join(ROOT, src), *opts, *extra], capture_output=True, text=True,
                          check=True).stdout


def backward_copies(fused):
    """{op: count} of the activations in the backward part of --dump=fused (after its
    "backward:" line), each required fused into a loop."""
    count = {}
    for line in fused.split("\nbackward:\n", 1)[1].splitlines():
        m = re.match(r"\s*%\d+ = (\w+)\(", line)
        if m and m.group(1) in ACTIVATIONS:
            assert "internal" in line or m.group(1) == "dropout", f"a copy not fused into a loop: {line.strip()}"
            count[m.group(1)] = count.get(m.group(1), 0) + 1
    return count


def arena_bytes(plan):
    return int(re.search(r"^arena: (\d+) bytes", plan, re.M).group(1))


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name, src, opts, want in MODELS:
        got = backward_copies(netc_out(netc, src, opts, "--dump=fused"))
        assert got == want, f"{name}: computed again in the backward pass: {got}, want {want}"
        kept = backward_copies(netc_out(netc, src, opts, "--no-remat", "--dump=fused"))
        assert not kept, f"{name}: --no-remat still computes {kept} again"
        remat, plain = (arena_bytes(netc_out(netc, src, opts, *x, "--dump=memplan")) for x in ([], ["--no-remat"]))
        if want:
            assert remat < plain, f"{name}: arena {remat} bytes, {plain} with --no-remat"
        else:
            assert remat == plain, f"{name}: nothing computed again, yet the arena is {remat} bytes, not {plain}"
        saved, data = [], None
        for extra in ([], ["--no-remat"]):
            exe = os.path.join(work, name + ("-kept" if extra else ""))
            subprocess.run([netc, os.path.join(ROOT, src), *opts, *extra, "-o", exe], check=True)
            data = data or write_data(exe, work)  # the same inputs: --no-remat changes no input
            out = exe + ".safetensors"
            train_and_save(exe, data, 3, out)
            saved.append(open(out, "rb").read())
        assert saved[0] == saved[1], f"{name}: the weights differ with --no-remat"
        print(f"remat: {name}: {sum(want.values())} activations computed again, arena {remat} bytes against "
              f"{plain}; 3 steps identical to --no-remat")


if __name__ == "__main__":
    main()
