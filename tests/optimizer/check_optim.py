"""Compare a generated optimizer_step() (run by driver.c) with torch.optim on the same
parameters, gradients and learning rates.

usage: check_optim.py OUTPUT_OF_DRIVER sgd|adamw A B C D   (arguments as emit_optim's)

Both sides compute in float32 with the same formulas, but torch's vectorised kernels may
round some products differently (fused multiply-add); after six steps of values of order 1
the parameters agree to a few ulp. A wrong formula (bias correction, momentum start, decay
order) is off by 1e-4 or more, so the bound is 1e-6.
"""
import sys

import numpy as np
import torch

TOLERANCE = 1e-6


def main():
    lines = open(sys.argv[1]).read().split()
    n, ng = int(lines[0]), int(lines[1])
    got = np.array([float(v) for v in lines[2:]], dtype=np.float64)
    kind, a, b, c, d = sys.argv[2], *map(float, sys.argv[3:7])
    p0 = torch.sin(torch.arange(n, dtype=torch.float32))
    w = torch.nn.Parameter(p0[:ng].clone())
    if kind == "sgd":
        opt = torch.optim.SGD([w], lr=0.1, momentum=a, dampening=b, weight_decay=c, nesterov=bool(d))
    else:
        opt = torch.optim.AdamW([w], lr=0.1, betas=(a, b), eps=c, weight_decay=d)
    for t in range(1, 7):
        w.grad = torch.cos(np.float32(0.37) * torch.arange(ng, dtype=torch.float32) + t)
        lr = np.float32(0.01) * (np.float32(1) + np.float32(0.1) * np.float32(t))
        for group in opt.param_groups:
            group["lr"] = float(lr)
        opt.step()
    ref = np.concatenate([w.detach().numpy(), p0[ng:].numpy()]).astype(np.float64)
    err = np.abs(ref - got).max()
    print(f"{kind} {sys.argv[3:7]}: max |netc - torch| = {err:.3g} over {n} floats ({ng} trainable)")
    sys.exit(0 if err <= TOLERANCE and len(got) == n else 1)


main()
