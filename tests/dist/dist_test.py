#!/usr/bin/env python3
"""Distributed trainers (netc --distributed) under Open MPI's mpirun, on the CPU.

  dist_test.py CASE NETC WORK

  equivalence  N ranks at batch B against one process at batch N*B (MLP, LeNet): the same
               samples in the same steps, so the same parameters up to the order of float32 sums;
               one rank against the plain trainer, bit for bit; a sharded evaluation against a
               whole one; rank 0 alone writes the log and the weights
  checkpoint   stop and resume under 2 ranks (bit-identical to an uninterrupted run), resume
               under 4 ranks of half the batch and in one process of the global batch; a
               different global batch refused
  failures     a rank killed, a rank that hangs (the timeout), a signal to one rank, ranks that
               start from different weights, options that need one process
  shard        --shard-optimizer (ZeRO-1): 2, 3 and 4 ranks against one process (AdamW, no_decay,
               clip_grad_norm), one rank against the plain trainer, checkpoints that hold the whole
               optimizer state resumed under other rank counts, sharded or not
  sync_bn      ResNet-18 (narrow): a step of 2 and 4 ranks with --sync-bn against one process at
               the global batch, one rank against the plain trainer; per-rank statistics end with
               rank 0's running statistics, which a sharded evaluation uses on every rank
  accumulate   --accumulate K (gradient accumulation): one process at batch B with K = 4, 2 ranks with
               K = 2 (plain and --shard-optimizer; AdamW with clip_grad_norm active) against one
               process at batch 4B: the same samples in each step, the same parameters up to the
               order of the sums; K = 1 the plain trainer's bits; stopped and resumed with the same
               K bit for bit, and as another split of the same global batch within rounding;
               another global batch refused
  target       training to a target accuracy (--target-accuracy): 2 ranks stop together after the
               first evaluation that meets it; beside an evaluation rank, whose results come later,
               every rank stops at the same step and the checkpoint resumes to the weights of the
               run without a target; a missed target ends every rank with status 7; evaluations
               every 4 steps (--eval-every-steps) by the 2 ranks and by an evaluation rank: the same
               evaluations of the same steps, the training untouched, and the same --save-best file
               (the parameters handed to the evaluator, written by rank 0)
  eval_rank    --eval-rank: 2 and 1 training ranks with an evaluation rank against the same ranks
               evaluating between epochs (ResNet-18, narrow): the same weights and evaluations,
               the results taken after later steps; stopped and resumed; refusals

The machine may have 2 cores: mpirun runs with --oversubscribe, and every trainer with one
thread, so 4 ranks share 2 cores and each run takes a few seconds.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import Checks, fashion, fashion_files, mpi_env, mpirun_args, run_cases, st_load  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
check = Checks()

ENV = mpi_env()

TRAIN = fashion_files("train")
EVAL = fashion_files("test")
DATA = ["--data", f"image={TRAIN[0]}", "--data", f"label={TRAIN[1]}"]
EVAL_DATA = ["--eval-data", f"image={EVAL[0]}", "--eval-data", f"label={EVAL[1]}"]
RUN = DATA + ["--threads", "1", "--quiet"]


def build(netc, work, model, batch, distributed, bucket_kib=None, sync_bn=False):
    exe = os.path.join(work, f"{model}_b{batch}{'_dist' if distributed else ''}")
    if bucket_kib:
        exe += f"_k{bucket_kib}"
    if sync_bn:
        exe += "_sync"
    if not os.path.exists(exe):
        cmd = [netc, os.path.join(REPO, "models", model + ".net"), "-D", f"batch={batch}", "-o", exe]
        if model == "resnet18_cifar":
            cmd += ["-D", "width=4"]  # a narrow ResNet-18: seconds per run
        if distributed:
            cmd.append("--distributed")
        if bucket_kib:
            cmd += ["--bucket-kib", str(bucket_kib)]
        if sync_bn:
            cmd.append("--sync-bn")
        subprocess.run(cmd, check=True)
    return exe


def mpirun(ranks, argv, timeout=240, **kw):
    return subprocess.run(mpirun_args(ranks) + argv, env=ENV, capture_output=True,
                          text=True, timeout=timeout, **kw)


def run(argv, timeout=240):
    return subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=timeout)


def max_rel(a, b):
    """The largest difference of a tensor of a and b, relative to that tensor's largest value."""
    worst = (0.0, "")
    for name in a:
        x, y = a[name].astype("float64"), b[name].astype("float64")
        d = float(abs(x - y).max() / max(abs(x).max(), 1e-30))
        worst = max(worst, (d, name))
    return worst


# N ranks at batch B and one process at N*B see the same samples in each step; their gradients
# differ only in the order the float32 sums are added (B per rank, then the ranks), a relative
# 1e-7 per step. Over the short runs here that stays below 1e-6 of each tensor's scale (2-4e-7
# measured); 1e-5 leaves room for other CPUs' kernels. A broken shard (wrong samples), a missing
# division by the ranks (twice the step) or no sum at all changes the parameters by a sizeable
# part of their updates, 1e-3 and more.
SAME_RUN = 1e-5


def case_equivalence(netc, work):
    for model, batch, steps in (("mlp", 32, 40), ("lenet", 16, 12)):
        one = build(netc, work, model, 2 * batch, False)
        plain_half = build(netc, work, model, batch, False)
        dist = build(netc, work, model, batch, True, bucket_kib=16)  # several buckets
        quarter = build(netc, work, model, batch // 2, True)
        steps_arg = ["--steps", str(steps)]
        ref = os.path.join(work, f"{model}_one.st")
        r = run([one] + RUN + steps_arg + ["--save", ref])
        check.expect(r, 0, f"{model}: one process at batch {2 * batch}")
        for ranks, exe in ((2, dist), (4, quarter)):
            out, log = os.path.join(work, f"{model}_x{ranks}.st"), os.path.join(work, f"{model}_x{ranks}.jsonl")
            r = mpirun(ranks, [exe] + RUN + steps_arg + ["--save", out, "--log", log, "--log-every", "4"])
            if not check.expect(r, 0, f"{model}: {ranks} ranks"):
                continue
            d, name = max_rel(st_load(ref), st_load(out))
            check(d <= SAME_RUN, f"{model}: {ranks} ranks against one process: {name} differs by {d:.3g} relative")
            print(f"ok   {model}: {ranks} ranks at batch {2 * batch // ranks} = one process at {2 * batch}: "
                  f"largest difference {d:.2g} relative ({name})")
            with open(log) as f:
                lines = [line for line in f if '"step"' in line]
            # rank 0 alone writes: one line per 4 steps, not one per rank
            check(len(lines) == steps // 4, f"{model}: {ranks} ranks wrote {len(lines)} log lines, want {steps // 4}")
            check(f'"ranks": {ranks}, "batch": {2 * batch // ranks}, "global_batch": {2 * batch}' in lines[-1],
                  f"{model}: the log line lacks the batches: {lines[-1]}")
        # One rank runs the same operations in the same order as the plain trainer: the sum over
        # one rank returns its input, and the division by 1 is exact.
        a, b = os.path.join(work, f"{model}_plain.st"), os.path.join(work, f"{model}_x1.st")
        check.expect(run([plain_half] + RUN + steps_arg + ["--save", a]), 0, f"{model}: plain trainer")
        check.expect(mpirun(1, [dist] + RUN + steps_arg + ["--save", b]), 0, f"{model}: one rank")
        check(open(a, "rb").read() == open(b, "rb").read(), f"{model}: one rank differs from the plain trainer")
    # A sharded evaluation sums the same per-sample losses as a whole one (batches of 32 against
    # 64 change only the products' blocking: float32 rounding, 1e-6 of the mean loss).
    weights = os.path.join(work, "mlp_one.st")
    mlp64, mlp32 = build(netc, work, "mlp", 64, False), build(netc, work, "mlp", 32, True, bucket_kib=16)
    logs = [os.path.join(work, f"eval{k}.jsonl") for k in (1, 3)]
    whole = run([mlp64, "--eval-only", "--init", weights, "--threads", "1", "--log", logs[0]] + EVAL_DATA)
    shard = mpirun(3, [mlp32, "--eval-only", "--init", weights, "--threads", "1", "--log", logs[1]] + EVAL_DATA)
    if check.expect(whole, 0, "evaluation in one process") and check.expect(shard, 0, "evaluation over 3 ranks"):
        (l1, a1), (l3, a3) = eval_result(logs[0]), eval_result(logs[1])
        check(abs(l1 - l3) <= 1e-5 * l1 and a1 == a3, f"evaluation: one process loss {l1} accuracy {a1}, 3 ranks {l3} {a3}")


def case_metrics(netc, work):
    """Two metrics, the arg-max's and the top-5 accuracy (metrics = [...]), summed over the ranks:
    the training lines of 2 ranks against one process at twice the batch, an evaluation sharded
    over 3 ranks against one process, and an evaluation rank beside 2 training ranks against the
    evaluations those ranks make themselves."""
    with open(os.path.join(REPO, "models", "mlp.net")) as f:
        text = f.read()
    net = os.path.join(work, "mlp2.net")
    with open(net, "w") as f:
        f.write(text.replace("metrics   = accuracy(logits, label)",
                             "metrics   = [accuracy(logits, label), accuracy(logits, label, top_k = 5)]"))

    def build2(batch, distributed):
        exe = os.path.join(work, f"mlp2_b{batch}{'_dist' if distributed else ''}")
        if not os.path.exists(exe):
            subprocess.run([netc, net, "-D", f"batch={batch}", "-o", exe] + (["--distributed"] if distributed else []),
                           check=True)
        return exe

    one, two = build2(64, False), build2(32, True)
    w, logs = os.path.join(work, "mlp2.st"), [os.path.join(work, f"train{k}.jsonl") for k in (1, 2)]
    steps = ["--steps", "16", "--log-every", "4", "--no-shuffle"]
    r1 = run([one] + RUN + steps + ["--save", w, "--log", logs[0]])
    r2 = mpirun(2, [two] + RUN + steps + ["--log", logs[1]])
    if check.expect(r1, 0, "two metrics: one process") and check.expect(r2, 0, "two metrics: 2 ranks"):
        lines = [[json.loads(x) for x in open(log) if '"step"' in x] for log in logs]
        # the same 256 samples per line, predicted from weights equal to float32 rounding: a count
        # moves only where two logits are that close, at most a sample or two of the 256
        ok = len(lines[0]) == len(lines[1]) == 4 and all(
            abs(a[k] - b[k]) <= 2 / 256 for a, b in zip(*lines) for k in ("accuracy", "top5_accuracy"))
        check(ok and all(a["top5_accuracy"] >= a["accuracy"] for a in lines[1]),
              f"two metrics: 2 ranks' training lines {lines[1]}, one process's {lines[0]}")
    elogs = [os.path.join(work, f"eval{k}.jsonl") for k in (1, 3)]
    whole = run([one, "--eval-only", "--init", w, "--threads", "1", "--log", elogs[0]] + EVAL_DATA)
    shard = mpirun(3, [two, "--eval-only", "--init", w, "--threads", "1", "--log", elogs[1]] + EVAL_DATA)
    if check.expect(whole, 0, "two metrics: evaluation in one process") and \
            check.expect(shard, 0, "two metrics: evaluation over 3 ranks"):
        e1, e3 = ([json.loads(x) for x in open(log) if '"eval": true' in x][-1] for log in elogs)
        # whole rows' counts: the same predictions give the same sums, exactly
        check(e1["accuracy"] == e3["accuracy"] and e1["top5_accuracy"] == e3["top5_accuracy"]
              and e1["top5_accuracy"] > e1["accuracy"], f"two metrics: evaluation in one process {e1}, over 3 ranks {e3}")
        print(f"ok   two metrics over the ranks: accuracy {e3['accuracy']}, top5_accuracy {e3['top5_accuracy']}")
    # an evaluation rank: 64 samples a step, 128 training samples, 3 epochs (an evaluation after each)
    images, labels = fashion("train")
    small = [os.path.join(work, f"small_{k}.npy") for k in ("image", "label")]
    np.save(small[0], images[:128, None].astype("float32"))
    np.save(small[1], labels[:128].astype("int64"))
    args = ["--data", f"image={small[0]}", "--data", f"label={small[1]}", "--eval-data", f"image={small[0]}",
            "--eval-data", f"label={small[1]}", "--threads", "1", "--epochs", "3", "--quiet"]
    evals = {}
    for np_, extra in ((2, []), (3, ["--eval-rank"])):
        log = os.path.join(work, f"er{np_}.jsonl")
        r = mpirun(np_, [two] + args + extra + ["--log", log])
        if check.expect(r, 0, f"two metrics: {np_} processes{' with an evaluation rank' * bool(extra)}"):
            evals[np_] = [(e["epoch"], e["accuracy"], e["top5_accuracy"]) for e in map(json.loads, open(log))
                          if e.get("eval")]
    if len(evals) == 2:
        check(evals[2] == evals[3] and len(evals[2]) == 3,
              f"two metrics: evaluations by the training ranks {evals[2]}, by the evaluation rank {evals[3]}")


def cifar_like(work, split, n):
    """n Fashion-MNIST images as ResNet-18's 32x32 three-channel input: normalised, padded, repeated."""
    import numpy as np
    images, labels = fashion(split)
    x = (images[:n].astype("float32") / 255.0 - 0.286) / 0.353
    x = np.repeat(np.pad(x[:, None], ((0, 0), (0, 0), (2, 2), (2, 2))), 3, axis=1).astype("float32")
    paths = [os.path.join(work, f"{split}_{what}.npy") for what in ("image", "label")]
    np.save(paths[0], x)
    np.save(paths[1], labels[:n].astype("int64"))
    return [f"image={paths[0]}", f"label={paths[1]}"]


def eval_result(log):
    """The last evaluation's loss and accuracy in a --log file."""
    with open(log) as f:
        last = [json.loads(line) for line in f if '"eval": true' in line][-1]
    return last["loss"], last["accuracy"]


def running_stats(tensors):
    return {k: v for k, v in tensors.items() if ".running_" in k}


def update_diff(init, ref, other):
    """The largest difference of a trainable tensor of ref and other, relative to ref's change from init."""
    import numpy as np
    worst = (0.0, "")
    for name in ref:
        if ".running_" in name or name.endswith(".num_batches_tracked"):
            continue
        a, b, i = (t[name].astype("float64") for t in (ref, other, init))
        d = float(np.linalg.norm(a - b) / max(np.linalg.norm(a - i), 1e-30))
        worst = max(worst, (d, name))
    return worst


# One step of a synchronised ResNet-18 against one process: the gradient of the first
# convolution comes out of 20 batch-norm backward passes, each subtracting nearly equal sums, so
# reordering its float32 sums moves that gradient by up to 3e-5 of itself (measured: the same
# process with 1 and 2 threads). 1e-3 leaves room for other CPUs' kernels. Per-rank statistics,
# backward sums not averaged over the ranks, or no sum at all change a tensor's update by 0.1 to 1
# of itself. Later steps are left out: this narrow network on 32 images a step amplifies such
# differences tenfold a step, for one process as much as for several.
SAME_STEP = 1e-3


def case_sync_bn(netc, work):
    resnet = os.path.join(REPO, "models", "resnet18_cifar.net")
    for argv, needle in ((["--sync-bn"], "batch norm (--sync-bn): 20 layers summed over the ranks in 60 blocking sums"),
                         ([], "batch norm: 20 layers normalise with each rank's own batch")):
        check.expect(run([netc, resnet, "--distributed", "--report"] + argv), 0, "--report " + " ".join(argv), needle)
    train, held = cifar_like(work, "train", 256), cifar_like(work, "test", 96)
    data = [a for d in train for a in ("--data", d)]
    run_args = data + ["--threads", "1", "--quiet", "--steps", "1"]
    one = build(netc, work, "resnet18_cifar", 32, False)
    init, ref = os.path.join(work, "init.st"), os.path.join(work, "one.st")
    # a step with nothing to learn saves the initial parameters
    check.expect(run([one] + run_args + ["--lr", "0", "--weight-decay", "0", "--save", init]), 0, "initial weights")
    check.expect(run([one] + run_args + ["--save", ref]), 0, "one process at batch 32")
    for ranks, sync in ((2, True), (4, True), (2, False)):
        exe = build(netc, work, "resnet18_cifar", 32 // ranks, True, sync_bn=sync)
        out = os.path.join(work, f"x{ranks}{'_sync' if sync else ''}.st")
        r = mpirun(ranks, [exe] + run_args + ["--save", out])
        if not check.expect(r, 0, f"{ranks} ranks{' --sync-bn' if sync else ''}"):
            continue
        d, name = update_diff(st_load(init), st_load(ref), st_load(out))
        s, stat = max_rel(*(running_stats(st_load(f)) for f in (ref, out)))
        if not sync:  # each rank's own statistics: a different step, which is what --sync-bn is for
            if check(d > 0.05, f"per-rank batch norm, {ranks} ranks: {name}'s step differs by only {d:.3g}"):
                print(f"ok   per-rank batch norm: {ranks} ranks take another step ({name}'s differs by {d:.2g})")
        elif check(d <= SAME_STEP, f"--sync-bn, {ranks} ranks: {name}'s step differs from one process's by {d:.3g}") \
                and check(s <= SAME_RUN, f"--sync-bn, {ranks} ranks: {stat} differs by {s:.3g} relative"):
            print(f"ok   --sync-bn: {ranks} ranks at batch {32 // ranks} take one process's step at batch 32: "
                  f"largest difference {d:.2g} of a tensor's step ({name}); running statistics {s:.2g} ({stat})")
    # One rank: the sums over one rank return their input, bit for bit the plain trainer's.
    a, b = os.path.join(work, "plain16.st"), os.path.join(work, "sync1.st")
    check.expect(run([build(netc, work, "resnet18_cifar", 16, False)] + run_args + ["--save", a]), 0, "plain, batch 16")
    check.expect(mpirun(1, [build(netc, work, "resnet18_cifar", 16, True, sync_bn=True)] + run_args + ["--save", b]),
                 0, "--sync-bn, one rank")
    check(open(a, "rb").read() == open(b, "rb").read(), "--sync-bn: one rank differs from the plain trainer")
    # Per-rank statistics: the ranks end with rank 0's running statistics (or the end-of-run
    # check of equal parameters fails), and a sharded evaluation uses them on every rank, so it
    # equals one process's evaluation of the saved weights (float32 rounding of the batches' sums).
    exe, weights = build(netc, work, "resnet18_cifar", 16, True), os.path.join(work, "per_rank.st")
    evals = [a for d in held for a in ("--eval-data", d)]
    logs = [os.path.join(work, f"eval{k}.jsonl") for k in (1, 2)]
    r = mpirun(2, [exe] + data + ["--threads", "1", "--steps", "3", "--save", weights, "--log", logs[1]] + evals)
    whole = run([one, "--eval-only", "--init", weights, "--threads", "1", "--log", logs[0]] + evals)
    if check.expect(r, 0, "per-rank batch norm, 2 ranks, evaluated") and check.expect(whole, 0, "evaluation"):
        (l1, a1), (l2, a2) = eval_result(logs[0]), eval_result(logs[1])
        check(abs(l1 - l2) <= 1e-5 * l1 and a1 == a2,
              f"per-rank batch norm: 2 ranks evaluated loss {l2} accuracy {a2}, one process {l1} {a1}")


def case_shard(netc, work):
    """--shard-optimizer (ZeRO-1) on tests/torch/recipe.net: AdamW, a no_decay group, clip_grad_norm;
    and LAMB, whose trust ratios need each tensor's norms summed over the ranks' slices."""
    import numpy as np
    rng = np.random.default_rng(1)
    x, y = os.path.join(work, "x.npy"), os.path.join(work, "y.npy")
    np.save(x, rng.standard_normal((480, 20)).astype("float32"))
    np.save(y, rng.integers(0, 5, 480).astype("int64"))
    args = ["--data", f"x={x}", "--data", f"label={y}", "--threads", "1", "--quiet"]
    CLIP = ["-D", "clip=0.3"]  # the gradient's norm is 0.5-0.7: every step clips, with the norm of all the slices
    recipe = os.path.join(REPO, "tests", "torch", "recipe.net")

    def exe(batch, sharded):
        path = os.path.join(work, f"recipe_b{batch}{'_zero' if sharded else ''}")
        if not os.path.exists(path):  # 1 KiB buckets: four of them, each sliced between the ranks
            subprocess.run([netc, recipe, "-D", f"batch={batch}", "-o", path, "--distributed", "--bucket-kib", "1"]
                           + CLIP + (["--shard-optimizer"] if sharded else []), check=True)
        return path

    one, out = os.path.join(work, "plain.st"), {}
    plain = os.path.join(work, "recipe_b24")
    subprocess.run([netc, recipe, "-D", "batch=24", "-o", plain] + CLIP, check=True)
    check.expect(run([plain] + args + ["--save", one]), 0, "one process at batch 24")
    # every rank updates its slices and the others gather them: the same step as one process,
    # up to the order of the float32 sums (as dist_equivalence); 3 ranks slice unevenly
    for ranks in (2, 3, 4):
        out[ranks] = os.path.join(work, f"zero{ranks}.st")
        r = mpirun(ranks, [exe(24 // ranks, True)] + args[:-1] + ["--save", out[ranks]])
        if check.expect(r, 0, f"--shard-optimizer, {ranks} ranks", "sharded optimizer: rank 0 updates"):
            d, name = max_rel(st_load(one), st_load(out[ranks]))
            if check(d <= SAME_RUN, f"--shard-optimizer, {ranks} ranks: {name} differs by {d:.3g} relative"):
                print(f"ok   --shard-optimizer: {ranks} ranks = one process, largest difference {d:.2g} ({name})")
    # one rank updates the whole buffer in the plain trainer's loops and order
    b = os.path.join(work, "zero1.st")
    check.expect(mpirun(1, [exe(24, True)] + args + ["--save", b]), 0, "--shard-optimizer, one rank")
    check(open(one, "rb").read() == open(b, "rb").read(), "--shard-optimizer: one rank differs from the plain trainer")
    # checkpoints hold the whole optimizer state: stop and resume under 2 sharded ranks (bit for
    # bit), under 3 sharded ranks and one process; an unsharded run's checkpoint under 4 sharded
    ck, dck = os.path.join(work, "ck.st"), os.path.join(work, "dck.st")
    check.expect(mpirun(2, [exe(12, True)] + args + ["--checkpoint", ck, "--stop-at", "5"]), 4, "sharded --stop-at 5")
    check.expect(mpirun(2, [exe(12, False)] + args + ["--checkpoint", dck, "--stop-at", "5"]), 4, "unsharded --stop-at")
    resumed = os.path.join(work, "resumed.st")
    if check.expect(mpirun(2, [exe(12, True)] + args + ["--resume", ck, "--save", resumed]), 0, "sharded resume"):
        check(open(out[2], "rb").read() == open(resumed, "rb").read(), "the resumed sharded run differs from the "
              "uninterrupted one")
    for what, argv, f in (("3 sharded ranks", mpirun_args(3) + [exe(8, True)], ck),
                          ("one process", [plain], ck),
                          ("4 sharded ranks, an unsharded checkpoint", mpirun_args(4) + [exe(6, True)], dck)):
        res = os.path.join(work, what.replace(" ", "_").replace(",", "") + ".st")
        if check.expect(run(argv + args + ["--resume", f, "--save", res]), 0, f"{what} resume"):
            d, name = max_rel(st_load(out[2]), st_load(res))
            check(d <= SAME_RUN, f"{what}: {name} differs from the uninterrupted run by {d:.3g} relative")
    # distributed LAMB and LARS: each rank's slices cut tensors (1 KiB buckets, 3 ranks unevenly),
    # so every tensor's norms are the ranks' sums; one rank is the plain trainer, bit for bit
    for opt in ("lamb", "lars"):
        name_ = opt.upper()
        sharded = ["-D", f"{opt}=true", "--distributed", "--bucket-kib", "1", "--shard-optimizer"]
        lone, whole = os.path.join(work, f"{opt}_plain"), os.path.join(work, f"{opt}.st")
        subprocess.run([netc, recipe, "-D", "batch=24", "-D", f"{opt}=true", "-o", lone] + CLIP, check=True)
        check.expect(run([lone] + args + ["--save", whole]), 0, f"{name_}, one process")
        for ranks in (1, 2, 3):
            path, res = os.path.join(work, f"{opt}_zero{ranks}"), os.path.join(work, f"{opt}{ranks}.st")
            subprocess.run([netc, recipe, "-D", f"batch={24 // ranks}", "-o", path] + CLIP + sharded, check=True)
            if check.expect(mpirun(ranks, [path] + args + ["--save", res]), 0, f"sharded {name_}, {ranks} ranks"):
                if ranks == 1:
                    check(open(whole, "rb").read() == open(res, "rb").read(),
                          f"sharded {name_}: one rank differs from the plain trainer")
                    continue
                d, name = max_rel(st_load(whole), st_load(res))
                if check(d <= SAME_RUN, f"sharded {name_}, {ranks} ranks: {name} differs by {d:.3g} relative"):
                    print(f"ok   sharded {name_}: {ranks} ranks = one process, largest difference {d:.2g} ({name})")
    r = run([netc, recipe, "--distributed", "--shard-optimizer", "--report"])
    check.expect(r, 0, "--report of a sharded trainer", "updates 1/N of the 837 trainable floats")
    r = run([netc, recipe, "--shard-optimizer", "-o", os.path.join(work, "refused")])
    check.expect(r, 2, "--shard-optimizer alone", "give --distributed too")


def case_accumulate(netc, work):
    recipe = os.path.join(REPO, "tests", "torch", "recipe.net")

    def trainer(batch, *flags):
        exe = os.path.join(work, f"recipe_b{batch}{''.join(f.replace('-', '_') for f in flags)}")
        if not os.path.exists(exe):
            subprocess.run([netc, recipe, "-D", f"batch={batch}", "-D", "steps=12", "-D", "clip=0.05", "-o", exe,
                            *flags], check=True)
        return exe

    x, y = os.path.join(work, "x.npy"), os.path.join(work, "label.npy")
    rng = np.random.default_rng(4)
    np.save(x, rng.normal(size=(256, 20)).astype(np.float32))
    np.save(y, rng.integers(0, 5, 256).astype(np.int64))
    args = ["--data", f"x={x}", "--data", f"label={y}", "--threads", "1", "--quiet", "--seed", "5"]

    def train(what, argv, *extra):
        out = os.path.join(work, what.replace(" ", "_").replace(",", "") + ".st")
        return out if check.expect(run(argv + args + list(extra) + ["--save", out]), 0, what) else None

    whole = train("batch 64", [trainer(64)])
    plain = train("batch 16", [trainer(16)])
    one = train("batch 16 accumulate 1", [trainer(16)], "--accumulate", "1")
    check(open(one, "rb").read() == open(plain, "rb").read(), "--accumulate 1 differs from the plain trainer")
    far, _ = max_rel(st_load(whole), st_load(plain))
    check(far > 100 * SAME_RUN, f"a batch of 16 ends only {far:.3g} from a batch of 64: the comparison is blind")
    log = os.path.join(work, "k4.jsonl")
    k4 = train("batch 16 accumulate 4", [trainer(16)], "--accumulate", "4", "--log", log)
    outs = [k4, train("2 ranks accumulate 2", mpirun_args(2) + [trainer(16, "--distributed")], "--accumulate", "2"),
            train("2 sharded ranks accumulate 2", mpirun_args(2) + [trainer(16, "--distributed", "--shard-optimizer")],
                  "--accumulate", "2")]
    for what, out in zip(("batch 16 with --accumulate 4", "2 ranks of 16 with --accumulate 2",
                          "2 sharded ranks of 16 with --accumulate 2"), outs):
        d, name = max_rel(st_load(whole), st_load(out))
        if check(d <= SAME_RUN, f"{what}: {name} differs from one batch of 64 by {d:.3g} relative"):
            print(f"ok   {what} = one batch of 64, largest difference {d:.2g} ({name})")
    lines = [json.loads(s) for s in open(log)]
    check(any(ln.get("accumulate") == 4 and ln.get("global_batch") == 64 for ln in lines),
          f"--accumulate 4: the log names it and the global batch: {lines[:1]}")
    # stopped at step 5 and resumed: with the same K bit for bit; as 2 ranks with K = 2 or one
    # batch of 64 (the same global batch) within rounding; K = 2 alone (32) refused
    ck = os.path.join(work, "k4.ckpt")
    check.expect(run([trainer(16)] + args + ["--accumulate", "4", "--checkpoint", ck, "--stop-at", "5"]), 4,
                 "--accumulate 4, --stop-at 5")
    res = train("batch 16 accumulate 4 resumed", [trainer(16)], "--accumulate", "4", "--resume", ck)
    check(open(res, "rb").read() == open(k4, "rb").read(), "--accumulate 4 resumed differs from the uninterrupted run")
    for what, argv in (("2 ranks with --accumulate 2", mpirun_args(2) + [trainer(16, "--distributed"), "--accumulate",
                                                                         "2"]),
                       ("one batch of 64", [trainer(64)])):
        res = train(f"resumed as {what}", argv, "--resume", ck)
        d, name = max_rel(st_load(k4), st_load(res))
        if check(d <= SAME_RUN, f"resumed as {what}: {name} differs by {d:.3g} relative"):
            print(f"ok   --accumulate 4's checkpoint resumed as {what}, largest difference {d:.2g} ({name})")
    r = run([trainer(16)] + args + ["--accumulate", "2", "--resume", ck])
    check.expect(r, 1, "--accumulate 2 refuses an --accumulate 4 checkpoint", "global batch of 64",
                 "this run's is 32 (1 rank x --accumulate 2 x batch 16)")
    r = run([trainer(16)] + args + ["--accumulate", "0"])
    check.expect(r, 2, "--accumulate 0", "--accumulate needs an integer >= 1, found '0'")
    # accumulate = 4 in the train section: the default, the bits of --accumulate 4; the option wins
    compiled = train("accumulate = 4", [trainer(16, "-D", "acc=4")])
    check(open(compiled, "rb").read() == open(k4, "rb").read(), "accumulate = 4 differs from --accumulate 4")
    log2 = os.path.join(work, "acc4_k2.jsonl")
    train("accumulate = 4 with --accumulate 2", [trainer(16, "-D", "acc=4")], "--accumulate", "2", "--log", log2)
    check(any(json.loads(s).get("accumulate") == 2 for s in open(log2)), "--accumulate 2 over accumulate = 4")
    # a GPU trainer's: its default too, and its step's launches for a summed batch (the emulated
    # trainer's accumulation is tests/cuda/emu's)
    r = run([netc, recipe, "-D", "acc=2", "--backend", "cuda", "--dump=c"])
    check.expect(r, 0, "a GPU trainer with accumulate = 2", ".accumulate = 2,", "if (part == RT_STEP_SUM)")


def case_checkpoint(netc, work):
    dist, half, one = build(netc, work, "mlp", 32, True), build(netc, work, "mlp", 16, True), \
        build(netc, work, "mlp", 64, False)
    steps = ["--steps", "30"]
    full, ck = os.path.join(work, "full.st"), os.path.join(work, "ck.st")
    check.expect(mpirun(2, [dist] + RUN + steps + ["--save", full]), 0, "2 ranks, uninterrupted")
    r = mpirun(2, [dist] + RUN + steps + ["--checkpoint", ck, "--stop-at", "12"])
    check.expect(r, 4, "2 ranks, --stop-at 12", "checkpoint")
    # the same ranks and threads: the same operations in the same order, bit for bit
    resumed = os.path.join(work, "resumed.st")
    r = mpirun(2, [dist] + RUN + ["--resume", ck, "--checkpoint", os.path.join(work, "ck2.st"), "--save", resumed])
    if check.expect(r, 0, "2 ranks resume 2 ranks' checkpoint"):
        check(open(full, "rb").read() == open(resumed, "rb").read(), "the resumed 2-rank run differs from the "
              "uninterrupted one")
    # the same global batch another way: 4 ranks of 16, or one process of 64
    for what, argv in (("4 ranks of batch 16", mpirun_args(4) + [half]),
                       ("one process of batch 64", [one])):
        out = os.path.join(work, what.replace(" ", "_") + ".st")
        r = run(argv + RUN[:-1] + ["--resume", ck, "--save", out])
        if check.expect(r, 0, f"{what} resume 2 ranks' checkpoint", "2 ranks of batch 32"):
            d, name = max_rel(st_load(full), st_load(out))
            check(d <= SAME_RUN, f"{what}: {name} differs from the 2-rank run by {d:.3g} relative")
    r = mpirun(4, [dist] + RUN + ["--resume", ck])
    check.expect(r, 1, "4 ranks of batch 32 refuse 2 ranks' checkpoint", "global batch of 64", "this run's is 128")


def rank_pids(exe, timeout=60):
    """The trainer's processes under mpirun, by rank."""
    end = time.time() + timeout
    while time.time() < end:
        pids = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{pid}/exe") != exe:
                    continue
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            for e in env:
                if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                    pids[int(e.split(b"=")[1])] = int(pid)
        if len(pids) == 2:
            return pids
        time.sleep(0.2)
    return {}


def start_long(exe, extra_env=None, *argv):
    env = dict(ENV, **(extra_env or {}))
    return subprocess.Popen(mpirun_args(2) + [exe] + RUN + ["--epochs", "50"] + list(argv),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_started(exe):
    pids = rank_pids(exe)
    time.sleep(1.5)  # past start-up, into the steps
    return pids


def case_failures(netc, work):
    mlp = os.path.join(REPO, "models", "mlp.net")
    for argv, needle in ((["--distributed", "--bucket-kib", "0"], "--bucket-kib takes a whole number of KiB"),
                         (["--sync-bn"], "--sync-bn sums batch norm's statistics over the ranks of a distributed "
                                         "trainer; give --distributed too")):
        check.expect(run([netc, mlp, "-o", os.path.join(work, "refused")] + argv), 2, "netc " + " ".join(argv), needle)
    report = run([netc, mlp, "--distributed", "--bucket-kib", "1", "--report"])
    # 1 KiB buckets cut from the end: fc2's bias and weight fill the first (5,160 bytes), ready
    # after fc2's weight gradient; fc1's bias (512 bytes) and weight the second, ready at the end
    check.expect(report, 0, "netc --report lists the buckets", "in 2 buckets", "0                  1290",
                 "1                100480", "per step and rank: 0.4071 MB")
    exe = build(netc, work, "mlp", 32, True)
    # a rank killed: mpirun sees it die and ends the other
    p = start_long(exe)
    pids = wait_started(exe)
    if check(len(pids) == 2, "found both ranks' processes"):
        os.kill(pids[1], signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
        check(p.returncode != 0 and "signal 9" in out, f"killed rank: exit {p.returncode}\n{out}")
        print(f"ok   a killed rank ends the job (exit {p.returncode})")
    else:
        p.kill()
    # a rank that hangs: the other's wait times out and ends the job
    p = start_long(exe, {"NETC_DIST_TIMEOUT": "3"})
    pids = wait_started(exe)
    if check(len(pids) == 2, "found both ranks' processes"):
        os.kill(pids[1], signal.SIGSTOP)
        out, _ = p.communicate(timeout=120)
        check(p.returncode == 6 and "rank 0: no answer from the other ranks for 3 s" in out,
              f"hung rank: exit {p.returncode}\n{out}")
        print(f"ok   a hung rank ends the job after NETC_DIST_TIMEOUT (exit {p.returncode})")
    else:
        p.kill()
    # SIGTERM to rank 1 alone: every rank stops after the same step, rank 0 writes the checkpoint
    ck = os.path.join(work, "stop.st")
    p = start_long(exe, None, "--checkpoint", ck)
    pids = wait_started(exe)
    if check(len(pids) == 2, "found both ranks' processes"):
        os.kill(pids[1], signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
        check(p.returncode == 4 and "stopped by a signal to another rank" in out and os.path.exists(ck),
              f"SIGTERM to rank 1: exit {p.returncode}\n{out}")
        r = mpirun(2, [exe] + RUN + ["--resume", ck, "--stop-at", "1000", "--checkpoint", ck])
        check.expect(r, 4, "the stopped run resumes under 2 ranks")
    else:
        p.kill()
    # ranks that start from different weights (MPMD: one file per rank)
    a, b = os.path.join(work, "a.st"), os.path.join(work, "b.st")
    one = build(netc, work, "mlp", 32, False)
    check.expect(run([one] + RUN + ["--steps", "1", "--save", a]), 0, "weights a")
    check.expect(run([one] + RUN + ["--steps", "2", "--save", b]), 0, "weights b")
    r = run(mpirun_args(1) + [exe] + RUN + ["--steps", "2", "--init", a, ":", "-np", "1", exe]
            + RUN + ["--steps", "2", "--init", b])
    check.expect(r, 1, "ranks with different --init files", "the ranks hold different parameters at the start")
    for opt in (["--gradcheck"],
                ["--predict", f"image={TRAIN[0]}", "--init", a, "--predict-out", os.path.join(work, "p.npy")]):
        r = mpirun(2, [exe] + DATA + opt)
        check.expect(r, 2, f"{opt[0]} under 2 ranks", f"{opt[0]} runs as one process")


def eval_lines(log):
    """The evaluations in a --log file, in the order written: (epoch, loss, accuracy, the step of
    the last training line before it)."""
    lines, step = [], 0
    with open(log) as f:
        for e in map(json.loads, f):
            if e.get("eval"):
                lines.append((e["epoch"], e["loss"], e["accuracy"], step))
            step = e.get("step", step)
    return lines


def case_eval_rank(netc, work):
    # ResNet-18 (narrow), whose batch norm's running statistics are parameters the evaluator must
    # be handed too: 2 training ranks and an evaluator against the same 2 ranks evaluating
    # between epochs, and one training rank and an evaluator against one rank.
    train, held = cifar_like(work, "train", 96), cifar_like(work, "test", 44)  # 44: a short last batch
    args = ([a for d in train for a in ("--data", d)] + [a for d in held for a in ("--eval-data", d)]
            + ["--threads", "1", "--epochs", "3", "--log-every", "1"])
    for ranks, batch in ((2, 16), (1, 32)):
        exe = build(netc, work, "resnet18_cifar", batch, True)
        runs = {}
        for np_, extra in ((ranks, []), (ranks + 1, ["--eval-rank"])):
            out, log = os.path.join(work, f"er{ranks}_{np_}.st"), os.path.join(work, f"er{ranks}_{np_}.jsonl")
            r = mpirun(np_, [exe] + args + extra + ["--save", out, "--log", log])
            if check.expect(r, 0, f"{ranks} training rank{'s' * (ranks > 1)}{' and an evaluator' * bool(extra)}"):
                runs[bool(extra)] = (out, log, r.stdout)
        if len(runs) < 2:
            continue
        (out_s, log_s, _), (out_a, log_a, stdout) = runs[False], runs[True]
        # The evaluator takes no part in training: the training ranks run the same operations.
        check(open(out_s, "rb").read() == open(out_a, "rb").read(),
              f"{ranks} training ranks: an evaluation rank changed the trained weights")
        check(f"distributed: {ranks} rank" in stdout and f"evaluation: by process {ranks} of the job" in stdout,
              f"the start-up lines do not name the evaluation rank:\n{stdout}")
        sync, asyn = eval_lines(log_s), eval_lines(log_a)
        # The same batches of the same parameters: each batch's float32 loss and correct count
        # are the same bits; only the order of the float64 sums over batches differs (1e-15).
        ok = [a[0] for a in asyn] == [1, 2, 3] and len(sync) == 3 and all(
            a[0] == b[0] and abs(a[1] - b[1]) <= 1e-12 * abs(b[1]) and a[2] == b[2] for a, b in zip(sync, asyn))
        # Rank 0 takes a result after a step: one handed over at the end of epoch e lands after
        # a step of epoch e + 1 (3 steps an epoch), unless the hand-over waited for it.
        check([a[3] for a in sync] == [3, 6, 9], f"evaluations between epochs follow steps {[a[3] for a in sync]}")
        check(all(a[3] > 3 * a[0] for a in asyn[:2]),
              f"the evaluation rank's results follow steps {[a[3] for a in asyn]}: training waited for them")
        if check(ok, f"{ranks} training ranks: evaluations between epochs {sync}, by the evaluation rank {asyn}"):
            print(f"ok   --eval-rank beside {ranks} training rank{'s' * (ranks > 1)}: the same weights, bit for "
                  f"bit, and the same 3 evaluations (losses {', '.join(f'{a[1]:.5f}' for a in asyn)})")
    # Stopped after step 4 with the evaluation of epoch 1 in flight, and resumed: the checkpoint
    # waited for it, the resumed run evaluates epochs 2 and 3, the weights are the uninterrupted run's.
    exe, ck, log = build(netc, work, "resnet18_cifar", 16, True), os.path.join(work, "er.ck"), os.path.join(work, "er.jsonl")
    out = os.path.join(work, "er_resumed.st")
    r = mpirun(3, [exe] + args + ["--eval-rank", "--checkpoint", ck, "--stop-at", "4", "--log", log])
    if check.expect(r, 4, "--eval-rank: stopped at step 4"):
        r = mpirun(3, [exe] + args + ["--eval-rank", "--resume", ck, "--save", out, "--log", log])
        if check.expect(r, 0, "--eval-rank: resumed"):
            check(open(out, "rb").read() == open(os.path.join(work, "er2_3.st"), "rb").read(),
                  "--eval-rank: the resumed run differs from the uninterrupted one")
            check([e[0] for e in eval_lines(log)] == [1, 2, 3], f"--eval-rank: stopped and resumed, the log's "
                  f"evaluations are {eval_lines(log)}")
    exe = build(netc, work, "resnet18_cifar", 32, True)
    check.expect(mpirun(1, [exe] + args + ["--eval-rank"]), 1, "--eval-rank in a job of one process",
                 "--eval-rank takes the job's last process for evaluation, and this job has one")
    check.expect(run([exe] + args[:4] + ["--eval-rank"]), 2, "--eval-rank without --eval-data",
                 "--eval-rank needs the data to evaluate")
    check.expect(run([build(netc, work, "resnet18_cifar", 32, False)] + args + ["--eval-rank"]), 2,
                 "--eval-rank in a trainer that is not distributed", "unknown option '--eval-rank'")


def case_target(netc, work):
    net = os.path.join(REPO, "tests", "checkpoint", "sgd_momentum.net")
    exe = os.path.join(work, "sgd_dist")
    subprocess.run([netc, net, "--distributed", "-o", exe], check=True)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4))
    args = []
    for split, n in (("data", 96), ("eval-data", 40)):  # four classes a linear map separates
        x = rng.standard_normal((n, 16)).astype(np.float32)
        files = [os.path.join(work, f"{split}_{k}.npy") for k in ("x", "label")]
        np.save(files[0], x)
        np.save(files[1], (x @ w).argmax(1).astype(np.int64))
        args += [f"--{split}", f"x={files[0]}", f"--{split}", f"label={files[1]}"]
    args += ["--threads", "1", "--epochs", "8", "--quiet"]
    p = lambda name: os.path.join(work, name)  # noqa: E731
    r = mpirun(2, [exe] + args + ["--save", p("full.st"), "--log", p("full.jsonl")])
    if not check.expect(r, 0, "2 ranks without a target"):
        return
    accs = [e[2] for e in eval_lines(p("full.jsonl"))]
    k = next(i for i in range(1, len(accs)) if accs[i] > max(accs[:i])) + 1
    target = repr((max(accs[:k - 1]) + accs[k - 1]) / 2)  # met first by epoch k's evaluation
    per_epoch = 96 // 16
    r = mpirun(2, [exe] + args + ["--target-accuracy", target, "--log", p("t2.jsonl")])
    if check.expect(r, 0, f"2 ranks, target accuracy {float(target):.4f}"):
        check([e[0] for e in eval_lines(p("t2.jsonl"))] == list(range(1, k + 1)) and
              {"target_reached": True, "epoch": k, "step": k * per_epoch} in map(json.loads, open(p("t2.jsonl"))),
              f"2 ranks: evaluations {eval_lines(p('t2.jsonl'))}, want epochs 1..{k} and a stop after step {k * per_epoch}")
    # an evaluation rank: rank 0 learns it a step or more after the epoch; the others stop with it
    r = mpirun(3, [exe] + args + ["--eval-rank", "--target-accuracy", target, "--checkpoint", p("t3.ck"),
                                  "--log", p("t3.jsonl")])
    if check.expect(r, 0, "2 ranks and an evaluator, the same target"):
        log = [json.loads(x) for x in open(p("t3.jsonl"))]
        reached = [e for e in log if "target_reached" in e]
        stop = log[-1].get("step", 0)  # the checkpoint's line
        check(len(reached) == 1 and reached[0]["epoch"] == k and k * per_epoch < stop < 8 * per_epoch,
              f"beside an evaluator: {reached}, stopped after step {stop}, want epoch {k}'s evaluation and a stop "
              f"after step {k * per_epoch}")
        r = mpirun(2, [exe] + args + ["--resume", p("t3.ck"), "--save", p("t3.st")])
        if check.expect(r, 0, "the checkpoint of the stop beside an evaluator, resumed by 2 ranks"):
            check(open(p("t3.st"), "rb").read() == open(p("full.st"), "rb").read(),
                  "the stop beside an evaluator, resumed to the end, differs from the run without a target")
    for np_, extra in ((2, []), (3, ["--eval-rank"])):
        check.expect(mpirun(np_, [exe] + args + extra + ["--epochs", "2", "--target-loss", "-1"]), 7,
                     f"a missed target, {np_} processes", "without reaching its target (loss <= -1)")
    evals = {}
    for np_, extra in ((2, []), (3, ["--eval-rank"])):
        log, out = p(f"s{np_}.jsonl"), p(f"s{np_}.st")
        r = mpirun(np_, [exe] + args + extra + ["--eval-every-steps", "4", "--log", log, "--save", out,
                                               "--save-best", p(f"best{np_}.st")])
        if check.expect(r, 0, f"--eval-every-steps 4, {np_} processes"):
            evals[np_] = [(e["step"], e["loss"], e["accuracy"]) for e in map(json.loads, open(log)) if e.get("eval")]
            check(open(out, "rb").read() == open(p("full.st"), "rb").read(),
                  f"--eval-every-steps 4, {np_} processes: the training changed")
    if len(evals) == 2:
        # the same parameters, evaluated whole by the evaluator or in shares by the ranks: the
        # counts exactly, the float64 sums of the losses within 1e-12
        check([e[0] for e in evals[2]] == list(range(4, 48, 4)) + [48] and
              all(a[0] == b[0] and a[2] == b[2] and abs(a[1] - b[1]) <= 1e-12 * abs(b[1])
                  for a, b in zip(evals[2], evals[3])) and len(evals[2]) == len(evals[3]),
              f"--eval-every-steps 4: by the ranks {evals[2]}, by an evaluation rank {evals[3]}")
        check(open(p("best2.st"), "rb").read() == open(p("best3.st"), "rb").read(),
              "--save-best: the ranks' file and the one beside an evaluation rank differ")


CASES = {"equivalence": case_equivalence, "checkpoint": case_checkpoint, "failures": case_failures,
         "sync_bn": case_sync_bn, "shard": case_shard, "eval_rank": case_eval_rank, "accumulate": case_accumulate,
         "metrics": case_metrics, "target": case_target}

if __name__ == "__main__":
    sys.exit(run_cases(CASES, "dist", check, sys.argv))
