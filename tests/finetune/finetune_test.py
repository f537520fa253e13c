"""Fine-tuning loads (docs/trainer.md, "Fine-tuning"): --init against files built from a PyTorch
module whose names and shapes differ from the model's in several ways at once.

usage: finetune_test.py CASE NETC WORKDIR
  strict     a file with a misshapen head, a missing bias and an extra tensor: every mismatch is
             listed with its name and both shapes in one run, exit status 1; a DDP file (names
             starting with "module.") gets the --init-prefix hint
  no_decay   train { no_decay = ["biases", "norms"] } places biases and batch-norm weights (and
             layernorm's and rmsnorm's, no_decay_norms.net) after
             the decayed weights (--dump=memplan) and the trainer trains; the update itself is
             checked against torch.optim parameter groups in tests/optimizer
  rules      --init-skip keeps the head's initialisation (whatever the file's shapes), loads the
             body exactly; --init-partial loads what fits and lists what it left alone;
             --init-prefix strips "module."; the same from a netc checkpoint; usage errors

head.net trains with lr = 0, so a run of one step saves exactly the parameters it started from:
the loaded ones bit for bit, the others as the seed initialises them (compared with a run
without --init).
"""
import os
import re
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, run_cases, st_load, st_save  # noqa: E402

check = Checks()
expect = check.expect


def pretrained(classes):
    """A PyTorch module with head.net's names; its head has `classes` outputs."""
    torch.manual_seed(1)
    net = torch.nn.Module()
    net.fc1 = torch.nn.Linear(16, 32)
    net.fc2 = torch.nn.Linear(32, classes)
    return {k: v.detach().numpy() for k, v in net.state_dict().items()}


def setup(netc, work):
    exe = os.path.join(work, "head")
    subprocess.run([netc, os.path.join(HERE, "head.net"), "-o", exe], check=True)
    rng = np.random.default_rng(0)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((16, 16)).astype(np.float32))
    np.save(os.path.join(work, "y.npy"), rng.integers(0, 4, 16).astype(np.int64))
    common = ["--threads", "1", "--steps", "1", "--seed", "5", "--data", f"x={work}/x.npy",
              "--data", f"label={work}/y.npy"]
    return exe, common


def run(exe, *argv):
    return subprocess.run([exe, *argv], capture_output=True, text=True, timeout=120)


def trained(exe, common, work, what, *argv, status=0, needles=()):
    """The parameters saved after one step with lr = 0, i.e. the ones the run started from."""
    out = os.path.join(work, what.replace(" ", "_") + ".st")
    expect(run(exe, *common, *argv, "--save", out), status, what, *needles)
    return st_load(out) if os.path.exists(out) else {}


def same(got, want, names, what):
    for n in names:
        check(n in got and np.array_equal(got[n], want[n]), f"{what}: {n} differs")


def case_strict(netc, work):
    exe, common = setup(netc, work)
    sd = pretrained(10)
    del sd["fc1.bias"]
    sd["extra.weight"] = np.ones((3, 2), np.float32)
    st_save(os.path.join(work, "bad.st"), sd)
    r = run(exe, *common, "--init", os.path.join(work, "bad.st"))
    expect(r, 1, "strict load lists every mismatch", "4 mismatches with model 'finetune_head'",
           "tensor 'fc2.weight' has shape [10, 32] but the model's parameter is [4, 32]",
           "tensor 'fc2.bias' has shape [10] but the model's parameter is [4]",
           "missing tensor 'fc1.bias' [32]", "unexpected tensor 'extra.weight' [3, 2]", "--init-skip")
    check("module." not in r.stderr, "no prefix hint for a file without module. names")
    ddp = {"module." + k: v for k, v in pretrained(4).items()}
    st_save(os.path.join(work, "ddp.st"), ddp)
    expect(run(exe, *common, "--init", os.path.join(work, "ddp.st")), 1, "DDP names", "8 mismatches",
           "unexpected tensor 'module.fc1.weight' [32, 16]", "add --init-prefix module.")


def case_rules(netc, work):
    exe, common = setup(netc, work)
    fresh = trained(exe, common, work, "no init")
    sd = pretrained(10)
    st_save(os.path.join(work, "head10.st"), sd)
    head10 = os.path.join(work, "head10.st")
    body, head = ["fc1.weight", "fc1.bias"], ["fc2.weight", "fc2.bias"]

    # --init-skip: the body from the file, the head as initialised; the file's head is ignored
    for pattern in ["fc2", "fc2.*", "fc2.weight,fc2.bias"]:
        got = trained(exe, common, work, f"skip {pattern}", "--init", head10, "--init-skip", pattern,
                      needles=["loaded 2 of 4 parameters", "kept the initialisation of 'fc2.weight' [4, 32]",
                               "ignored tensor 'fc2.bias' [10] of the file (--init-skip)"])
        same(got, sd, body, f"--init-skip {pattern}")
        same(got, fresh, head, f"--init-skip {pattern}")
    expect(run(exe, *common, "--init", head10, "--init-skip", "fc3"), 1, "a skip matching nothing",
           "--init-skip 'fc3' matches no parameter")

    # --init-partial: missing and unexpected tensors are listed; a misshapen one is still refused
    part = {k: v for k, v in pretrained(4).items() if k != "fc2.bias"}
    part["aux.weight"] = np.zeros((2,), np.float32)
    st_save(os.path.join(work, "part.st"), part)
    got = trained(exe, common, work, "partial", "--init", os.path.join(work, "part.st"), "--init-partial",
                  needles=["loaded 3 of 4 parameters", "kept the initialisation of 'fc2.bias' [4]",
                           "ignored tensor 'aux.weight' [2]"])
    same(got, part, body + ["fc2.weight"], "--init-partial")
    same(got, fresh, ["fc2.bias"], "--init-partial")
    expect(run(exe, *common, "--init", head10, "--init-partial"), 1, "partial keeps shape checks",
           "tensor 'fc2.weight' has shape [10, 32]")
    got = trained(exe, common, work, "partial quiet", "--init", os.path.join(work, "part.st"), "--init-partial",
                  "--quiet")
    same(got, part, body, "--init-partial --quiet")

    # --init-prefix: module.fc1.weight fills fc1.weight
    full = pretrained(4)
    st_save(os.path.join(work, "ddp.st"), {"module." + k: v for k, v in full.items()})
    got = trained(exe, common, work, "prefix", "--init", os.path.join(work, "ddp.st"), "--init-prefix", "module.")
    same(got, full, body + head, "--init-prefix")
    expect(run(exe, *common, "--init", os.path.join(work, "ddp.st"), "--init-partial"), 1,
           "a partial load that loads nothing", "no tensor of the file is a parameter", "add --init-prefix module.")

    # a netc checkpoint with a 10-class head: its optimizer state is not a parameter
    exe10 = os.path.join(work, "head10")
    subprocess.run([netc, os.path.join(HERE, "head.net"), "-o", exe10, "-D", "lr=0.1", "-D", "momentum=0.9"], check=True)
    ck = os.path.join(work, "run.ckpt")
    expect(run(exe10, *common, "--init", head10, "--init-skip", "fc2", "--checkpoint", ck), 0, "checkpoint run")
    saved = st_load(ck)
    check("netc:optimizer_state" in saved, "the checkpoint holds an optimizer state")
    got = trained(exe, common, work, "from checkpoint", "--init", ck)
    same(got, saved, body + head, "--init from a checkpoint")
    got = trained(exe, common, work, "checkpoint skip", "--init", ck, "--init-skip", "fc2")
    same(got, saved, body, "--init-skip from a checkpoint")
    same(got, fresh, head, "--init-skip from a checkpoint")

    expect(run(exe, *common, "--init-partial"), 2, "rules without --init", "need --init FILE")


def param_offsets(netc, model):
    """The flat offset of every parameter in declaration order, from --dump=memplan."""
    out = subprocess.run([netc, model, "--dump=memplan"], capture_output=True, text=True, check=True).stdout
    return [int(m) for m in re.findall(r"^%\d+\s+param\s+\w+\s+\[[^]]*\]\s+param\s+(\d+)", out, re.M)]


def case_no_decay(netc, work):
    model = os.path.join(HERE, "no_decay.net")
    # declaration order: conv1.weight [108], bn1.weight, bn1.bias, running_mean, running_var,
    # num_batches_tracked, fc.weight [720], fc.bias
    offs = param_offsets(netc, model)
    check(offs == [0, 828, 832, 841, 845, 849, 108, 836], f"no_decay group placement: {offs}")
    exe = os.path.join(work, "no_decay")
    subprocess.run([netc, model, "-o", exe], check=True)
    rng = np.random.default_rng(0)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((8, 3, 8, 8)).astype(np.float32))
    np.save(os.path.join(work, "y.npy"), rng.integers(0, 5, 8).astype(np.int64))
    expect(run(exe, "--threads", "1", "--steps", "2", "--data", f"x={work}/x.npy", "--data",
               f"label={work}/y.npy"), 0, "no_decay trainer")
    # "norms" names layernorm's and rmsnorm's weights and biases too: declaration order ln.weight,
    # ln.bias, fc1.weight [36], fc1.bias, ln2.weight (no bias), rms.weight, fc.weight [30],
    # fc.bias; the decayed 77 floats first, the norms after them in declaration order
    offs = param_offsets(netc, os.path.join(HERE, "no_decay_norms.net"))
    check(offs == [77, 83, 0, 36, 89, 95, 42, 72], f"no_decay norms placement: {offs}")


def main():
    cases = {"strict": case_strict, "rules": case_rules, "no_decay": case_no_decay}
    return run_cases(cases, "finetune", check, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
