"""One SGD step of compiled trainers against a float64 referee, with PyTorch's float32 as the
measure of float32 rounding (used by fused_vs_unfused.sh).

    step_vs_float64.py [--ulp-spread] [--ignore INPUT=VALUE] WORKDIR LR TRAINER... -- NETC MODEL.net [-D ...]

Runs `NETC MODEL.net --dump=grad` with the same -D flags the trainers were compiled with (which
must make the first step a plain p - LR * g: weight_decay=0, no warmup, learning rate LR) and
evaluates that graph with the float64 IR interpreter of tests/gradcheck/ir_gradcheck.py on one
batch (floats N(0, 1), integer inputs 0..9) and parameters He-scaled N(0, 1) (batch-norm scales
1 + N(0, 0.1^2)). The same interpreter in float32, i.e. PyTorch's float32 kernels on this CPU,
gives the yardstick. --ignore sets three in four of an integer input's entries (drawn from the
same seed) to VALUE, as masked-LM labels are mostly a cross-entropy's ignore_index. Each trainer takes one step from those parameters (--init) on that batch;
the gradient it applied is (p - p') / LR.

For each trainable parameter, err = max |g - g64| / max |g64|. A trainer passes when, for every
parameter, err <= 4 * err32 + 1e-6, err32 being PyTorch float32's: two float32 implementations
that sum in different orders are equally far from the exact value, up to the spread of their
rounding (measured: netc's errors are 0.1-2x PyTorch's); 4x leaves room for that and for a
long reduction netc blocks differently; 1e-6 (~16 ulps) covers the applied gradient's own
rounding (p' = p - LR g in float32: with LR 1000, |p| << |LR g|, so ~1 ulp of g) and gradients
that PyTorch happens to get exactly. A wrong gradient, or a kernel that rounds to bfloat16
(0.4 % of the update), is far beyond it. Prints, per trainer, the worst parameter's err against
err32, and the largest difference between the trainers' gradients.

This holds for networks small enough that no ReLU input lies within rounding of 0 (the tests'
ReLU models run at batch 8 and small widths) or with smooth activations (layouts_agree.sh
--silu). --ulp-spread also prints how far the exact gradient moves when the parameters move by
at most one float32 ulp, and fails beyond 1e-4: ResNet-18 at batch 32 and width 64 moves by 7e-7 with SiLU, and by
2e-2 to 5e-2 with ReLU (two draws), as far as PyTorch's float32 is off there: no float32
implementation can be held to the exact gradient of such a network.
"""
import os
import subprocess
import sys

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gradcheck"))
sys.path.insert(0, os.path.join(here, "..", "tools"))
from ir_gradcheck import INT_DTYPES, Interp, parse_dump  # noqa: E402
from netc_testlib import st_load, st_save  # noqa: E402


def initial_params(nodes, params):
    """Values a trainer could start from: He-scaled weights, batch-norm scales near 1."""
    rng = np.random.default_rng(5)
    out = {}
    for name, nid, _, _ in params:
        shape = nodes[nid].shape
        if len(shape) >= 2:
            v = rng.normal(size=shape) * np.sqrt(2 / np.prod(shape[1:]))
        elif name.endswith("weight") or name.endswith("running_var"):
            v = 1 + 0.1 * rng.normal(size=shape)
        else:
            v = 0.1 * rng.normal(size=shape)
        out[name] = np.asarray(v, np.float32)
    return out


def batch(nodes, ignore):
    rng = np.random.default_rng(6)
    data = {}
    for n in nodes:
        if n.op == "input":
            data[n.name] = (rng.integers(0, 10, n.shape).astype(np.int64) if n.dtype in INT_DTYPES
                            else rng.normal(size=n.shape).astype(np.float32))
    for name, value in ignore:
        data[name][rng.random(data[name].shape) < 0.75] = value
    return data


def reference(nodes, params, inputs, pvals, dtype):
    """The gradient of every trainable parameter, evaluated in dtype."""
    ins = {k: torch.from_numpy(a) if a.dtype.kind in "iu" else torch.from_numpy(a).to(dtype)
           for k, a in inputs.items()}
    ps = {k: torch.from_numpy(a).to(dtype) for k, a in pvals.items()}
    values = Interp(nodes, ins, ps, dtype).run(len(nodes))
    return {name: values[gid].double().numpy() for name, _, trainable, gid in params if trainable}


def trainer_step(exe, work, inputs, init, lr):
    args = []
    for k, a in inputs.items():
        path = os.path.join(work, f"step-{k}.npy")
        np.save(path, a)
        args += ["--data", f"{k}={path}"]
    out = exe + "-step.safetensors"
    subprocess.run([exe, *args, "--init", init, "--steps", "1", "--no-shuffle", "--threads", "2", "--quiet",
                    "--save", out], check=True)
    return out


def ulp_spread(nodes, params, inputs, pvals, g64, scale):
    """The exact gradient's largest relative move under a random change of each parameter by at
    most one float32 ulp (2^-24 relative), and the parameter it moves most."""
    rng = np.random.default_rng(7)
    moved = {k: np.asarray(v.astype(np.float64) * (1 + rng.uniform(-2**-24, 2**-24, np.shape(v))))
             for k, v in pvals.items()}
    g = reference(nodes, params, inputs, moved, torch.float64)
    spread = {k: np.abs(g[k] - g64[k]).max() / scale[k] for k in g64}
    worst = max(spread, key=spread.get)
    return spread[worst], worst


def main():
    spread_wanted = sys.argv[1] == "--ulp-spread"
    if spread_wanted:
        del sys.argv[1]
    ignore = []
    while sys.argv[1] == "--ignore":
        name, value = sys.argv[2].split("=")
        ignore.append((name, int(value)))
        del sys.argv[1:3]
    split = sys.argv.index("--")
    work, lr, trainers = sys.argv[1], float(sys.argv[2]), sys.argv[3:split]
    netc, model, flags = sys.argv[split + 1], sys.argv[split + 2], sys.argv[split + 3:]
    dump = subprocess.run([netc, model, *flags, "--dump=grad"], capture_output=True, text=True, check=True)
    nodes, params, _, _ = parse_dump(dump.stdout)
    os.makedirs(work, exist_ok=True)
    inputs, pvals = batch(nodes, ignore), initial_params(nodes, params)
    init = os.path.join(work, "step-init.safetensors")
    st_save(init, pvals)
    g64 = reference(nodes, params, inputs, pvals, torch.float64)
    g32 = reference(nodes, params, inputs, pvals, torch.float32)
    scale = {k: max(np.abs(g).max(), 1e-30) for k, g in g64.items()}
    err32 = {k: np.abs(g32[k] - g64[k]).max() / scale[k] for k in g64}
    failed = 0
    if spread_wanted:
        spread, where = ulp_spread(nodes, params, inputs, pvals, g64, scale)
        print(f"  the float64 gradient under a one-ulp change of the parameters moves by {spread:.3g} ({where})")
        # 1e-4: above the smooth networks' (ResNet-18 at batch 32 7e-7, ResNet-50 at batch 4, whose
        # last batch norms see 16 values, 7e-6), far below ReLU ResNets' (1e-2 and more)
        if spread > 1e-4:
            print("  the step is not a smooth function of the weights here: comparing it is not about rounding")
            failed += 1
    applied = []
    for exe in trainers:
        got = st_load(trainer_step(exe, work, inputs, init, lr))
        g = {k: (pvals[k].astype(np.float64) - got[k]) / lr for k in g64}
        applied.append(g)
        worst, worst_k = -1.0, None
        for k in g64:
            err = np.abs(g[k] - g64[k]).max() / scale[k]
            bound = 4 * err32[k] + 1e-6
            if err > bound:
                print(f"  {os.path.basename(exe)}: {k}: error {err:.3g} against float64, PyTorch float32 "
                      f"{err32[k]:.3g} (bound {bound:.3g})")
                failed += 1
            if err - bound > worst:
                worst, worst_k = err - bound, k
        errs = {k: np.abs(g[k] - g64[k]).max() / scale[k] for k in g64}
        ratio = max(g64, key=lambda k: errs[k] / max(err32[k], 1e-12))
        print(f"  {os.path.basename(exe)}: closest to its bound: {worst_k}: error {errs[worst_k]:.3g}, PyTorch "
              f"float32 {err32[worst_k]:.3g}; largest error {max(errs.values()):.3g}; largest ratio to PyTorch: "
              f"{errs[ratio] / max(err32[ratio], 1e-12):.3g} ({ratio})")
    if len(applied) == 2:
        diff = max(np.abs(applied[0][k] - applied[1][k]).max() / scale[k] for k in g64)
        print(f"  largest difference between the two trainers' gradients: {diff:.3g} (relative)")
    print(f"step_vs_float64: {len(trainers)} trainers, {len(g64)} parameters, {failed} beyond float32 rounding")
    sys.exit(1 if failed or not g64 else 0)


if __name__ == "__main__":
    main()
