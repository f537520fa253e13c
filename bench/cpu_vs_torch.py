"""Train the MLP and LeNet for one epoch of Fashion-MNIST with netc and with PyTorch on the CPU,
same batch (64), same thread count, in one run; print samples/s, peak memory and the ratios.

usage: /usr/bin/python3 bench/cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
                                              [--models mlp,lenet] [--repeat 5] [--python PYTHON]

samples/s is the training loop only (data already in memory), median over --repeat runs:
netc's is total samples / total time of its logged intervals, PyTorch's is timed around its
loop. Peak memory is each process's maximum resident set size. --python runs PyTorch with another
interpreter (a newer PyTorch, README "Benchmarks"); the header names its version.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
from netc_testlib import fashion_files  # noqa: E402
from bench_runs import torch_blas  # noqa: E402

TORCH_LOOP = r"""
import sys, time, resource, json
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from netc_testlib import fashion, torch_model
torch.set_num_threads(int(sys.argv[3]))
torch.manual_seed(0)
images, labels = fashion("train")
x_all = torch.from_numpy(images.astype(np.float32)).reshape(-1, 1, 28, 28)
y_all = torch.from_numpy(labels.astype(np.int64))
net = torch_model(sys.argv[2])
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
batch = 64
steps = len(x_all) // batch
perm = torch.randperm(len(x_all))
t0 = time.perf_counter()
for s in range(steps):
    idx = perm[s * batch:(s + 1) * batch]
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(net(x_all[idx]), y_all[idx])
    loss.backward()
    opt.step()
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * batch / dt, "version": torch.__version__,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def run_netc(netc, model, threads, work):
    exe = os.path.join(work, model)
    subprocess.run([netc, os.path.join(ROOT, "models", f"{model}.net"), "-o", exe,
                    "-D", "batch=64"], check=True)
    log = os.path.join(work, f"{model}.jsonl")
    images, labels = fashion_files("train")
    proc = subprocess.Popen([exe, "--data", f"image={images}", "--data", f"label={labels}",
                             "--epochs", "1", "--threads", str(threads), "--log", log,
                             "--log-every", "100", "--quiet"])
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not all children's
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{exe} failed with status {proc.returncode}")
    peak = usage.ru_maxrss
    rows = [json.loads(l) for l in open(log)]
    rates = [r["samples_per_s"] for r in rows if "samples_per_s" in r and not r.get("eval")]
    # the first interval includes start-up; the steady state is what a long run sees
    rate = statistics.median(rates[1:] if len(rates) > 2 else rates)
    return rate, peak


def run_torch(python, model, threads):
    out = subprocess.run([python, "-c", TORCH_LOOP, os.path.join(ROOT, "tests", "tools"),
                          model, str(threads)], check=True, capture_output=True, text=True,
                         env=torch_blas(python)[0])
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["samples_per_s"], r["peak_kib"], r["version"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--netc", default=os.path.join(ROOT, "build", "compiler", "netc"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--models", default="mlp,lenet")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", default=sys.executable, help="the interpreter for the PyTorch runs")
    args = ap.parse_args()
    print(f"CPU training, one epoch of Fashion-MNIST, batch 64, {args.threads} threads, "
          f"median of {args.repeat} runs")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for model in args.models.split(","):
            ours, theirs = [], []
            for _ in range(args.repeat):  # interleaved, so a slow spell of the machine hits both
                ours.append(run_netc(args.netc, model, args.threads, work))
                theirs.append(run_torch(args.python, model, args.threads))
            n_rate = statistics.median(r for r, _ in ours)
            t_rate = statistics.median(r for r, _, _ in theirs)
            n_mem = max(m for _, m in ours) / 1024
            t_mem = max(m for _, m, _ in theirs) / 1024
            rows.append(f"{model:8s} {n_rate:15.0f} {t_rate:16.0f} {n_rate / t_rate:11.2f}x "
                        f"{n_mem:14.1f} {t_mem:15.1f} {n_mem / t_mem:12.2f}x")
    print(f"PyTorch {theirs[0][2]} ({args.python}), eager{torch_blas(args.python)[1]}")
    print(f"{'model':8s} {'netc samples/s':>15s} {'torch samples/s':>16s} {'speed ratio':>12s} "
          f"{'netc peak MiB':>14s} {'torch peak MiB':>15s} {'memory ratio':>13s}")
    print("\n".join(rows))

if __name__ == "__main__":
    main()
