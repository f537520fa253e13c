"""What the step benchmarks (gpt2_, resnet_, bert_ and lora_cpu_vs_torch.py) share: a netc trainer
timed from its JSON log and a PyTorch loop run in its own interpreter (ending in TORCH_TIMING),
each for WARMUP untimed steps and then the timed ones, and synthetic token windows.
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WARMUP = 2  # untimed steps before the timed ones, in both


# The end of every PyTorch loop (a program text that defines step(s) and steps): WARMUP untimed
# steps, then the timed ones; it leaves dt, their seconds, warmup_s, the untimed steps' (with
# torch.compile, its compilation), and peak_kib, the process's peak resident set, for the loop's
# own last line.
TORCH_TIMING = f"""
tw = time.perf_counter()
for s in range({WARMUP}):
    step(s)
t0 = time.perf_counter()
warmup_s = t0 - tw
for s in range(steps):
    step(s)
dt = time.perf_counter() - t0
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""


# A PyTorch program's float32 matrix-product peak (2048^3, the best of 5, on the threads it set):
# it leaves matmul_flops, the yardstick for FLOP utilisation.
TORCH_MATMUL_PEAK = """
a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
matmul_flops = 0.0
for _ in range(5):
    t = time.perf_counter()
    a @ b
    matmul_flops = max(matmul_flops, 2 * 2048 ** 3 / (time.perf_counter() - t))
"""


def run_args(ap, batch, steps):
    """The options every step benchmark takes: netc, threads, the batch and timed steps (with
    their defaults), the runs to take the median of, PyTorch's interpreter."""
    ap.add_argument("--netc", default=os.path.join(ROOT, "build", "compiler", "netc"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the interpreter for the PyTorch runs")


def run_netc(exe, args, threads, steps, batch, work, env=None):
    """steps + WARMUP steps of a trainer (with env, a dict, added to the environment): samples/s
    over the timed steps (from its log, one line a step) and the process's peak resident set."""
    log = os.path.join(work, "netc.jsonl")
    proc = subprocess.Popen([exe, *args, "--steps", str(steps + WARMUP), "--threads", str(threads),
                             "--no-shuffle", "--log", log, "--log-every", "1", "--quiet"],
                            env=dict(os.environ, **(env or {})))
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"bench: netc trainer failed with status {status}")
    rates = [json.loads(line)["samples_per_s"] for line in open(log) if '"step"' in line][WARMUP:]
    seconds = sum(batch / r for r in rates)
    return {"samples_per_s": steps * batch / seconds, "peak_kib": usage.ru_maxrss}


def run_torch(python, loop, *args):
    """A PyTorch loop (a program text) in python with its arguments: the JSON of its last line."""
    out = subprocess.run([python, "-c", loop, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def token_files(work, n, seq, vocab):
    """n windows of a random token stream as WORK/tokens.npy and the next tokens as targets.npy."""
    stream = np.random.default_rng(0).integers(0, vocab, size=n * seq + 1)
    idx = np.arange(n)[:, None] * seq + np.arange(seq + 1)[None, :]
    np.save(f"{work}/tokens.npy", stream[idx][:, :-1].astype(np.int64))
    np.save(f"{work}/targets.npy", stream[idx][:, 1:].astype(np.int64))
