"""The views (tests/torch/views.net) against PyTorch: the same weights (--init), the same batches
in order, five plain SGD steps; then every parameter compared.

usage: views.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import st_load, st_save  # noqa: E402

# Relative error ||netc - torch|| / ||torch|| per tensor: both compute in float32 with different
# summation orders, ~1e-6 after five steps; a wrong axis, a transposed operand or a missing
# gradient term is off by 1e-2 and more.
TOLERANCE = 1e-4
STEPS, B, T, C, H, CLASSES, LR = 5, 4, 6, 8, 2, 5, 0.05


def forward(p, x):
    qkv = x @ p["c_attn.weight"] + p["c_attn.bias"]          # Conv1D: weight [in, out]
    q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in qkv.split(C, -1))
    a = torch.softmax(q @ k.transpose(-1, -2) * 0.5, -1)
    y = (a @ v).transpose(1, 2).reshape(B, T, C)
    y = y @ p["c_proj.weight"] + p["c_proj.bias"]
    h = (y - y.mean(-1, keepdim=True)) / torch.sqrt(y.var(-1, keepdim=True, correction=0) + 1e-5)
    feat = torch.cat([h[:, -1], h[:, 1:].amax(1), h[..., :-2, :].sum(1) * 0.1], -1)
    return feat @ p["head"].T


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    shapes = {"c_attn.weight": (C, 3 * C), "c_attn.bias": (3 * C,), "c_proj.weight": (C, C),
              "c_proj.bias": (C,), "head": (CLASSES, 3 * C)}
    p = {k: (torch.randn(s, generator=g) * 0.3).requires_grad_() for k, s in shapes.items()}
    init = os.path.join(work, "init.safetensors")
    st_save(init, {k: v.detach().numpy() for k, v in p.items()})
    rng = np.random.default_rng(3)
    x = rng.standard_normal((STEPS * B, T, C)).astype(np.float32)
    y = rng.integers(0, CLASSES, STEPS * B).astype(np.int64)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "y.npy"), y)

    exe, out = os.path.join(work, "views"), os.path.join(work, "out.safetensors")
    subprocess.run([netc, os.path.join(HERE, "views.net"), "-o", exe], check=True)
    subprocess.run([exe, "--data", f"x={work}/x.npy", "--data", f"label={work}/y.npy", "--init", init,
                    "--steps", str(STEPS), "--no-shuffle", "--quiet", "--threads", "2", "--save", out], check=True)
    got = st_load(out)

    opt = torch.optim.SGD(p.values(), lr=LR)
    for s in range(STEPS):
        xb, yb = torch.from_numpy(x[s * B:(s + 1) * B]), torch.from_numpy(y[s * B:(s + 1) * B])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(p, xb), yb).backward()
        opt.step()

    failed = 0
    for name, want in p.items():
        want = want.detach().double().numpy()
        err = np.linalg.norm(got[name] - want) / max(np.linalg.norm(want), 1e-12)
        ok = err <= TOLERANCE
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative error {err:.3g}")
    sys.exit(1 if failed else 0)


main()
