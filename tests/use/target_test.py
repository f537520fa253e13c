"""Training to a quality target (docs/trainer.md, "Training to a target"): a run stops at its
first evaluation that meets the target, as MLPerf's runs do, and a run that ends without one
fails with status 7.

usage: target_test.py CASE NETC WORKDIR
  run   a target accuracy taken from a full run's evaluations: the run with it stops at the first
        epoch whose evaluation reaches it (its log, console and MLPerf log say so), and its
        checkpoint, resumed without the target, ends in the full run's weights bit for bit; a run
        stopped before the target and resumed with it stops at the same place with the same
        weights; an unreachable target trains every epoch, writes the weights that run would
        write and exits 7 (MLPerf's status "aborted"); every target must be met by the same
        evaluation; the train section's target_accuracy does the same, and needs --eval-data
        unless --no-target drops it; bad values and targets outside training are refused;
        --eval-every 3 evaluates epochs 3, 6 and the last, the same values as every epoch's,
        and a target is met at the first of them whose evaluation meets it; --eval-every-steps 5
        (and the train section's eval_every_steps) evaluates after every fifth step and the last,
        inside the epochs, without changing the training, with an epoch's end giving its
        evaluation's values; stopped and resumed, no evaluation is lost or made twice; a target
        stops the run at the first of these evaluations that meets it; --save-best holds the
        parameters of the best evaluation (the highest accuracy, or the lowest loss of a model
        without a metric), those of a checkpoint at that epoch's end, bit for bit, without
        changing the training; a resumed run beats the best its checkpoint records, not its own

Every run uses --threads 1, so that runs compare bit for bit.
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, run_cases, st_load  # noqa: E402

check = Checks()
MISSED = 7
STEPS_PER_EPOCH = 12  # 96 training samples, batch 8
EPOCHS = 8


def run(*argv):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)


def build(netc, net, exe):
    r = run(netc, net, "-o", exe)
    assert r.returncode == 0, r.stdout + r.stderr
    return exe


def data(work):
    """Four classes a linear map separates: the evaluation accuracy climbs over the epochs."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4))
    files = {}
    for split, n in (("train", 96), ("eval", 40)):
        x = rng.standard_normal((n, 16)).astype(np.float32)
        files[split] = (os.path.join(work, f"{split}_x.npy"), os.path.join(work, f"{split}_y.npy"))
        np.save(files[split][0], x)
        np.save(files[split][1], (x @ w).argmax(1).astype(np.int64))
    return (["--data", f"x={files['train'][0]}", "--data", f"label={files['train'][1]}", "--threads", "1"],
            ["--eval-data", f"x={files['eval'][0]}", "--eval-data", f"label={files['eval'][1]}"])


def records(log):
    with open(log) as f:
        return [json.loads(x) for x in f]


def eval_epochs(log):
    return [e["epoch"] for e in records(log) if e.get("eval")]


def run_stop(mllog):
    with open(mllog) as f:
        stops = [json.loads(x.split(":::MLLOG ", 1)[1]) for x in f if '"run_stop"' in x]
    return stops[-1]["metadata"]["status"] if len(stops) == 1 else f"{len(stops)} run_stop lines"


def same_tensors(a, b):
    ta, tb = st_load(a), st_load(b)
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


def pick_target(log):
    """The first epoch after the first whose evaluation accuracy beats every one before it, and an
    accuracy between the best before it and its own, which it alone of the epochs up to it meets."""
    accs = [e["accuracy"] for e in records(log) if e.get("eval")]
    for k in range(1, len(accs)):
        if accs[k] > max(accs[:k]):
            return k + 1, (max(accs[:k]) + accs[k]) / 2
    raise AssertionError(f"the evaluation accuracy never rose: {accs}")


def case_run(netc, work):
    net = os.path.join(ROOT, "tests", "checkpoint", "sgd_momentum.net")  # a cosine schedule: the
    exe = build(netc, net, os.path.join(work, "sgd"))  # rate of a step depends on the run's length
    train, ev = data(work)
    p = lambda name: os.path.join(work, name)  # noqa: E731
    full = [*train, *ev, "--epochs", str(EPOCHS)]
    r = run(exe, *full, "--save", p("full.st"), "--log", p("full.jsonl"))
    assert r.returncode == 0, r.stdout + r.stderr
    k, target = pick_target(p("full.jsonl"))
    step = k * STEPS_PER_EPOCH

    # The run with the target stops after epoch k's evaluation, as a finished run does.
    r = run(exe, *full, "--target-accuracy", repr(target), "--save", p("t.st"), "--checkpoint", p("t.ck"),
            "--log", p("t.jsonl"), "--mllog", p("t.mllog"))
    if check.expect(r, 0, f"target accuracy {target:.4f}", f"target reached (accuracy >= {target:.6g}) by epoch {k}'s"):
        last = records(p("t.jsonl"))[-2:]  # the target line, then the checkpoint's
        check(eval_epochs(p("t.jsonl")) == list(range(1, k + 1)) and
              last[0] == {"target_reached": True, "epoch": k, "step": step} and last[1].get("step") == step,
              f"target accuracy {target}: evaluations {eval_epochs(p('t.jsonl'))}, want 1..{k}; log ends {last}")
        check(run_stop(p("t.mllog")) == "success", f"a reached target: MLPerf's run_stop {run_stop(p('t.mllog'))}")
        saved, ck = st_load(p("t.st")), st_load(p("t.ck"))
        check(all(np.array_equal(saved[n], ck[n]) for n in saved), "the target's --save differs from its checkpoint")
        check(not same_tensors(p("t.st"), p("full.st")), "the run with a target trained to the end")
        # Its checkpoint is a clean stop: resumed without the target, the full run's weights.
        r = run(exe, *full, "--resume", p("t.ck"), "--save", p("t_resumed.st"))
        if check.expect(r, 0, "the target's checkpoint resumed without the target"):
            check(same_tensors(p("t_resumed.st"), p("full.st")),
                  "the target's checkpoint resumed to the end differs from the uninterrupted run")
    # Stopped in epoch k - 1 and resumed with the target: the same stop, the same weights.
    stop_at = step - STEPS_PER_EPOCH - 5
    with_target = [*full, "--target-accuracy", repr(target)]
    r = run(exe, *with_target, "--checkpoint", p("s.ck"), "--stop-at", stop_at)
    if check.expect(r, 4, f"stopped at step {stop_at}"):
        r = run(exe, *with_target, "--resume", p("s.ck"), "--save", p("s.st"), "--log", p("s.jsonl"))
        if check.expect(r, 0, "resumed with the target"):
            check(same_tensors(p("s.st"), p("t.st")) and eval_epochs(p("s.jsonl"))[-1] == k,
                  f"stopped and resumed with the target: evaluations {eval_epochs(p('s.jsonl'))}, weights "
                  f"{'equal' if same_tensors(p('s.st'), p('t.st')) else 'differ'}")
    check_eval_every(exe, full, target, p)
    check_eval_every_steps(exe, full, target, p)
    check_missed(exe, train, ev, target, p)
    check_model_target(netc, net, train, ev, k, target, p)
    check_save_best(exe, full, "accuracy", p)
    check_save_best(p("no_metric"), full, "loss", p)
    check_refusals(exe, train, ev, p)


def check_eval_every(exe, full, target, p):
    every = {e["epoch"]: e for e in records(p("full.jsonl")) if e.get("eval")}
    r = run(exe, *full, "--eval-every", "3", "--log", p("e3.jsonl"))
    if check.expect(r, 0, "--eval-every 3"):
        got = [e for e in records(p("e3.jsonl")) if e.get("eval")]
        check([e["epoch"] for e in got] == [3, 6, EPOCHS] and all(e == every[e["epoch"]] for e in got),
              f"--eval-every 3: evaluations {got}, want epochs 3, 6, {EPOCHS} as every epoch's")
    met = [e for e in (3, 6, EPOCHS) if every[e]["accuracy"] >= target]
    r = run(exe, *full, "--eval-every", "3", "--target-accuracy", repr(target), "--log", p("e3t.jsonl"))
    if check.expect(r, 0 if met else MISSED, f"--eval-every 3 with the target (met by epoch {met[:1]})"):
        check(eval_epochs(p("e3t.jsonl"))[-1] == (met[0] if met else EPOCHS),
              f"--eval-every 3 with the target: evaluations {eval_epochs(p('e3t.jsonl'))}, met by {met[:1]}")
    check.expect(run(exe, *full, "--eval-every", "0"), 2, "--eval-every 0", "--eval-every needs an integer >= 1")


def step_evals(log):
    return [(e["step"], e["accuracy"]) for e in records(log) if e.get("eval")]


def check_eval_every_steps(exe, full, target, p):
    every = {e["epoch"]: e for e in records(p("full.jsonl")) if e.get("eval")}
    total = EPOCHS * STEPS_PER_EPOCH
    r = run(exe, *full, "--eval-every-steps", "5", "--save", p("s5.st"), "--log", p("s5.jsonl"))
    if not check.expect(r, 0, "--eval-every-steps 5"):
        return
    got = {e["step"]: e for e in records(p("s5.jsonl")) if e.get("eval")}
    check(list(got) == list(range(5, total, 5)) + [total], f"--eval-every-steps 5: evaluations after steps {list(got)}")
    check(same_tensors(p("s5.st"), p("full.st")), "--eval-every-steps 5 changed the training")
    # step 60 ends epoch 5, and 96 the run: the parameters the epochs' evaluations saw
    for step in (60, total):
        e = every[step // STEPS_PER_EPOCH]
        check(got[step]["epoch"] == e["epoch"] and got[step]["loss"] == e["loss"] and got[step]["accuracy"] == e["accuracy"],
              f"the evaluation after step {step}: {got[step]}, epoch {e['epoch']}'s {e}")
    # stopped after step 10, a checkpoint at 5 and 10, each after that step's evaluation
    args = [*full, "--eval-every-steps", "5", "--checkpoint", p("s5.ck"), "--checkpoint-every", "5"]
    r = run(exe, *args, "--stop-at", "10", "--log", p("s5a.jsonl"))
    if check.expect(r, 4, "--eval-every-steps 5 stopped after step 10"):
        r = run(exe, *args, "--resume", p("s5.ck"), "--log", p("s5b.jsonl"), "--save", p("s5b.st"))
        if check.expect(r, 0, "--eval-every-steps 5 resumed"):
            check(step_evals(p("s5a.jsonl")) == [(5, got[5]["accuracy"]), (10, got[10]["accuracy"])] and
                  step_evals(p("s5b.jsonl")) == [(s, got[s]["accuracy"]) for s in list(got)[2:]] and
                  same_tensors(p("s5b.st"), p("full.st")),
                  f"stopped after step 10 and resumed: evaluations {step_evals(p('s5a.jsonl'))} then "
                  f"{step_evals(p('s5b.jsonl'))}")
    met = [s for s in got if got[s]["accuracy"] >= target]
    r = run(exe, *full, "--eval-every-steps", "5", "--target-accuracy", repr(target), "--log", p("s5t.jsonl"))
    if check.expect(r, 0 if met else MISSED, f"--eval-every-steps 5 with the target (met after step {met[:1]})",
                    *([f"by the evaluation after step {met[0]}"] if met else [])):
        check(step_evals(p("s5t.jsonl"))[-1][0] == (met[0] if met else total),
              f"--eval-every-steps 5 with the target: evaluations {step_evals(p('s5t.jsonl'))}")


def check_save_best(exe, full, key, p):
    """--save-best against the parameters at the end of the best epoch, and across a resume."""
    tag = os.path.basename(exe)
    r = run(exe, *full, "--save-best", p(f"{tag}_best.st"), "--save", p(f"{tag}_all.st"), "--log", p(f"{tag}_b.jsonl"))
    if not check.expect(r, 0, f"--save-best ({key})"):
        return
    evals = [e for e in records(p(f"{tag}_b.jsonl")) if e.get("eval")]
    sign = 1 if key == "accuracy" else -1
    best = max(evals, key=lambda e: (sign * e[key], -e["epoch"]))["epoch"]  # the first of equals
    r = run(exe, *full, "--stop-at", best * STEPS_PER_EPOCH, "--checkpoint", p(f"{tag}_at_best.ck"))
    if best < EPOCHS and not check.expect(r, 4, f"stopped at the end of epoch {best}"):
        return
    if best == EPOCHS:  # the run's end: its --save
        want = st_load(p(f"{tag}_all.st"))
    else:
        want = st_load(p(f"{tag}_at_best.ck"))
    got = st_load(p(f"{tag}_best.st"))
    check(all(np.array_equal(got[n], want[n]) for n in got) and got.keys() <= want.keys(),
          f"--save-best ({key}): not the parameters at the end of epoch {best}, the best evaluation")
    if key == "accuracy":
        full_run = run(exe, *full, "--save", p("again.st"))
        check(full_run.returncode == 0 and same_tensors(p(f"{tag}_all.st"), p("again.st")),
              "--save-best changed the training")
    # stopped in epoch 5, resumed with another file: written only if a later epoch beats the best
    args = [*full, "--checkpoint", p(f"{tag}_b.ck")]
    r = run(exe, *args, "--stop-at", 4 * STEPS_PER_EPOCH + 5, "--save-best", p(f"{tag}_b1.st"))
    if check.expect(r, 4, f"--save-best ({key}) stopped in epoch 5"):
        r = run(exe, *args, "--resume", p(f"{tag}_b.ck"), "--save-best", p(f"{tag}_b2.st"))
        if check.expect(r, 0, f"--save-best ({key}) resumed"):
            if best > 4:
                check(same_tensors(p(f"{tag}_b2.st"), p(f"{tag}_best.st")),
                      f"--save-best resumed: epoch {best}'s parameters not written after the resume")
            else:
                check(same_tensors(p(f"{tag}_b1.st"), p(f"{tag}_best.st")) and not os.path.exists(p(f"{tag}_b2.st")),
                      f"--save-best resumed: the best (epoch {best}) was before the stop, yet the resumed run wrote "
                      f"{p(f'{tag}_b2.st')}")


def check_missed(exe, train, ev, target, p):
    """A target no evaluation meets: every epoch, the weights written, status 7."""
    two = [*train, *ev, "--epochs", "2"]
    r = run(exe, *two, "--save", p("two.st"))
    assert r.returncode == 0, r.stdout + r.stderr
    # a cross-entropy is never negative
    r = run(exe, *two, "--target-loss", "-1", "--save", p("m.st"), "--log", p("m.jsonl"), "--mllog", p("m.mllog"))
    if check.expect(r, MISSED, "an unreachable target", "the run ended after step 24 without reaching its target "
                    "(loss <= -1): the last evaluation, epoch 2's, gave loss"):
        check(same_tensors(p("m.st"), p("two.st")), "a missed target: --save differs from the run without one")
        check(records(p("m.jsonl"))[-1] == {"target_reached": False, "step": 24} and eval_epochs(p("m.jsonl")) == [1, 2],
              f"a missed target: the log ends {records(p('m.jsonl'))[-1]}")
        check(run_stop(p("m.mllog")) == "aborted", f"a missed target: MLPerf's run_stop {run_stop(p('m.mllog'))}")
    # Both targets: the accuracy alone is met at epoch k, never with the loss.
    r = run(exe, *train, *ev, "--epochs", str(EPOCHS), "--target-accuracy", repr(target), "--target-loss", "-1",
            "--log", p("b.jsonl"))
    if check.expect(r, MISSED, "two targets, one never met", "without reaching its target (accuracy >= "):
        check(eval_epochs(p("b.jsonl")) == list(range(1, EPOCHS + 1)), "two targets: stopped when one was met")


def check_model_target(netc, net, train, ev, k, target, p):
    """train { target_accuracy = A }: the same stop; --eval-data needed, --no-target drops it."""
    with open(net) as f:
        text = f.read()
    assert "  epochs = 3\n" in text
    src = p("target.net")
    with open(src, "w") as f:
        f.write(text.replace("  epochs = 3\n", f"  epochs = {EPOCHS}\n  target_accuracy = {target!r}\n"))
    exe = build(netc, src, p("model_target"))
    r = run(exe, *train, *ev, "--save", p("mt.st"), "--log", p("mt.jsonl"))
    if check.expect(r, 0, "the train section's target_accuracy"):
        check(eval_epochs(p("mt.jsonl")) == list(range(1, k + 1)) and same_tensors(p("mt.st"), p("t.st")),
              f"target_accuracy: evaluations {eval_epochs(p('mt.jsonl'))}, want 1..{k}, and --target-accuracy's weights")
    check.expect(run(exe, *train), 2, "the model's target without --eval-data", "has no --eval-data",
                 "from the model's train section", "--no-target")
    r = run(exe, *train, "--no-target", "--epochs", "2", "--save", p("nt.st"))
    if check.expect(r, 0, "--no-target without --eval-data"):
        check(same_tensors(p("nt.st"), p("two.st")), "--no-target: not the run without a target")
    check.expect(run(exe, "--help"), 0, "--help", f"drop the model's target (accuracy >= {target:.6g})")
    src = p("steps.net")
    with open(src, "w") as f:
        f.write(text.replace("  epochs = 3\n", "  epochs = 2\n  eval_every_steps = 7\n"))
    r = run(build(netc, src, p("model_steps")), *train, *ev, "--log", p("ms.jsonl"))
    if check.expect(r, 0, "the train section's eval_every_steps"):
        check([s for s, _ in step_evals(p("ms.jsonl"))] == [7, 14, 21, 24],
              f"eval_every_steps = 7: evaluations after steps {step_evals(p('ms.jsonl'))}")
    # a model with no metric has no accuracy to reach
    src = p("no_metric.net")
    with open(src, "w") as f:
        f.write(text.replace("  metrics = accuracy(logits, label)\n", ""))
    bare = build(netc, src, p("no_metric"))
    check.expect(run(bare, *train, *ev, "--target-accuracy", "0.5"), 2, "--target-accuracy without a metric",
                 "reports no accuracy")
    check.expect(run(bare, *train, *ev, "--epochs", "1", "--target-loss", "100"), 0, "--target-loss without a metric",
                 "target reached (loss <= 100) by epoch 1's")


def check_refusals(exe, train, ev, p):
    for value in ("0", "1.5", "-0.1", "abc", "nan", ""):
        check.expect(run(exe, *train, *ev, "--target-accuracy", value), 2, f"--target-accuracy '{value}'",
                     "--target-accuracy needs an accuracy, a number in (0, 1]")
    check.expect(run(exe, *train, *ev, "--target-loss", "inf"), 2, "--target-loss inf", "--target-loss needs a number")
    check.expect(run(exe, *train, "--target-loss", "1"), 2, "--target-loss without --eval-data", "has no --eval-data",
                 "from the command line")
    check.expect(run(exe, *ev, "--eval-only", "--init", p("full.st"), "--target-loss", "1"), 2,
                 "--target-loss with --eval-only", "are for training runs")
    check.expect(run(exe, *train, "--save-best", p("x.st")), 2, "--save-best without --eval-data",
                 "--save-best keeps the parameters of the best evaluation")
    check.expect(run(exe, *ev, "--eval-only", "--init", p("full.st"), "--save-best", p("x.st")), 2,
                 "--save-best with --eval-only", "trains nothing")
    check.expect(run(exe, *train, *ev, "--save-best", p("x.st"), "--save", p("x.st")), 2,
                 "--save-best naming --save's file", "name the same file")
    check(not os.path.exists(p("x.st")), "a refused run wrote x.st")


if __name__ == "__main__":
    sys.exit(run_cases({"run": case_run}, "target", check, sys.argv))
