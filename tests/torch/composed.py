"""The built-ins composed of other operators (compiler/frontend/sema_composed.c) against PyTorch's
own, in float64 on the same data.

pointwise (composed_pointwise.net): the element-wise ones made of where and comparisons, at the
points where the two could differ: abs at 0 (gradient sign(0) = 0), leaky_relu at 0 (the slope),
clamp on its bounds (the gradient passes), maximum and minimum at ties (half to each side), and
powers. The trainer's output (--predict, the concatenated values) on the initial weights, then
every parameter after one SGD step.

layers (composed_layers.net): groupnorm and upsample between two convolutions, against
torch.nn.GroupNorm and nearest interpolation, and conv1d against torch.nn.Conv1d (dilated,
strided, grouped, two in a chain), and conv_transpose2d against torch.nn.ConvTranspose2d (strided
with output padding, grouped, a 2x3 kernel, dilated): every parameter after three SGD steps, the
trainer built with its default channels-last layouts and with --layout=row-major; with them
instancenorm2d, maxpool1d and avgpool1d, normalize, cosine_similarity, one_hot, and pad in its
three modes and cropping.

activations (composed_activations.net): the activations (softplus, elu, selu, celu, mish,
hardtanh, relu6, hardsigmoid, hardswish, logsigmoid, softsign, prelu, glu, logsumexp; log1p,
expm1, detach) and the regression losses l1, smooth_l1 and huber against torch.nn.functional's
on their kinks and thresholds and where an exponential of the branch not taken would overflow:
the values (and NaN where PyTorch gives NaN), then every parameter after one SGD step.

rnn (composed_rnn.net): lstm and gru, two layers each, batch-first and sequence-first, against
torch.nn.LSTM and torch.nn.GRU with the same weights under the same names: every parameter
after three SGD steps.

usage: composed.py pointwise|layers|activations|rnn NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, st_load, st_save  # noqa: E402

# pointwise: the values are exact or one float32 rounding from the float64 reference (a product, a square
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


def pointwise(netc, work, check):
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
    subprocess.run([netc, os.path.join(HERE, "composed_pointwise.net"), "-o", exe], check=True)
    # the output on the data and on a row with NaN in every column: NaN wherever PyTorch's is
    nan_x = np.concatenate([x, np.full((1, N), np.nan, np.float32)])
    np.save(os.path.join(work, "x_nan.npy"), nan_x)
    pred = os.path.join(work, "z.npy")
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), "--predict",
                    f"x={os.path.join(work, 'x_nan.npy')}", "--predict-out", pred, "--quiet"], check=True)
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), "--data", f"x={paths['x']}",
                    "--data", f"t={paths['t']}", "--steps", "1", "--quiet", "--save", os.path.join(work, "out.safetensors")],
                   check=True)
    got = st_load(os.path.join(work, "out.safetensors"))

    p = {k: torch.from_numpy(v.astype(np.float64)).requires_grad_() for k, v in init.items()}
    xt = torch.from_numpy(x.astype(np.float64))
    with torch.no_grad():
        want_nan = forward(torch.from_numpy(nan_x.astype(np.float64)), p["w"], p["u"]).numpy()
    got_nan = np.load(pred)
    same = np.array_equal(np.isnan(got_nan), np.isnan(want_nan))
    print(f"NaN row: NaN in {int(np.isnan(got_nan).sum())} outputs, PyTorch in {int(np.isnan(want_nan).sum())}")
    check(same, "NaN where PyTorch's output is not, or the other way round")
    z = forward(xt, p["w"], p["u"])
    err = np.abs(got_nan[:len(x)] - z.detach().numpy()).max() / np.abs(z.detach().numpy()).max()
    print(f"values: largest difference {err:.2e} of the largest")
    check(err <= TOLERANCE, f"the values differ from PyTorch's by {err:.2e}")
    torch.nn.functional.mse_loss(z, torch.from_numpy(t.astype(np.float64))).backward()
    for name, v in p.items():
        want = (v - LR * v.grad).detach().numpy()
        e = np.abs(got[name] - want).max() / np.abs(want).max()
        print(f"{name} after one step: largest difference {e:.2e} of the largest (gradient {v.grad.numpy()})")
        check(e <= TOLERANCE, f"{name} differs from PyTorch's after one step by {e:.2e}")


# layers: float32 against float64 through two 3x3 convolutions (27 and 72 terms), a group norm
# over 72 values and three steps: ~1e-6 relative per tensor; a wrong group (a channel in the
# next group), a missing 1/scale or a block of the upsampling's gradient left out moves a tensor
# by 1e-2 and more.
LAYERS_TOL = 2e-5
LAYERS_STEPS, LAYERS_LR = 3, 0.1


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.gn = torch.nn.GroupNorm(4, 8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.seq1 = torch.nn.Conv1d(4, 6, 3, padding=2, dilation=2)
        self.seq2 = torch.nn.Conv1d(6, 6, 4, stride=2, padding=1, groups=2)
        self.de1 = torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)
        self.de2 = torch.nn.ConvTranspose2d(4, 6, (2, 3), stride=(2, 1), padding=(0, 1), groups=2, bias=False)
        self.de3 = torch.nn.ConvTranspose2d(3, 2, 3, dilation=2, padding=2)
        self.de4 = torch.nn.ConvTranspose2d(3, 2, 2, stride=2, output_padding=1)
        self.conv3 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.inorm = torch.nn.InstanceNorm2d(4, affine=True)
        self.proj = torch.nn.Linear(108, 8)
        self.proj2 = torch.nn.Linear(108, 8)
        self.cls = torch.nn.Linear(4, 3)
        self.conv4 = torch.nn.Conv2d(3, 2, 3)
        self.conv5 = torch.nn.Conv2d(3, 2, 3)
        self.causal = torch.nn.Conv1d(4, 3, 3, dilation=2)
        self.conv6 = torch.nn.Conv2d(3, 2, 1)

    def forward(self, x, s, lbl):
        F = torch.nn.functional
        y = torch.relu(self.gn(self.conv(x)))
        z = self.conv2(F.interpolate(y, scale_factor=2, mode="nearest"))
        r = self.de2(torch.relu(self.de1(x)))
        g = self.inorm(self.conv3(x)) + F.instance_norm(x[:, :1], eps=1e-3)
        h1 = self.seq1(s)
        p = F.max_pool1d(h1, 3, stride=2, padding=1) + F.avg_pool1d(h1, 2)
        emb = self.proj(x.flatten(1))
        cs = F.cosine_similarity(emb, self.proj2(x.flatten(1)))
        c5 = self.cls(F.one_hot(lbl, 4).double())
        pads = (self.conv4(F.pad(x, (1, 2, 0, 1), mode="reflect")), self.conv5(F.pad(x, (2, 1, 1, 2), mode="replicate")),
                self.causal(F.pad(s, (4, 0))), self.conv6(F.pad(x, (-1, -1, 1, 0), value=0.5)))
        pads = torch.cat([v.flatten(1) for v in pads], 1)
        return (z, self.seq2(torch.relu(h1)), r, self.de3(x), self.de4(x), g, p, F.normalize(emb), cs, c5, pads)


def layers(netc, work, check):
    torch.manual_seed(4)
    net = Layers().double()
    with torch.no_grad():  # the norm's scale and shift off 1 and 0, so that a missing one shows
        net.gn.weight.add_(torch.randn(8, dtype=torch.float64) * 0.3)
        net.gn.bias.add_(torch.randn(8, dtype=torch.float64) * 0.3)
    init = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()}
    st_save(os.path.join(work, "init.safetensors"), init)
    rng = np.random.default_rng(6)
    data = {"x": (3, 6, 6), "t": (8, 12, 12), "s": (4, 10), "u": (6, 5), "v": (6, 24, 12), "o": (2, 6, 6),
            "e": (2, 13, 13), "gt": (4, 6, 6), "pt": (6, 5), "nt": (8,), "ct": (), "c5t": (5, 3), "padt": (254,)}
    data = {k: rng.standard_normal((2 * LAYERS_STEPS, *v)).astype(np.float32) for k, v in data.items()}
    data["lbl"] = rng.integers(0, 4, (2 * LAYERS_STEPS, 5))
    for k, v in data.items():
        np.save(os.path.join(work, f"{k}.npy"), v)
    net.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in init.items()})
    opt = torch.optim.SGD(net.parameters(), lr=LAYERS_LR)
    for s in range(LAYERS_STEPS):
        opt.zero_grad()
        b = {k: torch.from_numpy(v[2 * s:2 * s + 2]) for k, v in data.items()}
        b = {k: v if k == "lbl" else v.double() for k, v in b.items()}
        outs = net(b["x"], b["s"], b["lbl"])
        targets = [b[k] for k in ("t", "u", "v", "o", "e", "gt", "pt", "nt", "ct", "c5t", "padt")]
        sum(torch.nn.functional.mse_loss(a, t) for a, t in zip(outs, targets)).backward()
        opt.step()
    for tag, flags in (("channels-last", []), ("row-major", ["--layout=row-major"])):
        exe = os.path.join(work, f"layers-{tag}")
        subprocess.run([netc, os.path.join(HERE, "composed_layers.net"), "-o", exe, *flags], check=True)
        out = exe + ".safetensors"
        files = sum((["--data", f"{k}={work}/{k}.npy"] for k in data), [])
        subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), *files, "--steps", str(LAYERS_STEPS),
                        "--no-shuffle", "--quiet", "--save", out], check=True)
        got = st_load(out)
        for name, want in net.state_dict().items():
            want = want.numpy()
            e = np.linalg.norm(got[name] - want) / np.linalg.norm(want)
            print(f"{tag}: {name} relative error {e:.2e}")
            check(e <= LAYERS_TOL, f"{tag}: {name} differs from PyTorch's by {e:.2e}")


# activations: each value is a few float32 roundings of functions within 2 ulp (rt_expf, log1pf,
# expm1f, tanhf) from the float64 reference, ~10 ulp = 6e-7 of the value at most; 2e-6 leaves
# a margin. Values float32 cannot hold (logsigmoid(100) = -4e-44, below FLT_MIN: the float32
# exponential gives 0) count within ACT_FLOOR. A gradient that differs at a kink or a threshold
# moves one element's gradient by half of it or all of it: 1e-3 and more of the parameter.
ACT_TOL, ACT_FLOOR = 2e-6, 1e-30
# the parameters after one step: the targets are the values plus N(0, 1), so each value's share
# of the gradient, z - t, is about 1 whether the value is 1e-3 or 100; float32 rounds a value of
# 100 by 4e-6 (half an ulp), and so that share, by 4e-6 of the largest gradient. A gradient that
# differs at a kink moves one of ~20 shares by half of it or all of it: 1e-2 of the largest.
ACT_GRAD_TOL = 2e-5
# kinks and thresholds: 0, +-1 (hardtanh), 6 (relu6), +-3 (hardsigmoid, hardswish), 1.5 (2x = 3,
# softplus's threshold at beta 2), 20 (the default threshold); +-30 and +-100, where an
# exponential of the other branch would overflow
ACT_ROW = [0.0, 1.0, -1.0, 3.0, -3.0, 6.0, 1.5, 20.0, 30.0, -30.0, 100.0, -100.0, 0.5, -0.5, 2.5, -2.5]
# y - s for the regression losses: 0 (l1's kink), +-0.5 (smooth_l1's beta), +-2 (huber's delta)
ACT_DIFF = [0.0, 0.5, -0.5, 2.0, -2.0, 0.0, 0.25, 1.0, -1.0, 3.0, 0.0, -3.0, 0.5, -2.0, -0.25, 2.0]
ACT_SLOPES = {"slope.weight": [0.1], "slopes.weight": [0.25, -0.5, 1.5, 0.3]}


def hardswish(y):
    """F.hardswish through PyTorch's scalar kernel, one element at a time. At 3 its vectorised
    CPU kernel gives the gradient 1 (x >= 3 takes the linear side), the scalar and CUDA kernels
    3/3 + 1/2 = 3/2 (x <= 3 the quadratic one), as netc does."""
    return torch.stack([torch.nn.functional.hardswish(v.reshape(1))[0] for v in y.flatten()]).reshape(y.shape)


def act_forward(y, p):
    F = torch.nn.functional
    return torch.cat([F.softplus(y), F.softplus(y, beta=2, threshold=3), F.elu(y), F.selu(y), F.celu(y, alpha=0.5),
                      F.mish(y), F.hardtanh(y), F.hardtanh(y, -0.5, 6), F.relu6(y), F.hardsigmoid(y),
                      hardswish(y), F.logsigmoid(y), F.softsign(y), F.prelu(y, p["slope.weight"]),
                      F.prelu(y.reshape(len(y), 4, 4), p["slopes.weight"]).reshape(len(y), N),
                      torch.log1p(y * y) + torch.expm1(0.01 * y), torch.tanh(y) * torch.tanh(y).detach(), F.glu(y),
                      torch.logsumexp(y, -1, keepdim=True)], -1)


def act_loss(y, s, z, t):
    F = torch.nn.functional
    return (F.l1_loss(y, s) + F.smooth_l1_loss(y, s, beta=0.5) + F.huber_loss(y, s, delta=2) +
            F.mse_loss(z, t))


def close(got, want):
    """the largest |got - want| over ACT_TOL |want| + ACT_FLOOR (at most 1 passes), NaN where
    PyTorch's is"""
    if not np.array_equal(np.isnan(got), np.isnan(want)): return np.inf
    ok = ~np.isnan(want)
    return float((np.abs(got[ok] - want[ok]) / (ACT_TOL * np.abs(want[ok]) + ACT_FLOOR)).max())


def activations(netc, work, check):
    x = np.array([ACT_ROW, ACT_ROW[::-1]], dtype=np.float32)
    s = x - np.array([ACT_DIFF, ACT_DIFF[::-1]], dtype=np.float32)
    init = {"w": np.zeros(N, np.float32), **{k: np.array(v, np.float32) for k, v in ACT_SLOPES.items()}}
    p = {k: torch.from_numpy(v.astype(np.float64)).requires_grad_() for k, v in init.items()}
    y = torch.from_numpy(x.astype(np.float64)) + p["w"]
    with torch.no_grad():  # targets near the values (ACT_GRAD_TOL)
        t = act_forward(y, p).numpy()
    t = (t + np.random.default_rng(5).standard_normal(t.shape)).astype(np.float32)
    for k, v in (("x", x), ("s", s), ("t", t)):
        np.save(os.path.join(work, f"{k}.npy"), v)
    exe = os.path.join(work, "activations")
    subprocess.run([netc, os.path.join(HERE, "composed_activations.net"), "-o", exe], check=True)

    # the output with the default initialisation (prelu's slopes 0.1 and 0.25), on the data and on
    # a row of NaN
    nan_x = np.concatenate([x, np.full((1, N), np.nan, np.float32)])
    np.save(os.path.join(work, "x_nan.npy"), nan_x)
    pred, w_only = os.path.join(work, "z.npy"), os.path.join(work, "w.safetensors")
    st_save(w_only, {"w": np.zeros(N, np.float32)})
    subprocess.run([exe, "--init", w_only, "--init-partial", "--predict", f"x={work}/x_nan.npy", "--predict-out",
                    pred, "--quiet"], check=True)
    default = {"slope.weight": torch.tensor([0.1], dtype=torch.float64),
               "slopes.weight": torch.full((4,), 0.25, dtype=torch.float64)}
    with torch.no_grad():
        want = act_forward(torch.from_numpy(nan_x.astype(np.float64)), default).numpy()
    e = close(np.load(pred), want)
    print(f"values (default slopes, and a NaN row): largest error {e:.2f} of the tolerance")
    check(e <= 1, f"the values differ from PyTorch's: {e:.2f} of the tolerance (inf: NaN in other places)")

    # one SGD step from other slopes: every parameter against PyTorch's
    st_save(os.path.join(work, "init.safetensors"), init)
    out = os.path.join(work, "out.safetensors")
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), *sum((["--data", f"{k}={work}/{k}.npy"]
                    for k in "xst"), []), "--steps", "1", "--quiet", "--save", out], check=True)
    got = st_load(out)
    f64 = {k: torch.from_numpy(v.astype(np.float64)) for k, v in (("s", s), ("t", t))}
    act_loss(y, f64["s"], act_forward(y, p), f64["t"]).backward()
    for name, v in p.items():
        want = (v - LR * v.grad).detach().numpy()
        e = np.abs(got[name] - want).max() / np.abs(want).max()
        print(f"{name} after one step: largest difference {e:.2e} of the largest")
        check(e <= ACT_GRAD_TOL, f"{name} differs from PyTorch's after one step by {e:.2e}")


# rnn: float32 against float64 through 7 steps of two layers (each step a product of 5 to 8
# terms and a few roundings in the gates), over 3 steps of SGD: ~1e-6 relative per tensor, as
# the layers case; a gate out of PyTorch's order, a missing bias or a state not carried from
# one step to the next moves a tensor by 1e-2 and more.
RNN_TOL, RNN_STEPS, RNN_LR = 2e-5, 3, 0.5


class Rnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.LSTM(5, 8, 2, batch_first=True)
        self.dec = torch.nn.GRU(4, 5, 2)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, s):
        a, _ = self.enc(x)
        b, _ = self.dec(s.transpose(0, 1))
        return a, b.transpose(0, 1), self.fc(a[:, -1])


def rnn(netc, work, check):
    torch.manual_seed(8)
    net = Rnn().double()
    init = {k: v.detach().numpy().astype(np.float32) for k, v in net.state_dict().items()}
    st_save(os.path.join(work, "init.safetensors"), init)
    net.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in init.items()})
    rng = np.random.default_rng(9)
    data = {"x": (7, 5), "s": (6, 4), "t": (7, 8), "u": (6, 5), "v": (4,)}
    data = {k: rng.standard_normal((3 * RNN_STEPS, *v)).astype(np.float32) for k, v in data.items()}
    for k, v in data.items():
        np.save(os.path.join(work, f"{k}.npy"), v)
    opt = torch.optim.SGD(net.parameters(), lr=RNN_LR)
    for step in range(RNN_STEPS):
        opt.zero_grad()
        b = {k: torch.from_numpy(v[3 * step:3 * step + 3].astype(np.float64)) for k, v in data.items()}
        outs = net(b["x"], b["s"])
        sum(torch.nn.functional.mse_loss(o, b[k]) for o, k in zip(outs, "tuv")).backward()
        opt.step()
    exe = os.path.join(work, "rnn")
    subprocess.run([netc, os.path.join(HERE, "composed_rnn.net"), "-o", exe], check=True)
    out = exe + ".safetensors"
    files = sum((["--data", f"{k}={work}/{k}.npy"] for k in data), [])
    subprocess.run([exe, "--init", os.path.join(work, "init.safetensors"), *files, "--steps", str(RNN_STEPS),
                    "--no-shuffle", "--quiet", "--save", out], check=True)
    got = st_load(out)
    check(sorted(got) == sorted(init), f"the saved names {sorted(got)} are not PyTorch's {sorted(init)}")
    for name, want in net.state_dict().items():
        want = want.numpy()
        e = np.linalg.norm(got[name] - want) / np.linalg.norm(want)
        print(f"{name} relative error {e:.2e}")
        check(e <= RNN_TOL, f"{name} differs from PyTorch's by {e:.2e}")


def main():
    case, netc, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    check = Checks()
    {"pointwise": pointwise, "layers": layers, "activations": activations, "rnn": rnn}[case](netc, work, check)
    print(f"composed {case}: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
