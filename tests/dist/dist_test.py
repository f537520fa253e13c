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

The machine may have 2 cores: mpirun runs with --oversubscribe, and every trainer with one
thread, so 4 ranks share 2 cores and each run takes a few seconds.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import Checks, fashion_files, run_cases, st_load  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
check = Checks()

ENV = dict(os.environ)
if os.geteuid() == 0:  # CI runs as root; Open MPI refuses root without both of these
    ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
# Containers often forbid the cross-memory attach Open MPI's shared-memory transport tries first,
# and mpirun then prints a warning per message; copying through shared memory always works.
ENV["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
ENV.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")

TRAIN = fashion_files("train")
EVAL = fashion_files("test")
DATA = ["--data", f"image={TRAIN[0]}", "--data", f"label={TRAIN[1]}"]
EVAL_DATA = ["--eval-data", f"image={EVAL[0]}", "--eval-data", f"label={EVAL[1]}"]
RUN = DATA + ["--threads", "1", "--quiet"]


def build(netc, work, model, batch, distributed, bucket_kib=None):
    exe = os.path.join(work, f"{model}_b{batch}{'_dist' if distributed else ''}")
    if bucket_kib:
        exe += f"_k{bucket_kib}"
    if not os.path.exists(exe):
        cmd = [netc, os.path.join(REPO, "models", model + ".net"), "-D", f"batch={batch}", "-o", exe]
        if distributed:
            cmd.append("--distributed")
        if bucket_kib:
            cmd += ["--bucket-kib", str(bucket_kib)]
        subprocess.run(cmd, check=True)
    return exe


def mpirun(ranks, argv, timeout=240, **kw):
    return subprocess.run(["mpirun", "--oversubscribe", "-np", str(ranks)] + argv, env=ENV, capture_output=True,
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
    whole = run([mlp64, "--eval-only", "--init", weights, "--threads", "1"] + EVAL_DATA)
    shard = mpirun(3, [mlp32, "--eval-only", "--init", weights, "--threads", "1"] + EVAL_DATA)
    if check.expect(whole, 0, "evaluation in one process") and check.expect(shard, 0, "evaluation over 3 ranks"):
        def loss_acc(out):
            words = [line for line in out.splitlines() if line.startswith("eval:")][0].split()
            return float(words[2]), float(words[4])
        (l1, a1), (l3, a3) = loss_acc(whole.stdout), loss_acc(shard.stdout)
        check(abs(l1 - l3) <= 1e-5 * l1 and abs(a1 - a3) <= 1e-4,
              f"evaluation: one process loss {l1} accuracy {a1}, 3 ranks {l3} {a3}")


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
    for what, argv in (("4 ranks of batch 16", ["mpirun", "--oversubscribe", "-np", "4", half]),
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
    return subprocess.Popen(["mpirun", "--oversubscribe", "-np", "2", exe] + RUN + ["--epochs", "50"] + list(argv),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_started(exe):
    pids = rank_pids(exe)
    time.sleep(1.5)  # past start-up, into the steps
    return pids


def case_failures(netc, work):
    mlp = os.path.join(REPO, "models", "mlp.net")
    for argv, needle in ((["--distributed", "--backend", "cuda"], "--backend cuda has no distributed trainer yet"),
                         (["--distributed", "--bucket-kib", "0"], "--bucket-kib takes a whole number of KiB")):
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
    r = run(["mpirun", "--oversubscribe", "-np", "1", exe] + RUN + ["--steps", "2", "--init", a, ":", "-np", "1", exe]
            + RUN + ["--steps", "2", "--init", b])
    check.expect(r, 1, "ranks with different --init files", "the ranks hold different parameters at the start")
    for opt in (["--gradcheck"],
                ["--predict", f"image={TRAIN[0]}", "--init", a, "--predict-out", os.path.join(work, "p.npy")]):
        r = mpirun(2, [exe] + DATA + opt)
        check.expect(r, 2, f"{opt[0]} under 2 ranks", f"{opt[0]} runs as one process")


CASES = {"equivalence": case_equivalence, "checkpoint": case_checkpoint, "failures": case_failures}

if __name__ == "__main__":
    sys.exit(run_cases(CASES, "dist", check, sys.argv))
