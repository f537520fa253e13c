"""ResNet training on the CPU: netc against PyTorch, same batch, same threads, same synthetic
data, in one run; prints samples/s, each run's fraction of the machine's float32
matrix-product peak, peak memory, and netc's speed against PyTorch's best. The network is
ResNet-18 with the CIFAR stem (models/resnet18_cifar.net against torchvision's resnet18 with a
3x3 stride-1 conv1 and no max-pool, 32x32 images, 10 classes) or, with --model resnet50,
ResNet-50 v1.5 (models/resnet50.net against torchvision's resnet50: 1000 classes, label
smoothing 0.1, --image-size pixels square, 224 by default).

usage: /usr/bin/python3 bench/resnet_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
                                                     [--model resnet18_cifar|resnet50]
                                                     [--image-size 224] [--batch 32] [--steps 8]
                                                     [--repeat 3] [--python PYTHON] [--no-compile]

netc runs four trainers: its default (channels-last: the runtime's Winograd F(2x2, 3x3) for the
3x3 convolutions of stride 1, oneDNN's convolutions with the kernels oneDNN picks for this CPU for
the others: docs/trainer.md), the same as an AVX2 CPU runs it (ONEDNN_MAX_CPU_ISA=AVX2 and
NETC_GEMM=onednn, every product in oneDNN as there; on an AVX-512 machine also
OPENBLAS_CORETYPE=Haswell; on an AVX2 machine the two are the same), the default with every convolution in oneDNN
(NETC_CONV=direct), and --layout=row-major (im2col + OpenBLAS).
PyTorch runs eager (NCHW), eager with channels_last tensors, and, from PyTorch 2 on,
torch.compile (its compilation falls in the untimed warm-up steps and is reported apart;
--no-compile leaves it out). --python runs the PyTorch side with another interpreter, e.g. a
virtual environment with a current PyTorch (README, "Benchmarks"); the header names its version,
and the OpenBLAS kernels it runs (bench_runs.torch_blas: newer ones than Debian's OpenBLAS would
choose on a CPU it does not know).

The peak is PyTorch's float32 product of two 2048x2048 matrices on the same threads, the best
of 5 (measured in every PyTorch run; the best is used). A training step's work is counted as
the convolutions' and the classifier's multiply-adds, two FLOPs each, three times (forward,
data gradient, weight gradient), less the first convolution's data gradient, which neither
side computes: 3.33 GFLOP a sample for ResNet-18 (CIFAR), 24.3 for ResNet-50 at 224x224. Batch
norm, ReLU, pooling and the optimizer are not counted, so the fraction understates the work
done. The count is a direct convolution's: Winograd's F(2x2, 3x3) does 16 multiplications per 2x2 output tile and channel
pair where the direct convolution does 36, so a trainer that runs it (netc's default) can pass
100 % of the peak; its figure is the speed of a direct convolution that would match it.

Each run trains for 2 warm-up steps plus --steps timed steps (netc: from its JSON log, one line
per step; PyTorch: timed around its loop). Runs alternate between the netc and PyTorch variants
so that noise on a shared machine hits all; the medians are compared. Peak memory is each
process's maximum resident set size.
"""
import argparse
import os
import statistics
import subprocess
import tempfile

import numpy as np

from bench_runs import ROOT, TORCH_MATMUL_PEAK, TORCH_TIMING, WARMUP, run_args, run_netc, run_torch, cpu_isa, torch_blas

# name: (--layout, environment)
NETC = {
    "netc channels-last": ("channels-last", {}),
    "netc channels-last, as on an AVX2 CPU": ("channels-last", {"ONEDNN_MAX_CPU_ISA": "AVX2", "NETC_GEMM": "onednn"}),
    "netc channels-last, oneDNN's direct convolutions (NETC_CONV=direct)": ("channels-last", {"NETC_CONV": "direct"}),
    "netc row-major": ("row-major", {}),
}

TORCH_LOOP = r"""
import sys, time, resource, json
import numpy as np, torch, torchvision
threads, batch, steps, data, mode, arch = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                           sys.argv[5], sys.argv[6])
torch.set_num_threads(threads)
torch.manual_seed(0)
fmt = torch.channels_last if mode == "channels_last" else torch.contiguous_format
x_all = torch.from_numpy(np.load(data + "/image.npy"))
y_all = torch.from_numpy(np.load(data + "/label.npy"))
if arch == "resnet50":  # models/resnet50.net's recipe
    net, smoothing, decay = torchvision.models.resnet50(num_classes=1000), 0.1, 1e-4
else:  # models/resnet18_cifar.net's
    net, smoothing, decay = torchvision.models.resnet18(num_classes=10), 0.0, 5e-4
    net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = torch.nn.Identity()
net = net.to(memory_format=fmt).train()
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=decay)
model = torch.compile(net) if mode == "compile" else net
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x_all[idx].contiguous(memory_format=fmt)), y_all[idx],
                                      label_smoothing=smoothing).backward()
    opt.step()
""" + TORCH_TIMING + TORCH_MATMUL_PEAK + r"""
print(json.dumps({"samples_per_s": steps * batch / dt, "version": torch.__version__, "peak_kib": peak_kib,
                  "warmup_s": warmup_s, "matmul_flops": matmul_flops}))
"""

VERSION = "import torch; print(torch.__version__)"


def resnet18_cifar_convs(size):
    """(input channels, output channels, kernel, output size) of every convolution, and the
    classifier's (inputs, classes)."""
    convs = [(3, 64, 3, size)]
    c, hw = 64, size
    for stage in range(4):
        planes = 64 << stage
        hw //= 2 if stage else 1
        convs += [(c, planes, 3, hw)] + [(planes, planes, 3, hw)] * 3  # two blocks of two
        if stage:
            convs.append((c, planes, 1, hw))  # the first block's shortcut
        c = planes
    return convs, (c, 10)


def resnet50_convs(size):
    """The same for ResNet-50 v1.5: a 7x7 stride-2 stem, a stride-2 max-pool, four stages of
    bottlenecks (1x1, 3x3 carrying the stride, 1x1 to 4x the width; the first block's shortcut
    a 1x1 convolution)."""
    hw = size // 2
    convs = [(3, 64, 7, hw)]
    c, hw = 64, hw // 2
    for stage, blocks in enumerate((3, 4, 6, 3)):
        planes = 64 << stage
        for b in range(blocks):
            stride = 2 if stage and not b else 1
            convs += [(c, planes, 1, hw), (planes, planes, 3, hw // stride), (planes, 4 * planes, 1, hw // stride)]
            if not b:
                convs.append((c, 4 * planes, 1, hw // stride))
            c, hw = 4 * planes, hw // stride
    return convs, (c, 1000)


MODELS = {"resnet18_cifar": resnet18_cifar_convs, "resnet50": resnet50_convs}


def train_flops(model, size):
    """FLOPs of one sample's training step: 2 per multiply-add of every convolution and of the
    classifier, for the forward pass and both gradients, less the first convolution's data
    gradient (the image needs none)."""
    convs, (features, classes) = MODELS[model](size)
    macs = [cin * cout * k * k * out * out for cin, cout, k, out in convs]
    return 2 * (3 * (sum(macs) + features * classes) - macs[0])


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, batch=32, steps=8)
    ap.add_argument("--model", choices=sorted(MODELS), default="resnet18_cifar")
    ap.add_argument("--image-size", type=int, default=224, help="ResNet-50's images (a multiple of 32)")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    a = ap.parse_args()
    size, classes = (a.image_size, 1000) if a.model == "resnet50" else (32, 10)
    if size % 32:
        ap.error(f"--image-size is {size}: expected a multiple of 32")
    version = subprocess.run([a.python, "-c", VERSION], check=True, capture_output=True, text=True).stdout.strip()
    modes = ["eager", "channels_last"]
    if not a.no_compile and int(version.split(".")[0]) >= 2:
        modes.append("compile")
    netc = {name: (layout, dict(env)) for name, (layout, env) in NETC.items()}
    if cpu_isa() == "AVX-512":  # OpenBLAS's AVX-512 kernels would still run its products
        netc["netc channels-last, as on an AVX2 CPU"][1]["OPENBLAS_CORETYPE"] = "Haswell"
    runs = {name: [] for name in [*netc, *(f"PyTorch {m}" for m in modes)]}
    with tempfile.TemporaryDirectory() as work:
        n = a.batch * (a.steps + WARMUP)
        rng = np.random.default_rng(0)
        np.save(f"{work}/image.npy", rng.normal(size=(n, 3, size, size)).astype(np.float32))
        np.save(f"{work}/label.npy", rng.integers(0, classes, n).astype(np.int64))
        defines = ["-D", f"batch={a.batch}"] + (["-D", f"image_size={size}"] if a.model == "resnet50" else [])
        exes = {}
        for layout in ("channels-last", "row-major"):
            exes[layout] = os.path.join(work, f"{a.model}-{layout}")
            subprocess.run([a.netc, os.path.join(ROOT, "models", f"{a.model}.net"), "-o", exes[layout],
                            *defines, f"--layout={layout}"], check=True)
        args = ["--data", f"image={work}/image.npy", "--data", f"label={work}/label.npy"]
        for _ in range(a.repeat):
            for name, (layout, env) in netc.items():
                runs[name].append(run_netc(exes[layout], args, a.threads, a.steps, a.batch, work, env))
            for m in modes:
                runs[f"PyTorch {m}"].append(run_torch(a.python, TORCH_LOOP, str(a.threads), str(a.batch),
                                                      str(a.steps), work, m, a.model))
    peak = max(r["matmul_flops"] for m in modes for r in runs[f"PyTorch {m}"])
    per_sample = train_flops(a.model, size)
    rate = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
    best_torch = max((k for k in rate if k.startswith("PyTorch")), key=rate.get)
    shape = f" at {size}x{size}" if a.model == "resnet50" else ""
    print(f"{a.model} training{shape}, batch {a.batch}, {a.threads} threads, {a.steps} timed steps, "
          f"median of {a.repeat}; CPU: {cpu_isa()}")
    print(f"PyTorch {version} ({a.python}){torch_blas(a.python)[1]}")
    print(f"{per_sample / 1e9:.2f} GFLOP per sample (convolutions and "
          f"classifier); float32 matmul peak measured {peak / 1e9:.1f} GFLOP/s (PyTorch, 2048^3)")
    if "PyTorch compile" in runs:
        print(f"torch.compile: {statistics.median(r['warmup_s'] for r in runs['PyTorch compile']):.0f} s "
              f"of compilation and warm-up per run, not timed")
    print("| | samples/s | GFLOP/s | of the matmul peak | against PyTorch's best | peak RSS |")
    print("|---|---|---|---|---|---|")
    for name, rs in runs.items():
        mem = max(r["peak_kib"] for r in rs) / 1024
        print(f"| {name} | {rate[name]:.1f} | {rate[name] * per_sample / 1e9:.0f} | "
              f"{100 * rate[name] * per_sample / peak:.0f}% | {rate[name] / rate[best_torch]:.2f}x | {mem:.0f} MiB |")
    print("(GFLOP/s count a direct convolution's multiply-adds; netc's 3x3 convolutions of stride 1 are "
          "Winograd's F(2x2, 3x3) except under NETC_CONV=direct, 2.25x fewer multiplications, so its "
          "fraction can pass 100 %)")
    print(f"netc's default against PyTorch's best ({best_torch}): "
          f"**{rate['netc channels-last'] / rate[best_torch]:.2f}x**")


if __name__ == "__main__":
    main()
