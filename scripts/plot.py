#!/usr/bin/env python3
"""Draw a trainer's JSON Lines log (--log FILE): the loss, the accuracy and the learning rate
against the optimizer step.

usage: scripts/plot.py RUN.jsonl [-o CURVES.png] [--values VALUES.json]

Three panels share the step axis: the loss (the mean over each log interval, and each
evaluation's, drawn at the step it followed), the accuracy (training and evaluation, where the
model has a metric; the panel is left out otherwise) and the learning rate. A value logged as
null (not finite) leaves a gap. --values writes the series that were drawn as JSON, so a test or a
user can check the picture against the log. The picture is written by matplotlib's Agg backend
(no display needed); the format follows the name's suffix (.png, .svg, .pdf).
"""
import argparse
import json
import math
import sys


def read_log(path):
    """The series of a log: step records and evaluations, each evaluation placed at the step of
    the last step record before it. Checkpoint records are skipped."""
    series = {"train_loss": [], "train_accuracy": [], "lr": [], "eval_loss": [], "eval_accuracy": []}
    step = 0
    with open(path, errors="replace") as f:  # a binary file fails as JSON, below
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                r = e.msg
            if not isinstance(r, dict):
                sys.exit(f"error: {path}:{lineno}: not a JSON object; is it a trainer's --log file?")
            if "step" in r and "loss" in r and not r.get("eval"):
                step = r["step"]
                series["train_loss"].append((step, r["loss"]))
                series["lr"].append((step, r.get("lr")))
                if "accuracy" in r:
                    series["train_accuracy"].append((step, r["accuracy"]))
            elif r.get("eval"):
                series["eval_loss"].append((step, r.get("loss")))
                if "accuracy" in r:
                    series["eval_accuracy"].append((step, r["accuracy"]))
    if not series["train_loss"] and not series["eval_loss"]:
        sys.exit(f"error: {path} holds no step or evaluation records; is it a trainer's --log file?")
    return series


def xy(points):
    """Steps and values, with NaN for null so that matplotlib leaves a gap."""
    return [p[0] for p in points], [math.nan if p[1] is None else p[1] for p in points]


def draw(series, title, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_acc = bool(series["train_accuracy"] or series["eval_accuracy"])
    rows = 3 if has_acc else 2
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.6 * rows), sharex=True, constrained_layout=True)
    loss_ax, lr_ax = axes[0], axes[-1]
    loss_ax.plot(*xy(series["train_loss"]), label="train", color="tab:blue")
    if series["eval_loss"]:
        loss_ax.plot(*xy(series["eval_loss"]), "o-", label="eval", color="tab:orange")
    loss_ax.set_ylabel("loss")
    loss_ax.legend()
    if has_acc:
        acc_ax = axes[1]
        if series["train_accuracy"]:
            acc_ax.plot(*xy(series["train_accuracy"]), label="train", color="tab:blue")
        if series["eval_accuracy"]:
            acc_ax.plot(*xy(series["eval_accuracy"]), "o-", label="eval", color="tab:orange")
        acc_ax.set_ylabel("accuracy")
        acc_ax.legend()
    lr_ax.plot(*xy(series["lr"]), color="tab:green")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.savefig(out, dpi=100)


def main():
    ap = argparse.ArgumentParser(description="Draw a netc trainer's JSON Lines log.")
    ap.add_argument("log", help="the trainer's --log file")
    ap.add_argument("-o", "--output", default="curves.png", help="the picture (default curves.png)")
    ap.add_argument("--values", help="also write the plotted series to this JSON file")
    a = ap.parse_args()
    try:
        series = read_log(a.log)
    except OSError as e:
        sys.exit(f"error: cannot read '{a.log}': {e.strerror}")
    try:
        draw(series, a.log, a.output)
    except OSError as e:
        sys.exit(f"error: cannot write '{a.output}': {e.strerror}")
    if a.values:
        with open(a.values, "w") as f:
            json.dump(series, f)
    counts = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in series.items() if v)
    print(f"{a.output}: {counts}")


if __name__ == "__main__":
    main()
