"""netc --profile: a CPU trainer that reports where its step's time goes.

  - LeNet built with --profile trains to the same bits as without it (a mark reads the clock and
    nothing else), and after training prints the report: the steps after the first, the step's
    split into forward and backward, optimizer and the rest, and two tables, by operator and by
    operator and .net line;
  - the tables name the pieces LeNet has (conv2d and both its gradients, maxpool2d, the fused
    add+relu, the products of both passes) at the lines of models/lenet.net they come from;
  - the report adds up by construction: the by-operator shares sum to the forward and backward
    share, and the three parts of the step to 100 % (each within the rounding of the printed
    figures); the pieces counted are the generated step's rt_prof_mark calls; a convolution's
    GFLOP/s times its time is its FLOPs (the three directions of conv2, counted by hand; twice
    them a step with --accumulate 2);
  - a trainer built without --profile has no marks in its C and prints no report; one step alone
    is reported with the first step included; --profile with --backend cuda is refused.

No time is compared with a bound: the figures are the machine's.

usage: profile_test.py NETC WORKDIR
"""
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import Checks  # noqa: E402

checks = Checks()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LENET = os.path.join(ROOT, "models", "lenet.net")


def table(text, title_line):
    """The rows (lists of cells) of the markdown table that follows the line starting title_line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title_line))
    while not lines[start].startswith("|"):
        start += 1
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def percent(cell):
    return float(cell.split()[0])


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(f"{work}/image.npy", rng.normal(size=(96, 1, 28, 28)).astype(np.float32))
    np.save(f"{work}/label.npy", rng.integers(0, 10, 96).astype(np.int64))
    data = ["--data", f"image={work}/image.npy", "--data", f"label={work}/label.npy", "--no-shuffle", "--threads", "2"]
    exes = {}
    for name, flags in (("plain", []), ("profiled", ["--profile"])):
        exes[name] = os.path.join(work, f"lenet-{name}")
        subprocess.run([netc, LENET, "-D", "batch=16", "-o", exes[name], "--emit-dir", f"{work}/src-{name}", *flags],
                       check=True)
    runs = {}
    for name, exe in exes.items():
        runs[name] = subprocess.run([exe, *data, "--steps", "6", "--save", f"{work}/{name}.safetensors"],
                                    capture_output=True, text=True)
        checks(runs[name].returncode == 0, f"{name} trainer exits 0:\n{runs[name].stderr}")
    same = open(f"{work}/plain.safetensors", "rb").read() == open(f"{work}/profiled.safetensors", "rb").read()
    checks(same, "--profile's trainer saves the same bytes as the plain one")
    checks("profile (netc --profile)" not in runs["plain"].stdout, "the plain trainer prints no profile")
    plain_c = open(f"{work}/src-plain/lenet-plain.c").read()
    checks("rt_prof" not in plain_c, "the plain trainer's C has no marks")

    out = runs["profiled"].stdout
    head = re.search(r"profile \(netc --profile\): 5 steps after the first, ([0-9.]+) ms a step on 2 threads\n"
                     r"forward and backward [0-9.]+ ms \(([0-9.]+) %\), optimizer [0-9.]+ ms \(([0-9.]+) %\), "
                     r"the rest \(waiting for the next batch\) [0-9.-]+ ms \((-?[0-9.]+) %\)", out)
    if not checks(head is not None, f"the report's head (5 steps after the first, the step's three parts):\n{out}"):
        return 1
    fb, opt, rest = (float(head.group(i)) for i in (2, 3, 4))
    # three figures each rounded to 0.1 %: their sum is 100 within 0.15
    checks(abs(fb + opt + rest - 100) <= 0.15, f"the step's parts sum to 100 %: {fb} + {opt} + {rest}")
    by_op = table(out, "| share of the step")
    ops = {row[4]: row for row in by_op}  # share, ms a step, GFLOP/s, pieces, operator
    for op in ("conv2d", "conv2d_bwd_data", "conv2d_bwd_filter", "maxpool2d", "maxpool2d_bwd", "fused add+relu",
               "matmul", "matmul, backward", "xent", "xent_bwd"):
        checks(op in ops, f"the by-operator table has a row for {op}: {sorted(ops)}")
    for op in ("conv2d", "conv2d_bwd_filter"):  # tens of microseconds at least: shown as more than 0.000
        checks(op in ops and float(ops[op][1]) > 0, f"{op}'s row has a time: {ops.get(op)}")
    # n rows each rounded to 0.1 %: within 0.05 n (and the head's 0.05) of the forward and backward share
    total = sum(percent(row[0]) for row in by_op)
    checks(abs(total - fb) <= 0.05 * (len(by_op) + 1), f"the operators' shares sum to forward and backward's: "
           f"{total:.1f} against {fb}")
    # GFLOP/s: twice the multiply-adds over the time; LeNet's conv2 at batch 16 (6 -> 16 channels,
    # 5x5, 10x10 outputs) is 2 * 16 * 16 * 100 * 6 * 25 FLOPs in each direction. The trainer
    # divides exactly; only the printing rounds: ms to 3 decimals (within 0.0005) and GFLOP/s to 1
    # (within 0.05), so the product is within 0.05 ms + 0.0005 GFLOP/s + 0.05 * 0.0005 of the
    # FLOPs in 1e6 (over 5 % where a slow or busy machine gives under 1 GFLOP/s), with 1 %
    # more for the float parsing. With --accumulate 2 a step is two batches: twice the FLOPs a step.
    conv2 = next(i + 1 for i, text in enumerate(open(LENET).read().splitlines()) if "conv2:" in text)
    flops = 2 * 16 * 16 * 100 * 6 * 25
    twice = subprocess.run([exes["profiled"], *data, "--steps", "3", "--accumulate", "2"], capture_output=True,
                           text=True).stdout
    for report, batches in ((out, 1), (twice, 2)):
        directions = [row for row in table(report, "By operator and line")
                      if row[5] == f"lenet.net:{conv2}" and row[4].startswith("conv2d")]
        checks(len(directions) == 3, f"conv2's three directions have rows: {directions}")
        for row in directions:
            gflops, ms = float(row[2]), float(row[1])
            got = gflops * 1e9 * ms * 1e-3
            rounding = (0.05 * ms + 0.0005 * gflops + 0.05 * 0.0005) * 1e6 * 1.01
            checks(abs(got - batches * flops) <= rounding,
                   f"{row[4]} at line {conv2}, {batches} batch(es) a step: GFLOP/s x ms = {got:.0f} FLOPs, "
                   f"want {batches * flops}: {row}")
    checks(ops.get("maxpool2d", [""] * 5)[2] == "", f"a row without products has no GFLOP/s: {ops.get('maxpool2d')}")
    marks = len(re.findall(r"rt_prof_mark\(\d+\);", open(f"{work}/src-profiled/lenet-profiled.c").read()))
    pieces = sum(int(row[3]) for row in by_op)
    checks(pieces == marks, f"the table counts {pieces} pieces, the step marks {marks}")
    by_line = table(out, "By operator and line")
    lines = {(row[4], row[5]) for row in by_line}
    src = open(LENET).read().splitlines()
    for op, needle in (("conv2d", "conv1:"), ("conv2d_bwd_filter", "conv2:"), ("matmul", "fc1:")):
        line = next(i + 1 for i, text in enumerate(src) if needle in text)
        checks((op, f"lenet.net:{line}") in lines, f"{op} at lenet.net:{line} (the line of {needle}): {sorted(lines)}")

    one = subprocess.run([exes["profiled"], *data, "--steps", "1"], capture_output=True, text=True)
    checks("profile (netc --profile): 1 step (the first included)" in one.stdout,
           f"one step alone is reported, the first included:\n{one.stdout}")
    cuda = subprocess.run([netc, LENET, "--backend", "cuda", "--profile", "-o", f"{work}/never"], capture_output=True,
                          text=True)
    checks.expect(cuda, 2, "--profile with --backend cuda", "--profile", "CUDA Graph", "nsys")
    checks(not os.path.exists(f"{work}/never"), "--backend cuda --profile writes no trainer")
    print(f"profile_test: {checks.count} checks, {len(checks.failures)} failed")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
