"""The emulated CUDA trainer against the CPU trainer of the same model (emu_vs_cpu.sh).

    emu_compare.py WORKDIR STEPS TOLERANCE CPU_TRAINER EMU_TRAINER
    emu_compare.py WORKDIR --bf16 EPOCHS PARAM_TOL LOSS_TOL CPU_TRAINER EMU_TRAINER
    emu_compare.py WORKDIR --fp16 EPOCHS PARAM_TOL LOSS_TOL CPU_TRAINER EMU_TRAINER
    emu_compare.py WORKDIR --ranks N STEPS TOLERANCE CPU_TRAINER EMU_TRAINER
    emu_compare.py WORKDIR --ranks N --fp16 EPOCHS PARAM_TOL LOSS_TOL CPU_TRAINER EMU_TRAINER
    emu_compare.py WORKDIR --frozen-half STEPS PLAIN_EMU_TRAINER FROZEN_HALF_EMU_TRAINER

Both train STEPS steps on the same synthetic data (as tests/fusion/train_pair.py's, 64 seeded
samples in file order, extended to every input dtype) from the same initial weights (--init,
written here from --list-params), logging every 2 steps and evaluating on the first 21 samples
(so the last evaluation batch is padded whenever the batch does not divide 21). Required:
  - every saved tensor within TOLERANCE, relative to max(1, the tensor's largest magnitude), and
    so every tensor of the final checkpoints, the optimizer state included (both also write one
    every 3 steps);
  - the same log records; each logged loss within TOLERANCE relative to max(1, |loss|), each
    accuracy within one evaluation sample (a near-tie of two logits may break either way);
  - the emulated run with blocks and threads in reverse order (NETC_EMU_REVERSE) ends with the
    same bits: no kernel's result depends on the order of its blocks;
  - the emulated run stopped with --stop-at half way (exit status 4, a checkpoint) and resumed
    ends with the same bits as the uninterrupted emulated run, and logs the same losses;
  - with a NaN in one sample of the third batch, both stop with exit status 3 and name the same
    step (3, or later where the model drops the NaN from the loss, as a max-pooling may, and
    only the parameters it reached through the gradients carry it on): the device's on-device
    non-finite check, read back at the next log interval;
  - with the recipe changed on the command line (--lr, --weight-decay, --warmup-steps) the
    parameters still agree within TOLERANCE, and differ from the plain emulated run's;
  - --eval-only on the emulated run's saved weights logs exactly its final evaluation (the
    device path of rt_main's --eval-only);
  - --predict of the evaluation samples with those weights writes the CPU trainer's output
    within TOLERANCE (compare_predict: the device's output copied out and converted);
  - with --accumulate 2 the same again against the CPU trainer's --accumulate 2, a stop and
    resume and a NaN (compare_accumulate).
Prints the worst differences.

With --bf16 the emulated trainer was built with --precision bf16 and the bits cannot match:
main_bf16 requires instead that both runs converge alike on learnable data. With --fp16
(--precision fp16) main_fp16 requires the same, then checks the dynamic loss scale with forced
overflows (loss_scale_checks).

With --frozen-half two emulated trainers of one model in bf16 or fp16, without and with netc
--frozen-half, must give the same bits (main_frozen_half).

With --ranks N both trainers are distributed and run as N ranks under mpirun (main_ranks): the
same parameters, checkpoints and logs within TOLERANCE, and the same step on a NaN.
"""
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "..", "tools"))
from netc_testlib import log_records as records, model_output, mpi_env, mpirun_args, st_load, st_save  # noqa: E402

EVAL_SAMPLES = 21


def write_data(exe, work):
    """64 samples shaped like the model's inputs (read from EXE --help), as .npy files: u8
    inputs 0..255, other integer inputs (labels) 0..9, floating-point inputs N(0, 50^2) as f32
    (the trainer converts them by value to f16 or bf16). Returns the --data arguments."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    rng = np.random.default_rng(7)
    args = []
    for name, dt, dims in re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\]", text, re.M):
        shape = (64,) + tuple(int(d) for d in dims.split(",") if d.strip())
        if dt == "u8":
            arr = rng.integers(0, 256, shape).astype(np.uint8)
        elif dt in ("i32", "i64"):
            arr = rng.integers(0, 10, shape).astype(np.int64)
        else:
            arr = (rng.normal(size=shape) * 50).astype(np.float32)
        path = os.path.join(work, f"data-{name}.npy")
        np.save(path, arr)
        args += ["--data", f"{name}={path}"]
    return args


def write_eval_data(train_args, work):
    """The first EVAL_SAMPLES samples of each training file, as --eval-data."""
    args = []
    for spec in train_args[1::2]:
        name, path = spec.split("=", 1)
        out = os.path.join(work, f"eval-{name}.npy")
        np.save(out, np.load(path)[:EVAL_SAMPLES])
        args += ["--eval-data", f"{name}={out}"]
    return args


def write_init(exe, path):
    """Seeded weights for every parameter --list-params names: U(-1/sqrt(fan_in), ..) for
    weights, near 1 for a batch norm's scale, small running statistics, and 0 batches tracked."""
    text = subprocess.run([exe, "--list-params"], capture_output=True, text=True, check=True).stdout
    rng = np.random.default_rng(11)
    tensors = {}
    for name, dims in re.findall(r"^(\S+) +\[([^\]]*)\]", text, re.M):
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
        if name.endswith("num_batches_tracked"):
            tensors[name] = np.zeros(shape, np.int64)
        elif name.endswith("running_var"):
            tensors[name] = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("running_mean") or len(shape) == 1 and name.endswith("bias"):
            tensors[name] = rng.uniform(-0.1, 0.1, shape)
        elif len(shape) == 1:  # a batch norm's weight
            tensors[name] = rng.uniform(0.8, 1.2, shape)
        else:
            bound = 1 / np.sqrt(np.prod(shape[1:]))
            tensors[name] = rng.uniform(-bound, bound, shape)
    st_save(path, tensors)


def poisoned_data(exe, train_args, work, ranks=1, every=False):
    """The training data with NaN in the first sample of the third (global) batch (--no-shuffle),
    or of the second where an epoch has no third; with `every`, in every sample (its first
    element)."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    batch = int(re.search(r"batch (\d+)\)", text).group(1)) * ranks
    args = []
    for opt, spec in zip(train_args[::2], train_args[1::2]):
        name, path = spec.split("=", 1)
        arr = np.load(path)
        if arr.dtype.kind == "f":
            arr = arr.copy()
            if every:
                arr.reshape(len(arr), -1)[:, 0] = np.nan
            else:
                arr[(2 if 3 * batch <= len(arr) else 1) * batch].flat[0] = np.nan
            path = os.path.join(work, f"{'all-' if every else ''}nan-{name}.npy")
            np.save(path, arr)
        args += [opt, f"{name}={path}"]
    return args


def nonfinite_step(exe, args, launch=(), env=None):
    r = subprocess.run([*launch, exe, *args], capture_output=True, text=True, env=env)
    m = re.search(r"loss is .* at step (\d+)", r.stderr)
    assert r.returncode == 3 and m, f"{exe} on NaN data: exit status {r.returncode}, {r.stderr!r}"
    return int(m.group(1))


def train(exe, common, tag, work, *extra, expect=0, env=None, launch=()):
    log, out = os.path.join(work, f"{tag}.jsonl"), os.path.join(work, f"{tag}.safetensors")
    r = subprocess.run([*launch, exe, *common, "--log", log, "--save", out, *extra], stderr=subprocess.PIPE,
                       text=True, env=env)
    assert r.returncode == expect, f"{tag}: exit status {r.returncode}, expected {expect}:\n{r.stderr}"
    return log, out


def rel(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.abs(x - y).max() / max(1.0, float(np.abs(y).max()))) if x.size else 0.0


def compare_params(a_path, b_path, tol, what):
    a, b = st_load(a_path), st_load(b_path)
    assert a.keys() == b.keys(), f"{what}: different tensors saved"
    worst, where = 0.0, ""
    for k in a:
        err = rel(a[k], b[k])
        assert err <= tol, f"{what}: {k}: relative difference {err:.3g} (tolerance {tol:g})"
        if err > worst:
            worst, where = err, k
    return worst, where


def compare_logs(emu, cpu, tol):
    a, b = records(emu), records(cpu)
    assert [sorted(r) for r in a] == [sorted(r) for r in b], f"the logs differ in their records:\n{a}\n{b}"
    worst_loss = worst_acc = 0.0
    for x, y in zip(a, b):
        # float32 sums, whose order the backends choose; the metrics (accuracy, top5_accuracy, ...)
        rounded = ("loss", "lr", "grad_norm")
        assert {k: v for k, v in x.items() if k not in rounded and not k.endswith("accuracy")} == \
               {k: v for k, v in y.items() if k not in rounded and not k.endswith("accuracy")}, f"records differ: {x} {y}"
        if "grad_norm" in x:
            err = abs(x["grad_norm"] - y["grad_norm"]) / max(1.0, abs(y["grad_norm"]))
            assert err <= tol, f"logged gradient norms differ by {err:.3g} (tolerance {tol:g}): {x} {y}"
        assert x.get("lr") == y.get("lr"), f"learning rates differ: {x} {y}"
        assert (x["loss"] is None) == (y["loss"] is None), f"one loss is not finite: {x} {y}"
        if x["loss"] is not None:
            err = abs(x["loss"] - y["loss"]) / max(1.0, abs(y["loss"]))
            assert err <= tol, f"logged losses differ by {err:.3g} (tolerance {tol:g}): {x} {y}"
            worst_loss = max(worst_loss, err)
        for k in (k for k in x if k.endswith("accuracy")):
            d = abs(x[k] - y[k])
            assert d <= 1.0 / EVAL_SAMPLES + 1e-9, f"{k} differs by more than one sample: {x} {y}"
            worst_acc = max(worst_acc, d)
    return len(a), worst_loss, worst_acc


# ---- bf16 and fp16: the same convergence, not the same bits

def predict_args(exe, evals):
    """The --predict arguments for the --eval-data files `evals` (only the inputs the model's
    output reads, as EXE --help names them) and the output's per-sample shape; for a model with
    no output, the first input's and None."""
    output = model_output(exe)
    files = dict(spec.split("=", 1) for spec in evals[1::2])
    names = output[1] if output else list(files)[:1]
    args = [a for name in names for a in ("--predict", f"{name}={files[name]}")]
    return args, output[0] if output else None


def recipe_flags(exe):
    """The trainer options that change the recipe (rt_hparams.c), valued away from the model's
    own: half its learning rate (as --help gives it), a weight decay of 1e-3 and 2 warm-up steps."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    lr = float(re.search(r"^  --lr X +base learning rate \(default ([^)]+)\)", text, re.M).group(1))
    return ["--lr", repr(lr / 2), "--weight-decay", "0.001", "--warmup-steps", "2"]


def compare_predict(cpu, emu, evals, weights, work, tol):
    """--predict of the evaluation samples with `weights`: the emulated trainer's output (the device
    path: its evaluation step, the output's bytes copied out of the arena and turned into float32
    in logical order by the generated output_to_host) against the CPU trainer's, within `tol`
    relative to max(1, the output's largest magnitude). Returns that worst difference, or None
    for a model without an output (both trainers must then refuse --predict)."""
    args, dims = predict_args(cpu, evals)
    outs = []
    for exe, tag in ((cpu, "cpu"), (emu, "emu")):
        out = os.path.join(work, f"{tag}-predict.npy")
        r = subprocess.run([exe, *args, "--predict-out", out, "--init", weights, "--threads", "2", "--quiet"],
                           capture_output=True, text=True)
        if dims is None:
            assert r.returncode == 2 and "has no output" in r.stderr, \
                f"{tag} --predict without an output: status {r.returncode}, {r.stderr!r}"
            continue
        assert r.returncode == 0, f"{tag} --predict: exit status {r.returncode}:\n{r.stderr}"
        outs.append(np.load(out))
    if dims is None:
        return None
    a, b = outs
    assert a.shape == b.shape == (EVAL_SAMPLES, *dims), f"--predict wrote {b.shape} (emulated), {a.shape} (CPU)"
    worst = float(np.max(np.abs(a.astype(np.float64) - b))) / max(1.0, float(np.max(np.abs(a)))) if a.size else 0.0
    assert worst <= tol, f"--predict: the emulated trainer's output differs from the CPU trainer's by {worst:.3g}"
    return worst


def write_learnable_data(exe, work, n_train, n_eval):
    """Ten classes a model can learn: each floating-point input is its class's fixed pattern,
    N(0, 150^2) per 4x4 block of pixels (per element where the last two axes are not multiples
    of 4; a convolution sees shapes, not single pixels), plus N(0, 75^2) noise per element and
    sample, in the models' 0..255 pixel units (they divide by 255), centred on 0. The one
    integer input of shape [] is the label. Writes n_train training and n_eval held-out samples
    (the same patterns, fresh noise); returns their --data and --eval-data arguments. A token
    model (integer inputs of one shape [seq]: tokens, then their targets) gets sequences instead
    (write_sequence_data)."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    inputs = re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\]", text, re.M)
    if all(dt in ("i32", "i64") and dims.strip() for _, dt, dims in inputs):
        return write_sequence_data(text, inputs, work, n_train, n_eval)
    rng = np.random.default_rng(5)
    patterns = {}
    for name, dt, dims in inputs:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
        if dt in ("i32", "i64"):
            assert not shape, f"half-precision comparison: integer input {name} is not a label"
        elif len(shape) >= 2 and shape[-1] % 4 == 0 and shape[-2] % 4 == 0:
            coarse = rng.normal(size=(10,) + shape[:-2] + (shape[-2] // 4, shape[-1] // 4))
            patterns[name] = np.kron(coarse, np.ones((4, 4)))
        else:
            patterns[name] = rng.normal(size=(10,) + shape)
    assert len(patterns) == len(inputs) - 1, \
        f"half-precision comparison: needs floating-point inputs and a label: {inputs}"
    args = []
    for tag, n in (("data", n_train), ("eval-data", n_eval)):
        label = rng.integers(0, 10, n)
        for name, dt, dims in inputs:
            if name in patterns:
                p = patterns[name]
                arr = (150 * p[label] + 75 * rng.normal(size=(n,) + p.shape[1:])).astype(np.float32)
            else:
                arr = label.astype(np.int32 if dt == "i32" else np.int64)
            path = os.path.join(work, f"{tag}-{name}.npy")
            np.save(path, arr)
            args += [f"--{tag}", f"{name}={path}"]
    return args


def write_sequence_data(help_text, inputs, work, n_train, n_eval):
    """A token model's learnable data: sequences where each token follows from the one before
    (t' = 3 t + 1 mod V, V the vocabulary --help gives, from a random first token), the first
    input the sequence and the second its next tokens, as a language model reads them."""
    assert len(inputs) == 2 and inputs[0][2] == inputs[1][2], f"token model: needs tokens and targets: {inputs}"
    vocab = int(re.search(r"indices in \[0, (\d+)\)", help_text).group(1))
    seq = int(inputs[0][2])
    rng = np.random.default_rng(5)
    args = []
    for tag, n in (("data", n_train), ("eval-data", n_eval)):
        t = np.zeros((n, seq + 1), np.int64)
        t[:, 0] = rng.integers(0, vocab, n)
        for i in range(1, seq + 1):
            t[:, i] = (3 * t[:, i - 1] + 1) % vocab
        for (name, dt, _), arr in zip(inputs, (t[:, :-1], t[:, 1:])):
            path = os.path.join(work, f"{tag}-{name}.npy")
            np.save(path, arr.astype(np.int32 if dt == "i32" else np.int64))
            args += [f"--{tag}", f"{name}={path}"]
    return args


def travelled_apart(a_path, b_path, init_path):
    """The largest, over tensors, of |a - b| / |b - init| (Frobenius norms): how far run a ended
    from run b, as a fraction of how far b moved from the common start."""
    a, b, p0 = st_load(a_path), st_load(b_path), st_load(init_path)
    assert a.keys() == b.keys(), "half precision vs CPU: different tensors saved"
    worst, where = 0.0, ""
    for k in b:
        moved = np.linalg.norm(np.float64(b[k]) - p0[k])
        if moved == 0:  # never trained (num_batches_tracked): must agree exactly
            assert np.array_equal(a[k], b[k]), f"half precision vs CPU: {k} differs but does not train"
            continue
        d = float(np.linalg.norm(np.float64(a[k]) - b[k]) / moved)
        if d > worst:
            worst, where = d, k
    return worst, where


def predict_loss(exe, data, weights, work, tag):
    """--predict of data's --eval-data samples with `weights` against the trainer's own --eval-only
    loss on them, for a model trained with cross_entropy(logits, labels) over the last axis of its
    output (the default output: the logits): the mean cross-entropy of the written logits against
    the labels, computed here in float64, is that loss. The device reads the same values its loss
    kernel reads (in half precision, the logits rounded to bf16 or fp16 are the loss's operand),
    so the two differ by the loss kernel's float32 rounding: a log-sum-exp over V terms and a
    sum over the samples, each within a few ulps (2^-24 relative) per term, far below 1e-5 of the
    loss. A wrong offset, layout or conversion of the copy changes the loss by its own size.
    Returns the relative difference."""
    evals = data[data.index("--eval-data"):]
    args, dims = predict_args(exe, evals)
    out, log = os.path.join(work, f"{tag}-predict.npy"), os.path.join(work, f"{tag}-eval-only.jsonl")
    for extra in (["--predict-out", out, *args], ["--eval-only", *evals, "--log", log]):
        r = subprocess.run([exe, *extra, "--init", weights, "--threads", "2", "--quiet"], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"{tag} {extra[0]}: exit status {r.returncode}:\n{r.stderr}"
    logits = np.load(out).astype(np.float64)
    named = {spec.split("=", 1)[0] for spec in args[1::2]}
    labels = [np.load(spec.split("=", 1)[1]) for spec in evals[1::2] if spec.split("=", 1)[0] not in named]
    assert len(labels) == 1 and labels[0].shape == logits.shape[:-1], \
        f"{tag} --predict: logits {logits.shape} for labels {[x.shape for x in labels]}"
    top = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=-1)) + top[..., 0]
    ce = float(np.mean(lse - np.take_along_axis(logits, labels[0][..., None].astype(np.int64), -1)[..., 0]))
    want = records(log)[-1]["loss"]
    gap = abs(ce - want) / abs(want)
    assert gap <= 1e-5, f"{tag} --predict: its logits' cross-entropy {ce:.8g}, the evaluation loss {want:.8g}"
    return gap


def converge_half(kind, work, epochs, param_tol, loss_tol, cpu, emu, ranks=1):
    """The emulated --precision bf16 (KIND) trainer against the float32 CPU trainer: the same init,
    data and batches for EPOCHS epochs of write_learnable_data's 256 samples, evaluated on its 64
    held-out ones after every epoch. Required, with L0 the first step's loss (the initial
    weights' loss, about ln 10):
      - the CPU run learns, to a final evaluation loss below L0 / 20, or the comparison means
        nothing; and so does the bf16 run;
      - the first step's loss (forward only) and every epoch's evaluation loss agree within
        LOSS_TOL * L0: the learning curves coincide;
      - every parameter tensor ends within PARAM_TOL of the CPU run's, relative to the distance
        the CPU run moved it from the init (travelled_apart);
      - blocks and threads in reverse order give the same bits (no race in the cast kernels).
    Why not closer: bf16 keeps 8 significant bits, so each operand of a product is rounded by up
    to 2^-9 relative and each product's result again (2^-8 = 3.9e-3 at most, half that on
    average). A gradient passes two or three such roundings per product, and a ReLU whose input
    moved across 0 passes or blocks a term: mlp's first-step fc1 gradient is 5% off the float32
    one, exactly as a numpy model of the same bf16 roundings gives. Batch after batch these
    errors partly cancel and partly steer the run along a nearby path. fp16 keeps 11 bits
    (2^-12 relative per rounding) and under a loss scale its gradients stay clear of the
    subnormals, so its tolerances are tighter."""
    os.makedirs(work, exist_ok=True)
    data = write_learnable_data(cpu, work, 256, 64)
    init = os.path.join(work, "init.safetensors")
    write_init(cpu, init)
    run = ranks_run(ranks)
    common = [*data, "--epochs", str(epochs), "--init", init, "--seed", "3", "--threads", threads(ranks), "--quiet",
              "--log-every", "1"]
    cpu_log, cpu_out = train(cpu, common, "cpu", work, **run)
    emu_log, emu_out = train(emu, common, "emu", work, **run)

    def curve(log):  # the first step's loss, then each epoch's evaluation loss
        rs = records(log)
        return [next(r["loss"] for r in rs if "step" in r)] + [r["loss"] for r in rs if r.get("eval")]
    cc, ec = curve(cpu_log), curve(emu_log)
    assert len(cc) == len(ec) == epochs + 1 and None not in cc + ec, f"{kind} vs CPU: curves {ec} and {cc}"
    l0 = cc[0]
    assert cc[-1] < l0 / 20, f"the CPU trainer does not learn the data: evaluation losses {cc[1:]}, first {l0}"
    assert ec[-1] < l0 / 20, f"the {kind} trainer does not learn: evaluation losses {ec[1:]}, first {ec[0]}"
    gap = max(abs(x - y) for x, y in zip(ec, cc)) / l0
    assert gap <= loss_tol, f"{kind} vs CPU losses differ by {gap:.3g} of the first ({loss_tol:g} allowed): " \
                            f"first step, then evaluations: {kind} {ec}, CPU {cc}"
    apart, where = travelled_apart(emu_out, cpu_out, init)
    assert apart <= param_tol, f"{kind} vs CPU: {where} ends {apart:.3g} of its travel from the CPU run's " \
                               f"({param_tol:g} allowed)"

    reverse = dict(run, env=dict(run.get("env") or os.environ, NETC_EMU_REVERSE="1"))
    _, reversed_out = train(emu, common, "emu-reversed", work, **reverse)
    a, b = st_load(reversed_out), st_load(emu_out)
    for k in b:
        assert np.array_equal(a[k], b[k]), f"{kind}, blocks and threads in reverse order: {k} differs (a race)"
    predicted = predict_loss(emu, data, emu_out, work, f"{kind} emulated") if ranks == 1 else None

    print(f"{kind} emulated vs float32 CPU over {epochs} epochs: evaluation loss {ec[-1]:.4g} vs {cc[-1]:.4g} "
          f"(first step {ec[0]:.5g} vs {cc[0]:.5g}), curves within {gap:.3g} of the first loss; parameters "
          f"within {apart:.3g} of their travel ({where}); reverse block order: identical; --predict's "
          f"cross-entropy: {'not run (ranks)' if predicted is None else f'{predicted:.3g} from the evaluation loss'}")


def main_bf16(work, epochs, param_tol, loss_tol, cpu, emu):
    converge_half("bf16", work, epochs, param_tol, loss_tol, cpu, emu)


def main_fp16(work, epochs, param_tol, loss_tol, cpu, emu, ranks=1):
    converge_half("fp16", work, epochs, param_tol, loss_tol, cpu, emu, ranks)
    loss_scale_checks(os.path.join(work, "scale"), cpu, emu, ranks)


def ranks_run(ranks):
    """train()'s and nonfinite_step()'s launch and environment for `ranks` ranks (none for one)."""
    return dict(env=mpi_env(), launch=mpirun_args(ranks)) if ranks > 1 else {}


def threads(ranks):
    return "1" if ranks > 1 else "2"  # the ranks share the 2 cores


def training_data(args):
    """The --data arguments of write_learnable_data's."""
    return [x for pair in zip(args[::2], args[1::2]) if pair[0] == "--data" for x in pair]


def step_records(log):
    """(loss, loss_scale, skipped_steps) of each step record of a --log-every 1 run."""
    return [(r["loss"], r["loss_scale"], r["skipped_steps"]) for r in records(log) if not r.get("eval")]


def scales_by_rule(first, interval, skipped):
    """The scale after each step by torch.cuda.amp.GradScaler's update(): halved on a step that
    overflowed (its skipped count grew), doubled after `interval` finite steps in a row."""
    scale, good, out, before = first, 0, [], 0
    for n in skipped:
        if n > before:
            scale, good = scale / 2, 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2, 0
        out.append(scale)
        before = n
    return out


def st_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def cpu_resumes_scaled(work, common, one, m, steps, first, cpu, emu, ranks):
    """A trainer without loss scaling (the CPU one) resuming the fp16 run's checkpoint after its m
    skipped steps counts only the updates made in AdamW's bias correction, as the fp16 trainer
    does: resumed 2 steps after the skips, it ends with the bits it ends with when it resumes the
    run started at the scale the skips reached, 2 steps in (the same parameters and optimizer
    state, m steps fewer); and its own checkpoints pass the loss scale on as they found it."""
    run = ranks_run(ranks)
    forced, unforced = (os.path.join(work, f"{t}-late.ckpt") for t in ("forced", "unforced"))
    train(emu, [*common, "--steps", str(steps)], "forced-late", work, "--loss-scale", str(first), "--checkpoint",
          forced, "--stop-at", str(m + 2), expect=4, **run)
    train(emu, [*common, "--steps", str(steps - m)], "unforced-late", work, "--loss-scale", str(first >> m),
          "--checkpoint", unforced, "--stop-at", "2", expect=4, **run)
    again = [*one, "--threads", threads(ranks), "--quiet", "--log-every", "1"]
    passed_on = os.path.join(work, "cpu-after-forced.ckpt")
    _, a = train(cpu, again, "cpu-after-forced", work, "--resume", forced, "--checkpoint", passed_on, **run)
    _, b = train(cpu, again, "cpu-after-unforced", work, "--resume", unforced, **run)
    x, y = st_load(a), st_load(b)
    for k in y:
        assert np.array_equal(x[k], y[k]), f"the CPU trainer resuming after {m} skipped steps: {k} differs from " \
                                           f"its resuming the run without them (its optimizer counted the skips)"
    got, had = st_metadata(passed_on), st_metadata(forced)
    keys = ("loss_scale", "loss_scale_good", "loss_scale_interval", "skipped_steps")
    assert all(got.get(k) == had[k] for k in keys) and int(had["skipped_steps"]) == m, \
        f"the CPU trainer's checkpoint after resuming the fp16 run: {[got.get(k) for k in keys]}, " \
        f"the fp16 run's {[had.get(k) for k in keys]}"
    return "; the CPU trainer resuming it after the skips counts the updates alike and passes the scale on"


def accumulate_scaled(work, common, one, steps, first, a_log, a_out, emu):
    """The forced run again with --accumulate 2 on its one batch twice over: each step sums the
    batch's scaled gradients twice and halves them - (g + g) / 2 is g exactly, as (l + l) / 2 is
    the loss - so the run must give the forced run's bits: the same steps skipped (an overflow in
    either batch makes the sum Inf), the same scales, losses and parameters. A scale moved
    between a step's batches, a batch's overflow lost, or a skipped step that kept the sum,
    would not."""
    twice = []
    for opt, spec in zip(one[::2], one[1::2]):
        name, path = spec.split("=", 1)
        arr = np.load(path)
        doubled = os.path.join(work, f"twice-{name}.npy")
        np.save(doubled, np.concatenate([arr, arr]))
        twice += [opt, f"{name}={doubled}"]
    base = [x for x in common if x not in one]  # the same options but the data
    log, out = train(emu, [*twice, *base, "--steps", str(steps)], "forced-acc", work, "--loss-scale", str(first),
                     "--accumulate", "2")
    assert step_records(log) == step_records(a_log), \
        f"--accumulate 2 on the batch twice: {step_records(log)[:6]}, without {step_records(a_log)[:6]}"
    x, y = st_load(out), st_load(a_out)
    for k in y:
        assert np.array_equal(x[k], y[k]), f"--accumulate 2 on the batch twice: {k} differs from the forced run's"
    return "--accumulate 2 on the batch twice: the same skips, scales and bits"


def loss_scale_checks(work, cpu, emu, ranks=1):
    """--precision fp16's dynamic loss scale, with overflows forced by a first scale of 2^32 (the
    loss gradient's seed, so fp16 products of the scaled gradients overflow until it comes down),
    on data of one batch without shuffling, so that every step sees the same batch:
      - the run skips its first m >= 1 steps, and those steps leave the parameters alone: each
        of the first m + 1 steps logs the first step's loss to the bit, the step after them not;
      - the logged scale follows GradScaler's rule from the logged skips (halved on an
        overflow; with --loss-scale-interval 3, doubled after 3 finite steps, and an overflow
        again where that is too much);
      - the run equals, bit for bit, a run started at the scale the skips reached, 2^(32-m),
        with m fewer steps: a skipped step changes nothing, nor counts as an update in AdamW's
        bias correction (its step count would differ by m), and the unscaling is exact;
      - the CPU trainer resumes such a run after its skips counting the updates alike
        (cpu_resumes_scaled);
      - stopped inside the skipped steps and resumed from the checkpoint: the same bits and the
        same log (the scale and its counters are checkpointed), and --loss-scale against that
        checkpoint is refused;
      - a NaN in the data stops the run at the step the CPU trainer names, exit status 3: an
        overflow skips a step, a non-finite loss still ends the run; where the model drops the
        NaN from the loss (a max-pooling's fmaxf does), its gradients are not finite and that
        step is skipped, as GradScaler skips it, while the float32 run's parameters turn NaN; and
        with such a NaN in every sample, every step is skipped until the scale is 2^-24, where
        the run stops (status 3) naming the gradients;
      - --loss-scale that is not a power of two is refused, as is --loss-scale for a trainer
        without loss scaling.
    With `ranks` ranks (distributed trainers) each rank takes its batch of the global one, so
    the ranks must decide every skip alike (their parameters are compared at the end of each
    run: a rank that skipped alone would stop the run); the data is one global batch."""
    os.makedirs(work, exist_ok=True)
    run = ranks_run(ranks)
    launch, env = run.get("launch", []), run.get("env")
    text = subprocess.run([emu, "--help"], capture_output=True, text=True, check=True).stdout
    batch = int(re.search(r"batch (\d+)\)", text).group(1))
    learn = write_learnable_data(cpu, work, batch * ranks, batch)
    one = training_data(learn)
    init = os.path.join(work, "init.safetensors")
    write_init(cpu, init)
    steps, first = 40, 2 ** 32
    common = [*one, "--init", init, "--no-shuffle", "--seed", "3", "--threads", threads(ranks), "--quiet",
              "--log-every", "1"]

    a_log, a_out = train(emu, [*common, "--steps", str(steps)], "forced", work, "--loss-scale", str(first), **run)
    a = step_records(a_log)
    skipped = [r[2] for r in a]
    m = next((i for i, n in enumerate(skipped) if n == i), len(a))  # the leading skipped steps
    assert len(a) == steps and 1 <= m <= steps - 10, f"first scale 2^32: {m} leading steps skipped of {len(a)}"
    assert [r[1] for r in a] == scales_by_rule(first, 2000, skipped), f"scales {[r[1] for r in a]}, skips {skipped}"
    losses = [r[0] for r in a]
    assert losses[:m + 1] == [losses[0]] * (m + 1) and losses[m + 1] != losses[0], \
        f"the {m} skipped steps moved the parameters: losses {losses[:m + 2]}"

    if ranks == 1:
        accumulated = accumulate_scaled(work, common, one, steps, first, a_log, a_out, emu)

    b_log, b_out = train(emu, [*common, "--steps", str(steps - m)], "unforced", work, "--loss-scale",
                         str(first >> m), **run)
    x, y = st_load(a_out), st_load(b_out)
    lrs = lambda log: [r["lr"] for r in records(log) if not r.get("eval")]  # noqa: E731
    if lrs(b_log) == lrs(a_log)[m:]:  # the same learning rates: the same steps
        for k in y:
            assert np.array_equal(x[k], y[k]), f"{m} skipped steps, then {steps - m}: {k} differs from a run of " \
                                               f"{steps - m} steps at scale 2^{32 - m}"
        assert [r[0] for r in step_records(b_log)] == losses[m:], "the runs' losses differ after the skipped steps"
        same = f"bit-identical to {steps - m} steps from 2^{32 - m}"
        same += cpu_resumes_scaled(work, common, one, m, steps, first, cpu, emu, ranks)
    else:  # a schedule over the run's length (GPT-2's cosine) gives the shorter run other rates
        same = "a shorter run has other learning rates (a schedule over the run), not compared"

    g_log, _ = train(emu, [*common, "--steps", "12"], "growth", work, "--loss-scale", str(first >> m),
                     "--loss-scale-interval", "3", **run)
    g = step_records(g_log)
    got = [r[1] for r in g]
    assert got == scales_by_rule(first >> m, 3, [r[2] for r in g]) and max(got) > first >> m, \
        f"--loss-scale-interval 3: scales {got}, skips {[r[2] for r in g]}"

    stop, ckpt = max(1, m // 2), os.path.join(work, "forced.ckpt")
    resumed = [*common, "--steps", str(steps)]
    train(emu, resumed, "resumed", work, "--loss-scale", str(first), "--checkpoint", ckpt, "--stop-at", str(stop),
          expect=4, **run)
    _, r_out = train(emu, [*one, "--threads", threads(ranks), "--quiet", "--log-every", "1"], "resumed", work,
                     "--resume", ckpt, "--checkpoint", ckpt, **run)
    x = st_load(r_out)
    for k in y:
        assert np.array_equal(x[k], st_load(a_out)[k]), f"resumed at step {stop}: {k} differs"
    assert records(os.path.join(work, "resumed.jsonl")) == records(a_log), f"resumed at step {stop}: the log differs"
    r = subprocess.run([*launch, emu, *one, "--resume", ckpt, "--loss-scale", "1024", "--quiet"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and "leave --loss-scale out" in r.stderr, f"--loss-scale on resume: {r.stderr!r}"

    # NaN in the data: only where the model has a floating-point input (not a token model)
    if any(np.load(spec.split("=", 1)[1]).dtype.kind == "f" for spec in one[1::2]):
        several = os.path.join(work, "batches")
        os.makedirs(several, exist_ok=True)
        four = training_data(write_learnable_data(cpu, several, 4 * batch * ranks, batch))
        nan = [*poisoned_data(cpu, four, work, ranks), "--steps", "6", "--threads", threads(ranks), "--quiet", "--init",
               init, "--no-shuffle", "--seed", "3"]
        at = nonfinite_step(cpu, nan, **run)
        nan_log = os.path.join(work, "nan.jsonl")
        r = subprocess.run([*launch, emu, *nan, "--log", nan_log, "--log-every", "1"], capture_output=True, text=True,
                           env=env)
        nan_stop = re.search(r"loss is .* at step (\d+)", r.stderr)
        if nan_stop:  # the loss saw the NaN: the run ends where the float32 one does
            assert r.returncode == 3 and int(nan_stop.group(1)) == at, \
                f"NaN in the third batch: the CPU trainer stops at step {at}, fp16: {r.returncode}, {r.stderr!r}"
            nan_end = f"stops at step {at}"
        else:  # a max-pooling dropped it from the loss; the gradients carry it: that step is skipped
            skipped = [x["skipped_steps"] for x in records(nan_log) if not x.get("eval")]
            assert r.returncode == 0 and len(skipped) == 6 and skipped[2] > skipped[1], \
                f"NaN in the third batch, not in the loss: exit status {r.returncode}, skips {skipped}, {r.stderr!r}"
            # NaN in every sample: every step's gradients, never the loss. Skipped, and the scale
            # halved, until it is 2^-24, where that is divergence: from 2^-22, the third step stops
            poisoned = poisoned_data(cpu, one, work, ranks, every=True)
            r = subprocess.run([*launch, emu, *poisoned, "--steps", "6", "--threads", threads(ranks), "--quiet",
                                "--init", init, "--loss-scale", "0x1p-22"], capture_output=True, text=True, env=env)
            stopped = "gradients are NaN or infinite at step 3 although the loss is finite" in r.stderr
            assert r.returncode == 3 and stopped, \
                f"NaN gradients in every step from a scale of 2^-22: exit status {r.returncode}, {r.stderr!r}"
            nan_end = f"skips step 3 (the CPU run stops at step {at}); NaN gradients at every step stop it at 2^-24"
    else:
        nan_end = "not poisoned (no floating-point input)"

    for exe, value, needle in ((emu, "3", "needs a power of two"), (emu, "0x1p200", "needs a power of two"),
                               (cpu, "1024", "--loss-scale")):
        r = subprocess.run([*launch, exe, *one, "--loss-scale", value], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and needle in r.stderr, f"--loss-scale {value}: status {r.returncode}, {r.stderr!r}"
    print(f"fp16 loss scale{f' ({ranks} ranks)' if ranks > 1 else ''}: from 2^32, {m} steps skipped, parameters "
          f"untouched by them, scale 2^{32 - m} after; {same}; growth every 3 steps as GradScaler's; stopped at step "
          f"{stop} and resumed: identical; NaN data {nan_end}{'; ' + accumulated if ranks == 1 else ''}")


# ---- distributed: N ranks of each, the emulated one's gradients and loss summed by NCCL's calls

def main_ranks(work, ranks, steps, tol, cpu, emu):
    """Both trainers as `ranks` ranks of the same per-rank batch, one thread each: the emulated
    step averages each gradient bucket with ncclAvg (its floats scaled by 1/N, then summed; for
    N = 2 the same bits as the CPU trainer's sum, then scaling) and sums the loss over the ranks
    before the non-finite check, so the comparison holds to TOLERANCE as in main(); a bucket
    left out, started before its last gradient or joined late moves the parameters by a
    gradient's share."""
    os.makedirs(work, exist_ok=True)
    env, launch = mpi_env(), mpirun_args(ranks)
    data = write_data(cpu, work)
    init = os.path.join(work, "init.safetensors")
    write_init(cpu, init)
    evals = write_eval_data(data, work)
    base = [*data, *evals, "--steps", str(steps), "--threads", "1", "--quiet", "--log-every", "2"]
    fresh = ["--init", init, "--seed", "3"]
    common = base + fresh
    every = ["--checkpoint-every", "3", "--checkpoint"]
    cpu_log, cpu_out = train(cpu, common, "cpu", work, *every, os.path.join(work, "cpu.ckpt"), env=env,
                             launch=launch)
    emu_log, emu_out = train(emu, common, "emu", work, *every, os.path.join(work, "emu.ckpt"), env=env,
                             launch=launch)
    worst, where = compare_params(emu_out, cpu_out, tol, f"{ranks} emulated ranks vs {ranks} CPU ranks")
    worst_ckpt, where_ckpt = compare_params(os.path.join(work, "emu.ckpt"), os.path.join(work, "cpu.ckpt"), tol,
                                            f"{ranks} ranks: emulated vs CPU checkpoints")
    n, worst_loss, worst_acc = compare_logs(emu_log, cpu_log, tol)
    n_evals = compare_eval_rank(emu, common, work, ranks, env, emu_out, emu_log)
    # checkpoints every 3 steps: each rank ends an evaluation in flight before each
    n_async = compare_eval_async(emu, [*common, *every, os.path.join(work, "emu-async.ckpt")], work, emu_out, emu_log,
                                 False, env=env, launch=launch)
    nan = [*poisoned_data(cpu, data, work, ranks), "--steps", str(steps), "--threads", "1", "--quiet", "--log-every", "2",
           "--init", init, "--no-shuffle", "--seed", "3"]
    at = nonfinite_step(cpu, nan, launch, env), nonfinite_step(emu, nan, launch, env)
    assert at[0] == at[1] and at[0] >= 2, \
        f"NaN in the data: {ranks} CPU ranks stop at step {at[0]}, {ranks} emulated ranks at {at[1]}"
    # the step's sum bucket by bucket before its mean over the ranks, no collective in a summed batch
    acc = compare_accumulate(cpu, emu, base, fresh, data, work, tol, max(2, steps // 2 // 2 * 2), ranks, env, launch)

    print(f"{ranks} emulated ranks vs {ranks} CPU ranks after {steps} steps: parameters {worst:.3g} "
          f"({where or 'identical'}), final checkpoints {worst_ckpt:.3g} ({where_ckpt or 'identical'}), {n} log "
          f"records: losses {worst_loss:.3g}, accuracy {worst_acc:.3g}; NaN found by both at step {at[0]}; "
          f"with an evaluation rank the same weights and {n_evals} evaluations; with --eval-async the same "
          f"weights and {n_async} evaluations, logged later; {acc}")


def compare_accumulate(cpu, emu, common, fresh, data, work, tol, stop, ranks=1, env=None, launch=()):
    """Both trainers again with --accumulate 2: each step two batches, whose gradients the device
    sums in its arena (the step's graphs RT_STEP_SUM, then RT_STEP_LAST) as the CPU trainer does
    in memory, then halves (exact), dropout masks drawn per batch, the step's loss the two
    batches' mean. Required: the same parameters, final checkpoints and log records within
    TOLERANCE, as without; the emulated run stopped at step `stop` and resumed, the same bits
    and log (the device's sum is empty at every step's end); with a NaN in the third batch (the
    second step's first), both stop at the same step. A sum not halved, not emptied, a batch's
    loss left out or masks not drawn per batch move the parameters by a gradient's share or the
    NaN's step (step 2 where the batch's NaN reaches its loss). Returns what it found, for the summary line."""
    acc = ["--accumulate", "2"]
    run = dict(env=env, launch=launch)
    ckpt = lambda tag: ["--checkpoint", os.path.join(work, f"{tag}.ckpt")]  # noqa: E731
    cpu_log, cpu_out = train(cpu, common + fresh + acc, "cpu-acc", work, *ckpt("cpu-acc"), **run)
    emu_log, emu_out = train(emu, common + fresh + acc, "emu-acc", work, *ckpt("emu-acc"), **run)
    worst, where = compare_params(emu_out, cpu_out, tol, "--accumulate 2: emulated vs CPU")
    compare_params(os.path.join(work, "emu-acc.ckpt"), os.path.join(work, "cpu-acc.ckpt"), tol,
                   "--accumulate 2: emulated vs CPU checkpoints")
    n, worst_loss, _ = compare_logs(emu_log, cpu_log, tol)
    with open(emu_log) as f:
        assert any(json.loads(line).get("accumulate") == 2 for line in f), "--accumulate 2: the log does not say so"
    stopped = os.path.join(work, "emu-acc-stopped.ckpt")
    train(emu, common + fresh + acc, "emu-acc-resumed", work, "--checkpoint", stopped, "--stop-at", str(stop),
          expect=4, **run)
    _, resumed = train(emu, common + acc, "emu-acc-resumed", work, "--resume", stopped, "--checkpoint", stopped, **run)
    a, b = st_load(resumed), st_load(emu_out)
    for k in b:
        assert np.array_equal(a[k], b[k]), f"--accumulate 2, resumed at step {stop}: {k} differs"
    assert records(os.path.join(work, "emu-acc-resumed.jsonl")) == records(emu_log), \
        f"--accumulate 2, resumed at step {stop}: the log differs from the uninterrupted run's"
    steps = common[common.index("--steps") + 1]
    nan = [*poisoned_data(cpu, data, work, ranks), "--steps", steps, "--threads", common[common.index("--threads") + 1],
           "--quiet", "--log-every", "2", *fresh, *acc]
    at = nonfinite_step(cpu, nan, launch, env), nonfinite_step(emu, nan, launch, env)
    assert at[0] == at[1], f"--accumulate 2, NaN in the data: the CPU trainer stops at step {at[0]}, the emulated " \
                           f"one at {at[1]}"
    return (f"--accumulate 2: parameters {worst:.3g} ({where or 'identical'}), {n} log records, losses "
            f"{worst_loss:.3g}, resumed at step {stop}: identical, NaN found by both at step {at[0]}")


def compare_eval_rank(emu, common, work, ranks, env, emu_out, emu_log):
    """The emulated trainer again with --eval-rank (one process more, whose device opens without
    the collectives and only evaluates): the same weights, bit for bit (the training ranks run the
    same steps), the same step records, and the same evaluations: each batch's float32 sums are
    the same bits, only their float64 sum over batches is added in another order (1e-15)."""
    log, out = train(emu, common, "emu-evalrank", work, "--eval-rank", env=env, launch=mpirun_args(ranks + 1))
    assert open(out, "rb").read() == open(emu_out, "rb").read(), "--eval-rank changed the trained weights"
    split = lambda rs: ([r for r in rs if not r.get("eval")], [r for r in rs if r.get("eval")])  # noqa: E731
    (steps_a, evals_a), (steps_s, evals_s) = split(records(log)), split(records(emu_log))
    assert steps_a == steps_s, f"--eval-rank changed the step records:\n{steps_a}\n{steps_s}"
    assert evals_s and [r["epoch"] for r in evals_a] == [r["epoch"] for r in evals_s], \
        f"evaluations with --eval-rank {evals_a}, without {evals_s}"
    for a, b in zip(evals_a, evals_s):
        assert abs(a["loss"] - b["loss"]) <= 1e-12 * abs(b["loss"]) and \
            {k: v for k, v in a.items() if k.endswith("accuracy")} == {k: v for k, v in b.items() if k.endswith("accuracy")}, \
            f"an evaluation differs with --eval-rank: {a} {b}"
    return len(evals_a)


def compare_eval_async(emu, args, work, emu_out, emu_log, later, env=None, launch=()):
    """The emulated trainer again with --eval-async: each evaluation runs in a second arena on a
    copy of the parameters, one batch per later training step, and is logged a step after its
    last batch (or before a checkpoint). The same weights, bit for bit, and the same step records;
    the same evaluations, bit for bit (the same kernels on the same parameters, their sums added
    in the same order), which an evaluation that read the training arena would not give; with
    `later` (no checkpoints between), each evaluation with training after it lands after a later
    step's line."""
    log, out = train(emu, args, "emu-evalasync", work, "--eval-async", env=env, launch=launch)
    assert open(out, "rb").read() == open(emu_out, "rb").read(), "--eval-async changed the trained weights"
    split = lambda rs: ([r for r in rs if not r.get("eval")], [r for r in rs if r.get("eval")])  # noqa: E731
    (steps_a, evals_a), (steps_s, evals_s) = split(records(log)), split(records(emu_log))
    assert steps_a == steps_s, f"--eval-async changed the step records:\n{steps_a}\n{steps_s}"
    assert evals_s and evals_a == evals_s, f"evaluations with --eval-async {evals_a}, without {evals_s}"

    def step_before(rs, epoch):  # the step of the last step record before the epoch's evaluation
        at = next(i for i, r in enumerate(rs) if r.get("eval") and r["epoch"] == epoch)
        return max([r["step"] for r in rs[:at] if "step" in r] or [0])

    a, s_ = records(log), records(emu_log)
    for e in evals_s[:-1] if later else []:  # each but the last has training after it
        assert step_before(a, e["epoch"]) > step_before(s_, e["epoch"]), \
            f"--eval-async: epoch {e['epoch']}'s evaluation was logged where the synchronous one is:\n{a}"
    if later and len(evals_s) > 1:
        check_target_async(emu, args, work, a, evals_s[0], env, launch)
    return len(evals_a)


def check_target_async(emu, args, work, async_records, first, env, launch):
    """--eval-async with a target the first evaluation meets (its own loss): the run stops after
    the step whose end that evaluation's result landed at, with the step records of the run
    without a target up to there and one for the steps since the last of them (unless the stop
    is at a log point), and not before the step after its epoch."""
    log, _ = train(emu, args, "emu-evalasync-target", work, "--eval-async", "--target-loss",
                   repr(first["loss"] * (1 + 1e-6)),  # above the loss the log rounded to 8 digits
                   env=env, launch=launch)
    got = records(log)
    at = next(i for i, r in enumerate(async_records) if r.get("eval"))
    steps = [r for r in got if "step" in r and "epoch" in r and "target_reached" not in r and "checkpoint" not in r]
    want = [r for r in async_records[:at] if "step" in r]
    reached = [r for r in got if "target_reached" in r]
    assert reached and reached[0]["epoch"] == first["epoch"] and steps[:len(want)] == want, \
        f"--eval-async with a target met by epoch {first['epoch']}: {reached}, steps {steps}, want the steps {want}"
    stop = reached[0]["step"]
    last = [] if want and want[-1]["step"] == stop else [stop]
    assert [r["step"] for r in steps[len(want):]] == last, \
        f"--eval-async with a target: stopped after step {stop}, step records {steps}, want {want} and {last}"


def compare_step_evals(cpu, emu, args, work, emu_out, steps, tol):
    """Evaluations every 3 optimizer steps (--eval-every-steps 3), inside the epochs: the device
    evaluates between two steps, the sums of the interval so far taken first, as the CPU trainer
    does. Required: the CPU trainer's records within TOLERANCE (compare_logs), an evaluation after
    each third step and after the last; the training untouched (the weights of the emulated run
    without them, bit for bit); with --eval-async, the same evaluations and weights; --save-best's
    file, read back from the device after the best evaluation, the parameters of a checkpoint
    taken at that step."""
    cpu_log, _ = train(cpu, args, "cpu-evalsteps", work, "--eval-every-steps", "3")
    best = os.path.join(work, "emu-best.safetensors")
    log, out = train(emu, args, "emu-evalsteps", work, "--eval-every-steps", "3", "--save-best", best)
    compare_logs(log, cpu_log, tol)
    evals = [r for r in records(log) if r.get("eval")]
    want = [s for s in range(3, steps, 3)] + [steps]
    assert [r["step"] for r in evals] == want, f"--eval-every-steps 3: evaluations {evals}, want after steps {want}"
    assert open(out, "rb").read() == open(emu_out, "rb").read(), "--eval-every-steps changed the trained weights"
    log_a, out_a = train(emu, args, "emu-evalsteps-async", work, "--eval-every-steps", "3", "--eval-async")
    assert open(out_a, "rb").read() == open(emu_out, "rb").read(), \
        "--eval-every-steps with --eval-async changed the trained weights"
    evals_a = [r for r in records(log_a) if r.get("eval")]
    assert evals_a == evals, f"--eval-every-steps 3: evaluations with --eval-async {evals_a}, without {evals}"
    key = "accuracy" if "accuracy" in evals[0] else "loss"
    sign = 1 if key == "accuracy" else -1
    at = max(evals, key=lambda r: (sign * r[key] if r[key] is not None else -math.inf, -r["step"]))["step"]
    if at < steps:
        ck = os.path.join(work, "emu-at-best.ckpt")
        train(emu, args, "emu-at-best", work, "--stop-at", str(at), "--checkpoint", ck, expect=4)
    else:
        ck = emu_out
    got, want = st_load(best), st_load(ck)
    assert all(np.array_equal(got[k], want[k]) for k in got), \
        f"--save-best: not the parameters after step {at}, the best evaluation's ({key})"
    return len(evals)


def half_marked(exe):
    """--list-params: {name: marked as kept in half on the device} for each frozen parameter."""
    text = subprocess.run([exe, "--list-params"], capture_output=True, text=True, check=True).stdout
    return {m.group(1): m.group(2) is not None for m in re.finditer(r"^(\S+) .*  frozen( \(\w+ on the device\))?$",
                                                                      text, re.M)}


def main_frozen_half(work, steps, plain, frozen):
    """The device trainer compiled with --frozen-half (FROZEN: its frozen weights that only
    products read kept in bf16 or fp16 on the device, rounded once at the upload) against the
    same without it (PLAIN: those weights float32 on the device, cast to the same type in every
    step by the kernels' rt_bits.h rounding, the function the upload rounds with). The products
    read the same bits, so everything else must be the same bits too:
      - --list-params marks some frozen parameters, and only in FROZEN;
      - the saved parameters, the checkpoints (optimizer state included) and the logs of STEPS
        steps; every frozen parameter saved is the init's value exactly (the host's float32
        copy is what files are written from, never the device's rounded one);
      - FROZEN stopped half way and resumed (the upload rounds the checkpoint's values again);
      - FROZEN with --eval-async (its second arena gets the half values too);
      - a LoRA model's --save-adapter and --save-merged files, byte for byte."""
    os.makedirs(work, exist_ok=True)
    marked, unmarked = half_marked(frozen), half_marked(plain)
    assert any(marked.values()), f"--frozen-half: --list-params marks no frozen parameter as kept in half: {marked}"
    assert unmarked.keys() == marked.keys() and not any(unmarked.values()), \
        f"without --frozen-half --list-params marks {unmarked}"
    data = write_data(plain, work)
    init = os.path.join(work, "init.safetensors")
    write_init(plain, init)
    evals = write_eval_data(data, work)
    common = [*data, *evals, "--steps", str(steps), "--threads", "2", "--quiet", "--log-every", "2"]
    fresh = ["--init", init, "--no-shuffle", "--seed", "3"]
    lora = any(".lora_A." in k for k in st_load(init))
    outs = {}
    for tag, exe in (("plain", plain), ("frozen", frozen)):
        extra = ["--checkpoint-every", "3", "--checkpoint", os.path.join(work, f"{tag}.ckpt")]
        if lora:
            extra += ["--save-adapter", os.path.join(work, f"{tag}-adapter"), "--save-merged",
                      os.path.join(work, f"{tag}-merged.safetensors")]
        outs[tag] = train(exe, common + fresh, tag, work, *extra)

    def same_bits(a_path, b_path, what):
        a, b = st_load(a_path), st_load(b_path)
        assert a.keys() == b.keys(), f"--frozen-half: {what}: different tensors"
        for k in b:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), f"--frozen-half: {what}: {k} differs"
    (plain_log, plain_out), (frozen_log, frozen_out) = outs["plain"], outs["frozen"]
    same_bits(frozen_out, plain_out, "the saved parameters")
    same_bits(os.path.join(work, "frozen.ckpt"), os.path.join(work, "plain.ckpt"), "the final checkpoints")
    assert records(frozen_log) == records(plain_log), "--frozen-half: the logs differ"
    saved, p0 = st_load(frozen_out), st_load(init)
    for k in marked:
        assert np.array_equal(saved[k], p0[k].astype(np.float32)), f"--frozen-half: frozen {k} is not the init's"
    if lora:
        for f in ("adapter/adapter_model.safetensors", "adapter/adapter_config.json", "merged.safetensors"):
            a, b = (os.path.join(work, f"{tag}-{f}") for tag in ("frozen", "plain"))
            assert open(a, "rb").read() == open(b, "rb").read(), f"--frozen-half: {f} differs"

    stop = max(2, steps // 2 // 2 * 2)
    ckpt = os.path.join(work, "frozen-stopped.ckpt")
    train(frozen, common + fresh, "frozen-resumed", work, "--checkpoint", ckpt, "--stop-at", str(stop), expect=4)
    _, resumed = train(frozen, common, "frozen-resumed", work, "--resume", ckpt, "--checkpoint", ckpt)
    same_bits(resumed, frozen_out, f"stopped at step {stop} and resumed")
    n_async = compare_eval_async(frozen, [*common, *fresh], work, frozen_out, frozen_log, True)
    kept = [k for k, v in marked.items() if v]
    print(f"--frozen-half: {len(kept)} of {len(marked)} frozen parameters kept in half ({', '.join(kept)}); "
          f"{steps} steps: parameters, checkpoints and logs identical to the plain trainer's, frozen ones the "
          f"init's{', adapters and merged weights identical' if lora else ''}; resumed at step {stop}: identical; "
          f"--eval-async: {n_async} evaluations identical")


def main():
    if sys.argv[2] == "--frozen-half":
        return main_frozen_half(sys.argv[1], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    if sys.argv[2] == "--ranks" and sys.argv[4] == "--fp16":
        return main_fp16(sys.argv[1], int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]), sys.argv[8],
                         sys.argv[9], ranks=int(sys.argv[3]))
    if sys.argv[2] == "--ranks":
        return main_ranks(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6],
                          sys.argv[7])
    if sys.argv[2] in ("--bf16", "--fp16"):
        half = main_bf16 if sys.argv[2] == "--bf16" else main_fp16
        return half(sys.argv[1], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6],
                         sys.argv[7])
    work, steps, tol, cpu, emu = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.makedirs(work, exist_ok=True)
    data = write_data(cpu, work)
    init = os.path.join(work, "init.safetensors")
    write_init(cpu, init)
    evals = write_eval_data(data, work)
    common = [*data, *evals, "--steps", str(steps), "--threads", "2", "--quiet",
              "--log-every", "2"]
    fresh = ["--init", init, "--no-shuffle", "--seed", "3"]

    # checkpoints every 3 steps (a device trainer reads its sums back for each) and at the end,
    # where the optimizer state, laid out as the CPU's, is compared too
    every = ["--checkpoint-every", "3", "--checkpoint"]
    cpu_log, cpu_out = train(cpu, common + fresh, "cpu", work, *every, os.path.join(work, "cpu.ckpt"))
    emu_log, emu_out = train(emu, common + fresh, "emu", work, *every, os.path.join(work, "emu.ckpt"))
    worst, where = compare_params(emu_out, cpu_out, tol, "emulated vs CPU")
    worst_ckpt, where_ckpt = compare_params(os.path.join(work, "emu.ckpt"), os.path.join(work, "cpu.ckpt"), tol,
                                            "emulated vs CPU checkpoints")
    n, worst_loss, worst_acc = compare_logs(emu_log, cpu_log, tol)

    # blocks and threads in the opposite order: the same bits, or some kernel races
    _, reversed_out = train(emu, common + fresh, "emu-reversed", work, env=dict(os.environ, NETC_EMU_REVERSE="1"))
    a, b = st_load(reversed_out), st_load(emu_out)
    for k in b:
        assert np.array_equal(a[k], b[k]), f"blocks and threads in reverse order: {k} differs (a race in a kernel)"

    # stopped half way (an even step: a log boundary) and resumed: the same bits and losses
    stop = max(2, steps // 2 // 2 * 2)
    ckpt = os.path.join(work, "emu-stopped.ckpt")
    train(emu, common + fresh, "emu-resumed", work, "--checkpoint", ckpt, "--stop-at", str(stop), expect=4)
    _, resumed = train(emu, common, "emu-resumed", work, "--resume", ckpt, "--checkpoint", ckpt)
    a, b = st_load(resumed), st_load(emu_out)
    for k in b:
        assert np.array_equal(a[k], b[k]), f"resumed at step {stop}: {k} differs from the uninterrupted run"
    assert records(os.path.join(work, "emu-resumed.jsonl")) == records(emu_log), \
        f"resumed at step {stop}: the log differs from the uninterrupted run's"

    # the recipe changed on the command line: the device takes it from its state, as the CPU
    # trainer from RtCtx, so both still agree, and the emulated run moved off the plain one
    recipe = recipe_flags(cpu)
    _, cpu_recipe = train(cpu, common + fresh, "cpu-recipe", work, *recipe)
    _, emu_recipe = train(emu, common + fresh, "emu-recipe", work, *recipe)
    worst_recipe, _ = compare_params(emu_recipe, cpu_recipe, tol, f"{' '.join(recipe)}: emulated vs CPU")
    a, b = st_load(emu_recipe), st_load(emu_out)
    assert any(not np.array_equal(a[k], b[k]) for k in b), f"{' '.join(recipe)} left the emulated run as it was"

    n_async = compare_eval_async(emu, [*common, *fresh], work, emu_out, emu_log, True)
    n_step_evals = compare_step_evals(cpu, emu, [*common, *fresh], work, emu_out, steps, tol)
    for exe, args, needle in ((emu, data, "--eval-async needs the data to evaluate: add --eval-data"),
                              (emu, [*evals, "--eval-only", "--init", init], "leave out --eval-only and --predict"),
                              (cpu, [*data, *evals], "--eval-async evaluates on a second stream of a GPU trainer")):
        r = subprocess.run([exe, *args, "--eval-async"], capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, f"--eval-async refused: status {r.returncode}, {r.stderr!r}"
    acc = compare_accumulate(cpu, emu, common, fresh, data, work, tol, stop)

    # --eval-only on the saved weights: the device evaluates them as the run's final evaluation did
    eval_log = os.path.join(work, "emu-eval-only.jsonl")
    r = subprocess.run([emu, *evals, "--threads", "2", "--init", emu_out, "--eval-only", "--log", eval_log],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"--eval-only: exit status {r.returncode}:\n{r.stderr}"
    final = [x for x in records(emu_log) if x.get("eval")][-1]
    final.pop("epoch")
    assert records(eval_log) == [final], f"--eval-only logged {records(eval_log)}, the run's final evaluation {final}"
    worst_predict = compare_predict(cpu, emu, evals, emu_out, work, tol)

    # a NaN in the data: both stop at the same step, with the non-finite exit status
    nan = [*poisoned_data(cpu, data, work), "--steps", str(steps), "--threads", "2", "--quiet", "--log-every", "2",
           *fresh]
    at = nonfinite_step(cpu, nan), nonfinite_step(emu, nan)
    assert at[0] == at[1] and at[0] >= 3, \
        f"NaN in the third batch: the CPU trainer stops at step {at[0]}, the emulated one at {at[1]}"

    print(f"emulated vs CPU after {steps} steps: parameters {worst:.3g} ({where or 'identical'}), "
          f"final checkpoints {worst_ckpt:.3g} ({where_ckpt or 'identical'}), "
          f"{n} log records: losses {worst_loss:.3g}, accuracy {worst_acc:.3g}; "
          f"reverse block order: identical; stopped at step {stop} and resumed: identical; "
          f"NaN found by both at step {at[0]}; {' '.join(recipe)}: parameters {worst_recipe:.3g}; "
          f"--eval-only: the final evaluation; --predict: "
          f"{'no output' if worst_predict is None else f'{worst_predict:.3g}'}; --eval-async: the same weights "
          f"and {n_async} evaluations, logged later; --eval-every-steps 3: {n_step_evals} evaluations as the CPU's, "
          f"with --eval-async too; {acc}")


if __name__ == "__main__":
    main()
