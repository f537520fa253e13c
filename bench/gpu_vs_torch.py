"""Training on one NVIDIA GPU: netc's CUDA trainer against PyTorch on the same GPU, same model,
batch and optimizer; prints samples/s, step time, host CPU time per step, peak device memory
and the ratios.

usage: python3 bench/gpu_vs_torch.py [--netc build/compiler/netc] [--models lenet,resnet50]
                                     [--compile-modes reduce-overhead[,max-autotune]] [--repeat 2]

  lenet     batch 256, Fashion-MNIST-shaped synthetic data (uint8 pixels, 10 classes). Strict
            float32 on both sides (netc --precision fp32; PyTorch with TF32 off).
  resnet50  batch 256, 224x224, ImageNet-shaped synthetic data (float32 N(0,1) images, int64
            labels in 1000 classes), SGD lr 0.1, momentum 0.9, weight decay 1e-4, label
            smoothing 0.1 as models/resnet50.net. netc runs in --precision bf16 and PyTorch in
            bf16 autocast and in tf32; each row says which.

Runners: netc's trainer with its step replayed as a CUDA Graph and with --no-graph; PyTorch
eager and torch.compile(mode=...) of the module ("reduce-overhead" uses CUDA graphs;
"max-autotune" adds kernel autotuning and takes minutes to compile ResNet-50, hence opt-in), all
channels-last, cudnn.benchmark on, optimizer step uncompiled (foreach SGD).

How it is measured (warm-up excluded, medians of --repeat):
  netc      each repeat runs the trainer twice, W and W+T steps; step time = the difference of
            the wall times / T (start-up, graph capture and warm-up cancel), host CPU time = the
            difference of the process's user+system time / T (all its threads: the data loader
            too). samples/s = batch / step time. The log's own rate over the last T steps is
            printed beside it.
  PyTorch   one process per runner: W warm-up steps (compilation included), then --repeat
            timed runs of T steps between torch.cuda.synchronize() calls; host CPU time is
            time.process_time() over them. Its batches are already on the GPU (the usual
            synthetic-data benchmark), while netc reads a memory-mapped .npy through its own
            loader and pinned staging, so netc's numbers include its input path.
  memory    nvidia-smi --query-compute-apps, sampled every 0.2 s while each process runs: the
            process's whole device footprint (CUDA context, library workspaces, allocator cache);
            for PyTorch also torch.cuda.max_memory_allocated (tensors only). When nvidia-smi
            cannot see the process (another PID namespace), the sum over all processes is used and
            marked '*'; without nvidia-smi it is not measured.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
import trainer_cache  # noqa: E402  (trainers built ahead on a CPU machine: tests/gpu/pack.sh)

# per model: batch, netc -D values, steps (warm-up W, timed T), the precisions of each side
MODELS = {
    "lenet": dict(batch=256, defs=["batch=256"], warmup=50, timed=400, classes=10,
                  netc_precision="fp32", torch_precisions=["fp32"]),
    "resnet50": dict(batch=256, defs=["batch=256", "image_size=224"], warmup=5, timed=20, classes=1000,
                     netc_precision="bf16", torch_precisions=["bf16", "tf32"]),
}

TORCH_SCRIPT = r"""
import json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
sys.path.insert(0, os.path.join(cfg["root"], "tests", "tools"))
torch.backends.cudnn.benchmark = True
tf32 = cfg["precision"] == "tf32"
torch.backends.cuda.matmul.allow_tf32 = tf32
torch.backends.cudnn.allow_tf32 = tf32
dev = torch.device(cfg.get("device", "cuda"))  # "cpu" only to smoke-test this script without a GPU
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
torch.manual_seed(0)
batch, model = cfg["batch"], cfg["model"]


def resnet50():
    try:
        import torchvision
        return torchvision.models.resnet50()
    except ImportError:  # the same network, for a machine without torchvision
        from torch import nn

        class Bottleneck(nn.Module):
            def __init__(self, cin, planes, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, planes, 1, bias=False); self.bn1 = nn.BatchNorm2d(planes)
                self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False); self.bn2 = nn.BatchNorm2d(planes)
                self.conv3 = nn.Conv2d(planes, 4 * planes, 1, bias=False); self.bn3 = nn.BatchNorm2d(4 * planes)
                self.downsample = None
                if stride != 1 or cin != 4 * planes:
                    self.downsample = nn.Sequential(nn.Conv2d(cin, 4 * planes, 1, stride, bias=False),
                                                    nn.BatchNorm2d(4 * planes))

            def forward(self, x):
                y = torch.relu(self.bn1(self.conv1(x)))
                y = torch.relu(self.bn2(self.conv2(y)))
                y = self.bn3(self.conv3(y))
                return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

        layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                       nn.MaxPool2d(3, 2, 1)], 64
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, planes, stride if i == 0 else 1))
                cin = 4 * planes
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
        return nn.Sequential(*layers)


if model == "lenet":
    from netc_testlib import torch_model
    net = torch_model("lenet")
    opt_args, smoothing = dict(lr=0.01, momentum=0.9, weight_decay=0.0), 0.0
    pool = 64  # batches of data resident on the GPU, visited in turn
    xs = torch.randint(0, 256, (pool * batch, 1, 28, 28), dtype=torch.uint8, device=dev).float()
else:
    net = resnet50()
    opt_args, smoothing = dict(lr=0.1, momentum=0.9, weight_decay=1e-4), 0.1
    pool = 4
    xs = torch.randn(pool * batch, 3, cfg["image_size"], cfg["image_size"], device=dev)
ys = torch.randint(0, cfg["classes"], (pool * batch,), device=dev)
xs = xs.contiguous(memory_format=torch.channels_last)
net = net.to(dev).to(memory_format=torch.channels_last).train()
opt = torch.optim.SGD(net.parameters(), foreach=True, **opt_args)
fwd = net if cfg["mode"] == "eager" else torch.compile(net, mode=cfg["mode"])
bf16 = cfg["precision"] == "bf16"


def step(i):
    x, y = xs[(i % pool) * batch:(i % pool + 1) * batch], ys[(i % pool) * batch:(i % pool + 1) * batch]
    opt.zero_grad(set_to_none=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
        loss = torch.nn.functional.cross_entropy(fwd(x), y, label_smoothing=smoothing)
    loss.backward()
    opt.step()
    return loss


t0 = time.perf_counter()
for i in range(cfg["warmup"]):
    step(i)
sync()
warm_s = time.perf_counter() - t0
if dev.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
walls, cpus = [], []
for r in range(cfg["repeat"]):
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(cfg["timed"]):
        loss = step(i)
    sync()
    walls.append((time.perf_counter() - t0) / cfg["timed"])
    cpus.append((time.process_time() - c0) / cfg["timed"])
print(json.dumps({"step_s": walls, "host_s": cpus, "warmup_s": warm_s, "loss": float(loss),
                  "allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else 0}))
"""


class MemorySampler:
    """The peak of a process's device memory, as nvidia-smi reports it, sampled every 0.2 s."""

    def __init__(self, pid):
        self.pid, self.peak, self.peak_all, self.stop, self.seen = str(pid), 0, 0, False, False
        self.ok = shutil.which("nvidia-smi") is not None
        self.thread = threading.Thread(target=self.loop, daemon=True)
        if self.ok:
            self.thread.start()

    def loop(self):
        while not self.stop:
            p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True)
            rows = [line.split(",") for line in p.stdout.strip().splitlines() if "," in line]
            total = 0
            for pid, mib in rows:
                try:
                    total += int(mib)
                except ValueError:
                    continue
                if pid.strip() == self.pid:
                    self.seen, self.peak = True, max(self.peak, int(mib))
            self.peak_all = max(self.peak_all, total)
            time.sleep(0.2)

    def result(self):
        """'N MiB', 'N MiB*' (all processes), or 'not measured'."""
        self.stop = True
        if not self.ok:
            return "not measured"
        self.thread.join()
        if self.seen:
            return f"{self.peak} MiB"
        return f"{self.peak_all} MiB*" if self.peak_all else "not measured"


def run_measured(cmd, timeout):
    """Run cmd with its device memory sampled; returns (wall s, its own user+system CPU s,
    peak device memory, its output). Raises RuntimeError when it fails or runs past timeout."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mem = MemorySampler(proc.pid)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time, not nvidia-smi's
    wall = time.perf_counter() - t0
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    memory = mem.result()
    if proc.returncode != 0:
        why = f"timed out after {timeout} s" if wall >= timeout else f"exit {proc.returncode}"
        raise RuntimeError(f"{why}: {' '.join(cmd[:3])} ...\n{out[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, memory, out


def write_data(model, cfg, work):
    """Synthetic training data as .npy files in work (reused when already there)."""
    import numpy as np
    b = cfg["batch"]
    stem = f"{work}/{model}-b{b}"
    args = ["--data", f"image={stem}-image.npy", "--data", f"label={stem}-label.npy"]
    if all(os.path.exists(f"{stem}-{name}.npy") for name in ("image", "label")):
        return args
    rng = np.random.default_rng(0)
    if model == "lenet":
        n = b * 64
        images = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    else:
        # one epoch longer than the longest run (W+T steps): an epoch's end drains netc's
        # pipeline (the host waits for the device), which the steady state it measures has not;
        # at batch 256, 26 batches are 6656 samples, 4.0 GB
        n = b * (cfg["warmup"] + cfg["timed"] + 1)
        images = np.lib.format.open_memmap(f"{stem}-image.npy", "w+", np.float32, (n, 3, 224, 224))
        for i in range(0, n, 64):
            images[i:i + 64] = rng.standard_normal((min(64, n - i), 3, 224, 224), dtype=np.float32)
        images.flush()
        del images
    if model == "lenet":
        np.save(f"{stem}-image.npy", images)
    np.save(f"{stem}-label.npy", rng.integers(0, cfg["classes"], n).astype(np.int64))
    return args


def netc_runs(exe, data, cfg, graph, repeat, work):
    """[(step s, host s, memory, log rate)] for `repeat` pairs of runs (W and W+T steps)."""
    w, t, b = cfg["warmup"], cfg["timed"], cfg["batch"]
    out = []
    for r in range(repeat):
        res = {}
        for steps in (w, w + t):
            log = f"{work}/netc-{os.path.basename(exe)}-{steps}.jsonl"
            cmd = [exe, *data, "--steps", str(steps), "--no-shuffle", "--quiet", "--log", log,
                   "--log-every", str(w)] + ([] if graph else ["--no-graph"])
            wall, cpu, mem, _ = run_measured(cmd, timeout=600)
            res[steps] = (wall, cpu, mem, log)
        (wa, ca, _, _), (wb, cb, mem, log) = res[w], res[w + t]
        rows = [json.loads(line) for line in open(log)]
        rows = [x for x in rows if "step" in x and not x.get("eval") and x.get("samples_per_s")]
        seconds, steps_logged, prev = 0.0, 0, 0
        for x in rows:
            if x["step"] > w:
                seconds += (x["step"] - prev) * b / x["samples_per_s"]
                steps_logged += x["step"] - prev
            prev = x["step"]
        log_rate = steps_logged * b / seconds if seconds else None
        out.append(((wb - wa) / t, (cb - ca) / t, mem, log_rate))
    return out


def torch_run(model, cfg, mode, precision, repeat, timeout):
    args = dict(root=ROOT, model=model, batch=cfg["batch"], classes=cfg["classes"], image_size=224,
                warmup=cfg["warmup"] if mode == "eager" else max(cfg["warmup"], 10),
                timed=cfg["timed"], repeat=repeat, mode=mode, precision=precision)
    _, _, mem, out = run_measured([sys.executable, "-c", TORCH_SCRIPT, json.dumps(args)], timeout)
    r = json.loads(out.strip().splitlines()[-1])
    return statistics.median(r["step_s"]), statistics.median(r["host_s"]), mem, r


def netc_flags(cfg, arch):
    flags = ["--backend", "cuda", "--precision", cfg["netc_precision"]] + (["--arch", arch] if arch else [])
    for d in cfg["defs"]:
        flags += ["-D", d]
    return flags


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--netc", default=os.path.join(ROOT, "build", "compiler", "netc"))
    ap.add_argument("--models", default="lenet,resnet50")
    ap.add_argument("--compile-modes", default="reduce-overhead",
                    help="torch.compile modes besides eager, comma-separated ('' for none; max-autotune is slow)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--torch-timeout", type=int, default=420, help="seconds for one PyTorch runner")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "gpu-bench"))
    ap.add_argument("--arch", help="--arch for netc, e.g. sm_90")
    ap.add_argument("--trainers", default=os.environ.get("NETC_TRAINERS"),
                    help="a folder of netc trainers built ahead (a pack's trainers/; default $NETC_TRAINERS)")
    ap.add_argument("--prebuild", action="store_true",
                    help="only build netc's trainers into --trainers (no GPU needed; tests/gpu/pack.sh)")
    a = ap.parse_args()
    if a.prebuild:
        if not a.trainers:
            ap.error("--prebuild needs --trainers DIR")
        for model in a.models.split(","):
            how, seconds = trainer_cache.build(a.netc, os.path.join(ROOT, "models", f"{model}.net"),
                                               netc_flags(MODELS[model], a.arch), f"{a.trainers}/{model}.tmp-exe",
                                               a.trainers, fill=True)
            os.remove(f"{a.trainers}/{model}.tmp-exe")
            print(f"{model}: {how} ({seconds:.0f} s)")
        return
    if not (shutil.which("nvidia-smi") and "GPU" in subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                                                                    text=True).stdout):
        sys.exit("gpu_vs_torch: no GPU on this machine (nvidia-smi -L lists none); nothing measured")
    if not os.access(a.netc, os.X_OK):
        sys.exit(f"gpu_vs_torch: no netc at {a.netc}: build it or pass --netc")
    os.makedirs(a.work, exist_ok=True)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[0]
    modes = ["eager"] + [m for m in a.compile_modes.split(",") if m]
    unknown = [m for m in a.models.split(",") if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}: this benchmark has {sorted(MODELS)}")
    failed = False
    for model in a.models.split(","):
        cfg = MODELS[model]
        b = cfg["batch"]
        print(f"\n## {model}, batch {b}, on {gpu}: {cfg['timed']} timed steps after {cfg['warmup']} warm-up, "
              f"median of {a.repeat}", flush=True)
        print("| runner | precision | samples/s | step ms | host CPU ms/step | peak device memory | "
              "torch allocated | netc graph speed / this |")
        print("|---|---|---|---|---|---|---|---|", flush=True)
        rows = {}
        data = write_data(model, cfg, a.work)
        exe = f"{a.work}/{model}-netc"
        try:
            try:
                how, seconds = trainer_cache.build(a.netc, os.path.join(ROOT, "models", f"{model}.net"),
                                                   netc_flags(cfg, a.arch), exe, a.trainers)
            except subprocess.CalledProcessError as e:
                print(e.stdout + e.stderr, file=sys.stderr)
                raise
            print(f"(netc --backend cuda --precision {cfg['netc_precision']}: trainer {how} in "
                  f"{seconds:.0f} s)", flush=True)
            for graph in (True, False):
                runs = netc_runs(exe, data, cfg, graph, a.repeat, a.work)
                step = statistics.median(r[0] for r in runs)
                host = statistics.median(r[1] for r in runs)
                rates = [r[3] for r in runs if r[3]]
                name = "netc graph" if graph else "netc --no-graph"
                rows[name] = step
                log_rate = f" (log: {statistics.median(rates):.0f})" if rates else ""
                print(f"| {name} | {cfg['netc_precision']} | {b / step:.0f}{log_rate} | {step * 1e3:.2f} | "
                      f"{host * 1e3:.2f} | {runs[-1][2]} | - | {step / rows.get('netc graph', step):.2f}x |",
                      flush=True)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            print(f"| netc | {cfg['netc_precision']} | FAILED: {str(e).splitlines()[0]} |||||", flush=True)
            print(str(e), file=sys.stderr)
            failed = True
        graph_step = rows.get("netc graph")
        for precision in cfg["torch_precisions"]:
            for mode in modes:
                name = f"PyTorch {mode}"
                try:
                    step, host, mem, r = torch_run(model, cfg, mode, precision, a.repeat, a.torch_timeout)
                except (RuntimeError, ValueError, IndexError) as e:
                    print(f"| {name} | {precision} | FAILED-TO-RUN: {str(e).splitlines()[0]} |||||", flush=True)
                    print(str(e), file=sys.stderr)
                    continue
                ratio = f"**{step / graph_step:.2f}x**" if graph_step else "-"
                print(f"| {name} | {precision} | {b / step:.0f} | {step * 1e3:.2f} | {host * 1e3:.2f} | {mem} | "
                      f"{r['allocated_mib']:.0f} MiB | {ratio} |", flush=True)
        print("netc graph speed / this = this runner's step time / netc's with graph (= netc's samples/s / "
              "this runner's): above 1, netc is faster. Across precisions (netc bf16 against PyTorch tf32) "
              "it compares different arithmetic.")
        if model == "resnet50":
            print("netc --precision bf16: bf16 products and convolutions with float32 master weights, "
                  "activations between them stored in float32; PyTorch's bf16 rows use autocast.")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
