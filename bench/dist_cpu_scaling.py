"""Data-parallel training on one machine's CPU: netc --distributed under mpirun against PyTorch's
DistributedDataParallel (gloo), for 1, 2 and 4 ranks, in one run.

usage: /usr/bin/python3 bench/dist_cpu_scaling.py [--netc build/compiler/netc] [--model lenet]
                                                  [--batch 64] [--steps 300] [--ranks 1,2,4]

Each rank trains at --batch (weak scaling: the global batch is batch x ranks) with
cores / ranks threads (at least 1, so 4 ranks on 2 cores share them). Printed per rank count:
samples/s over all ranks, for netc and PyTorch, and their ratio; netc's share of the step spent
waiting for the other ranks (the log's comm_wait, which includes waiting for a slower rank, not
only moving bytes); and, from netc --report, the gradient bytes each rank sums per step with the
time per step that implies beside the measured step time.
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

ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
if os.geteuid() == 0:
    ENV.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

TORCH_DDP = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, torch, torch.distributed as dist
from netc_testlib import fashion, torch_model
model, batch, steps, ranks, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])

def rank_main(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    images, labels = fashion("train")
    x_all = torch.from_numpy(images.astype(np.float32)).reshape(-1, 1, 28, 28)
    y_all = torch.from_numpy(labels.astype(np.int64))
    net = torch.nn.parallel.DistributedDataParallel(torch_model(model))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    perm = torch.randperm(len(x_all))
    def step(s):
        g = (s * ranks + rank) * batch % (len(x_all) - batch)
        idx = perm[g:g + batch]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
        opt.step()
    for s in range(10):
        step(s)
    dist.barrier()
    t0 = time.perf_counter()
    for s in range(steps):
        step(s)
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"samples_per_s": steps * batch * ranks / dt}))
    dist.destroy_process_group()

if ranks > 1:  # forked: a script given with -c cannot be re-imported by spawn
    torch.multiprocessing.start_processes(rank_main, nprocs=ranks, start_method="fork")
else:
    rank_main(0)
"""


def report_bytes(netc, model, batch):
    out = subprocess.run([netc, os.path.join(ROOT, "models", f"{model}.net"), "-D", f"batch={batch}",
                          "--distributed", "--report"], check=True, capture_output=True, text=True).stdout
    line = [x for x in out.splitlines() if "per step and rank" in x][0]
    return float(line.split(":")[1].split("MB")[0]) * 1e6


def log_every(steps):
    """Steps per logged interval: 50, or fewer for a short run, so that it logs at least 3
    intervals after the first (which holds the start-up) for the medians."""
    return max(1, min(50, steps // 4))


def run_netc(exe, ranks, threads, steps, work):
    log = os.path.join(work, f"netc_{ranks}.jsonl")
    images, labels = fashion_files("train")
    subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), exe, "--data", f"image={images}",
                    "--data", f"label={labels}", "--steps", str(steps), "--threads", str(threads), "--log", log,
                    "--log-every", str(log_every(steps)), "--quiet"], check=True, env=ENV)
    with open(log) as f:
        lines = [json.loads(x) for x in f if '"step"' in x][1:]  # the first interval holds the start-up
    return statistics.median(x["samples_per_s"] for x in lines), statistics.median(x["comm_wait"] for x in lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--netc", default=os.path.join(ROOT, "build", "compiler", "netc"))
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", default="1,2,4")
    a = ap.parse_args()
    if a.steps < 4:
        sys.exit(f"bench: --steps {a.steps}: at least 4 (the medians are over logged intervals after the first)")
    import torch
    cores = os.cpu_count()
    bytes_per_step = report_bytes(a.netc, a.model, a.batch)
    print(f"{a.model}, batch {a.batch} per rank, {cores} cores; PyTorch {torch.__version__} DDP (gloo)"
          f"{torch_blas(sys.executable)[1]}; "
          f"Open MPI {subprocess.run(['mpirun', '--version'], capture_output=True, text=True).stdout.split()[3]}")
    print(f"each rank sums {bytes_per_step / 1e6:.3f} MB of gradients per step (netc --report)")
    print(f"{'ranks':>5} {'threads':>7} {'netc samples/s':>15} {'torch samples/s':>16} {'ratio':>6} "
          f"{'netc waiting':>13} {'step ms':>8} {'GB/s if all wait moved bytes':>29}")
    with tempfile.TemporaryDirectory() as work:
        exe = os.path.join(work, a.model)
        subprocess.run([a.netc, os.path.join(ROOT, "models", f"{a.model}.net"), "-D", f"batch={a.batch}",
                        "--distributed", "-o", exe], check=True)
        for ranks in [int(r) for r in a.ranks.split(",")]:
            threads = max(1, cores // ranks)
            rate, wait = run_netc(exe, ranks, threads, a.steps, work)
            torch_out = subprocess.run([sys.executable, "-c", TORCH_DDP, os.path.join(ROOT, "tests", "tools"), a.model,
                                        str(a.batch), str(a.steps), str(ranks), str(threads)],
                                       check=True, capture_output=True, text=True,
                                       env=torch_blas(sys.executable)[0]).stdout
            torch_rate = json.loads(torch_out.strip().splitlines()[-1])["samples_per_s"]
            step_s = a.batch * ranks / rate
            moved = bytes_per_step * 2 * (ranks - 1) / ranks
            bw = moved / (wait * step_s) / 1e9 if ranks > 1 and wait > 0 else float("nan")
            print(f"{ranks:>5} {threads:>7} {rate:>15.0f} {torch_rate:>16.0f} {rate / torch_rate:>5.2f}x "
                  f"{100 * wait:>12.1f}% {1e3 * step_s:>8.2f} {bw:>29.2f}")


if __name__ == "__main__":
    main()
