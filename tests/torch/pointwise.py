"""The element-wise built-ins made of where and comparisons (tests/torch/pointwise.net) against
PyTorch's own operators, at the points where the two could differ: abs at 0 (gradient sign(0) =
0), leaky_relu at 0 (the slope), clamp on its bounds (the gradient passes), maximum and minimum
at ties (half to each side), and powers. The trainer's output (--predict, the concatenated
values) on the initial weights, then every parameter after one SGD step, both against PyTorch
in float64 on the same data.

usage: pointwise.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, st_load, st_save  # noqa: E402

# The values are exact or one float32 rounding from the float64 reference (a product, a square
# root, a quotient): relative 2^-24 = 6e-8 of each value, 1e-6 leaves a margin. A gradient
# convention that differs at a kink moves one element's gradient by half of it or all of it,
# 0.5 * lr * |dz| ~ 1e-2 of the parameter.
TOLERANCE = 1e-6
N, LR = 16, 0.5
# row values with 0, the clamp bounds +-1 and 0.5, and values either side of each
ROW = [0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -3.0, 1.5, -1.5, 0.75, 3.0, -0.25, 0.0, 1.0]


def forward(x, w, u):
    y = x + w
    return torch.cat([y.abs(), torch.nn.functional.leaky_relu(y, 0.1), y.clamp(-1, 1), y.clamp(min=0.5),
                      torch.maximum(y, u), torch.minimum(u, y),
                      (y + 4) ** -2 + (y + 4) ** 0.5 + y ** 3 + y ** 0], -1)


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    check = Checks()
    x = np.array([ROW, ROW[::-1]], dtype=np.float32)
    # u ties with both rows in the first 4 columns (0, 1, -1 and 0.5 stand there in each row)
    u = np.array([0.0, 1.0, -1.0, 0.5] + [0.3 * (i - 8) for i in range(4, N)], dtype=np.float32)
    x[1, :4] = x[0, :4]
    t = np.random.default_rng(3).standard_normal((2, 7 * N)).astype(np.float32)
    init = {"w": np.zeros(N, np.float32), "u": u}
    paths = {k: os.path.join(work, f"{k}.npy") for k in ("x", "t")}
    np.save(paths["x"], x)
    np.save(paths["t"], t)
    st_save(os.path.join(work, "init.safetensors"), init)

    exe = os.path.join(work, "pointwise")
    subprocess.run([netc, os.path.join(HERE, "pointwise.net"), "-o", exe], check=True)
    pred = os.path.join(work, "z.npy")
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), "--predict", f"x={paths['x']}",
                    "--predict-out", pred, "--quiet"], check=True)
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), "--data", f"x={paths['x']}",
                    "--data", f"t={paths['t']}", "--steps", "1", "--quiet", "--save", os.path.join(work, "out.safetensors")],
                   check=True)
    got = st_load(os.path.join(work, "out.safetensors"))

    p = {k: torch.from_numpy(v.astype(np.float64)).requires_grad_() for k, v in init.items()}
    xt = torch.from_numpy(x.astype(np.float64))
    z = forward(xt, p["w"], p["u"])
    err = np.abs(np.load(pred) - z.detach().numpy()).max() / np.abs(z.detach().numpy()).max()
    print(f"values: largest difference {err:.2e} of the largest")
    check(err <= TOLERANCE, f"the values differ from PyTorch's by {err:.2e}")
    torch.nn.functional.mse_loss(z, torch.from_numpy(t.astype(np.float64))).backward()
    for name, v in p.items():
        want = (v - LR * v.grad).detach().numpy()
        e = np.abs(got[name] - want).max() / np.abs(want).max()
        print(f"{name} after one step: largest difference {e:.2e} of the largest (gradient {v.grad.numpy()})")
        check(e <= TOLERANCE, f"{name} differs from PyTorch's after one step by {e:.2e}")
    print(f"pointwise: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
