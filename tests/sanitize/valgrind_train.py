#!/usr/bin/python3
"""A few training steps of a compiled model under valgrind's memcheck: no invalid read or
write, no use of uninitialised memory, no leak (docs/testing.md).

    valgrind_train.py NETC WORKDIR MODEL.net [-D NAME=VALUE]...

Compiles MODEL.net with the -D overrides, for the x86-64 level valgrind emulates (keep the model small: memcheck runs the trainer tens
of times slower), writes synthetic .npy data from the inputs the trainer's --help lists (float
inputs N(0, 1), integer inputs 0 or 1, which is a class label of every model), and runs under
`valgrind --leak-check=full --error-exitcode=99`:
  1. four steps stopped after the third (--stop-at, exit status 4), with evaluation data, a log
     and a checkpoint every two steps (the training set holds two batches and one sample more,
     so an epoch boundary and the evaluation's partial last batch are both crossed);
  2. --resume of that checkpoint to the end of the run, and --save;
  3. --init from the saved weights, one step.
Fails when valgrind reports any error (status 99) or a trainer fails.
"""
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

# --soname-synonyms: memcheck replaces malloc in jemalloc, which trainers link when netc found it
# (docs/trainer.md), as it does in the C library
VALGRIND = ["valgrind", "--quiet", "--leak-check=full", "--error-exitcode=99", "--num-callers=30",
            "--soname-synonyms=somalloc=*jemalloc*"]
DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "f64": np.float64,
          "i64": np.int64, "i32": np.int32, "u8": np.uint8}


def inputs_of(trainer):
    """[(name, dtype, per-sample shape)] and the batch, from the trainer's --help."""
    text = subprocess.run([trainer, "--help"], check=True, capture_output=True, text=True).stdout
    batch = int(re.search(r"model inputs \(per sample; batch (\d+)\)", text).group(1))
    found = re.findall(r"^  (\S+)\s+([a-z0-9]+)\[([0-9, ]*)\](?:  indices in \[0, \d+\))?$", text, re.M)
    return [(n, d, [int(x) for x in s.split(",") if x.strip()]) for n, d, s in found], batch


def write_data(work, inputs, samples, tag, rng):
    args = []
    for name, dtype, shape in inputs:
        if dtype[0] == "f":
            arr = rng.standard_normal([samples] + shape).astype(DTYPES[dtype])
        else:
            arr = rng.integers(0, 2, [samples] + shape).astype(DTYPES[dtype])
        path = os.path.join(work, f"{tag}_{name}.npy")
        np.save(path, arr)
        args.append(f"{name}={path}")
    return args


def run(what, argv, expect=0):
    start = time.monotonic()
    r = subprocess.run(VALGRIND + argv, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    print(f"valgrind_train: {what}: exit {r.returncode} in {time.monotonic() - start:.1f} s")
    if r.returncode != expect:
        print(r.stdout + r.stderr)
        if r.returncode == 99:
            sys.exit(f"valgrind_train: {what}: valgrind reported errors (above)")
        sys.exit(f"valgrind_train: {what}: the trainer exited with {r.returncode}, not {expect}")


def valgrind_level(netc):
    """The x86-64 level of the CPU that valgrind presents (3.19's memcheck runs AVX2 but not
    AVX-512 code), which the trainer is compiled for: netc names it when run under valgrind."""
    out = subprocess.run(["valgrind", "--quiet", netc, "--print-toolchain"], capture_output=True, text=True).stdout
    m = re.search(r"^CPU level +(\S+)", out, re.M)
    if not m:
        sys.exit(f"valgrind_train: netc --print-toolchain under valgrind names no CPU level:\n{out}")
    return m.group(1)


def main():
    if not shutil.which("valgrind"):
        sys.exit("valgrind_train: valgrind not found; install Debian's valgrind package")
    netc, work, model, defines = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    os.makedirs(work, exist_ok=True)
    name = os.path.basename(model)[:-4]
    trainer = os.path.join(work, name)
    subprocess.run([netc, model, "-o", trainer, "--cpu", valgrind_level(netc)] + defines, check=True)
    inputs, batch = inputs_of(trainer)
    rng = np.random.default_rng(1)
    data = sum((["--data", a] for a in write_data(work, inputs, 2 * batch + 1, "train", rng)), [])
    evals = sum((["--eval-data", a] for a in write_data(work, inputs, batch + 1, "eval", rng)), [])
    ckpt, weights = os.path.join(work, "run.ckpt"), os.path.join(work, "run.safetensors")
    common = [trainer, "--threads", "1", "--quiet"] + data
    run("4 steps stopped after 3, evaluation, log, checkpoints",
        common + evals + ["--steps", "4", "--stop-at", "3", "--log", os.path.join(work, "run.jsonl"),
                          "--log-every", "1", "--checkpoint", ckpt, "--checkpoint-every", "2"], expect=4)
    run("resume to the end, save", common + evals + ["--resume", ckpt, "--save", weights])
    run("init from the saved weights, 1 step", common + ["--init", weights, "--steps", "1"])
    print(f"valgrind_train: {name}: no errors")


if __name__ == "__main__":
    main()
