"""What the step benchmarks (gpt2_, vit_, resnet_, bert_ and lora_cpu_vs_torch.py) share: a netc
trainer timed from its JSON log and a PyTorch loop run in its own interpreter (TORCH_PRELUDE, the
loop, TORCH_TIMING), each for WARMUP untimed steps and then the timed ones, synthetic token
windows, and the table of rates and FLOP utilisation (flop_table).
"""
import functools
import json
import os
import statistics
import subprocess
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
WARMUP = 2  # untimed steps before the timed ones, in both


# The start of the step benchmarks' PyTorch loops (a program text run with the folder of its
# model's module and a JSON configuration as arguments): that folder on the path, the run's
# threads, batch, steps and data folder taken out of cfg (what is left: the model's sizes and the
# benchmark's own keys), torch on those threads and seeded.
TORCH_PRELUDE = r"""
import sys, time, resource, json
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
cfg = json.loads(sys.argv[2])
threads, batch, steps, data = (cfg.pop(k) for k in ("threads", "batch", "steps", "data"))
torch.set_num_threads(threads)
torch.manual_seed(0)
"""


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


def cpu_isa():
    """The newest of the vector instruction sets the benchmarks name that this CPU has."""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "older than AVX2"


# Which OpenBLAS kernels PyTorch runs: the core name of the libopenblas the interpreter loaded with
# torch (None when it loaded none: a PyPI wheel multiplies with MKL or oneDNN).
OPENBLAS_PROBE = """
import ctypes, json, torch
paths = [line.split()[-1] for line in open("/proc/self/maps") if "libopenblas" in line]
core = None
if paths:
    lib = ctypes.CDLL(paths[0])  # the library already loaded: dlopen returns it
    lib.openblas_get_corename.restype = ctypes.c_char_p
    core = lib.openblas_get_corename().decode()
print(json.dumps({"core": core}))
"""

# OpenBLAS's cores without AVX2: what 0.3.21 (Debian 12) falls back to on a CPU it does not know
OPENBLAS_OLD_CORES = {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
                      "Dunnington", "Nehalem", "Sandybridge", "Opteron", "Barcelona", "Bobcat", "Bulldozer"}


@functools.lru_cache(maxsize=None)
def torch_blas(python):
    """The environment PyTorch runs under in a comparison, and what the header says of it.

    Debian's python3-torch multiplies through OpenBLAS, and OpenBLAS 0.3.21 runs its oldest
    kernels (Prescott's: SSE3) on a CPU it does not know, such as an Intel Xeon of family 6 model
    207 with AVX-512: there PyTorch's 2048^3 product ran at a quarter of its rate with the SkylakeX
    kernels, and a comparison would measure PyTorch held back by its library. netc's trainers send
    such products to oneDNN (docs/trainer.md). So where PyTorch's OpenBLAS chose a core without
    AVX2 on a CPU with AVX2 (or AVX-512), and the user has not chosen one (OPENBLAS_CORETYPE),
    PyTorch runs with the newest core the CPU has; the header says so. Returns (the environment
    for PyTorch's runs, note)."""
    core = None
    if "OPENBLAS_CORETYPE" not in os.environ:
        out = subprocess.run([python, "-c", OPENBLAS_PROBE], check=True, capture_output=True, text=True).stdout
        core = json.loads(out.strip().splitlines()[-1])["core"]
    return blas_choice(core, cpu_isa(), os.environ)


def blas_choice(core, isa, environ):
    """torch_blas's decision, given the OpenBLAS core PyTorch loaded (None: no OpenBLAS), the
    CPU's instruction set (cpu_isa) and the environment: (PyTorch's environment, note)."""
    if "OPENBLAS_CORETYPE" in environ:
        return dict(environ), f"; OPENBLAS_CORETYPE={environ['OPENBLAS_CORETYPE']} (yours)"
    if core is None:
        return dict(environ), ""
    best = {"AVX-512": "SkylakeX", "AVX2": "Haswell"}.get(isa)
    if core not in OPENBLAS_OLD_CORES or best is None:
        return dict(environ), f"; its OpenBLAS runs {core} kernels"
    return (dict(environ, OPENBLAS_CORETYPE=best),
            f"; its OpenBLAS runs {best} kernels (OPENBLAS_CORETYPE={best}: it chose {core} for this CPU)")


def run_torch(python, loop, *args):
    """A PyTorch loop (a program text) in python with its arguments, under torch_blas(python)'s
    environment: the JSON of its last line."""
    out = subprocess.run([python, "-c", loop, *args], check=True, capture_output=True, text=True,
                         env=torch_blas(python)[0]).stdout
    return json.loads(out.strip().splitlines()[-1])


def token_files(work, n, seq, vocab):
    """n windows of a random token stream as WORK/tokens.npy and the next tokens as targets.npy."""
    stream = np.random.default_rng(0).integers(0, vocab, size=n * seq + 1)
    idx = np.arange(n)[:, None] * seq + np.arange(seq + 1)[None, :]
    np.save(f"{work}/tokens.npy", stream[idx][:, :-1].astype(np.int64))
    np.save(f"{work}/targets.npy", stream[idx][:, 1:].astype(np.int64))


def flop_table(unit, per_item, peak, netc_runs, netc_key, torch_runs, torch_key):
    """The summary of gpt2_ and vit_cpu_vs_torch.py: each side's median rate of `unit`s a second
    (the runs' netc_key, torch_key), its GFLOP/s at per_item FLOPs a `unit` and share of the
    matmul peak, and its largest peak memory; then netc's speed and memory over PyTorch's."""
    sides = [(name, statistics.median(r[key] for r in runs), max(r["peak_kib"] for r in runs) / 1024)
             for name, runs, key in (("netc", netc_runs, netc_key), ("PyTorch", torch_runs, torch_key))]
    print(f"| | {unit}s/s | GFLOP/s | of the matmul peak | peak RSS |")
    print("|---|---|---|---|---|")
    for name, rate, mem in sides:
        print(f"| {name} | {rate:.0f} | {rate * per_item / 1e9:.1f} | {100 * rate * per_item / peak:.0f}% | "
              f"{mem:.0f} MiB |")
    (_, nr, nm), (_, tr, tm) = sides
    print(f"netc / PyTorch: speed **{nr / tr:.2f}x**, memory {nm / tm:.2f}x")
