"""The per-model work of tests/gpu/run.sh: train a model's CPU trainer and its CUDA trainer
(`netc --backend cuda`) from the same initial weights on the same data and compare what they
save; check that graph replay and `--no-graph` give the same bits; check that the GPU's loss
falls like the CPU's on learnable data.

    gpu_check.py prepare  --model M [--work DIR]     CPU side only: data, init weights, CPU run
    gpu_check.py check    --model M [--work DIR]     prepare (if not done) + GPU runs + comparisons
    gpu_check.py converge --model M [--work DIR]     learnable synthetic data, CPU and GPU loss curves
    gpu_check.py dist     --model M [--work DIR]     the distributed trainer at one rank = the plain one
    gpu_check.py fashion  [--work DIR]               LeNet on Fashion-MNIST, if the files are here
    gpu_check.py sanitize --model M [--tools T,...]  the GPU trainer under compute-sanitizer's tools
    gpu_check.py referee  [--nets N,...]             GPU trainers (fp32, bf16, fp16) against float64
    gpu_check.py compare  A.safetensors B.safetensors [--init I] [--tol T]

Every check prints one line `RESULT<TAB>check<TAB>model<TAB>status<TAB>detail` (status PASS,
FAIL, SKIPPED or FAILED-TO-RUN) for run.sh's table, and the command exits 1 when a check
failed. Without a GPU the GPU checks FAIL; they never pass silently. `--self-test` (for a machine without a GPU)
stands a CPU trainer built with `--layout=row-major` in for the GPU trainer, so that everything
but the CUDA build itself can be exercised anywhere: it proves the script, not the backend.

`prepare` needs no GPU: run it on a CPU machine and carry --work along when the GPU machine
cannot link CPU trainers (OpenBLAS, oneDNN) or to save device time; `check` reuses a prepared
directory whose configuration (model, -D values, steps, netc binary) matches.
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:
    sys.exit("gpu_check: numpy is missing (pip install numpy, or run with a python3 that has it)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fusion"))
sys.path.insert(0, os.path.join(ROOT, "tests", "gradcheck"))
sys.path.insert(0, HERE)
from netc_testlib import fashion_files, log_records, model_output, st_load, st_save  # noqa: E402
from train_pair import write_data  # noqa: E402  (64 samples shaped like the model's inputs)
import trainer_cache  # noqa: E402  (tests/gpu/trainer_cache.py: trainers built ahead, by content)
import random_nets  # noqa: E402  (tests/gradcheck/random_nets.py: the referee's nets)

SEED = 3

# Per model: the -D values (small, so that the CPU side is quick too); `steps` of the CPU/GPU
# parameter comparison and its tolerance `tol`; `converge`, the steps of the convergence check
# (0: none) and any -D values it adds (`converge_defs`); `pixels`, whether the model reads 0..255
# pixel values.
#
# The comparison starts both trainers from the same weights on the same batches. Both compute
# in strict float32 (the GPU trainer is built with --precision fp32: no TF32), so they differ
# only in summation order and algorithms: cuDNN's and cuBLASLt's against oneDNN's blocking and
# OpenBLAS's kernels, parallel reductions (batch-norm sums, bias gradients, the loss) split
# differently; ~1e-7 relative per operation (more where cuDNN picks Winograd or FFT
# convolutions, whose rounding is ~1e-5). Three measures, three tolerances:
#
#   loss at step 1      relative; the forward pass from identical weights on the same batch:
#                       1e-4, as tests/torch (LOSS_TOL) against PyTorch.
#   running statistics  max |gpu - cpu| / max |cpu| per batch-norm running mean and variance: they
#                       depend on the forward passes only. `stat_tol`.
#   parameters          per tensor ||gpu - cpu|| / ||cpu - init||: how far apart the two runs
#                       ended, relative to how far training moved that tensor. `tol`.
#
# Parameters do not stay close for long in networks with batch norm: a bias gradient is a sum
# over the batch and the pixels of terms that nearly cancel (the next batch norm removes each
# channel's mean), so its rounding is amplified ~1000x; a pre-activation within rounding of
# zero lands on the other side of a ReLU, and a near-tie in a max-pool routes a gradient to
# another pixel. Measured on the CPU between two trainers that differ in exactly this way
# (channels-last oneDNN against row-major im2col + OpenBLAS: `gpu_check.py check --self-test`):
#
#   lenet           20 steps   parameters 2.7e-6 (1.5e-7 as max-abs relative)   no statistics
#   resnet18_cifar   2 steps   parameters 2.3e-3 (1.5e-2 after 3, 9e-2 after 5)  statistics 2.2e-7
#   resnet50         1 step    parameters 2.6e-2 (0.7 after 2: chaotic)          statistics 8.7e-5
#
# (mlp has no convolution, so both CPU layouts give it the same bits; lenet's dense layers are
# its measure.) Hence few steps for the ResNets, and tolerances ~10x the measured values, since
# the GPU's algorithms may round more than the CPU's. A real bug (a wrong index, a missing
# gradient term, a batch staged twice, a transposed tensor) is off by O(1) of the update, and in
# the loss and statistics by far more than 1e-4. mlp and lenet run 20 steps with momentum, so
# they check the optimizer state across steps tightly; the bit-identity checks (graph replay,
# --no-graph, a second run) run GRAPH_STEPS steps of every model on the GPU alone.
# A model not in the table: its defaults (a batch of 8 when it declares one), 1 step, and the
# loosest tolerances below; give it its own entry once it has been measured.
DEFAULT = dict(defs=[], steps=1, tol=0.2, stat_tol=1e-3, converge=0, pixels=False)
DROPOUT_TWICE = "dropout draws new masks for each micro-batch: a batch given twice is not the batch once"
MODELS = {
    "mlp": dict(defs=["batch=32"], steps=20, tol=1e-3, stat_tol=1e-4, converge=60, pixels=True),
    "lenet": dict(defs=["batch=32"], steps=20, tol=1e-3, stat_tol=1e-4, converge=80, pixels=True,
                  converge_defs=["lr=0.03"]),  # at its lr of 0.01 LeNet needs several hundred steps
    "resnet18_cifar": dict(defs=["batch=16", "width=16"], steps=2, tol=3e-2, stat_tol=1e-4, converge=40,
                           pixels=False),
    "resnet50": dict(defs=["batch=8", "image_size=32"], steps=1, tol=0.2, stat_tol=1e-3, converge=0,
                     pixels=False, pack_reference=False),  # 2 x 102 MB of weights: over a pack's 64 MiB
    # The transformers at a few layers and a small width (their defaults' weights are hundreds of
    # MB): one AdamW step, the loosest tolerance (not yet measured on a GPU). `noise`: tensors
    # with elements whose gradient is zero in exact arithmetic (an attention key's bias: the
    # softmax ignores a shift of a row's scores), which AdamW moves by +-lr on either side's
    # rounding noise; checked finite only, and reported.
    "gpt2": dict(defs=["vocab=256", "seq=64", "n_layer=2", "n_head=4", "n_embd=64", "batch=4"], steps=1, tol=0.2,
                 stat_tol=1e-3, converge=0, pixels=False, noise=["attn.c_attn.bias"]),
    "bert": dict(defs=["vocab=256", "seq=64", "max_position=64", "n_layer=2", "n_head=4", "hidden=64",
                       "intermediate=128", "batch=4", "dropout=0"], steps=1, tol=0.2, stat_tol=1e-3, converge=0,
                 pixels=False, noise=["attention.self.key.bias"]),
    "llama": dict(defs=["seq=64", "n_layer=2", "batch=4"], steps=1, tol=0.2, stat_tol=1e-3, converge=0,
                  pixels=False),
    "vit": dict(defs=["depth=2", "batch=8"], steps=1, tol=0.2, stat_tol=1e-3, converge=0, pixels=False,
                noise=["attn.qkv.bias"]),
    # The emulation test's nets (tests/cuda/emu/, --models): their defaults, one step, the loosest
    # tolerances. features' first convolution has a bias before batch norm (a shift the norm
    # takes out again: zero gradient, noise); attention and lora draw dropout masks, new ones for
    # each of --accumulate's micro-batches.
    "features": dict(DEFAULT, defs=["batch=8"], noise=["conv1.bias"]),
    "attention": dict(DEFAULT, defs=["batch=8"], no_accumulate=DROPOUT_TWICE),
    "lora": dict(DEFAULT, defs=["batch=8"], no_accumulate=DROPOUT_TWICE),
}
GRAPH_STEPS = 8   # steps of the bit-identity checks: the graph replayed over several batches
LOSS_TOL = 1e-4
# --predict of the data with the CPU run's weights: the GPU trainer's output (copied off the device
# and converted on the host) against the CPU trainer's, max |gpu - cpu| over the output's largest
# magnitude. A forward pass from identical weights, as the loss at step 1, but judged element by
# element: ~1e-7 relative per operation, ~1e-5 per convolution where cuDNN picks Winograd or FFT,
# through up to ResNet-50's 53 layers (batch norm rescales each) stays below 1e-3; a wrong
# offset, row or layout of the copy is off by the output's own size.
PREDICT_TOL = 1e-3


class CheckFailed(Exception):
    pass


class CannotRun(CheckFailed):
    """This machine cannot build the CPU reference (no OpenBLAS, oneDNN): FAILED-TO-RUN, not FAIL."""


def say(*args):
    print(*args, flush=True)


def result(check, model, status, detail):
    say(f"RESULT\t{check}\t{model}\t{status}\t{detail}")
    return status != "FAIL"


# A run that has not ended after this many seconds is taken for a hang and killed, with every
# process it started: a GPU trainer of the checks' sizes starts and trains in seconds (ResNet-50's
# cuDNN plans and algorithm trials included, estimated), so 180 s is generous, and one hung
# trainer (a graph that never completes, an NCCL or MPI start-up waiting for a peer) becomes one
# FAIL row instead of taking the whole device command with it. `--timeout` or $NETC_GPU_TIMEOUT
# change it; `--deadline` (an absolute time, from run.sh) caps it.
RUN_TIMEOUT = 180.0
limits = {"timeout": RUN_TIMEOUT, "deadline": None}


class DeadlinePassed(CannotRun):
    """The run's --deadline came before this command could start: FAILED-TO-RUN, not FAIL."""


def failed(e):
    """The status of a check that raised e: FAILED-TO-RUN where this machine or the deadline kept
    it from running (CannotRun), else FAIL."""
    return "FAILED-TO-RUN" if isinstance(e, CannotRun) else "FAIL"


def run(cmd, what, **kw):
    """Run cmd; on failure, or when it outlives the time limit (`limits`), raise CheckFailed
    naming `what`, the command and its last output."""
    t0 = time.time()
    timeout = limits["timeout"]
    if limits["deadline"] is not None:
        left = limits["deadline"] - t0
        if left <= 1:
            raise DeadlinePassed(f"{what} not started: run.sh's --deadline had passed")
        timeout = min(timeout, left)
    cmd = [str(c) for c in cmd]
    # a session of its own, so that a kill reaches what the trainer started (an MPI singleton's
    # helpers) and nothing else
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        lines = (out + err).strip().splitlines()[-6:] or ["(no output)"]
        raise CheckFailed(f"{what} timed out: killed after {timeout:.0f} s (a hang? --timeout changes the "
                          f"limit)\n    command: {' '.join(cmd)}\n    " + "\n    ".join(lines))
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if p.returncode != 0:
        lines = (p.stdout + p.stderr).strip().splitlines() or ["(no output)"]
        # the trainer's own error line, not a banner printed after it (MPI_Abort's)
        why = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1])
        tail = lines[-8:] if why in lines[-8:] else [why, "...", *lines[-7:]]
        raise CheckFailed(f"{what} failed (exit {p.returncode}): {why.strip()}\n"
                          f"    command: {' '.join(map(str, cmd))}\n    " + "\n    ".join(tail))
    return p, time.time() - t0


# Where a model's .net file is: models/, or the emulation test's nets (tests/cuda/emu/), which
# exercise what the stock models leave out (views read in place and permute views, attention's
# variants, LAMB, LARS, ...).
MODEL_DIRS = ("models", os.path.join("tests", "cuda", "emu"))


def model_src(model):
    """The .net file of `model`: the first of MODEL_DIRS that has one (models/ when none has)."""
    for d in MODEL_DIRS:
        path = os.path.join(ROOT, d, f"{model}.net")
        if os.path.exists(path):
            return path
    return os.path.join(ROOT, MODEL_DIRS[0], f"{model}.net")


def model_config(model, src):
    cfg = dict(MODELS.get(model, DEFAULT))
    if model not in MODELS and re.search(r"^const\b.*\bbatch\s*=", open(src).read(), re.M):
        cfg["defs"] = ["batch=8"]
    return cfg


def has_gpu():
    """True when nvidia-smi lists a GPU (or, without nvidia-smi, the driver shows one)."""
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        return p.returncode == 0 and "GPU" in p.stdout
    gpus = "/proc/driver/nvidia/gpus"
    return os.path.isdir(gpus) and bool(os.listdir(gpus))


# ---- weights

def list_params(exe):
    """[(name, shape, kind)] from `TRAINER --list-params`; kind is '', 'buffer' or 'frozen'."""
    out, _ = run([exe, "--list-params"], "--list-params")
    params = []
    for line in out.stdout.splitlines():
        m = re.match(r"^(\S+)\s+\[([^\]]*)\]\s+\d+\s*(\w*)\s*$", line)
        if m:
            shape = tuple(int(d) for d in m.group(2).split(",") if d.strip())
            params.append((m.group(1), shape, m.group(3)))
    if not params:
        raise CheckFailed(f"{exe} --list-params printed no parameters")
    return params


def write_init(exe, path, seed=SEED):
    """PyTorch's default initialisation, drawn with numpy: weights of rank >= 2 and their
    biases uniform in +-1/sqrt(fan_in); batch-norm scale 1, shift 0, running mean 0, variance 1,
    num_batches_tracked 0. (The trainers cannot save before a step: --steps needs >= 1.)"""
    rng = np.random.default_rng(seed)
    params = list_params(exe)
    shapes = {name: shape for name, shape, _ in params}
    tensors = {}
    for name, shape, _ in params:
        stem, _, leaf = name.rpartition(".")
        weight = shapes.get(f"{stem}.weight", ())
        fan_in = int(np.prod(weight[1:])) if len(weight) >= 2 else 0
        if leaf == "num_batches_tracked":
            arr = np.zeros(shape, np.int64)
        elif leaf == "running_var" or (leaf == "weight" and len(shape) == 1):
            arr = np.ones(shape, np.float32)
        elif leaf == "weight" and len(shape) == 4:
            # torchvision's ResNets: kaiming_normal_(mode="fan_out", nonlinearity="relu")
            fan_out = shape[0] * int(np.prod(shape[2:]))
            arr = rng.normal(0, np.sqrt(2 / fan_out), shape).astype(np.float32)
        elif fan_in and leaf in ("weight", "bias"):
            bound = 1 / np.sqrt(fan_in)
            arr = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            arr = np.zeros(shape, np.float32)
        tensors[name] = arr
    st_save(path, tensors)


class Comparison:
    """Two weight files compared tensor by tensor (see MODELS for the measures)."""

    def __init__(self):
        self.problems = []          # one line per tensor out of tolerance
        self.worst = (0.0, "")      # parameters: the largest update error, and its tensor
        self.worst_stat = (0.0, "")  # running statistics: the largest relative difference
        self.worst_abs = (0.0, "")  # every float tensor: max |a - b| / max(|b|, |init|, 1e-3)
        self.differ = []            # tensors whose bits differ
        self.noise = []             # tensors checked finite only (compare's `noise`)

    @property
    def ok(self):
        return not self.problems


def compare(a_path, b_path, init_path=None, tol=0.0, stat_tol=0.0, noise=()):
    """Compare weight file A with the reference B. tol 0: every tensor must have the same bits.
    Otherwise integer tensors (num_batches_tracked) must be equal, running statistics within
    stat_tol of their largest magnitude, a tensor whose name contains one of `noise` finite
    (MODELS), and every other tensor T within tol in ||A - B|| / ||B - INIT||; a tensor that
    training did not move must equal INIT's bits."""
    a, b = st_load(a_path), st_load(b_path)
    init = st_load(init_path) if init_path else {}
    c = Comparison()
    if a.keys() != b.keys():
        c.problems.append(f"different tensors: {sorted(set(a) ^ set(b))[:5]}")
        return c
    for name in b:
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            c.problems.append(f"{name}: {x.dtype}{list(x.shape)} against {y.dtype}{list(y.shape)}")
            continue
        if x.tobytes() != y.tobytes():
            c.differ.append(name)
        if tol == 0 or x.dtype.kind in "iu" or not x.size:
            if x.tobytes() != y.tobytes():
                n = int(np.count_nonzero(x != y))
                c.problems.append(f"{name}: {n} of {x.size} elements differ (must be identical)")
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        if not np.all(np.isfinite(x64)):
            c.problems.append(f"{name}: not finite")
            continue
        i64 = init[name].astype(np.float64) if name in init else np.zeros_like(y64)
        abs_err = np.abs(x64 - y64).max() / max(np.abs(y64).max(), np.abs(i64).max(), 1e-3)
        c.worst_abs = max(c.worst_abs, (float(abs_err), name))
        if any(part in name for part in noise):
            c.noise.append(name)
            continue
        if "running_" in name:
            err = np.abs(x64 - y64).max() / max(np.abs(y64).max(), 1e-30)
            c.worst_stat = max(c.worst_stat, (float(err), name))
            if err > stat_tol:
                c.problems.append(f"{name}: running statistic off by {err:.3g} relative (tolerance {stat_tol:g})")
            continue
        moved = np.linalg.norm(y64 - i64)
        if moved == 0:
            if x.tobytes() != y.tobytes():
                c.problems.append(f"{name}: did not move in the reference but differs")
            continue
        err = float(np.linalg.norm(x64 - y64) / moved)
        c.worst = max(c.worst, (err, name))
        if err > tol:
            c.problems.append(f"{name}: ||a - b|| / ||b - init|| = {err:.3g} (tolerance {tol:g})")
    return c


def first_loss(log):
    rows = [json.loads(line) for line in open(log)]
    losses = [r["loss"] for r in rows if "step" in r and not r.get("eval")]
    if not losses or losses[0] is None:
        raise CheckFailed(f"{log}: no finite loss logged")
    return losses[0]


# ---- trainers and runs

def netc_path(args):
    netc = os.path.abspath(args.netc)
    if not os.access(netc, os.X_OK):
        raise CheckFailed(f"no netc at {netc}: build it (cmake -S . -B build && cmake --build build) "
                          "or pass --netc")
    return netc


def merge_defs(*lists):
    """NAME=VALUE lists, a later value of a NAME replacing an earlier one (netc refuses twice)."""
    merged = {}
    for d in (d for lst in lists for d in lst):
        merged[d.split("=", 1)[0]] = d
    return list(merged.values())


def build(args, model, cfg, out, extra, what, defs=(), fill=None):
    """netc's trainer of `model` at `out`, or the same one from the --trainers folder (a pack's);
    with `fill` (default: `gpu_check.py pack`'s) a trainer netc built is stored there."""
    flags = list(extra)
    for d in merge_defs(cfg["defs"], defs, args.define or []):
        flags += ["-D", d]
    build_src(args, model_src(model), flags, out, what, fill)


def build_src(args, src, flags, out, what, fill=None):
    """build() of the .net file `src` with netc's `flags` as they are."""
    try:
        how, seconds = trainer_cache.build(netc_path(args), src, flags, out, args.trainers,
                                           fill=getattr(args, "fill_trainers", False) if fill is None else fill)
    except subprocess.CalledProcessError as e:
        tail = (e.stdout + e.stderr).strip().splitlines()[-8:] or ["(no output)"]
        raise CheckFailed(f"{what} failed (exit {e.returncode}): {tail[-1].strip()}\n"
                          f"    command: {' '.join(map(str, e.cmd))}\n    " + "\n    ".join(tail))
    say(f"  {how} {what}: {os.path.relpath(out, ROOT)} ({seconds:.1f} s)")


def gpu_build_flags(args):
    if args.self_test:
        return ["--layout=row-major"]
    precision = getattr(args, "precision", None) or "fp32"
    return ["--backend", "cuda", "--precision", precision] + (["--arch", args.arch] if args.arch else [])


def train(exe, data, steps, init, save, extra=(), log=None, env=None):
    cmd = [exe, *data, "--steps", steps, "--no-shuffle", "--seed", SEED, "--quiet",
           "--init", init, "--save", save, *extra]
    if log:
        cmd += ["--log", log]
    _, seconds = run(cmd, f"training {os.path.basename(exe)}", env=env)
    say(f"  trained {os.path.basename(exe)} {' '.join(map(str, extra))} -> "
        f"{os.path.basename(save)} ({seconds:.1f} s)")


def model_dir(args, model):
    return os.path.join(os.path.abspath(args.work), model)


def config_stamp(args, model, cfg):
    """What a prepared CPU run depends on (contents, not times or paths: a prepared directory
    is meant to be carried to another machine)."""
    digest = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: E731
    return {"model": model, "defs": merge_defs(cfg["defs"], args.define or []), "steps": cfg["steps"],
            "netc_sha256": digest(netc_path(args)),
            "model_sha256": digest(model_src(model))}


def prepare(args, model, cfg):
    """The CPU side: trainer, data, init weights, and the CPU run's result. Reused when a
    directory prepared with the same configuration is already there."""
    work = model_dir(args, model)
    stamp_path = os.path.join(work, "prepared.json")
    stamp = config_stamp(args, model, cfg)
    files = {"cpu": os.path.join(work, "cpu"), "init": os.path.join(work, "init.safetensors"),
             "result": os.path.join(work, "cpu.safetensors"), "log": os.path.join(work, "cpu.jsonl"),
             "predict": os.path.join(work, "cpu-predict.npy")}
    if os.path.exists(stamp_path) and json.load(open(stamp_path)) == stamp and \
            all(os.path.exists(files[f]) for f in ("init", "result", "log")):
        say(f"  reusing the prepared CPU run in {os.path.relpath(work, ROOT)}")
    else:
        if os.path.exists(stamp_path):
            os.remove(stamp_path)
        os.makedirs(work, exist_ok=True)
        build_cpu(args, model, cfg, files["cpu"])
        write_data(files["cpu"], work)
        write_init(files["cpu"], files["init"])
        train(files["cpu"], data_args(work), cfg["steps"], files["init"], files["result"],
              ["--log-every", "1"], log=files["log"])
        predict(files["cpu"], work, files["result"], files["predict"])
        json.dump(stamp, open(stamp_path, "w"), indent=1)
    return work, files


def predict(exe, work, weights, out):
    """EXE --predict of the data's samples (the inputs the model's output reads, as its --help
    names them) with `weights`, into `out`; False for a model without an output."""
    output = model_output(exe)
    if not output:
        return False
    files = [a for name in output[1] for a in ("--predict", f"{name}={os.path.join(work, f'data-{name}.npy')}")]
    run([exe, *files, "--init", weights, "--predict-out", out, "--quiet"], f"--predict of {os.path.basename(exe)}")
    return True


def predict_result(model, gpu, work, files):
    """The gpu-predict check: the GPU trainer's --predict against the prepared CPU one's (PREDICT_TOL)."""
    if not os.path.exists(files["predict"]):
        return result("gpu-predict", model, "SKIPPED", "the model has no output (no --predict)")
    out = os.path.join(work, "gpu-predict.npy")
    try:
        predict(gpu, work, files["result"], out)
    except CheckFailed as e:
        say(str(e))
        return result("gpu-predict", model, failed(e), str(e).splitlines()[0])
    got, want = np.load(out), np.load(files["predict"])
    if got.shape != want.shape:
        return result("gpu-predict", model, "FAIL", f"an array {got.shape}, the CPU trainer's {want.shape}")
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / max(float(np.max(np.abs(want))), 1e-30) \
        if want.size else 0.0
    return result("gpu-predict", model, "PASS" if err <= PREDICT_TOL else "FAIL",
                  f"{want.shape[0]} samples of {list(want.shape[1:])}: {err:.1e} of the output's scale "
                  f"(tol {PREDICT_TOL:g})")


def data_args(work):
    args = []
    for name in sorted(os.listdir(work)):
        m = re.fullmatch(r"data-(\w+)\.npy", name)
        if m:
            args += ["--data", f"{m.group(1)}={os.path.join(work, name)}"]
    return args


def cmd_prepare(args):
    model = args.model
    cfg = model_config(model, model_src(model))
    try:
        prepare(args, model, cfg)
        return result("prepare", model, "PASS", f"CPU run of {cfg['steps']} steps in {args.work}/{model}")
    except CheckFailed as e:
        say(str(e))
        return result("prepare", model, "FAIL", str(e).splitlines()[0])


def compare_with_cpu(model, cfg, gpu_result, files, loss_cpu, loss_gpu):
    """The cpu-vs-gpu check: loss at step 1, running statistics and parameters (see MODELS)."""
    c = compare(gpu_result, files["result"], files["init"], cfg["tol"], cfg["stat_tol"], cfg.get("noise", ()))
    loss_err = abs(loss_gpu - loss_cpu) / max(abs(loss_cpu), 1e-30)
    if loss_err > LOSS_TOL:
        c.problems.insert(0, f"loss at step 1: GPU {loss_gpu:.8g}, CPU {loss_cpu:.8g} "
                             f"(relative {loss_err:.2g} > {LOSS_TOL:g})")
    for m in c.problems[:10]:
        say("  " + m)
    stats = f", statistics {c.worst_stat[0]:.1e} (tol {cfg['stat_tol']:g})" if c.worst_stat[1] else ""
    return result("cpu-vs-gpu", model, "PASS" if c.ok else "FAIL",
                  f"{cfg['steps']} step{'s' if cfg['steps'] != 1 else ''}: loss@1 {loss_err:.1e} "
                  f"(tol {LOSS_TOL:g}), parameters {c.worst[0]:.1e} {c.worst[1]} (tol {cfg['tol']:g})"
                  f"{stats}; max-abs {c.worst_abs[0]:.1e}"
                  f"{f'; not judged (rounding noise): {len(c.noise)} tensors' if c.noise else ''}")


def cmd_check(args):
    model = args.model
    label = "self-test: CPU row-major stands in for the GPU" if args.self_test else "GPU fp32"
    cfg = model_config(model, model_src(model))
    if args.tol is not None:
        cfg["tol"] = args.tol
    say(f"== {model} ({' '.join('-D ' + d for d in merge_defs(cfg['defs'], args.define or []))}), "
        f"{cfg['steps']} step(s) against the CPU, {GRAPH_STEPS} for the bit checks, {label}")
    checks = ("cpu-vs-gpu", "gpu-deterministic", "graph-vs-no-graph", "accumulate")
    try:
        work, gpu = gpu_work(args, model)
        build(args, model, cfg, gpu, gpu_build_flags(args),
              "stand-in trainer (CPU, row-major)" if args.self_test else "GPU trainer")
    except CheckFailed as e:
        say(str(e))
        for check in checks:
            result(check, model, failed(e), str(e).splitlines()[0])
        return False
    ok = True
    try:
        _, files = prepare(args, model, cfg)
        cpu_error = None
    except CheckFailed as e:
        # the bit checks need no CPU trainer: data and init weights from the GPU trainer's
        # --help and --list-params, which work without touching the device
        say(str(e))
        cpu_error = str(e).splitlines()[0]
        # the GPU machine cannot build CPU trainers (no OpenBLAS, oneDNN): the reference comes
        # prepared from a CPU machine (pack.sh), and where it does not, this check did not run
        ok &= result(checks[0], model, failed(e),
                     f"no CPU reference: {cpu_error}")
        files = {"init": os.path.join(work, "init.safetensors")}
        write_data(gpu, work)
        write_init(gpu, files["init"])
    try:
        data = data_args(work)
        saved = {}
        if not cpu_error:
            saved["cpu-steps"] = os.path.join(work, "gpu.safetensors")
            train(gpu, data, cfg["steps"], files["init"], saved["cpu-steps"], ["--log-every", "1"],
                  log=os.path.join(work, "gpu.jsonl"))
        for name, extra in (("graph", []), ("graph-again", []),
                            ("no-graph", [] if args.self_test else ["--no-graph"])):
            saved[name] = os.path.join(work, f"gpu-{name}.safetensors")
            train(gpu, data, GRAPH_STEPS, files["init"], saved[name], extra)
        twice = None if cfg.get("no_accumulate") else batches_twice(gpu, work, data)
        if twice:
            saved["accumulate"] = os.path.join(work, "gpu-accumulate.safetensors")
            train(gpu, twice, GRAPH_STEPS, files["init"], saved["accumulate"], ["--accumulate", "2"])
        if not cpu_error:
            loss_cpu, loss_gpu = first_loss(files["log"]), first_loss(os.path.join(work, "gpu.jsonl"))
    except CheckFailed as e:
        say(str(e))
        for check in checks[1 if cpu_error else 0:]:
            result(check, model, failed(e), str(e).splitlines()[0])
        return False

    if not cpu_error:
        ok &= compare_with_cpu(model, cfg, saved["cpu-steps"], files, loss_cpu, loss_gpu)
        ok &= predict_result(model, gpu, work, files)
    for check, other in zip(checks[1:], ("graph-again", "no-graph")):
        ok &= bit_result(check, model, saved[other], saved["graph"],
                         " (self-test: both plain CPU runs)" if args.self_test else "")
    if "accumulate" in saved:
        ok &= bit_result("accumulate", model, saved["accumulate"], saved["graph"],
                         ", --accumulate 2 on each batch twice (the device's sum, halved)")
    else:
        result("accumulate", model, "SKIPPED", cfg.get("no_accumulate") or
               "batch norm moves its running statistics once per batch: a batch given twice is not the batch once")
    return ok


def batches_twice(exe, work, data):
    """--data arguments of the data with each batch given twice in a row (--no-shuffle's order),
    or None for a model with running statistics. With --accumulate 2 the device then sums each
    batch's gradients twice and halves them - (g + g) / 2 is g exactly, as (l + l) / 2 is the
    loss - so the run must give the plain run's bits."""
    if any("running_" in name for name, _, _ in list_params(exe)):
        return None
    help_text, _ = run([exe, "--help"], "--help")
    batch = int(re.search(r"batch (\d+)\)", help_text.stdout).group(1))
    out = []
    for opt, spec in zip(data[::2], data[1::2]):
        name, path = spec.split("=", 1)
        arr = np.load(path)
        whole = len(arr) // batch * batch
        blocks = arr[:whole].reshape(whole // batch, batch, *arr.shape[1:])
        doubled = os.path.join(work, f"twice-{name}.npy")
        np.save(doubled, np.repeat(blocks, 2, axis=0).reshape(2 * whole, *arr.shape[1:]))
        out += [opt, f"{name}={doubled}"]
    return out


def gpu_work(args, model):
    """The model's work folder, made, and its CUDA trainer's path there (a CPU stand-in's under
    --self-test); CheckFailed on a machine without a GPU."""
    if not args.self_test and not has_gpu():
        raise CheckFailed("no GPU on this machine (nvidia-smi -L lists none): the GPU checks cannot run")
    work = model_dir(args, model)
    os.makedirs(work, exist_ok=True)
    return work, os.path.join(work, "gpu-selftest" if args.self_test else "gpu")


def bit_result(check, model, path, ref, note):
    """A check that weight file `path` has the bits of `ref` after GRAPH_STEPS steps."""
    c = compare(path, ref)
    for m in c.problems[:10]:
        say("  " + m)
    detail = f"{GRAPH_STEPS} steps: bit-identical" if c.ok else \
        f"{len(c.differ)} tensors differ, first {c.differ[0] if c.differ else '?'}"
    return result(check, model, "PASS" if c.ok else "FAIL", detail + note)


# ---- a distributed trainer at one rank

# The models whose distributed GPU trainer (netc --distributed) is checked: 64 KiB buckets cut
# ResNet-18's gradients into several, so its captured graph forks and joins the NCCL stream more
# than once.
DIST_MODELS = ("mlp", "lenet", "resnet18_cifar")
DIST_FLAGS = ["--distributed", "--bucket-kib", "64"]
# Each as: its check's name, netc's flags, the trainer's suffix. With --shard-optimizer one rank's
# slices are the whole buffer, updated in place by the plain trainer's arithmetic (none of these
# models clips its gradients, whose norm the sharded update adds up in another order).
DIST_VARIANTS = (("dist-1-rank", DIST_FLAGS, "-dist"),
                 ("shard-1-rank", DIST_FLAGS + ["--shard-optimizer"], "-dist-shard"))


def singleton_env():
    """One rank started without mpirun (the GPU machine has none): Open MPI's singleton, without
    the daemon it would start; the pack's Open MPI when run.sh found one (OPAL_PREFIX)."""
    env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1", OMPI_MCA_mca_base_component_show_load_errors="0")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def stand_in_env(args, env=None):
    """The environment of a distributed check's run. Under --self-test the trainers are CPU
    stand-ins, and the plain one computes a weight gradient in row blocks (its update fused into
    the backward pass) that the distributed one computes in one product: OpenBLAS's AVX2 kernels
    (Zen, Haswell) round a product cut in blocks differently, so both then run netc's reference
    product (NETC_GEMM=reference, docs/trainer.md), whose bits depend on the operands alone."""
    env = dict(env or os.environ)
    if args.self_test:
        env["NETC_GEMM"] = "reference"
    return env


def cmd_dist(args):
    """The distributed trainer as one rank equals the plain trainer, bit for bit: its bucket
    means (ncclAvg over one rank) and loss sum return their inputs, and the split of the step's
    end divides the loss by 1; so does the one whose optimizer is sharded (its bucket slices
    reduced onto rank 0, its updated slices broadcast from it). All replay their graphs for
    GRAPH_STEPS steps."""
    model = args.model
    if model not in DIST_MODELS:
        say(f"== {model}: not one of the distributed check's models ({', '.join(DIST_MODELS)})")
        return True
    cfg = model_config(model, model_src(model))
    ok, plain_saved = True, None
    for check, flags, suffix in DIST_VARIANTS:
        say(f"== {model}: the distributed trainer ({' '.join(flags)}) at one rank against the plain one")
        try:
            work, plain = gpu_work(args, model)
            dist = plain + suffix
            build(args, model, cfg, plain, gpu_build_flags(args), "trainer")
            build(args, model, cfg, dist, gpu_build_flags(args) + flags, "distributed trainer")
            init = os.path.join(work, "init.safetensors")
            if not os.path.exists(init) or not data_args(work):  # the check step's, else the trainer's own
                write_data(plain, work)
                write_init(plain, init)
            saved = [os.path.join(work, f"{name}.safetensors") for name in ("gpu-plain", f"gpu{suffix}1")]
            # the distributed one first: where it cannot start (MPI, NCCL), that is what the row says
            train(dist, data_args(work), GRAPH_STEPS, init, saved[1], env=stand_in_env(args, singleton_env()))
            if plain_saved is None:  # once for both
                train(plain, data_args(work), GRAPH_STEPS, init, saved[0], env=stand_in_env(args))
                plain_saved = saved[0]
        except CheckFailed as e:
            say(str(e))
            ok = result(check, model, failed(e), str(e).splitlines()[0]) and ok
            continue
        ok = bit_result(check, model, saved[1], saved[0], " (self-test: CPU trainers)" if args.self_test else "") and ok
    return ok


# ---- convergence on learnable data

def smooth_templates(rng, shape):
    """10 random patterns of `shape`, constant over 4x4 blocks of the last two axes, so that
    convolutions and pooling see them as clearly as a dense layer does."""
    if len(shape) < 2:
        return rng.normal(size=(10,) + shape)
    h, w = shape[-2], shape[-1]
    coarse = rng.normal(size=(10,) + shape[:-2] + (-(-h // 4), -(-w // 4)))
    return coarse.repeat(4, axis=-2).repeat(4, axis=-1)[..., :h, :w]


def write_learnable(exe, work, samples, pixels, seed):
    """Inputs a model can learn: 10 classes, each a fixed smooth random template; a sample is
    its class's template plus half as much noise per element. Pixel models (inputs divided
    by 255 in the .net) get values 128 +- 80 in 0..255, the others unit scale. Returns the
    --data arguments."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    rng = np.random.default_rng(seed)
    templates_rng = np.random.default_rng(11)  # the same classes in training and evaluation data
    inputs = re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\]", text, re.M)
    labels = rng.integers(0, 10, samples)
    args = []
    for name, dt, dims in inputs:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
        if dt == "i64":
            arr = labels.astype(np.int64)
        else:
            templates = smooth_templates(templates_rng, shape)
            arr = templates[labels] + 0.5 * rng.normal(size=(samples,) + shape)
            arr = np.clip(128 + 80 * arr, 0, 255) if pixels else arr
            arr = arr.astype(np.float32)
        path = os.path.join(work, f"{name}.npy")
        np.save(path, arr)
        args += [f"{name}={path}"]
    return args


def read_log(path):
    rows = [json.loads(line) for line in open(path)]
    losses = [r["loss"] for r in rows if "step" in r and not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    return losses, evals[-1] if evals else None


def prepare_stamp(args, what, model, defs, **more):
    """A prepared CPU side's configuration: reused only when all of it is the same."""
    digest = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: E731
    return {"what": what, "model": model, "defs": merge_defs(defs, args.define or []),
            "netc_sha256": digest(netc_path(args)),
            "model_sha256": digest(model_src(model)), **more}


def reuse(work, stamp, files):
    path = os.path.join(work, "prepared.json")
    if os.path.exists(path) and json.load(open(path)) == stamp and all(os.path.exists(f) for f in files):
        say(f"  reusing the prepared CPU run in {os.path.relpath(work, ROOT)}")
        return True
    if os.path.exists(path):
        os.remove(path)
    return False


def build_cpu(args, model, cfg, out, defs=()):
    """A CPU trainer (never stored with the GPU trainers: the GPU machine cannot run one)."""
    try:
        build(args, model, cfg, out, [], "CPU trainer", defs, fill=False)
    except CheckFailed as e:
        raise CannotRun(f"{e}\n  (the CPU backend links OpenBLAS, oneDNN, cJSON and zlib: where they are "
                        f"missing, prepare the CPU side on a CPU machine: tests/gpu/pack.sh)")


def npy_args(flag, folder):
    """--data NAME=folder/NAME.npy for every .npy in folder (paths made here: a prepared folder moves)."""
    return [a for name in sorted(os.listdir(folder)) if name.endswith(".npy")
            for a in (flag, f"{name[:-4]}={os.path.join(folder, name)}")]


def prepare_converge(args, model, cfg, steps):
    """The convergence check's CPU side, shared by every --precision: learnable data, the init
    weights, the CPU run's log. Prepared on a CPU machine by pack.sh, reused on the GPU machine."""
    work = os.path.join(model_dir(args, model), "converge")
    stamp = prepare_stamp(args, "converge", model, cfg["defs"] + cfg.get("converge_defs", []), steps=steps)
    init, log = os.path.join(work, "init.safetensors"), os.path.join(work, "cpu.jsonl")
    if not reuse(work, stamp, [init, log]):
        os.makedirs(work, exist_ok=True)
        for sub in ("train", "eval"):
            shutil.rmtree(os.path.join(work, sub), ignore_errors=True)
            os.makedirs(os.path.join(work, sub))
        cpu = os.path.join(work, "cpu")
        more = cfg.get("converge_defs", [])
        build_cpu(args, model, cfg, cpu, more)
        batch = int(next(d.split("=")[1] for d in merge_defs(cfg["defs"], more, args.define or []) + ["batch=8"]
                         if d.startswith("batch=")))
        write_learnable(cpu, os.path.join(work, "train"), batch * 16, cfg["pixels"], 1)
        write_learnable(cpu, os.path.join(work, "eval"), batch * 8, cfg["pixels"], 2)
        write_init(cpu, init)
        train(cpu, converge_data(work), steps, init, os.path.join(work, "cpu.safetensors"), ["--log-every", "4"],
              log=log)
        json.dump(stamp, open(os.path.join(work, "prepared.json"), "w"), indent=1)
    return work, init, log


def converge_data(work):
    return npy_args("--data", os.path.join(work, "train")) + npy_args("--eval-data", os.path.join(work, "eval"))


def cmd_converge(args):
    """Train the CPU and the GPU trainer from the same init on learnable synthetic data for a
    few epochs. Passes when the GPU's training loss (the mean of the last three logged values)
    falls under half its first logged value and ends within 50% (+0.05) of the CPU's, and its
    evaluation accuracy is at most 0.05 below the CPU's. Two fp32 runs drift apart by rounding
    (and a ResNet's chaotically, see MODELS) but learn the same thing; a wrong gradient or
    update does not learn, or learns far slower. The CPU side may come prepared (pack.sh)."""
    model = args.model
    check_name = "converge" if args.precision == "fp32" else f"converge-{args.precision}"
    cfg = model_config(model, model_src(model))
    steps = args.steps or cfg["converge"]
    if not steps:
        return result(check_name, model, "SKIPPED", "not configured for this model (slow on the CPU side; "
                      "gpu_check.py converge --steps N runs it)")
    try:
        if not args.self_test and not has_gpu():
            raise CheckFailed("no GPU on this machine (nvidia-smi -L lists none)")
        work, init, cpu_log = prepare_converge(args, model, cfg, steps)
        gpu = os.path.join(work, f"gpu-{args.precision}")
        build(args, model, cfg, gpu, gpu_build_flags(args), "GPU trainer", cfg.get("converge_defs", []))
        log = os.path.join(work, f"gpu-{args.precision}.jsonl")
        train(gpu, converge_data(work), steps, init, os.path.join(work, f"gpu-{args.precision}.safetensors"),
              ["--log-every", "4"], log=log)
        curves = {"cpu": read_log(cpu_log), "gpu": read_log(log)}
    except CheckFailed as e:
        say(str(e))
        return result(check_name, model, failed(e),
                      str(e).splitlines()[0])
    (cl, ce), (gl, ge) = curves["cpu"], curves["gpu"]
    say(f"  loss every 4 steps, cpu: {' '.join(f'{x:.3f}' for x in cl)}")
    say(f"  loss every 4 steps, gpu: {' '.join(f'{x:.3f}' if x is not None else 'nan' for x in gl)}")
    problems = []
    if not gl or any(x is None for x in gl) or len(gl) < 3:
        problems.append("the GPU loss is missing or not finite")
        gl = [float("nan")] * 3
    tail = lambda curve: sum(curve[-3:]) / 3  # noqa: E731  (steps 4 apart: less noisy than one)
    if not tail(gl) < 0.5 * gl[0]:
        problems.append(f"GPU loss fell only from {gl[0]:.3f} to {tail(gl):.3f}")
    if not abs(tail(gl) - tail(cl)) <= 0.5 * tail(cl) + 0.05:
        problems.append(f"GPU loss ends at {tail(gl):.3f}, the CPU's at {tail(cl):.3f}")
    acc = lambda e: e.get("accuracy") if e else None  # noqa: E731
    if acc(ce) is not None and (acc(ge) is None or acc(ge) < acc(ce) - 0.05):
        problems.append(f"eval accuracy GPU {acc(ge)} vs CPU {acc(ce)}")
    detail = (f"{steps} steps: loss {gl[0]:.3f} -> {tail(gl):.3f} (CPU {cl[0]:.3f} -> {tail(cl):.3f}), "
              f"eval accuracy {acc(ge)} (CPU {acc(ce)})") if not problems else "; ".join(problems)
    if args.precision == "fp16":  # the dynamic loss scale where the run ended, and its skips
        last = [json.loads(x) for x in open(log) if '"loss_scale"' in x]
        if last:
            detail += f"; loss scale {last[-1]['loss_scale']:g}, {last[-1]['skipped_steps']} steps skipped"
    ok = result(check_name, model, "FAIL" if problems else "PASS", detail)
    if args.precision == "fp32":
        ok = eval_async(args, model, gpu, work, steps, init, log) and ok
    return ok


def eval_async(args, model, gpu, work, steps, init, log):
    """The converge run again with --eval-async: each evaluation on a second stream and arena,
    beside the training steps that follow it, from a copy of the parameters. The same weights
    bit for bit, the same step records and the same evaluations bit for bit (the same kernels and
    plans on the same parameters: docs/cuda.md); an evaluation that raced the training steps, read
    the training arena or lost a batch would not give them. Every evaluation of the run overlaps
    training but the last."""
    if args.self_test:
        return result("eval-async", model, "SKIPPED", "--self-test: a CPU trainer has no --eval-async")
    plain = os.path.join(work, "gpu-fp32.safetensors")
    out = os.path.join(work, "gpu-eval-async.safetensors")
    async_log = os.path.join(work, "gpu-eval-async.jsonl")
    try:
        train(gpu, converge_data(work), steps, init, out, ["--log-every", "4", "--eval-async"], log=async_log)
    except CheckFailed as e:
        say(str(e))
        return result("eval-async", model, failed(e), str(e).splitlines()[0])
    split = lambda rs: ([r for r in rs if not r.get("eval")], [r for r in rs if r.get("eval")])  # noqa: E731
    (steps_a, evals_a), (steps_s, evals_s) = split(log_records(async_log)), split(log_records(log))
    problems = []
    if open(out, "rb").read() != open(plain, "rb").read():
        c = compare(out, plain)
        problems.append(f"--eval-async changed the trained weights ({len(c.differ)} tensors differ)")
    if steps_a != steps_s:
        problems.append("--eval-async changed the step records")
    if not evals_s or evals_a != evals_s:
        problems.append(f"evaluations with --eval-async {evals_a[:2]}..., without {evals_s[:2]}...")
    for m in problems:
        say("  " + m)
    return result("eval-async", model, "FAIL" if problems else "PASS",
                  "; ".join(problems) if problems else
                  f"{steps} steps, {len(evals_s)} evaluations beside training: the same weights and evaluations, "
                  "bit for bit")


# The Fashion-MNIST check trains on the first FASHION_TRAIN training images and evaluates on the
# first FASHION_TEST test images: fashion_data writes them into the work directory as idx files
# (6.3 MiB gzipped where the four original files are 29 MiB), so that a pack carries them within
# its 64 MiB and the GPU machine needs no copy of the data set. Three epochs in file order at
# lr 0.03: measured on the CPU (12 runs, seeds 1-6, channels-last and row-major trainers) the test
# accuracy ends at 0.78-0.82.
FASHION_TRAIN, FASHION_TEST = 10000, 5000
FASHION_CFG = dict(MODELS["lenet"], defs=["batch=64", "lr=0.03"])
FASHION_STEPS = 3 * FASHION_TRAIN // 64


def write_idx_head(src, dst, n):
    """The first n items of the idx file src (gzipped) as the idx file dst, gzipped with no
    name or time in its header (the same bytes on every machine), written atomically."""
    with gzip.open(src, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = list(struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim]))
    if data[:2] != b"\0\0" or data[2] != 0x08 or dims[0] < n:
        raise CheckFailed(f"{src}: not an idx file of at least {n} unsigned bytes items")
    item = 1
    for d in dims[1:]:
        item *= d
    body = data[4 + 4 * ndim:4 + 4 * ndim + n * item]
    tmp = dst + ".tmp"
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        f.write(data[:4] + struct.pack(">" + "I" * ndim, n, *dims[1:]) + body)
    os.replace(tmp, dst)


def fashion_data(args):
    """The check's four files in WORK/fashion/data (written from the original files in
    NETC_FASHION_DIR where they are not there yet; a pack carries them) and the trainer's options
    that read them. CannotRun when neither is there: the GPU machine has no network."""
    out = os.path.join(os.path.abspath(args.work), "fashion", "data")
    src = fashion_files("train") + fashion_files("test")
    files = [os.path.join(out, os.path.basename(f)) for f in src]
    if not all(os.path.exists(f) for f in files):
        missing = [f for f in src if not os.path.exists(f)]
        if missing:
            raise CannotRun(f"no Fashion-MNIST subset in {out} and no {missing[0]} to write it from "
                            "(a pack made without --no-fashion carries it; or set NETC_FASHION_DIR)")
        os.makedirs(out, exist_ok=True)
        for f, dst, n in zip(src, files, (FASHION_TRAIN, FASHION_TRAIN, FASHION_TEST, FASHION_TEST)):
            write_idx_head(f, dst, n)
    return files, ["--data", f"image={files[0]}", "--data", f"label={files[1]}",
                   "--eval-data", f"image={files[2]}", "--eval-data", f"label={files[3]}"]


def prepare_fashion(args):
    """The Fashion-MNIST check's CPU side: init weights and the CPU run's log."""
    work = os.path.join(os.path.abspath(args.work), "fashion")
    files, data = fashion_data(args)
    stamp = prepare_stamp(args, "fashion", "lenet", FASHION_CFG["defs"], steps=FASHION_STEPS,
                          data_bytes=[os.path.getsize(f) for f in files])
    init, log = os.path.join(work, "init.safetensors"), os.path.join(work, "cpu.jsonl")
    if not reuse(work, stamp, [init, log]):
        os.makedirs(work, exist_ok=True)
        cpu = os.path.join(work, "cpu")
        build_cpu(args, "lenet", FASHION_CFG, cpu)
        write_init(cpu, init)
        train(cpu, data, FASHION_STEPS, init, os.path.join(work, "cpu.safetensors"), log=log)
        json.dump(stamp, open(os.path.join(work, "prepared.json"), "w"), indent=1)
    return work, init, log


def cmd_fashion(args):
    """LeNet, three epochs of the Fashion-MNIST subset (fashion_data) in file order on the GPU
    (fp32): test accuracy at least 0.75 and within 0.04 of the CPU trainer's from the same init.
    Measured on the CPU: 0.78-0.82 (12 runs); a channels-last and a row-major trainer from the
    same init, whose rounding differs as the GPU's does, end up to 0.022 apart over the 468
    steps (6 seeds), so 0.04 is that with room. A broken trainer stays far below 0.75 (chance is
    0.1). Without the files (no pack's, no NETC_FASHION_DIR) this is FAILED-TO-RUN. The CPU side
    may come prepared (pack.sh)."""
    model = "lenet"
    try:
        _, data = fashion_data(args)
        if not args.self_test and not has_gpu():
            raise CheckFailed("no GPU on this machine (nvidia-smi -L lists none)")
        work, init, cpu_log = prepare_fashion(args)
        gpu = os.path.join(work, "gpu")
        build(args, model, FASHION_CFG, gpu, gpu_build_flags(args), "GPU trainer")
        log = os.path.join(work, "gpu.jsonl")
        train(gpu, data, FASHION_STEPS, init, os.path.join(work, "gpu.safetensors"), log=log)
        accs = {"cpu": (read_log(cpu_log)[1] or {}).get("accuracy"), "gpu": (read_log(log)[1] or {}).get("accuracy")}
    except CheckFailed as e:
        say(str(e))
        return result("fashion-mnist", model, failed(e),
                      str(e).splitlines()[0])
    good = accs["gpu"] is not None and accs["gpu"] >= 0.75 and abs(accs["gpu"] - accs["cpu"]) <= 0.04
    return result("fashion-mnist", model, "PASS" if good else "FAIL",
                  f"3 epochs of {FASHION_TRAIN} images: test accuracy ({FASHION_TEST} images) GPU {accs['gpu']} "
                  f"CPU {accs['cpu']} (need >= 0.75, within 0.04)")


# compute-sanitizer's tools over a few steps of each GPU trainer: memcheck (out-of-bounds and
# misaligned accesses in our kernels and the libraries', device memory left allocated at exit),
# racecheck (shared-memory hazards: the reductions, attention), initcheck (reads of device memory
# never written: an arena slot read before the node that fills it). Each is a FAIL row with the
# first error and where it was; 10-100x slower than a plain run, so two steps of the check's
# small configurations.
SANITIZE_STEPS = 2
SANITIZE_TOOLS = {"memcheck": ["--leak-check", "full"], "racecheck": [], "initcheck": []}
SANITIZE_EXIT = 97  # --error-exitcode: errors found, told apart from the trainer's own exit status


def sanitizer_home():
    return os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer")


def sanitizer():
    """compute-sanitizer: $NETC_COMPUTE_SANITIZER, on PATH, or in $CUDA_HOME/bin
    (default /usr/local/cuda); None when there is none."""
    for path in (os.environ.get("NETC_COMPUTE_SANITIZER"), shutil.which("compute-sanitizer"), sanitizer_home()):
        if path:
            return path if os.access(path, os.X_OK) else None
    return None


def sanitizer_report(path):
    """(the first error with the line that says where, the summary line) from a compute-sanitizer
    log: its lines begin '========= '."""
    lines = [line[10:].strip() for line in open(path, errors="replace") if line.startswith("========= ")]
    lines = [line for line in lines if line and line != "COMPUTE-SANITIZER"]
    summary = next((line for line in lines if "SUMMARY" in line), "no summary line")
    report = [line for line in lines if "SUMMARY" not in line]
    first = report[0] if report else "no error reported"
    where = next((line for line in report[1:4] if line.startswith("at ")), "")
    return f"{first}{f' {where}' if where else ''}", summary


def cmd_sanitize(args):
    """The model's GPU trainer (the check's build, data and initial weights) under each of
    compute-sanitizer's tools for SANITIZE_STEPS steps: PASS when the tool reports no error;
    FAIL with its first error and where; FAILED-TO-RUN where there is no compute-sanitizer or it
    cannot use the GPU. Under --self-test, $NETC_COMPUTE_SANITIZER names a stand-in."""
    model = args.model
    cfg = model_config(model, model_src(model))
    tools = args.tools.split(",")
    try:
        unknown = [t for t in tools if t not in SANITIZE_TOOLS]
        if unknown:
            raise CheckFailed(f"unknown tool {unknown[0]} (choose from {', '.join(SANITIZE_TOOLS)})")
        san = sanitizer()
        if not san:
            raise CannotRun(f"no compute-sanitizer: none at $NETC_COMPUTE_SANITIZER, on PATH or at {sanitizer_home()}")
        work, gpu = gpu_work(args, model)
        build(args, model, cfg, gpu, gpu_build_flags(args),
              "stand-in trainer (CPU, row-major)" if args.self_test else "GPU trainer")
        init = os.path.join(work, "init.safetensors")
        if not data_args(work) or not os.path.exists(init):  # no prepared CPU side: the trainer's own
            write_data(gpu, work)
            write_init(gpu, init)
        data = data_args(work)
    except CheckFailed as e:
        say(str(e))
        for tool in tools:
            result(f"sanitize-{tool}", model, failed(e), str(e).splitlines()[0])
        return False
    ok = True
    for tool in tools:
        log = os.path.join(work, f"sanitize-{tool}.log")
        if os.path.exists(log):
            os.remove(log)
        cmd = [san, "--tool", tool, *SANITIZE_TOOLS[tool], "--error-exitcode", SANITIZE_EXIT, "--log-file", log,
               gpu, *data, "--steps", SANITIZE_STEPS, "--no-shuffle", "--seed", SEED, "--quiet", "--init", init,
               "--save", os.path.join(work, f"sanitize-{tool}.safetensors")]
        try:
            _, seconds = run(cmd, f"compute-sanitizer --tool {tool}")
        except CheckFailed as e:
            text = open(log, errors="replace").read() if os.path.exists(log) else ""
            refused = [line for line in text.splitlines() if "not supported" in line.lower()]
            if refused:  # a machine whose runtime the tools cannot instrument
                ok &= result(f"sanitize-{tool}", model, "FAILED-TO-RUN",
                             f"compute-sanitizer cannot use this GPU: {refused[0].strip('= ').strip()}")
            elif f"(exit {SANITIZE_EXIT})" in str(e).splitlines()[0] and text:
                first, summary = sanitizer_report(log)
                say(f"  {tool}: {first}; {summary} (all of it in {log})")
                ok &= result(f"sanitize-{tool}", model, "FAIL", f"{first}; {summary} ({log})")
            else:
                say(str(e))
                ok &= result(f"sanitize-{tool}", model, failed(e), str(e).splitlines()[0])
            continue
        _, summary = sanitizer_report(log) if os.path.exists(log) else (None, "no log written")
        ok &= result(f"sanitize-{tool}", model, "PASS", f"{SANITIZE_STEPS} steps: {summary} ({seconds:.0f} s)")
    return ok


# ---- referee: GPU trainers against the float64 interpreter (tests/gradcheck/ir_gradcheck.py)
#
# `check` compares the GPU trainer with the CPU trainer, whose rounding is its own, and only in
# float32; bf16 and fp16 are judged by convergence alone. Here each net's GPU trainer, in fp32,
# bf16 and fp16, takes one SGD step, evaluates and predicts from the same parameters and batch as
# ir_gradcheck.py's float64 interpreter, which in half precision runs netc's graph after autocast
# and rounds each bf16 or fp16 value from float32 as the device does: the tolerances are
# float32's (plus one unit in the half type's last place where a checked value may be a
# product's result), the same check cuda_emu_random_bf16 and _fp16 make of the emulated trainer
# (docs/testing.md). The nets are random_nets.py's (views in any order of their axes, reductions,
# norms, attention, convolutions: the cuBLASLt and cuDNN calls in many layouts), small enough
# that float32's rounding rarely tips a half-precision one. A trainer takes a few seconds here;
# 8 nets x 3 precisions about 3 minutes with the trainers packed.
REFEREE_NETS = [f"random_{n}" for n in range(8)]
REFEREE_PRECISIONS = ("fp32", "bf16", "fp16")


def referee_src(args, net):
    """The .net file of `net`: random_N is random_nets.py's net N, written into the work folder
    (the same text on every machine, so that a packed trainer is found by its content); any
    other name is tests/gradcheck/NAME.net."""
    m = re.fullmatch(r"random_(\d+)", net)
    if not m:
        return os.path.join(ROOT, "tests", "gradcheck", f"{net}.net")
    folder = os.path.join(os.path.abspath(args.work), "referee")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{net}.net")
    text = random_nets.gen(int(m.group(1)))
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    return path


def referee_builds(args):
    """(precision, netc flags) of each trainer the referee runs: fp32, bf16 and fp16 on the GPU;
    the self-test's CPU stand-in has float32 only."""
    precisions = ("fp32",) if args.self_test else REFEREE_PRECISIONS
    builds = []
    for precision in precisions:
        args.precision = precision
        builds.append((precision, gpu_build_flags(args)))
    args.precision = None
    return builds


def build_referee(args, net, precision, flags):
    """The trainer of `net` in `precision` (built with `flags`) in its own work folder: its
    path and the .net file's."""
    src = referee_src(args, net)
    work = os.path.join(os.path.abspath(args.work), "referee", f"{net}-{precision}")
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "trainer")
    build_src(args, src, flags, exe, f"{net}'s trainer ({precision})")
    return exe, src


def cmd_referee(args):
    nets = args.nets.split(",")
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        for precision, _ in referee_builds(args):
            for net in nets:
                result(f"referee-{precision}", net, "FAILED-TO-RUN", f"{sys.executable} has no torch (the referee's)")
        return True
    if args.self_test:
        say("  --self-test: the CPU stand-in has float32 only; the bf16 and fp16 rows need a GPU")
    ok = True
    for precision, flags in referee_builds(args):
        for net in nets:
            try:
                exe, src = build_referee(args, net, precision, flags)
                cmd = [sys.executable, os.path.join(ROOT, "tests", "gradcheck", "ir_gradcheck.py"), "--trainer",
                       netc_path(args), src, os.path.dirname(exe), "--exe", exe, *flags]
                try:
                    p, seconds = run(cmd, f"ir_gradcheck.py on {net} ({precision})")
                    text, status = p.stdout, "PASS"
                except CheckFailed as e:
                    if isinstance(e, CannotRun):
                        raise
                    text, status = str(e), "FAIL"
                say(text.rstrip())
                summary = re.search(r"(\d+) gradient elements checked.*?(\d+) failed \(the largest error (\S+) "
                                    r"of its tolerance\); evaluation (\S+) of its tolerance", text)
                detail = (f"gradients: {summary.group(2)} of {summary.group(1)} off, the largest error "
                          f"{summary.group(3)} of its tolerance; evaluation and --predict {summary.group(4)}"
                          if summary else text.strip().splitlines()[0])
                ok &= result(f"referee-{precision}", net, status, detail)
            except CheckFailed as e:
                say(str(e))
                ok &= result(f"referee-{precision}", net, failed(e), str(e).splitlines()[0])
    return ok


def cmd_pack(args):
    """On a CPU machine: every CPU side the GPU checks need, prepared in --work, and every GPU
    trainer they run, built into --trainers (tests/gpu/pack.sh), so that the GPU machine needs
    neither a C compiler nor OpenBLAS and oneDNN, and spends no time in NVRTC."""
    args.fill_trainers = True
    ok = True
    for model in args.models.split(","):
        cfg = model_config(model, model_src(model))
        step = "?"
        try:
            step = "check"
            say(f"== {model}: the cpu-vs-gpu reference and the GPU trainer")
            os.makedirs(model_dir(args, model), exist_ok=True)
            if cfg.get("pack_reference", True):
                prepare(args, model, cfg)
            else:
                say(f"  no CPU reference packed for {model} (too large); the GPU machine runs its bit checks only")
            build(args, model, cfg, os.path.join(model_dir(args, model), "gpu"), gpu_build_flags(args), "GPU trainer")
            if model in DIST_MODELS:
                for _, flags, suffix in DIST_VARIANTS:
                    build(args, model, cfg, os.path.join(model_dir(args, model), "gpu" + suffix),
                          gpu_build_flags(args) + flags, "distributed GPU trainer")
            if cfg["converge"]:
                step = "converge"
                work, _, _ = prepare_converge(args, model, cfg, cfg["converge"])
                for precision in ("fp32", "bf16", "fp16"):
                    args.precision = precision
                    build(args, model, cfg, os.path.join(work, f"gpu-{precision}"), gpu_build_flags(args),
                          f"GPU trainer ({precision})", cfg.get("converge_defs", []))
                args.precision = None
            result("pack", model, "PASS", "prepared")
        except CheckFailed as e:
            say(str(e))
            ok &= result("pack", model, "FAIL", f"{step}: {str(e).splitlines()[0]}")
    if args.referee:
        try:
            say(f"== the referee's GPU trainers: {args.nets}")
            for precision, flags in referee_builds(args):
                for net in args.nets.split(","):
                    build_referee(args, net, precision, flags)
            result("pack", "referee", "PASS", "built")
        except CheckFailed as e:
            say(str(e))
            ok &= result("pack", "referee", "FAIL", str(e).splitlines()[0])
    if args.fashion:
        try:
            say("== lenet on Fashion-MNIST: the CPU run and the GPU trainer")
            work, _, _ = prepare_fashion(args)
            build(args, "lenet", FASHION_CFG, os.path.join(work, "gpu"), gpu_build_flags(args), "GPU trainer")
            result("pack", "fashion-mnist", "PASS", "prepared")
        except CheckFailed as e:
            say(str(e))
            ok &= result("pack", "fashion-mnist", "FAIL", str(e).splitlines()[0])
    return ok


def cmd_compare(args):
    c = compare(args.a, args.b, args.init, args.tol, args.stat_tol)
    for m in c.problems:
        say(m)
    say(f"{'agree' if c.ok else 'DIFFER'}: parameters {c.worst[0]:.3g} ({c.worst[1]}), statistics "
        f"{c.worst_stat[0]:.3g} ({c.worst_stat[1]}), max-abs {c.worst_abs[0]:.3g} ({c.worst_abs[1]}); "
        f"{len(c.differ)} tensors differ in their bits")
    return c.ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--netc", default=os.path.join(ROOT, "build", "compiler", "netc"))
    common.add_argument("--work", default=os.path.join(ROOT, "build", "gpu-check"),
                        help="work directory (default build/gpu-check)")
    common.add_argument("-D", dest="define", action="append", metavar="NAME=VALUE",
                        help="another -D for both trainers (changes the prepared configuration)")
    common.add_argument("--arch", help="--arch for the GPU build, e.g. sm_90")
    common.add_argument("--self-test", action="store_true",
                        help="no GPU: a CPU row-major trainer stands in for the GPU trainer")
    common.add_argument("--timeout", type=float, default=float(os.environ.get("NETC_GPU_TIMEOUT", RUN_TIMEOUT)),
                        help=f"seconds after which a trainer's run is killed as a hang and FAILs "
                             f"(default $NETC_GPU_TIMEOUT or {RUN_TIMEOUT:g})")
    common.add_argument("--deadline", type=float,
                        help="a time (seconds since the epoch) after which no run starts (FAILED-TO-RUN) "
                             "and none runs on (run.sh --deadline)")
    common.add_argument("--trainers", default=os.environ.get("NETC_TRAINERS"),
                        help="a folder of trainers built ahead (a pack's trainers/): used when netc, the "
                             ".net file and the flags are the same (default $NETC_TRAINERS)")
    for name in ("prepare", "check", "converge", "dist", "sanitize"):
        p = sub.add_parser(name, parents=[common])
        p.add_argument("--model", required=True,
                       help="a model in models/ (mlp, lenet, ...) or tests/cuda/emu/ (views, permute_conv, ...)")
        if name == "check":
            p.add_argument("--tol", type=float, help="override the model's tolerance")
        if name == "sanitize":
            p.add_argument("--tools", default=",".join(SANITIZE_TOOLS),
                           help=f"compute-sanitizer tools to run (default {','.join(SANITIZE_TOOLS)})")
        if name == "converge":
            p.add_argument("--steps", type=int, help="override the model's convergence steps")
            p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                           help="the GPU trainer's --precision (bf16, fp16: mixed precision, same margins; "
                                "fp16 also reports its loss scale)")
    sub.add_parser("fashion", parents=[common])
    nets_help = (f"comma-separated nets: random_N (tests/gradcheck/random_nets.py's net N) or a name in "
                 f"tests/gradcheck/ (default {','.join(REFEREE_NETS)})")
    p = sub.add_parser("referee", parents=[common])
    p.add_argument("--nets", default=",".join(REFEREE_NETS), help=nets_help)
    p = sub.add_parser("pack", parents=[common])
    p.add_argument("--models", required=True, help="comma-separated models to prepare")
    p.add_argument("--no-fashion", dest="fashion", action="store_false", help="leave out Fashion-MNIST")
    p.add_argument("--referee", action="store_true", help="build the referee's GPU trainers too")
    p.add_argument("--nets", default=",".join(REFEREE_NETS), help=nets_help)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b", help="the reference")
    p.add_argument("--init", help="the initial weights, to report how far parameters moved")
    p.add_argument("--tol", type=float, default=0.0,
                   help="parameters: ||a - b|| / ||b - init|| per tensor; 0: every tensor bit-identical")
    p.add_argument("--stat-tol", type=float, default=0.0, help="running statistics, relative to their max")
    args = ap.parse_args()
    limits["timeout"] = getattr(args, "timeout", RUN_TIMEOUT)
    limits["deadline"] = getattr(args, "deadline", None)
    if getattr(args, "model", None) and not os.path.exists(model_src(args.model)):
        ap.error(f"no {args.model}.net in {' or '.join(d + '/' for d in MODEL_DIRS)}")
    ok = {"prepare": cmd_prepare, "check": cmd_check, "converge": cmd_converge, "dist": cmd_dist,
          "fashion": cmd_fashion, "sanitize": cmd_sanitize, "compare": cmd_compare, "pack": cmd_pack,
          "referee": cmd_referee}[args.cmd](args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
