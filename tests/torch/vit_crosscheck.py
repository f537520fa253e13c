"""models/vit.net against a Vision Transformer written out here in PyTorch with timm's
VisionTransformer parameter names (patch_embed.proj, cls_token, pos_embed, blocks.{i}.norm1,
.attn.qkv, .attn.proj, .norm2, .mlp.fc1, .mlp.fc2, norm, head): a small configuration through -D
(8x8 grey images, patches of 4, width 16, 2 layers of 2 heads, batch 4), the same initial weights
(torch's, saved to safetensors, given to the trainer with --init), the same images in the same
order (--no-shuffle), and STEPS AdamW steps with weight decay on the decay group only (timm's
split: biases, norms, cls_token and pos_embed without), clip_grad_norm (active: checked) and a
cosine schedule with warmup_steps = 2. The reference runs in float64.

Checked: every step's loss, learning rate and gradient norm before clipping; every parameter
after the run; the trainer's logits (--predict) against the reference's forward on the trained
weights; and netc's saved file loads into the PyTorch module with strict=True.

usage: vit_crosscheck.py NETC WORK [STEPS]
"""
import os
import sys

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from lm_check import (begin, as_float64, compare_logits, compare_params, compare_steps, compile_model, cosine_warmup,  # noqa: E402
                      nudged_init, predicted_logits, reference_steps, save_inputs, train)
from lm_check import key_bias_noise as lm_key_bias_noise  # noqa: E402
from netc_testlib import Checks  # noqa: E402

check = Checks()
CFG = dict(img_size=8, channels=1, classes=10, patch=4, dim=16, depth=2, heads=2, mlp_ratio=4)
BATCH, LR, WD, CLIP, WARMUP = 4, 1e-3, 0.05, 0.5, 2

# Tolerances, derived as gpt2_crosscheck.py's: float32 rounds each value at 2^-24 = 6e-8 relative,
# through sums of at most 4 * 16 = 64 terms (the MLP's second product; the patch convolution's 16),
# layer norms and softmaxes over 5 tokens, so the logits, losses and gradients differ by ~1e-6 of
# their size, and AdamW's update keeps a gradient's relative error. The bounds are those of
# gpt2_crosscheck.py; a missing term (a bias, the class token's or the position embedding's
# gradient, decay on a norm, no clipping) moves a tensor by 1e-3 of its size and more.
#
# The key part of each blocks.{i}.attn.qkv.bias (its middle third) has a gradient of 0 in exact
# arithmetic (softmax ignores a shift of all of a query's scores), so both sides follow rounding
# noise there, normalised by AdamW into updates of up to lr: held to |diff| <= steps * lr.
#
# Elsewhere a gradient element near 0 by chance does the same: Adam's first step is lr * g / |g|
# whatever g's size, so where |g| is 1e-7 of the tensor's root mean square, float32's rounding of g
# (1e-8 of that scale) moves that element by a good part of lr, and the later steps with it
# (seed 5's images: one element of pos_embed 5e-5 off, PyTorch's own float32 2e-5, then the
# gradient norms 2e-6). The images are chosen so that every gradient element of every step is at
# least 1e-5 of its tensor's root mean square in the reference (checked: SMALLEST_GRAD); there
# rounding moves an element by at most 1e-2 lr, within PARAM_TOL.
SMALLEST_GRAD = 1e-5
LOSS_TOL = 1e-6      # relative, per step (loss, grad_norm)
PARAM_TOL = 5e-6     # ||netc - torch|| / ||torch|| per tensor
LOGIT_TOL = 5e-6     # largest |difference| / largest |logit|
LR_TOL = 1e-7        # the logged rate is the double rate rounded to float


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        d = C // self.heads
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * d ** -0.5).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, mlp_ratio * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, channels, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    """timm's VisionTransformer (class token, no dropout) on raw pixels normalised as the model's."""

    def __init__(self, img_size, channels, classes, patch, dim, depth, heads, mlp_ratio):
        super().__init__()
        tokens = (img_size // patch) ** 2 + 1
        self.patch_embed = PatchEmbed(channels, dim, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, image):
        x = self.patch_embed((image / 255 - 0.2860) / 0.3530)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def no_decay(name):
    """timm's split (models/vit.net's no_decay): biases, norms, cls_token and pos_embed."""
    return name.endswith(".bias") or ".norm" in name or name.startswith(("norm.", "cls_token", "pos_embed"))


def key_bias_noise(name, got, want, start, steps):
    """attn.qkv.bias's key part (see the tolerances): |diff| <= steps * lr; the rest compared."""
    if not name.endswith("attn.qkv.bias"):
        return got, want, start
    return lm_key_bias_noise(check, name, got, want, start, CFG["dim"], steps * LR)


def smallest_gradient(name, g, smallest):
    """Keeps in smallest[0] the least |g| over the root mean square of its tensor, the key biases'
    (0 by construction, see the tolerances) left out."""
    g = g.detach().numpy().ravel()
    if name.endswith("attn.qkv.bias"):
        g = np.concatenate([g[:CFG["dim"]], g[2 * CFG["dim"]:]])
    smallest[0] = min(smallest[0], float(np.abs(g).min() / np.sqrt((g * g).mean())))


def reference(init, images, labels, steps):
    net = as_float64(ViT(**CFG), init)
    groups, smallest = [[], []], [1.0]
    for name, p in net.named_parameters():
        groups[no_decay(name)].append(p)
        p.register_hook(lambda g, name=name: smallest_gradient(name, g, smallest))
    opt = torch.optim.AdamW([{"params": groups[0], "weight_decay": WD}, {"params": groups[1], "weight_decay": 0.0}],
                            lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: cosine_warmup(k, steps, WARMUP))

    def loss_of(k):
        x, y = (torch.from_numpy(t[k * BATCH:(k + 1) * BATCH]) for t in (images, labels))
        return nn.functional.cross_entropy(net(x.double()), y)
    rows = reference_steps(net, opt, sched, steps, loss_of, CLIP)
    print(f"torch: the smallest gradient element is {smallest[0]:.1e} of its tensor's root mean square")
    check(smallest[0] >= SMALLEST_GRAD, f"a gradient element of {smallest[0]:.1e} of its tensor's root mean square: "
          f"below {SMALLEST_GRAD:g}, Adam amplifies its rounding (see the tolerances); choose other images")
    return net, rows


def main():
    netc, work, steps = begin(sys.argv, 1234)
    rng = np.random.default_rng(17)
    n, s = BATCH * steps, CFG["img_size"]
    images = rng.integers(0, 256, size=(n, CFG["channels"], s, s)).astype(np.float32)
    labels = rng.integers(0, CFG["classes"], size=n).astype(np.int64)
    inputs = save_inputs(work, "vit", {"image": images, "label": labels})
    init_file = os.path.join(work, "init.safetensors")
    init = nudged_init(ViT(**CFG), init_file, no_decay)

    exe = os.path.join(work, "vit")
    compile_model(netc, os.path.join(ROOT, "models", "vit.net"), exe,
                  dict(CFG, batch=BATCH, lr=LR, weight_decay=WD, grad_clip=CLIP, warmup_steps=WARMUP))
    logged, saved = train(exe, inputs, init_file, steps, exe)

    net64, rows = reference(init, images, labels, steps)
    compare_steps(check, logged, rows, CLIP, LOSS_TOL, LR_TOL)
    ref = {k: v.detach().numpy() for k, v in net64.state_dict().items()}
    compare_params(check, saved, ref, init, PARAM_TOL, lambda *a: key_bias_noise(*a, steps))

    # the trainer's own forward pass on its trained weights, against the reference's in float64
    trained64 = as_float64(ViT(**CFG), saved)
    got = predicted_logits(exe, exe + ".safetensors", {"image": inputs["image"]}, os.path.join(work, "logits.npy"))
    with torch.no_grad():
        compare_logits(check, got, trained64(torch.from_numpy(images).double()).numpy(), LOGIT_TOL)
    ViT(**CFG).load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)
    print(f"vit_crosscheck: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
