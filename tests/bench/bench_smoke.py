#!/usr/bin/python3
"""The benchmarks still run: each of bench/'s CPU comparisons at the smallest sizes that take
every path (netc's trainers and PyTorch's loops, the medians, the tables), and the decision that
picks PyTorch's OpenBLAS kernels.

    bench_smoke.py NETC

Nothing here is timed and no speed is asserted: a benchmark's figures mean something only at its
own sizes on a quiet machine (README, "Benchmarks"). What is asserted is what a change elsewhere
breaks without a test noticing: a trainer option or log field a benchmark reads, a PyTorch
program that no longer runs, a table that stops printing its ratios. Each summary ratio must be a
finite number above 0, and every header must name the PyTorch it ran.
"""
import math
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from bench_runs import OPENBLAS_OLD_CORES, blas_choice  # noqa: E402

PY = "/usr/bin/python3"


def fail(msg):
    sys.exit(f"bench_smoke: {msg}")


def check_blas_choice():
    """torch_blas's decision on every kind of CPU and library, whatever this machine is."""
    env = {"PATH": "/usr/bin"}
    cases = [  # (core, isa, environment) -> the OPENBLAS_CORETYPE PyTorch gets (None: unset)
        ("Prescott", "AVX-512", env, "SkylakeX"),
        ("Prescott", "AVX2", env, "Haswell"),
        ("Nehalem", "AVX2", env, "Haswell"),
        ("Prescott", "older than AVX2", env, None),  # nothing newer to offer
        ("SkylakeX", "AVX-512", env, None),           # it knew the CPU
        ("Zen", "AVX2", env, None),
        (None, "AVX-512", env, None),                 # no OpenBLAS: a wheel with MKL or oneDNN
        ("Prescott", "AVX-512", dict(env, OPENBLAS_CORETYPE="Haswell"), "Haswell"),  # the user's
    ]
    for core, isa, environ, want in cases:
        got_env, note = blas_choice(core, isa, environ)
        got = got_env.get("OPENBLAS_CORETYPE")
        if got != want or got_env.get("PATH") != "/usr/bin":
            fail(f"blas_choice({core}, {isa}, {environ}): OPENBLAS_CORETYPE {got}, expected {want}")
        if want and want not in note:
            fail(f"blas_choice({core}, {isa}): the header note {note!r} does not name {want}")
    if "SkylakeX" in OPENBLAS_OLD_CORES or "Haswell" in OPENBLAS_OLD_CORES:
        fail("an AVX2 core is listed among OpenBLAS's cores without AVX2")
    print(f"ok   blas_choice: {len(cases)} cases")


def run(name, args, ratios):
    """One benchmark: it must exit 0, name its PyTorch, and print each pattern of ratios (a regular
    expression whose groups are numbers) with finite numbers above 0."""
    proc = subprocess.run([PY, os.path.join(ROOT, "bench", name), *args], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        fail(f"{name} {' '.join(args)} exited with status {proc.returncode}:\n{out[-3000:]}")
    if not re.search(r"PyTorch \d+\.\d+", out):
        fail(f"{name}: no header names the PyTorch it ran:\n{out}")
    for pattern in ratios:
        m = re.search(pattern, out, re.M)
        if not m:
            fail(f"{name}: no line matches {pattern!r}:\n{out}")
        for x in m.groups():
            if not (math.isfinite(float(x)) and float(x) > 0):
                fail(f"{name}: {m.group(0)!r}: {x} is not a finite number above 0")
    print(f"ok   {name}: " + "; ".join(re.search(p, out, re.M).group(0).strip() for p in ratios))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    netc = ["--netc", sys.argv[1]]
    one = ["--threads", "1", "--repeat", "1"]  # CTest runs two tests at once on two cores
    check_blas_choice()
    num = r"([0-9.]+(?:e[-+]?\d+)?)"
    run("cpu_vs_torch.py", [*netc, *one, "--models", "mlp"],
        [rf"^mlp\s+{num}\s+{num}\s+{num}x\s+{num}\s+{num}\s+{num}x$"])
    tiny_lm = ["--seq", "16", "--vocab", "64", "--n-layer", "1", "--batch", "2", "--steps", "2"]
    run("gpt2_cpu_vs_torch.py", [*netc, *one, *tiny_lm, "--n-head", "2", "--n-embd", "32"],
        [rf"netc / PyTorch: speed \*\*{num}x\*\*, memory {num}x"])
    run("lora_cpu_vs_torch.py", [*netc, *one, *tiny_lm, "--n-head", "4", "--n-kv-head", "2", "--hidden", "64",
                                 "--intermediate", "128"],
        [rf"netc: LoRA / full fine-tuning: peak memory \*\*{num}x\*\*, speed {num}x",
         rf"netc / PyTorch, lora: speed \*\*{num}x\*\*, memory {num}x",
         rf"netc / PyTorch, full: speed \*\*{num}x\*\*, memory {num}x"])
    run("bert_cpu_vs_torch.py", [*netc, *one, "--n-layer", "1", "--batch", "2", "--steps", "1"],
        [rf"netc / PyTorch, plain: speed \*\*{num}x\*\*, memory {num}x",
         rf"netc / PyTorch, packed: speed \*\*{num}x\*\*, memory {num}x",
         rf"netc: packed / padded: {num}x"])
    run("resnet_cpu_vs_torch.py", [*netc, *one, "--batch", "2", "--steps", "1", "--no-compile"],
        [rf"^\| netc row-major \| {num} \| {num} \| {num}% \| {num}x \| {num} MiB \|$",
         rf"netc's default against PyTorch's best \([^)]*\): \*\*{num}x\*\*"])
    run("vit_cpu_vs_torch.py", [*netc, *one, "--batch", "2", "--steps", "1", "--depth", "1", "--dim", "16",
                                "--heads", "2", "--patch", "7"],
        [rf"netc / PyTorch: speed \*\*{num}x\*\*, memory {num}x"])
    run("dist_cpu_scaling.py", [*netc, "--steps", "8", "--batch", "8", "--ranks", "1,2"],
        [rf"^\s+1\s+\d+\s+{num}\s+{num}\s+{num}x", rf"^\s+2\s+\d+\s+{num}\s+{num}\s+{num}x"])


if __name__ == "__main__":
    main()
