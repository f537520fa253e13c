"""Compare a generated optimizer_step() (run by driver.c) with torch.optim on the same
parameters, gradients and learning rates.

usage: check_optim.py OUTPUT_OF_DRIVER sgd|adamw A B C D [no_decay]   (arguments as emit_optim's)

With no_decay, torch.optim gets two parameter groups, as PyTorch recipes build them: the first
30 trainable floats with the weight decay, the other 600 with weight_decay=0.

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
    nd = 30 if sys.argv[7:] == ["no_decay"] else ng
    groups = [torch.nn.Parameter(p0[:nd].clone()), torch.nn.Parameter(p0[nd:ng].clone())]
    decay = c if kind == "sgd" else d
    groups = [{"params": [groups[0]], "weight_decay": decay}, {"params": [groups[1]], "weight_decay": 0.0}]
    if kind == "sgd":
        opt = torch.optim.SGD(groups, lr=0.1, momentum=a, dampening=b, nesterov=bool(d))
    else:
        opt = torch.optim.AdamW(groups, lr=0.1, betas=(a, b), eps=c)
    for t in range(1, 7):
        grad = torch.cos(np.float32(0.37) * torch.arange(ng, dtype=torch.float32) + t)
        for group, part in zip(opt.param_groups, (grad[:nd], grad[nd:])):
            group["params"][0].grad = part.clone()
        lr = np.float32(0.01) * (np.float32(1) + np.float32(0.1) * np.float32(t))
        for group in opt.param_groups:
            group["lr"] = float(lr)
        opt.step()
    trained = [group["params"][0].detach().numpy() for group in opt.param_groups]
    ref = np.concatenate([*trained, p0[ng:].numpy()]).astype(np.float64)
    err = np.abs(ref - got).max()
    print(f"{kind} {sys.argv[3:]}: max |netc - torch| = {err:.3g} over {n} floats ({ng} trainable)")
    sys.exit(0 if err <= TOLERANCE and len(got) == n else 1)


main()
