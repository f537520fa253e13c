"""Using a trained model, and changing a run without recompiling (docs/trainer.md).

usage: use_test.py CASE NETC WORKDIR
  eval_only  --eval-only on the weights a run saved (and on its checkpoint) prints and logs
             exactly the loss and accuracy of that run's final evaluation, without --data; the
             options it cannot use are refused
  predict    --predict/--predict-out on a padded last batch: as many rows as the file has samples,
             equal to a float64 numpy forward pass of MLP on the same weights and to PyTorch's
             LeNet (channels-last convolutions inside) and to PyTorch's channels_last_output.net (a
             channels-last output, transposed back as it is written); LeNet's argmax gives the accuracy
             --eval-only prints, and its 3 largest the top-3 accuracy of accuracy(..., top_k = 3);
             labels are not needed; the output is refused as an input
  summary    netc --summary: LeNet's layers, shapes, parameters and mult-adds against the
             arithmetic written out below; the totals of LeNet and ResNet-18 (CIFAR) against the
             trainer's --list-params and PyTorch's count
  hparams    --lr X trains the same bits as the model compiled with -D lr=X (SGD, SGD with
             momentum, weight decay and a cosine schedule, AdamW with a step schedule), and
             --weight-decay X as -D weight_decay=X; --lr 0
             leaves the weights as --init gave them; --help lists each value with the model's
             default; values the schedule does not have and bad numbers are refused; a checkpoint
             records the overrides, so resuming it without them is refused

Every run uses --threads 1 so that runs compare bit for bit.
"""
import filecmp
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, run_cases, st_load, st_save  # noqa: E402

check = Checks()


def run(*argv):
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def compile_model(netc, net, exe, *defines):
    rc, out = run(netc, net, *defines, "-o", exe)
    assert rc == 0, out
    return exe


def mnist_like(work, n=40, rows=28):
    """Random images and labels of the given sample count (n is not a multiple of the batch, so
    the last evaluation batch is padded)."""
    rng = np.random.default_rng(1)
    img, lab = os.path.join(work, f"img{rows}.npy"), os.path.join(work, "lab.npy")
    np.save(img, rng.random((n, 1, rows, rows), dtype=np.float32))
    np.save(lab, rng.integers(0, 10, n).astype(np.int64))
    return img, lab


def last_eval(log):
    lines = [json.loads(x) for x in open(log)]
    return [x for x in lines if x.get("eval")][-1]


def case_eval_only(netc, work):
    exe = compile_model(netc, os.path.join(ROOT, "models", "lenet.net"), os.path.join(work, "lenet"),
                        "-D", "batch=16")
    img, lab = mnist_like(work)
    data = ["--data", f"image={img}", "--data", f"label={lab}"]
    ev = ["--eval-data", f"image={img}", "--eval-data", f"label={lab}"]
    w, ck, log = (os.path.join(work, f) for f in ("w.safetensors", "run.ckpt", "train.jsonl"))
    rc, out = run(exe, *data, *ev, "--threads", "1", "--steps", "4", "--save", w, "--checkpoint", ck, "--log", log)
    check(rc == 0, f"training run: {out}")
    final = last_eval(log)
    printed = [x for x in out.splitlines() if x.startswith("eval epoch")][-1].split(": ", 1)[1]
    for flag, f in (("--init", w), ("--resume", ck)):
        elog = os.path.join(work, f"eval{flag}.jsonl")
        rc, out = run(exe, *ev, flag, f, "--eval-only", "--threads", "1", "--log", elog)
        check(rc == 0, f"--eval-only {flag}: {out}")
        check(out.strip() == "eval: " + printed, f"--eval-only {flag} printed {out!r}, the run {printed!r}")
        got = [json.loads(x) for x in open(elog)]
        check(len(got) == 1 and got[0]["loss"] == final["loss"] and got[0]["accuracy"] == final["accuracy"],
              f"--eval-only {flag} logged {got}, the run's final evaluation {final}")
    refused = [(["--eval-only", *ev], "add --init FILE or --resume FILE"),
               (["--eval-only", "--init", w], "no evaluation data for input 'image'"),
               (["--eval-only", "--init", w, *ev, "--save", os.path.join(work, "x.st")], "trains nothing")]
    for args, words in refused:
        rc, out = run(exe, *args)
        check(rc == 2 and words in out, f"{args}: exit {rc}, want 2 and '{words}': {out}")


# (model, its inputs' data, the -D of its lr, the value the command line sets)
def hparam_models(work):
    img, lab = mnist_like(work)
    rng = np.random.default_rng(2)
    x16, x244, lab4 = (os.path.join(work, f) for f in ("x16.npy", "x244.npy", "lab4.npy"))
    np.save(x16, rng.standard_normal((32, 16), dtype=np.float32))
    np.save(x244, rng.standard_normal((32, 2, 4, 4), dtype=np.float32))
    np.save(lab4, rng.integers(0, 4, 32).astype(np.int64))
    ck = os.path.join(ROOT, "tests", "checkpoint")
    # adamw_bn.net writes its rate as a number; a copy names it, so that -D can set it
    adamw = os.path.join(work, "adamw_bn.net")
    with open(os.path.join(ck, "adamw_bn.net")) as f:
        text = f.read().replace("const batch = 8", "const batch = 8, lr = 0.01").replace("adamw(0.01", "adamw(lr")
    with open(adamw, "w") as f:
        f.write(text)
    return [(os.path.join(ROOT, "models", "mlp.net"), {"image": img, "label": lab}, ["-D", "batch=16"]),
            (os.path.join(ck, "sgd_momentum.net"), {"x": x16, "label": lab4}, []),
            (adamw, {"x": x244, "label": lab4}, [])]


def case_hparams(netc, work):
    for net, files, defs in hparam_models(work):
        name = os.path.basename(net)[:-4]
        data = [a for k, f in files.items() for a in ("--data", f"{k}={f}")]
        train = [*data, "--threads", "1", "--steps", "6", "--seed", "3"]
        exe = compile_model(netc, net, os.path.join(work, name), *defs)
        ref = compile_model(netc, net, os.path.join(work, name + "_lr"), *defs, "-D", "lr=0.0123")
        a, b = os.path.join(work, name + "_flag.st"), os.path.join(work, name + "_def.st")
        rc1, out1 = run(exe, *train, "--lr", "0.0123", "--save", a)
        rc2, out2 = run(ref, *train, "--save", b)
        check(rc1 == rc2 == 0, f"{name}: {out1} {out2}")
        check(filecmp.cmp(a, b, shallow=False), f"{name}: --lr 0.0123 differs from -D lr=0.0123")
        plain = os.path.join(work, name + "_plain.st")
        run(exe, *train, "--save", plain)
        check(not filecmp.cmp(a, plain, shallow=False), f"{name}: --lr 0.0123 changed nothing")
    check_weight_decay(netc, work)
    mlp = os.path.join(work, "mlp")
    img_lab = ["--data", f"image={files_of(work)[0]}", "--data", f"label={files_of(work)[1]}", "--threads", "1"]
    w0, w1 = os.path.join(work, "w0.st"), os.path.join(work, "w1.st")
    rc, out = run(mlp, *img_lab, "--steps", "1", "--save", w0)
    rc, out = run(mlp, *img_lab, "--steps", "5", "--init", w0, "--lr", "0", "--save", w1)
    check(rc == 0 and filecmp.cmp(w0, w1, shallow=False), f"--lr 0 changed the weights: {out}")
    check_help_and_refusals(work)


def check_weight_decay(netc, work):
    """--weight-decay X against -D weight_decay=X (mlp.net names it), from 0 in the model."""
    img, lab = files_of(work)
    train = ["--data", f"image={img}", "--data", f"label={lab}", "--threads", "1", "--steps", "6"]
    ref = compile_model(netc, os.path.join(ROOT, "models", "mlp.net"), os.path.join(work, "mlp_wd"),
                        "-D", "batch=16", "-D", "weight_decay=0.05")
    a, b, plain = (os.path.join(work, f"wd_{x}.st") for x in ("flag", "def", "plain"))
    rc1, out1 = run(os.path.join(work, "mlp"), *train, "--weight-decay", "0.05", "--save", a)
    rc2, out2 = run(ref, *train, "--save", b)
    run(os.path.join(work, "mlp"), *train, "--save", plain)
    check(rc1 == rc2 == 0 and filecmp.cmp(a, b, shallow=False), f"--weight-decay 0.05 differs from -D: {out1} {out2}")
    check(not filecmp.cmp(a, plain, shallow=False), "--weight-decay 0.05 changed nothing")


def files_of(work):
    return os.path.join(work, "img28.npy"), os.path.join(work, "lab.npy")


def check_help_and_refusals(work):
    rc, out = run(os.path.join(work, "mlp"), "--help")
    check(rc == 0 and "--lr X" in out and "(default 0.02)" in out and "--warmup-epochs X" in out and
          "--weight-decay X" in out,
          f"mlp --help lacks the schedule's values: {out}")
    check("--gamma" not in out, "mlp --help lists --gamma, which a constant schedule lacks")
    rc, out = run(os.path.join(work, "sgd_momentum"), "--help")
    check("--min-lr X" in out and "(default 0.001)" in out and "(default 0.5)" in out,
          f"sgd_momentum --help lacks min_lr 0.001 or warm-up 0.5: {out}")
    rc, out = run(os.path.join(work, "adamw_bn"), "--help")
    check("--step-epochs X" in out and "--gamma X" in out and "(default 0.5)" in out, f"adamw_bn --help: {out}")
    img, lab = files_of(work)
    data = ["--data", f"image={img}", "--data", f"label={lab}", "--threads", "1"]
    for args, words in ((["--gamma", "0.5"], "the model's schedule is constant(), which has no such value"),
                        (["--lr", "-1"], "--lr needs a number >= 0, found '-1'"),
                        (["--lr", "fast"], "--lr needs a number >= 0, found 'fast'")):
        rc, out = run(os.path.join(work, "mlp"), *data, *args)
        check(rc == 2 and words in out, f"{args}: exit {rc}, want 2 and '{words}': {out}")
    ck = os.path.join(work, "lr.ckpt")
    rc, out = run(os.path.join(work, "mlp"), *data, "--steps", "4", "--stop-at", "2", "--lr", "0.05",
                  "--checkpoint", ck)
    check(rc == 4, f"stopped run: exit {rc}: {out}")
    rc, out = run(os.path.join(work, "mlp"), *data, "--resume", ck, "--checkpoint", ck)
    check(rc == 1 and "schedule differ" in out, f"resume without the run's --lr: exit {rc}: {out}")
    rc, out = run(os.path.join(work, "mlp"), *data, "--resume", ck, "--checkpoint", ck, "--lr", "0.05")
    check(rc == 0, f"resume with the run's --lr: exit {rc}: {out}")


def st_tensors(path):
    return {k: np.asarray(v, dtype=np.float64) for k, v in st_load(path).items()}


def trained(netc, work, net, name, img, lab, *defs):
    """A trainer for `net` and the weights of a few steps of it."""
    exe = compile_model(netc, net, os.path.join(work, name), *defs)
    w = os.path.join(work, name + ".safetensors")
    rc, out = run(exe, "--data", f"image={img}", "--data", f"label={lab}", "--threads", "1", "--steps", "3",
                  "--save", w)
    assert rc == 0, out
    return exe, w


def predict(exe, w, img, out_npy, *extra):
    rc, out = run(exe, "--init", w, "--predict", f"image={img}", "--predict-out", out_npy, "--threads", "1", *extra)
    check(rc == 0, f"{exe} --predict: {out}")
    return np.load(out_npy) if rc == 0 else None


# Float32 against a float64 reference: each output sums a few hundred products of values of
# order 1 (pixels/255, weights ~0.05), so float32 rounding leaves a few 1e-6 relative; 1e-4 of
# the output's scale is far above that and far below any wrong weight, row or layout.
def close(got, want):
    return got is not None and got.shape == want.shape and np.abs(got - want).max() <= 1e-4 * max(1, np.abs(want).max())


def case_predict(netc, work):
    img, lab = mnist_like(work, n=40)  # 40 = 2 batches of 16 and a padded one of 8
    exe, w = trained(netc, work, os.path.join(ROOT, "models", "mlp.net"), "mlp", img, lab, "-D", "batch=16")
    got = predict(exe, w, img, os.path.join(work, "mlp_out.npy"))
    t = st_tensors(w)
    x = np.load(img).astype(np.float64).reshape(40, -1) / 255
    h = np.maximum(x @ t["fc1.weight"].T + t["fc1.bias"], 0)
    want = h @ t["fc2.weight"].T + t["fc2.bias"]
    check(got is not None and got.dtype == np.float32 and got.shape == (40, 10), f"mlp predictions: {got}")
    check(close(got, want), f"mlp predictions differ from numpy: {got} {want}")
    check_lenet(netc, work, img, lab)
    check_channels_last(netc, work)
    check_named_output(netc, work, img, lab)
    rc, out = run(exe, "--init", w, "--predict", f"image={img}", "--predict-out", img)
    check(rc == 2 and "would destroy that input" in out, f"--predict-out naming its input: exit {rc}: {out}")
    rc, out = run(exe, "--init", w, "--predict", f"image={img}", "--predict", f"label={lab}", "--predict-out",
                  os.path.join(work, "x.npy"))
    check(rc == 2 and "does not depend on input 'label'" in out, f"--predict label: exit {rc}: {out}")
    rc, out = run(exe, "--init", w, "--predict", f"image={img}")
    check(rc == 2 and "--predict-out" in out, f"--predict without --predict-out: exit {rc}: {out}")


def check_lenet(netc, work, img, lab):
    import torch
    exe, w = trained(netc, work, os.path.join(ROOT, "models", "lenet.net"), "lenet", img, lab, "-D", "batch=16")
    got = predict(exe, w, img, os.path.join(work, "lenet_out.npy"))
    t = {k: torch.tensor(v) for k, v in st_tensors(w).items()}
    F = torch.nn.functional
    x = torch.tensor(np.load(img).astype(np.float64)) / 255
    x = F.max_pool2d(F.relu(F.conv2d(x, t["conv1.weight"], t["conv1.bias"], padding=2)), 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, t["conv2.weight"], t["conv2.bias"])), 2).flatten(1)
    x = F.relu(F.linear(x, t["fc1.weight"], t["fc1.bias"]))
    x = F.relu(F.linear(x, t["fc2.weight"], t["fc2.bias"]))
    want = F.linear(x, t["fc3.weight"], t["fc3.bias"]).numpy()
    check(close(got, want), f"lenet predictions differ from PyTorch (float64): {got} {want}")
    rc, out = run(exe, "--init", w, "--eval-only", "--eval-data", f"image={img}", "--eval-data", f"label={lab}",
                  "--threads", "1")
    acc = float(out.split("accuracy ")[1]) if rc == 0 else -1
    mine = float((got.argmax(1) == np.load(lab)).mean()) if got is not None else -2
    check(abs(acc - mine) < 5e-5, f"lenet: --eval-only accuracy {acc}, argmax of the predictions {mine}")
    # accuracy(..., top_k = 3) on the same weights: the labels among each row's 3 largest
    # predictions (the last batch padded: its 8 padding rows must not count), printed as such
    net = os.path.join(work, "lenet_top3.net")
    with open(os.path.join(ROOT, "models", "lenet.net")) as f:
        text = f.read()
    with open(net, "w") as f:
        f.write(text.replace("accuracy(logits, label)", "accuracy(logits, label, top_k = 3)"))
    exe3 = compile_model(netc, net, os.path.join(work, "lenet_top3"), "-D", "batch=16")
    rc, out = run(exe3, "--init", w, "--eval-only", "--eval-data", f"image={img}", "--eval-data", f"label={lab}",
                  "--threads", "1")
    acc3 = float(out.split("top-3 accuracy ")[1]) if rc == 0 and "top-3 accuracy " in out else -1
    mine3 = float((np.argsort(-want, 1, kind="stable")[:, :3] == np.load(lab)[:, None]).any(1).mean())
    check(abs(acc3 - mine3) < 5e-5 and mine3 != mine,
          f"lenet: --eval-only top-3 accuracy {acc3}, the predictions' {mine3} (top-1 {mine}): {out}")


def check_channels_last(netc, work):
    import torch
    rng = np.random.default_rng(3)
    x, t = os.path.join(work, "cl_x.npy"), os.path.join(work, "cl_t.npy")
    np.save(x, rng.standard_normal((10, 3, 6, 6), dtype=np.float32))  # 10 = 2 batches of 4 and a padded one
    np.save(t, rng.standard_normal((10, 8, 6, 6), dtype=np.float32))
    exe = compile_model(netc, os.path.join(HERE, "channels_last_output.net"), os.path.join(work, "cl"))
    w, out = os.path.join(work, "cl.safetensors"), os.path.join(work, "cl_out.npy")
    rc, msg = run(exe, "--data", f"x={x}", "--data", f"t={t}", "--threads", "1", "--steps", "2", "--save", w)
    check(rc == 0, f"channels_last_output training: {msg}")
    rc, msg = run(exe, "--init", w, "--predict", f"x={x}", "--predict-out", out, "--threads", "1")
    check(rc == 0, f"channels_last_output --predict: {msg}")
    p = {k: torch.tensor(v) for k, v in st_tensors(w).items()}
    F = torch.nn.functional
    h = F.relu(F.conv2d(torch.tensor(np.load(x).astype(np.float64)), p["c1.weight"], p["c1.bias"], padding=1))
    want = F.conv2d(h, p["c2.weight"], p["c2.bias"], padding=1).numpy()
    check(close(np.load(out) if rc == 0 else None, want), "channels_last_output predictions differ from PyTorch")


def check_named_output(netc, work, img, lab):
    """train { output = probs }: --predict writes that value instead of the logits."""
    exe, w = trained(netc, work, os.path.join(HERE, "named_output.net"), "named", img, lab)
    got = predict(exe, w, img, os.path.join(work, "named_out.npy"))
    t = st_tensors(w)
    x = np.load(img).astype(np.float64).reshape(40, -1) / 255
    z = np.maximum(x @ t["fc1.weight"].T + t["fc1.bias"], 0) @ t["fc2.weight"].T + t["fc2.bias"]
    e = np.exp(z - z.max(1, keepdims=True))
    probs = e / e.sum(1, keepdims=True)
    check(close(got, probs), f"named output: not the softmax of the logits: {got}")
    # an output in a 16-bit float type, written as float32: each value is one of that type's, the
    # float32 probability rounded to nearest (at most half a unit in the last place: 2^-8 of the
    # value for bf16's 8 significant bits, 2^-11 for f16's 11, or half f16's smallest subnormal,
    # 2^-25), and the float32 value is within 1e-6 of float64's (a softmax of 10 terms, ~1e-7).
    # Measured: 2.6e-3 of the value in bf16, 3.3e-4 in f16, where reading the bits as the other
    # type, or as float32, is wrong by the value's own size.
    for half, ulp, tiny in (("bf16", 2.0**-8, 0.0), ("f16", 2.0**-11, 2.0**-25)):
        net = os.path.join(work, f"named_{half}.net")
        with open(os.path.join(HERE, "named_output.net")) as f:
            text = f.read().replace("output    = probs", f"output    = {half}(probs)")
        with open(net, "w") as f:
            f.write(text)
        exe = compile_model(netc, net, os.path.join(work, f"named_{half}"))
        got = predict(exe, w, img, os.path.join(work, f"named_{half}.npy"))
        if got is None:
            continue
        exact = (got.view(np.uint32) & 0xFFFF == 0).all() if half == "bf16" else \
            np.array_equal(got.astype(np.float16).astype(np.float32), got)
        check(got.dtype == np.float32 and exact, f"output = {half}(probs): values that are not {half}'s")
        check(got.shape == probs.shape and (np.abs(got - probs) <= ulp * np.abs(probs) + tiny + 1e-6).all(),
              f"output = {half}(probs): not the probabilities rounded to {half}: {got}")
    bad = os.path.join(work, "bad_output.net")
    with open(os.path.join(HERE, "named_output.net")) as f:
        text = f.read().replace("output    = probs", "output    = mean(probs)")
    with open(bad, "w") as f:
        f.write(text)
    rc, out = run(netc, bad, "--check")
    check(rc == 1 and "bad_output.net:16:" in out and "output must have one row per sample, [batch (16), ...], "
          "found shape []" in out, f"an output without a row per sample: exit {rc}: {out}")
    # a loss written without a loss function, and no output named: --predict has nothing to write
    none = os.path.join(work, "no_output.net")
    with open(os.path.join(HERE, "named_output.net")) as f:
        text = f.read().replace("output    = probs\n", "").replace("cross_entropy(logits, label)", "mean(logits * logits)")
    with open(none, "w") as f:
        f.write(text)
    exe = compile_model(netc, none, os.path.join(work, "no_output"))
    rc, out = run(exe, "--init", w, "--predict", f"image={img}", "--predict-out", os.path.join(work, "none.npy"))
    check(rc == 2 and "has no output" in out and "output = x" in out, f"--predict without an output: exit {rc}: {out}")


# LeNet (models/lenet.net) by hand, per sample: (layer, output shape, parameters, mult-adds).
#   conv1: 6 filters 1x5x5 + 6 biases = 156;    28*28 outputs * 6 channels * (1*5*5) = 117600
#   conv2: 16 filters 6x5x5 + 16 biases = 2416; 10*10 outputs * 16 channels * (6*5*5) = 240000
#   fc1: 400*120 + 120 = 48120;                 120 outputs * 400 inputs = 48000
#   fc2: 120*84 + 84 = 10164;                   84 * 120 = 10080
#   fc3: 84*10 + 10 = 850;                      10 * 84 = 840
# totals: 156 + 2416 + 48120 + 10164 + 850 = 61706 parameters;
#         117600 + 240000 + 48000 + 10080 + 840 = 416520 mult-adds, 833040 FLOPs
LENET = [("conv1", "[64, 6, 28, 28]", 156, 117600), ("conv2", "[64, 16, 10, 10]", 2416, 240000),
         ("fc1", "[64, 120]", 48120, 48000), ("fc2", "[64, 84]", 10164, 10080), ("fc3", "[64, 10]", 850, 840)]
# torchvision-style ResNet-18 for CIFAR-10 (3x3 stem, no max-pool), as PyTorch counts it:
# sum(p.numel() for p in model.parameters())
RESNET18_CIFAR_PARAMS = 11173962


def summary_rows(out):
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 8 and f[-2] == "line":  # name op [shape...] params macs line N
            shape = line[41:64].strip()
            rows.setdefault(f[0], (shape, int(f[-4]), int(f[-3])))
    return rows


def case_summary(netc, work):
    models = os.path.join(ROOT, "models")
    rc, out = run(netc, os.path.join(models, "lenet.net"), "--summary")
    check(rc == 0, f"netc --summary lenet: {out}")
    rows = summary_rows(out)
    for name, shape, params, macs in LENET:
        check(rows.get(name) == (shape, params, macs), f"lenet {name}: {rows.get(name)}, want {(shape, params, macs)}")
    check("total params: 61706 (trainable 61706, frozen 0)" in out, f"lenet params total: {out}")
    check("total mult-adds per sample: 416520 " in out and "= 833040" in out, f"lenet mult-adds total: {out}")
    check(sum(r[1] for r in rows.values()) == 61706, f"lenet rows do not add up to the total: {rows}")
    exe = compile_model(netc, os.path.join(models, "lenet.net"), os.path.join(work, "lenet"))
    rc, listed = run(exe, "--list-params")
    check("total 61706 parameters" in listed, f"lenet --list-params disagrees: {listed}")
    rc, out = run(netc, os.path.join(models, "resnet18_cifar.net"), "--summary")
    check(rc == 0 and f"total params: {RESNET18_CIFAR_PARAMS} " in out, f"resnet18_cifar params total: {out}")
    check(summary_rows(out).get("layer4.1.conv2") == ("[128, 512, 4, 4]", 512 * 512 * 9, 4 * 4 * 512 * 512 * 9),
          f"resnet18_cifar layer4.1.conv2: {summary_rows(out).get('layer4.1.conv2')}")


DEAD_NET = """model dead
const batch = 4
input x : f32[batch, 8]
input label : i64[batch]
h = relu(fc1: dense(x, 16))
aux = aux: dense(tanh(h), 3)
b = bnx: batchnorm2d(reshape(h, [batch, 4, 2, 2]))
logits = fc2: dense(h, 5)
train {
  loss = cross_entropy(logits, label)
  optimizer = sgd(0.1, weight_decay = 0.01)
}
"""


def case_dead(netc, work):
    """Values nothing needs are not computed (netc's drop_unused): the aux head's product and
    tanh have no code, and the batch norm on the side keeps only its statistics, whose running
    means and variances still move as PyTorch's forward pass moves them; the dead layers'
    parameters still take weight decay (their gradient is zero), and the live layers train as
    in the model without the dead lines."""
    net, live = os.path.join(work, "dead.net"), os.path.join(work, "live.net")
    with open(net, "w") as f:
        f.write(DEAD_NET)
    with open(live, "w") as f:
        f.write("".join(x for x in DEAD_NET.splitlines(True) if not x.startswith(("aux = ", "b = "))))
    rc, code = run(netc, net, "-w", "--dump=c")
    lines = [x for x in code.splitlines() if "// %" in x]
    check(rc == 0 and lines, f"netc --dump=c dead.net: {code[-2000:]}")
    check(not [x for x in lines if "dead.net:6" in x and ("matmul(" in x or "tanh(" in x)],
          "the aux head, which nothing reads, is computed: " + "; ".join(x for x in lines if "dead.net:6" in x))
    check([x for x in lines if "dead.net:7" in x and "bn_stats(" in x], "the side batch norm's statistics are gone")
    check(not [x for x in lines if "dead.net:7" in x and "row(" in x], "the side batch norm normalises what nothing reads")
    rng = np.random.default_rng(3)
    x, label = rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 5, 4).astype(np.int64)
    init = {"fc1.weight": rng.standard_normal((16, 8)), "fc1.bias": rng.standard_normal(16),
            "aux.weight": rng.standard_normal((3, 16)), "aux.bias": rng.standard_normal(3),
            "bnx.weight": rng.standard_normal(4), "bnx.bias": rng.standard_normal(4),
            "bnx.running_mean": np.zeros(4), "bnx.running_var": np.ones(4),
            "bnx.num_batches_tracked": np.zeros((), np.int64),
            "fc2.weight": rng.standard_normal((5, 16)), "fc2.bias": rng.standard_normal(5)}
    init = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in init.items()}
    files = {}
    for name, arr in (("x", x), ("label", label)):
        files[name] = os.path.join(work, name + ".npy")
        np.save(files[name], arr)
    data = [a for k, f in files.items() for a in ("--data", f"{k}={f}")]
    got = {}
    for which, path, names in (("dead", net, init), ("live", live, [k for k in init if k.startswith("fc")])):
        w0, w1 = os.path.join(work, which + "-init.safetensors"), os.path.join(work, which + ".safetensors")
        st_save(w0, {k: init[k] for k in names})
        exe = compile_model(netc, path, os.path.join(work, which), "-w")
        rc, out = run(exe, *data, "--init", w0, "--steps", "1", "--no-shuffle", "--threads", "1", "--quiet", "--save", w1)
        check(rc == 0, f"{which}: training: {out}")
        got[which] = st_tensors(w1) if rc == 0 else {}
    dead, lr, wd = got["dead"], 0.1, 0.01
    if not dead or not got["live"]:
        return
    # a zero gradient: one float32 step p - lr * wd * p, within float32's rounding of it
    for name in ("aux.weight", "aux.bias", "bnx.weight", "bnx.bias"):
        want = init[name].astype(np.float64) * (1 - lr * wd)
        check(np.abs(dead[name] - want).max() <= 1e-6 * np.abs(want).max(), f"{name}: not decayed: {dead[name]}")
    # the batch's statistics of h (float64 from the initial weights) over (batch, 2, 2) per channel,
    # as PyTorch's BatchNorm2d moves running_mean/var (momentum 0.1, the unbiased variance); h's
    # float32 rounding is ~1e-7 relative, 1e-5 absolute is far above it and below any wrong value
    h = np.maximum(x.astype(np.float64) @ init["fc1.weight"].T.astype(np.float64) + init["fc1.bias"], 0)
    c = h.reshape(4, 4, 4).transpose(1, 0, 2).reshape(4, -1)
    check(np.abs(dead["bnx.running_mean"] - 0.1 * c.mean(1)).max() <= 1e-5,
          f"running_mean {dead['bnx.running_mean']}, want {0.1 * c.mean(1)}")
    check(np.abs(dead["bnx.running_var"] - (0.9 + 0.1 * c.var(1, ddof=1))).max() <= 1e-5,
          f"running_var {dead['bnx.running_var']}, want {0.9 + 0.1 * c.var(1, ddof=1)}")
    check(int(dead["bnx.num_batches_tracked"]) == 1, f"num_batches_tracked {dead['bnx.num_batches_tracked']}")
    # the live layers: the same step as the model without the dead lines (the same kernels on the
    # same values; 1e-6 relative leaves room for a different vector remainder at other offsets)
    for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"):
        a, b = dead[name], got["live"][name]
        check(np.abs(a - b).max() <= 1e-6 * np.abs(b).max(), f"{name}: {a} against the live model's {b}")


if __name__ == "__main__":
    sys.exit(run_cases({"eval_only": case_eval_only, "hparams": case_hparams, "summary": case_summary,
                           "predict": case_predict, "dead": case_dead}, "use", check, sys.argv))
