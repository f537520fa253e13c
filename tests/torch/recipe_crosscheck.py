"""The training recipe against PyTorch: clip_grad_norm, warmup_steps, cosine and step(every_steps)
schedules over steps = N, with AdamW, SGD or LAMB and a no_decay group (tests/torch/recipe.net).

The reference is the same MLP in PyTorch in float64, from netc's initial weights, on the same
batches (--no-shuffle: the run's 48 samples are 3 batches an epoch, so steps = 10 or 12 cross
epochs), with
    torch.optim.AdamW([decay group, no_decay group with weight_decay 0], betas=(0.9, 0.95)),
    torch.optim.lr_scheduler.LambdaLR with rt_recipe.h's f(k) (below), stepped after every step,
    torch.nn.utils.clip_grad_norm_(params, C) between backward() and the optimizer's step.
Per step, netc's logged loss, learning rate and grad_norm (the norm before clipping) must match
torch's; after the run, every parameter; and the saved file must load into the module with
strict=True.

Cases:
  clip_active    clip_grad_norm = 0.05 (every step's norm is above it: checked), warmup_steps = 3,
                 cosine(min_lr) over 12 steps; and a run stopped at step 5 and resumed from its
                 checkpoint ends with the same bits as the uninterrupted one (the step count
                 and the schedule's position are restored).
  clip_inactive  clip_grad_norm = 100 (every norm is below it: checked, so the update is
                 AdamW's alone), warmup_steps = 2, step(every_steps = 4, gamma = 0.5), 10 steps;
                 and the trainer's --warmup-steps and --step-steps equal the compiled values.
  clip_sgd       clip_grad_norm = 0.3 active with SGD (momentum 0.9, weight decay on the decay
                 group), whose update is linear in the gradient, so the scale itself shows.
  clip_off       clip_grad_norm = 0: no clipping at all, same schedule as clip_active; and a
                 bound no norm reaches (1e6) trains the same bits (the scale is 1.0f, g * 1 == g).
  lars           LARS (torch has none: optim_ref.Lars is the MLPerf ResNet-50 reference's formula)
                 with clip_grad_norm = 0.3 active, a warm-up of 3 steps and poly(power = 2,
                 end_lr) after it; the no_decay group takes neither weight decay nor the trust
                 ratio, which shows as in lamb; a run stopped and resumed ends with the same bits;
                 --power and --end-lr on the command line equal -D power and -D min_lr.
  lamb           LAMB (torch has none: optim_ref.Lamb is its formula, as MLPerf BERT's apex
                 FusedLAMB computes it) with clip_grad_norm = 0.3 active, the warm-up and cosine schedule;
                 the no_decay group takes neither decay nor the trust ratio. The trust ratio
                 shows: the same reference without it ends far from netc. A run stopped at step
                 5 and resumed ends with the same bits.

usage: recipe_crosscheck.py CASE NETC WORK
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from netc_testlib import Checks, run_cases, st_load, st_save  # noqa: E402
from optim_ref import Lamb, Lars  # noqa: E402

check = Checks()
BATCH, SAMPLES, LR, WD, BETAS, EPS = 16, 48, 0.01, 0.1, (0.9, 0.95), 1e-8
ETA = 0.02  # LARS's trust coefficient in recipe.net: large enough for lr * ratio to move the weights

# Tolerances. netc computes in float32, the reference in float64: the forward and backward of
# this MLP (dot products of 20 and 32 terms) carry relative rounding errors of a few float32
# ulps (2^-24 = 6e-8 each), and the updates keep them relative, so after 12 steps the
# parameters differ by ~1e-7 of their size (measured: 5e-8 .. 2e-7, losses and norms 3e-8 ..
# 9e-8). 2e-6 leaves a margin of 10; no clipping where it is active moves AdamW's parameters
# by 1.5e-2 (measured), a warm-up one step longer by 2e-2, and SGD, linear in the gradient,
# shows any error of the scale itself. The logged learning rate is the double rate rounded to
# float: 1e-7 relative.
TOL, LR_TOL = 2e-6, 1e-7


def lr_lambda(k, sched, warmup, total, every, min_lr, power=2):
    """rt_recipe.h's rt_lr_at as a LambdaLR factor of the base rate."""
    if sched == 0:
        g = (min_lr + (LR - min_lr) * (1 + math.cos(math.pi * min(k / total, 1.0))) / 2) / LR
    elif sched == 1:
        g = 0.5 ** math.floor(k / every)
    else:  # poly: the decay over the steps after the warm-up
        g = (min_lr + (LR - min_lr) * (1 - min(max(k - warmup, 0) / (total - warmup), 1.0)) ** power) / LR
    return g * ((k + 1) / warmup if k < warmup else 1.0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 32)
        self.fc2 = torch.nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def data(work):
    rng = np.random.default_rng(16)
    x = rng.normal(size=(SAMPLES, 20)).astype(np.float32)
    y = rng.integers(0, 5, size=SAMPLES).astype(np.int64)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "label.npy"), y)
    return x, y


def trainer(netc, work, name, clip, sched, warmup, steps, every=4, min_lr=0.001, sgd=False, lamb=False, lars=False,
            power=2):
    exe = os.path.join(work, name)
    d = dict(clip=clip, sched=sched, warmup=warmup, steps=steps, every=every, min_lr=min_lr, batch=BATCH, lr=LR,
             sgd="true" if sgd else "false", lamb="true" if lamb else "false", lars="true" if lars else "false",
             eta=ETA, power=power)
    cmd = [netc, os.path.join(HERE, "recipe.net"), "-o", exe]
    for k, v in d.items():
        cmd += ["-D", f"{k}={v}"]
    subprocess.run(cmd, check=True)
    return exe


def run(exe, work, tag, *extra):
    out, log = os.path.join(work, f"{tag}.safetensors"), os.path.join(work, f"{tag}.jsonl")
    init = [] if "--resume" in extra else ["--init", os.path.join(work, "init.safetensors")]
    args = [exe, "--data", f"x={work}/x.npy", "--data", f"label={work}/label.npy", *init, "--no-shuffle",
            "--save", out, "--log", log, "--quiet", *extra]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode in (0, 4), f"{' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    lines = [json.loads(s) for s in open(log) if s.strip()]
    return (st_load(out) if os.path.exists(out) else None), [ln for ln in lines if "loss" in ln and "eval" not in ln]


def reference(x, y, init, clip, sched, warmup, steps, every=4, min_lr=0.001, sgd=False, lamb=False, lars=False,
              power=2, adapt=True):
    """torch in float64: per step (loss, lr, norm before clipping), and the final state dict
    (adapt=False: LAMB or LARS without its trust ratio, to show that it matters)."""
    torch.manual_seed(0)
    net = MLP().double()
    net.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in init.items()}, strict=True)
    decay = [net.fc1.weight, net.fc2.weight]
    no_decay = [net.fc1.bias, net.fc2.bias]
    groups = [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]
    if sgd:
        opt = torch.optim.SGD(groups, lr=LR, momentum=0.9)
    elif lamb:
        groups[0]["adapt"], groups[1]["adapt"] = adapt, False
        opt = Lamb(groups, lr=LR, betas=BETAS, eps=1e-6)
    elif lars:
        groups[0]["adapt"], groups[1]["adapt"] = adapt, False
        opt = Lars(groups, lr=LR, momentum=0.9, eta=ETA)
    else:
        opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_lambda(k, sched, warmup, steps, every, min_lr, power))
    per_epoch = SAMPLES // BATCH
    rows = []
    for k in range(steps):
        b = k % per_epoch
        xb = torch.from_numpy(x[b * BATCH:(b + 1) * BATCH].astype(np.float64))
        yb = torch.from_numpy(y[b * BATCH:(b + 1) * BATCH])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip))
        else:
            norm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in net.parameters())))
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sch.step()
        rows.append((float(loss), lr, norm))
    return rows, {k: v.detach().numpy() for k, v in net.state_dict().items()}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def compare(what, got_params, log, rows, ref_params, clip):
    check(len(log) == len(rows), f"{what}: {len(log)} log lines, want {len(rows)}")
    worst = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0}
    for ln, (loss, lr, norm) in zip(log, rows):
        worst["loss"] = max(worst["loss"], rel(ln["loss"], loss))
        worst["lr"] = max(worst["lr"], rel(ln["lr"], lr))
        if clip > 0:
            worst["grad_norm"] = max(worst["grad_norm"], rel(ln["grad_norm"], norm))
        else:
            check("grad_norm" not in ln, f"{what}: grad_norm logged without clip_grad_norm")
    print(f"{what}: per step, worst relative error: loss {worst['loss']:.2e}, lr {worst['lr']:.2e}, "
          f"grad_norm {worst['grad_norm']:.2e}")
    check(worst["loss"] <= TOL, f"{what}: losses differ by {worst['loss']:.2e} > {TOL}")
    check(worst["lr"] <= LR_TOL, f"{what}: learning rates differ by {worst['lr']:.2e} > {LR_TOL}")
    check(worst["grad_norm"] <= TOL, f"{what}: grad norms differ by {worst['grad_norm']:.2e} > {TOL}")
    for name, ref in ref_params.items():
        got = got_params[name]
        e = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        print(f"{what}: {name:10s} relative error {e:.2e}")
        check(e <= TOL, f"{what}: {name} differs from torch by {e:.2e} > {TOL}")
    fresh = MLP()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in got_params.items()}, strict=True)


def setup(netc, work):
    x, y = data(work)
    torch.manual_seed(1234)
    init = {k: v.detach().numpy() for k, v in MLP().state_dict().items()}
    st_save(os.path.join(work, "init.safetensors"), init)
    return x, y, init


def case_clip_active(netc, work):
    x, y, init = setup(netc, work)
    cfg = dict(clip=0.05, sched=0, warmup=3, steps=12)
    exe = trainer(netc, work, "active", **cfg)
    params, log = run(exe, work, "active")
    rows, ref = reference(x, y, init, **cfg)
    check(all(norm > cfg["clip"] for _, _, norm in rows), "clip_active: every norm is above the bound")
    compare("clip_active", params, log, rows, ref, cfg["clip"])
    # stopped after step 5 and resumed: the same bits, and the same log lines from step 6 on
    ck = os.path.join(work, "active.ckpt")
    run(exe, work, "stopped", "--checkpoint", ck, "--stop-at", "5")
    resumed, rlog = run(exe, work, "resumed", "--resume", ck)
    check(all(np.array_equal(resumed[k], params[k]) for k in params), "clip_active: resumed run ends with the same bits")
    tail = [ln for ln in log if ln["step"] > 5]
    check([(ln["loss"], ln["lr"], ln["grad_norm"]) for ln in rlog] ==
          [(ln["loss"], ln["lr"], ln["grad_norm"]) for ln in tail], "clip_active: resumed log lines equal")


def case_clip_inactive(netc, work):
    x, y, init = setup(netc, work)
    cfg = dict(clip=100, sched=1, warmup=2, steps=10)
    exe = trainer(netc, work, "inactive", **cfg)
    params, log = run(exe, work, "inactive")
    rows, ref = reference(x, y, init, **cfg)
    check(all(norm < cfg["clip"] for _, _, norm in rows), "clip_inactive: every norm is below the bound")
    compare("clip_inactive", params, log, rows, ref, cfg["clip"])
    # --warmup-steps and --step-steps on the command line train the bits of -D warmup and -D every
    flags, _ = run(exe, work, "flags", "--warmup-steps", "3", "--step-steps", "5")
    compiled, _ = run(trainer(netc, work, "compiled", **dict(cfg, warmup=3, every=5)), work, "compiled")
    check(all(np.array_equal(flags[k], compiled[k]) for k in flags) and
          not all(np.array_equal(flags[k], params[k]) for k in flags),
          "clip_inactive: --warmup-steps 3 --step-steps 5 equal -D warmup=3 -D every=5")


def case_clip_sgd(netc, work):
    x, y, init = setup(netc, work)
    cfg = dict(clip=0.3, sched=0, warmup=3, steps=12, sgd=True)
    params, log = run(trainer(netc, work, "sgd", **cfg), work, "sgd")
    rows, ref = reference(x, y, init, **cfg)
    check(all(norm > cfg["clip"] for _, _, norm in rows), "clip_sgd: every norm is above the bound")
    compare("clip_sgd", params, log, rows, ref, cfg["clip"])


def case_clip_off(netc, work):
    x, y, init = setup(netc, work)
    cfg = dict(clip=0, sched=0, warmup=3, steps=12)
    params, log = run(trainer(netc, work, "off", **cfg), work, "off")
    rows, ref = reference(x, y, init, **cfg)
    compare("clip_off", params, log, rows, ref, 0)
    # a bound no norm reaches multiplies every gradient by 1.0f: the same bits as no clipping
    far, _ = run(trainer(netc, work, "far", **dict(cfg, clip=1e6)), work, "far")
    check(all(np.array_equal(far[k], params[k]) for k in params), "clip_off: clip = 1e6 gives clip = 0's bits")


def layerwise_case(netc, work, name, **cfg):
    """A layer-wise optimizer (LAMB, LARS) against its reference with clip_grad_norm = 0.3 active:
    the run matches, the trust ratio shows (the reference without it ends far away), and a run
    stopped at step 5 and resumed ends with the same bits. Returns the trainer, its parameters
    and the reference's rows."""
    x, y, init = setup(netc, work)
    exe = trainer(netc, work, name, **cfg)
    params, log = run(exe, work, name)
    rows, ref = reference(x, y, init, **cfg)
    check(all(norm > cfg["clip"] for _, _, norm in rows), f"{name}: every norm is above the bound")
    compare(name, params, log, rows, ref, cfg["clip"])
    _, plain = reference(x, y, init, **cfg, adapt=False)
    far = min(np.linalg.norm(params[k] - plain[k]) / np.linalg.norm(plain[k]) for k in ("fc1.weight", "fc2.weight"))
    print(f"{name}: the weights without the trust ratio are {far:.2e} away")
    check(far > 100 * TOL, f"{name}: the trust ratio moves the weights by only {far:.2e}")
    ck = os.path.join(work, f"{name}.ckpt")
    run(exe, work, "stopped", "--checkpoint", ck, "--stop-at", "5")
    resumed, _ = run(exe, work, "resumed", "--resume", ck)
    check(all(np.array_equal(resumed[k], params[k]) for k in params), f"{name}: resumed run ends with the same bits")
    return exe, params, rows


def case_lamb(netc, work):
    layerwise_case(netc, work, "lamb", clip=0.3, sched=0, warmup=3, steps=12, lamb=True)


def case_lars(netc, work):
    cfg = dict(clip=0.3, sched=2, warmup=3, steps=12, lars=True)
    exe, params, rows = layerwise_case(netc, work, "lars", **cfg)
    check(rows[3][1] > rows[-1][1] > 0.001 * 0.999, f"lars: the poly schedule decays after the warm-up: "
                                                    f"{[r[1] for r in rows]}")
    # --power and --end-lr on the command line train the bits of -D power and -D min_lr
    flags, _ = run(exe, work, "flags", "--power", "1", "--end-lr", "0.002")
    compiled, _ = run(trainer(netc, work, "compiled", **dict(cfg, power=1, min_lr=0.002)), work, "compiled")
    check(all(np.array_equal(flags[k], compiled[k]) for k in flags) and
          not all(np.array_equal(flags[k], params[k]) for k in flags),
          "lars: --power 1 --end-lr 0.002 equal -D power=1 -D min_lr=0.002")


if __name__ == "__main__":
    torch.set_num_threads(1)
    cases = {"clip_active": case_clip_active, "clip_inactive": case_clip_inactive, "clip_sgd": case_clip_sgd,
             "clip_off": case_clip_off, "lamb": case_lamb, "lars": case_lars}
    sys.exit(run_cases(cases, "recipe_crosscheck", check, sys.argv))
