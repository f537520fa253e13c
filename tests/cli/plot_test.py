"""scripts/plot.py draws a trainer's log (docs/trainer.md, "Plotting a run"): a short run with
evaluations is drawn; the picture must exist and be a PNG of the size the script draws, and the
series the script reports (--values) must be exactly the log's loss, accuracy and learning-rate
values at their steps. A model with two metrics that trains to a target: both metrics' series
(training and evaluation) and the step the target stopped the run after. A file that is not a
log is refused with a message.

usage: plot_test.py CASE NETC WORKDIR   (CASE: curves)
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from netc_testlib import Checks, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "checkpoint", "sgd_momentum.net")
PLOT = os.path.join(HERE, "..", "..", "scripts", "plot.py")
check = Checks()


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, or None when the file is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def curves(netc, work):
    exe, log = os.path.join(work, "tr"), os.path.join(work, "run.jsonl")
    r = subprocess.run([netc, MODEL, "-o", exe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 16)).astype(np.float32)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "y.npy"), (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0))
    data = [f"x={work}/x.npy", f"label={work}/y.npy"]
    argv = [exe, "--data", data[0], "--data", data[1], "--eval-data", data[0], "--eval-data", data[1],
            "--log-every", "5", "--log", log, "--epochs", "3", "--quiet"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    png, values = os.path.join(work, "curves.png"), os.path.join(work, "values.json")
    r = subprocess.run([sys.executable, PLOT, log, "-o", png, "--values", values], capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0, f"plot.py: exit {r.returncode}\n{r.stderr}")
    size = png_size(png) if os.path.exists(png) else None
    # three panels of 2.6 inches at 100 dpi, 8 inches wide
    check(size == (800, 780), f"curves.png: {size}, want a PNG of 800 x 780")
    got = json.load(open(values))
    recs = [json.loads(s) for s in open(log)]
    steps = [x for x in recs if "step" in x and "loss" in x]
    want = {"train_loss": [[x["step"], x["loss"]] for x in steps],
            "train_accuracy": [[x["step"], x["accuracy"]] for x in steps],
            "lr": [[x["step"], x["lr"]] for x in steps]}
    evals, at = [], 0
    for x in recs:
        at = x["step"] if "step" in x and "loss" in x else at
        if x.get("eval"):
            evals.append((at, x))
    want["eval_loss"] = [[s, x["loss"]] for s, x in evals]
    want["eval_accuracy"] = [[s, x["accuracy"]] for s, x in evals]
    want["target_reached"] = []
    check(got == want, f"plotted values differ from the log:\n{got}\n{want}")
    check(len(want["eval_loss"]) == 3 and len(want["train_loss"]) == 15, f"log records: {want}")
    print(f"ok   curves: {r.stdout.strip()}")
    r = subprocess.run([sys.executable, PLOT, os.path.join(work, "x.npy"), "-o", png], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode != 0 and "error:" in r.stderr, f"plot.py on a .npy: exit {r.returncode} {r.stderr}")
    two_metrics(netc, work, data)


def two_metrics(netc, work, data):
    """metrics = [accuracy, top-2 accuracy] and a target the first evaluation meets."""
    net, exe, log = (os.path.join(work, f) for f in ("two.net", "two", "two.jsonl"))
    with open(MODEL) as f:
        text = f.read()
    with open(net, "w") as f:
        f.write(text.replace("metrics = accuracy(logits, label)",
                             "metrics = [accuracy(logits, label), accuracy(logits, label, top_k = 2)]"))
    r = subprocess.run([netc, net, "-o", exe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    argv = [exe, "--data", data[0], "--data", data[1], "--eval-data", data[0], "--eval-data", data[1],
            "--log-every", "5", "--log", log, "--epochs", "3", "--quiet", "--target-loss", "100"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    png, values = os.path.join(work, "two.png"), os.path.join(work, "two.json")
    r = subprocess.run([sys.executable, PLOT, log, "-o", png, "--values", values], capture_output=True, text=True,
                       timeout=300)
    check(r.returncode == 0 and png_size(png) == (800, 780), f"plot.py, two metrics: exit {r.returncode}\n{r.stderr}")
    got, recs = json.load(open(values)), [json.loads(s) for s in open(log)]
    steps = [x for x in recs if "step" in x and "loss" in x]
    evals = [x for x in recs if x.get("eval")]
    want = {f"{part}_{k}": [[steps[-1]["step"] if part == "eval" else x["step"], x[k]] for x in xs]
            for part, xs in (("train", steps), ("eval", evals)) for k in ("accuracy", "top2_accuracy")}
    want["target_reached"] = [[steps[-1]["step"], 1]]  # the first evaluation, after the first epoch
    check(all(got.get(k) == v for k, v in want.items()) and len(evals) == 1,
          f"two metrics and a target: plotted {got}, the log {want}")
    print(f"ok   two metrics and a target: {r.stdout.strip()}")


if __name__ == "__main__":
    sys.exit(run_cases({"curves": curves}, "plot", check, sys.argv))
