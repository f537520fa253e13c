"""ResNet-18 (CIFAR stem) training on the CPU: netc against PyTorch (torchvision's resnet18
with a 3x3 stride-1 conv1 and no max-pool), same batch, same threads, same synthetic data,
in one run; prints samples/s, peak memory and the ratios. netc runs twice: with its default
channels-last layout (oneDNN convolutions) and with --layout=row-major (im2col + OpenBLAS).

usage: /usr/bin/python3 bench/resnet_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
                                                     [--batch 32] [--steps 8] [--repeat 3]
                                                     [--python PYTHON]

--python runs the PyTorch side with another interpreter (a virtual environment with a newer
PyTorch and torchvision; default: the one running this script). The table's header names the
PyTorch version and the instruction set each side's oneDNN may use: netc's trainer holds oneDNN
to AVX2 unless ONEDNN_MAX_CPU_ISA says otherwise (docs/trainer.md), PyTorch's does not.

Each run trains for 2 warm-up steps plus --steps timed steps (netc: from its JSON log, one line
per step; PyTorch: timed around its loop). Runs alternate netc / PyTorch so that noise on a
shared machine hits both; the medians are compared. Peak memory is each process's maximum
resident set size.
"""
import argparse
import os
import statistics
import subprocess
import tempfile

import numpy as np

from bench_runs import ROOT, TORCH_TIMING, WARMUP, run_args, run_netc, run_torch

LAYOUTS = ("channels-last", "row-major")

TORCH_LOOP = r"""
import sys, time, resource, json
import numpy as np, torch, torchvision
threads, batch, steps, data = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
torch.manual_seed(0)
x_all = torch.from_numpy(np.load(data + "/image.npy"))
y_all = torch.from_numpy(np.load(data + "/label.npy"))
net = torchvision.models.resnet18(num_classes=10)
net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
net.maxpool = torch.nn.Identity()
net.train()
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
    opt.step()
""" + TORCH_TIMING + r"""
print(json.dumps({"samples_per_s": steps * batch / dt, "version": torch.__version__,
                  "peak_kib": peak_kib}))
"""


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, batch=32, steps=8)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        n = a.batch * (a.steps + WARMUP)
        rng = np.random.default_rng(0)
        np.save(f"{work}/image.npy", rng.normal(size=(n, 3, 32, 32)).astype(np.float32))
        np.save(f"{work}/label.npy", rng.integers(0, 10, n).astype(np.int64))
        exes = {}
        for layout in LAYOUTS:
            exes[layout] = os.path.join(work, f"resnet18_cifar-{layout}")
            subprocess.run([a.netc, os.path.join(ROOT, "models", "resnet18_cifar.net"), "-o", exes[layout],
                            "-D", f"batch={a.batch}", f"--layout={layout}"], check=True)
        args = ["--data", f"image={work}/image.npy", "--data", f"label={work}/label.npy"]
        netc, torch = {layout: [] for layout in LAYOUTS}, []
        for _ in range(a.repeat):
            for layout in LAYOUTS:
                netc[layout].append(run_netc(exes[layout], args, a.threads, a.steps, a.batch, work))
            torch.append(run_torch(a.python, TORCH_LOOP, str(a.threads), str(a.batch), str(a.steps), work))
    ts = statistics.median(r["samples_per_s"] for r in torch)
    tm = max(r["peak_kib"] for r in torch) / 1024
    print(f"resnet18_cifar training, batch {a.batch}, {a.threads} threads, {a.steps} timed steps, "
          f"median of {a.repeat}")
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    netc_isa, torch_isa = (isa, isa) if isa else ("at most AVX2 (its default)", "the CPU's best")
    print(f"PyTorch {torch[0]['version']} ({a.python}); oneDNN instruction set: netc {netc_isa}, "
          f"PyTorch {torch_isa}")
    print(f"| netc layout | netc samples/s | PyTorch samples/s | speed | netc peak RSS | PyTorch peak RSS | memory |")
    print(f"|---|---|---|---|---|---|---|")
    for layout in LAYOUTS:
        ns = statistics.median(r["samples_per_s"] for r in netc[layout])
        nm = max(r["peak_kib"] for r in netc[layout]) / 1024
        print(f"| {layout} | {ns:.1f} | {ts:.1f} | **{ns / ts:.2f}x** | {nm:.0f} MiB | {tm:.0f} MiB | {nm / tm:.2f}x |")


if __name__ == "__main__":
    main()
