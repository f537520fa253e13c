"""The Vision Transformer (models/vit.net) training on the CPU: netc's trainer against the same
model in PyTorch eager (tests/torch/vit_crosscheck.py's ViT, timm's VisionTransformer written
out), same sizes, batch, threads, recipe (AdamW with timm's no-decay split, clip_grad_norm 1.0)
and synthetic 28x28 images, in one run; prints images/s, peak memory and each side's FLOP
utilisation.

usage: /usr/bin/python3 bench/vit_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
           [--patch 4] [--dim 64] [--depth 4] [--heads 4] [--batch 64] [--steps 10] [--repeat 3]
           [--python PYTHON]

FLOP utilisation: an image's training FLOPs, 6 N T + 12 L T^2 D (N the parameters of the
products, the patch convolution's counted over its T - 1 patches, T tokens of width D, L
layers: PaLM's count per token, as gpt2_cpu_vs_torch.py's), times images/s, over PyTorch's
float32 [2048 x 2048] @ [2048 x 2048] rate with the same threads (bench_runs.TORCH_MATMUL_PEAK).

Each run trains 2 warm-up steps plus --steps timed steps (netc: from its JSON log; PyTorch: timed
around its loop). Runs alternate netc / PyTorch so that noise on a shared machine hits both; the
medians are compared. Peak memory is each process's maximum resident set.
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

from bench_runs import (ROOT, TORCH_MATMUL_PEAK, TORCH_PRELUDE, TORCH_TIMING, WARMUP, flop_table, run_args, run_netc,
                        run_torch, torch_blas)

TORCH_LOOP = TORCH_PRELUDE + r"""
from vit_crosscheck import ViT, no_decay
x_all = torch.from_numpy(np.load(data + "/image.npy"))
y_all = torch.from_numpy(np.load(data + "/label.npy"))
net = ViT(**cfg)
groups = [[], []]
for name, p in net.named_parameters():
    groups[no_decay(name)].append(p)
opt = torch.optim.AdamW([{"params": groups[0], "weight_decay": 0.05}, {"params": groups[1], "weight_decay": 0.0}],
                        lr=1e-3)
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
""" + TORCH_TIMING + TORCH_MATMUL_PEAK + r"""
print(json.dumps({"images_per_s": steps * batch / dt, "version": torch.__version__, "peak_kib": peak_kib,
                  "matmul_flops": matmul_flops,
                  "product_params": sum(p.numel() for n, p in net.named_parameters() if p.dim() >= 2 and
                                        n not in ("cls_token", "pos_embed"))}))
"""


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, batch=64, steps=10)
    ap.add_argument("--patch", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    a = ap.parse_args()
    sizes = dict(img_size=28, channels=1, classes=10, patch=a.patch, dim=a.dim, depth=a.depth, heads=a.heads,
                 mlp_ratio=4)
    tokens = (28 // a.patch) ** 2 + 1
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(0)
        n = a.batch * (a.steps + WARMUP)
        np.save(f"{work}/image.npy", rng.integers(0, 256, size=(n, 1, 28, 28)).astype(np.float32))
        np.save(f"{work}/label.npy", rng.integers(0, 10, size=n).astype(np.int64))
        exe = os.path.join(work, "vit")
        cmd = [a.netc, os.path.join(ROOT, "models", "vit.net"), "-o", exe, "-D", f"batch={a.batch}"]
        for k in ("patch", "dim", "depth", "heads"):
            cmd += ["-D", f"{k}={sizes[k]}"]
        subprocess.run(cmd, check=True)
        args = ["--data", f"image={work}/image.npy", "--data", f"label={work}/label.npy"]
        cfg = dict(sizes, threads=a.threads, batch=a.batch, steps=a.steps, data=work)
        netc, torch = [], []
        for _ in range(a.repeat):
            netc.append(run_netc(exe, args, a.threads, a.steps, a.batch, work))
            torch.append(run_torch(a.python, TORCH_LOOP, os.path.join(ROOT, "tests", "torch"), json.dumps(cfg)))
    peak = max(r["matmul_flops"] for r in torch)
    per_image = 6 * torch[0]["product_params"] * tokens + 12 * a.depth * tokens ** 2 * a.dim
    print(f"vit training (patches of {a.patch}, {tokens} tokens, width {a.dim}, {a.depth} layers, {a.heads} heads), "
          f"batch {a.batch}, {a.threads} threads, {a.steps} timed steps, median of {a.repeat}")
    print(f"PyTorch {torch[0]['version']} ({a.python}), eager{torch_blas(a.python)[1]}")
    print(f"{per_image / 1e6:.1f} MFLOP per image (6 N T + 12 L T^2 D); float32 matmul peak measured "
          f"{peak / 1e9:.1f} GFLOP/s (PyTorch, 2048^3)")
    flop_table("image", per_image, peak, netc, "samples_per_s", torch, "images_per_s")


if __name__ == "__main__":
    main()
