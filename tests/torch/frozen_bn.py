"""batchnorm2d(frozen=true) against PyTorch's bn.eval() during training: the same weights and
running statistics (--init), the same batches in order, five SGD steps with momentum; then
every parameter and buffer compared. bn1's running statistics must come back unchanged.

usage: frozen_bn.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import st_load, st_save  # noqa: E402

# Relative error ||netc - torch|| / ||torch|| per tensor: both compute in float32 with different
# summation orders, ~1e-6 after five steps; a frozen layer that used batch statistics, updated
# its running statistics or differentiated through them is off by 1e-2 and more.
TOLERANCE = 1e-4
STEPS, BATCH = 5, 8


def module():
    torch.manual_seed(7)
    net = nn.Module()
    net.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
    net.bn1 = nn.BatchNorm2d(4)
    net.conv2 = nn.Conv2d(4, 4, 3, bias=False)
    net.bn2 = nn.BatchNorm2d(4)
    net.fc = nn.Linear(4 * 4 * 4, 5)
    with torch.no_grad():  # pretrained-looking statistics and affine weights, far from 0 and 1
        net.bn1.running_mean.uniform_(-0.5, 0.5)
        net.bn1.running_var.uniform_(0.5, 2.0)
        net.bn1.weight.uniform_(0.5, 1.5)
        net.bn1.bias.uniform_(-0.2, 0.2)
        net.bn1.num_batches_tracked.fill_(100)
    return net


def forward(net, x):
    h = torch.relu(net.bn1(net.conv1(x)))
    h = torch.relu(net.bn2(net.conv2(h)))
    return net.fc(h.flatten(1))


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    net = module()
    init = os.path.join(work, "init.safetensors")
    st_save(init, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    rng = np.random.default_rng(3)
    x = rng.standard_normal((STEPS * BATCH, 3, 6, 6)).astype(np.float32)
    y = rng.integers(0, 5, STEPS * BATCH).astype(np.int64)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "y.npy"), y)

    exe, out = os.path.join(work, "frozen_bn"), os.path.join(work, "out.safetensors")
    subprocess.run([netc, os.path.join(HERE, "frozen_bn.net"), "-o", exe], check=True)
    subprocess.run([exe, "--data", f"x={work}/x.npy", "--data", f"label={work}/y.npy", "--init", init,
                    "--steps", str(STEPS), "--no-shuffle", "--quiet", "--threads", "2", "--save", out], check=True)
    got = st_load(out)

    net.train()
    net.bn1.eval()  # what frozen=true means
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for s in range(STEPS):
        xb, yb = torch.from_numpy(x[s * BATCH:(s + 1) * BATCH]), torch.from_numpy(y[s * BATCH:(s + 1) * BATCH])
        opt.zero_grad()
        nn.functional.cross_entropy(forward(net, xb), yb).backward()
        opt.step()

    failed = 0
    for name, want in net.state_dict().items():
        want = want.detach().double().numpy()
        err = np.linalg.norm(got[name] - want) / max(np.linalg.norm(want), 1e-12)
        ok = err <= TOLERANCE
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative error {err:.3g}")
    before = st_load(init)
    for name in ("bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"):
        same = np.array_equal(got[name], before[name])
        failed += not same
        print(f"{'ok  ' if same else 'FAIL'} {name} unchanged by training")
    moved = not np.array_equal(got["bn2.running_mean"], before["bn2.running_mean"])
    failed += not moved
    print(f"{'ok  ' if moved else 'FAIL'} bn2.running_mean updated (an ordinary batch norm)")
    sys.exit(1 if failed else 0)


main()
