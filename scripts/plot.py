#!/usr/bin/env python3
"""Draw a trainer's JSON Lines log (--log FILE): the loss, the accuracy and the learning rate
against the optimizer step.

usage: scripts/plot.py RUN.jsonl [-o CURVES.png] [--values VALUES.json]

Three panels share the step axis: the loss (the mean over each log interval, and each
evaluation's, drawn at the step it followed), the accuracies (training and evaluation of each
metric the model reports, `accuracy`, `top5_accuracy`, `accuracy_2`, ...; the panel is left out
for a model without one) and the learning rate. A run that reached its target (--target-accuracy,
--target-loss) has a dashed line at the step it stopped after. A value logged as null (not
finite) leaves a gap. --values writes the series that were drawn as JSON, so a test or a
user can check the picture against the log. The picture is written by matplotlib's Agg backend
(no display needed); the format follows the name's suffix (.png, .svg, .pdf).
"""
import argparse
import json
import math
import re
import sys


def is_metric(key):
    """A metric's key in a log record: accuracy, top5_accuracy, accuracy_2 (docs/language.md, Metric)."""
    return key == "accuracy" or key.endswith("_accuracy") or re.fullmatch(r"accuracy_\d+", key) is not None


def read_log(path):
    """The series of a log: step records and evaluations, each evaluation placed at the step of
    the last step record before it; each metric's as train_KEY and eval_KEY; a reached target
    (its step, and the epoch whose evaluation met it). Checkpoint records are skipped."""
    series = {"train_loss": [], "train_accuracy": [], "lr": [], "eval_loss": [], "eval_accuracy": [],
              "target_reached": []}
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
                for k in filter(is_metric, r):
                    series.setdefault("train_" + k, []).append((step, r[k]))
            elif r.get("eval"):
                series["eval_loss"].append((step, r.get("loss")))
                for k in filter(is_metric, r):
                    series.setdefault("eval_" + k, []).append((step, r[k]))
            elif r.get("target_reached") is True:
                series["target_reached"].append((r.get("step"), r.get("epoch")))
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

    metrics = [k[6:] for k in series if k.startswith("train_") and is_metric(k[6:])]
    metrics += [k[5:] for k in series if k.startswith("eval_") and is_metric(k[5:]) and k[5:] not in metrics]
    has_acc = any(series.get(f"{part}_{k}") for k in metrics for part in ("train", "eval"))
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
        for i, k in enumerate(metrics):  # the first metric in the loss panel's colours
            name = "" if i == 0 else " " + k.replace("_", " ")
            colors = ("tab:blue", "tab:orange") if i == 0 else (f"C{2 * i + 2}", f"C{2 * i + 3}")
            if series.get("train_" + k):
                acc_ax.plot(*xy(series["train_" + k]), label="train" + name, color=colors[0])
            if series.get("eval_" + k):
                acc_ax.plot(*xy(series["eval_" + k]), "o-", label="eval" + name, color=colors[1])
        acc_ax.set_ylabel("accuracy")
        acc_ax.legend()
    lr_ax.plot(*xy(series["lr"]), color="tab:green")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for step, epoch in series["target_reached"]:
            ax.axvline(step, linestyle="--", color="tab:red", label=f"target reached (epoch {epoch})")
    if series["target_reached"]:
        loss_ax.legend()
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
