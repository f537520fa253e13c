"""What a hostile or careless user can feed a trainer (docs/trainer.md, "What the trainer
promises"): counts that overflow, data whose values do not fit the input's dtype or class range,
compressed files that do not match their header, and data files that change while the trainer
reads them. Each must end in a clear message naming the file or option and a non-zero exit,
never a signal, a wrong answer or exit 0.

usage: hostile_inputs.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import bad_files  # noqa: E402
from bad_files import expect_fail, idx, npy  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def expect_ok(what, cmd):
    bad_files.cases += 1
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        bad_files.failures.append(f"{what}: exit status {r.returncode}, want 0\n{r.stderr}{r.stdout}")
    else:
        print(f"ok   {what}")


def counts(exe, train):
    """Counts from the command line are checked before they are multiplied or narrowed."""
    expect_fail("--epochs whose step count overflows", train("--epochs", str(1 << 61)),
                "--epochs 2305843009213693952", "steps")
    expect_fail("--threads past an int", train("--threads", str((1 << 32) + 1)), "--threads 4294967297", "1024")


def gradcheck_short(exe, work, train):
    """--gradcheck on fewer samples than a batch: refused, not false failures."""
    x4 = npy(f"{work}/gx4.npy", np.zeros((4, 28, 28), np.uint8))
    y4 = npy(f"{work}/gy4.npy", np.zeros(4, np.int64))
    expect_fail("--gradcheck on less than a batch", [exe, "--data", f"image={x4}", "--data", f"label={y4}", "--gradcheck"],
                "gx4.npy", "--gradcheck", "fewer than one batch of 8")


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "mlp")
    subprocess.run([netc, os.path.join(ROOT, "models", "mlp.net"), "-o", exe, "-D", "batch=8"], check=True)
    rng = np.random.default_rng(0)
    good_x = npy(f"{work}/x.npy", rng.integers(0, 255, (32, 28, 28), dtype=np.uint8))
    good_y = npy(f"{work}/y.npy", rng.integers(0, 10, (32,), dtype=np.int64))

    def train(*extra, x=good_x, y=good_y):
        return [exe, "--data", f"image={x}", "--data", f"label={y}", "--steps", "2", "--quiet", *extra]

    counts(exe, lambda *extra: [a for a in train(*extra) if a not in ("--steps", "2")])
    gradcheck_short(exe, work, train)
    print(f"{bad_files.cases} hostile-input cases, {len(bad_files.failures)} failed")
    for f in bad_files.failures:
        print("FAIL", f)
    return 1 if bad_files.failures else 0


if __name__ == "__main__":
    sys.exit(main())
