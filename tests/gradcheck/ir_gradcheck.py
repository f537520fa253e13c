#!/usr/bin/python3
"""Check autodiff's gradients on the IR itself, independent of code generation and the runtime.

    ir_gradcheck.py NETC MODEL.net
    ir_gradcheck.py --trainer NETC MODEL.net WORKDIR [--exe TRAINER] [NETC_FLAG ...]

The second form checks the compiled trainer against this float64 reference instead of finite
differences: the trainer starts from the same parameters (--init) on the same batch and takes
one SGD step, and the gradient it applied, (p - p') / lr, must match the reference's gradient
nodes. This needs no finite differences, so it also holds for models whose loss is too curved or
kinked for the trainer's float32 --gradcheck (batch norm over a handful of values per channel).
Then the trainer evaluates the same parameters on the same batch (--eval-only), and its loss must
match the reference's with batch norm from the running statistics (eval_check), and its accuracy
too where the model has the metric (accuracy_check). The gradient's tolerance includes how far float32
rounding alone moves it, measured by evaluating the same graph again in float32 (float32_spread):
a net whose loss amplifies rounding gets the room it needs, and every other keeps float32's.
Flags after WORKDIR go to netc when it compiles the trainer (`--copy-views`, `--no-fuse`, ...).
With `--exe TRAINER` the trainer was built elsewhere from those flags and is run as it is (the
emulated CUDA trainer of emu_vs_cpu.sh --reference).

Half precision (`--precision bf16` or `fp16` among the flags): the reference is then the graph
after autocast (`--dump=layout` with the flags), its casts included, and the interpreter rounds
every value of a half-precision type to it (from float32, as the device rounds), so that the
products read the operands the trainer's products read; under fp16 the loss gradient's seed is
LOSS_SCALE (halved while the reference overflows fp16), and the trainer's first scale too. The
trainer's values before each rounding differ from float64's by float32's rounding only, which
moves a rounded value by one unit of its last place only where it lies that close to a rounding
boundary (per float32 unit of difference, a fraction 2^-16 of the values in bf16, which keeps
16 fewer bits, and 2^-13 in fp16). So float32's tolerances below hold, plus one such unit (TIP)
where a checked value may itself be a product's rounded result (a filter's gradient, an
output); they do not hold for wide products in a chain (a rounding tipped upstream moves every
sum it enters, so that further roundings tip too: tests/gradcheck/conv2d_winograd.net in bf16
misses by 13 tolerances). Over random_nets.py's nets 0-99 in both precisions the largest error
was 0.26 of its tolerance (a gradient; evaluation 0.026, --predict 0.0053), where a reference
that does not round is 1 to 16 tolerances off in the gradients and 4 to 400 in the evaluation
loss.

Runs `NETC MODEL.net --dump=grad`, evaluates the printed graph with a float64 reference
interpreter (torch on the CPU), and compares every trainable parameter's gradient node with
central finite differences of the loss (every element up to 64 per parameter). The data comes
from make_data.py (same distributions as the trainer-level check); parameters are N(0, 1)
with a fixed seed.

A detach node's value is held at the checked point while the finite differences move the
parameters, which is what detach means: no gradient flows through it.

Why these tolerances: in float64 with h = 1e-6 the central difference is off by ~h^2 * f'''
(1e-12) plus rounding ~1e-16 / h (1e-10); an error of 1e-6 + 1e-5 * |g| is a wrong rule, not
noise. A kink (relu, max-pool tie) within 1e-6 of a checked point is improbable with random data.
Also checks that every evaluated value has the shape the IR says it has.
"""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_data  # noqa: E402

torch.set_default_dtype(torch.float64)

NODE = re.compile(r'\s+%(\d+) = (\w+)(?: "([^"]*)")?(?:\(([^)]*)\))? (\w+)\[([^\]]*)\](.*)$')
INT_DTYPES = {"i32", "i64", "u8"}
HALF = {"bf16": torch.bfloat16, "f16": torch.float16}
# --precision fp16: the loss gradient's first seed (the trainer's --loss-scale); halved while the
# reference overflows fp16 anywhere, as the trainer would skip that step (the trainer's default,
# 65536, overflows in these nets, whose gradients are not small)
LOSS_SCALE = 1024.0
# One unit in the last place of a half-precision value, relative to the value (at most): a value
# whose float32 sum lies that close to a rounding boundary rounds the other way in the trainer
TIP = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}


class Node:
    def __init__(self, m):
        self.id = int(m.group(1))
        self.op = m.group(2)
        self.name = m.group(3)
        self.ins = [int(t.strip()[1:]) for t in m.group(4).split(",")] if m.group(4) else []
        self.dtype = m.group(5)
        self.shape = tuple(int(d) for d in m.group(6).split(",")) if m.group(6).strip() else ()
        self.attr = {}
        for tok in m.group(7).split("#", 1)[0].split():
            k, _, v = tok.partition("=")
            try:
                self.attr[k] = [float(x) for x in v.split(",")] if v else True
            except ValueError:  # a word (filter=krsc in --dump=layout)
                self.attr[k] = v


def parse_dump(text):
    nodes, params, loss, n_fwd = [], [], None, None
    for line in text.splitlines():
        m = NODE.match(line)
        if m:
            nodes.append(Node(m))
        elif line.startswith("backward:"):
            n_fwd = len(nodes)
        elif line.startswith("loss = %"):
            loss = int(line.split("%")[1])
        elif line.startswith("param "):
            m = re.match(r"param (\S+) = %(\d+)( frozen| buffer)?(?:\s+grad %(\d+))?", line)
            params.append((m.group(1), int(m.group(2)), not m.group(3),
                           int(m.group(4)) if m.group(4) else None))
    for i, n in enumerate(nodes):
        assert n.id == i, f"node %{n.id} printed at position {i}"
    return nodes, params, loss, len(nodes) if n_fwd is None else n_fwd


def ignored_label(n, default=None):
    """The label an accuracy or cross-entropy node `n` leaves out (ignore_index), or `default`."""
    return int(n.attr["ignore_index"][0]) if "ignore_index" in n.attr else default


def top_k(n):
    """How many of the largest logits an accuracy node `n` counts a label among (top_k, else 1)."""
    return int(n.attr["top_k"][0]) if "top_k" in n.attr else 1


def ints(a):
    return [int(x) for x in a]


def sum_to(x, shape):
    lead = x.dim() - len(shape)
    x = x.sum(dim=tuple(range(lead))) if lead else x
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(dim=axes, keepdim=True) if axes else x


def vjp(f, x, dy):
    x = x.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(f(x), x, dy)
    return g


class Interp:
    """Evaluates the graph in float64, or in float32 (dtype) to measure float32 rounding."""

    def __init__(self, nodes, inputs, params, dtype=torch.float64):
        self.nodes, self.inputs, self.params, self.dtype = nodes, inputs, params, dtype
        self.param_order = list(params)  # the model's order: bn_stats' running=K indexes it
        self.masks = {}
        self.evaluating = False  # batch norm from the running statistics, as an evaluation does
        self.loss_scale = LOSS_SCALE
        self.half = None  # the trainer's half precision (bf16, fp16), where the graph has one
        self.frozen = {}  # detach nodes' values held fixed for the finite differences

    def mask(self, n, shape):
        key = int(n.attr["mask"][0])
        if key not in self.masks:  # one fixed mask per seed id, shared by forward and gradient
            g = torch.Generator().manual_seed(1000 + key)
            self.masks[key] = (torch.rand(shape, generator=g) >= n.attr["p"][0]).to(self.dtype)
        return self.masks[key] / (1 - n.attr["p"][0])

    def conv_args(self, n):
        a = n.attr
        return dict(stride=ints(a["stride"]), padding=ints(a["pad"]), dilation=ints(a["dilation"]),
                    groups=int(a["groups"][0]))

    def pool_args(self, n):
        a = n.attr
        return dict(kernel_size=ints(a["kernel"]), stride=ints(a["stride"]), padding=ints(a["pad"]))

    def eval_node(self, n, v):
        x = [v[i] for i in n.ins]
        op, a = n.op, n.attr
        axis = int(a["axis"][0]) if "axis" in a else -1  # printed only when not the last axis
        if op == "input": return self.inputs[n.name]
        if op == "param": return self.params[n.name]
        if op == "const": return torch.tensor(a["value"][0], dtype=self.dtype)
        simple = {
            "add": lambda: x[0] + x[1], "sub": lambda: x[0] - x[1], "mul": lambda: x[0] * x[1],
            "div": lambda: x[0] / x[1], "neg": lambda: -x[0], "relu": lambda: torch.relu(x[0]),
            "sigmoid": lambda: torch.sigmoid(x[0]), "tanh": lambda: torch.tanh(x[0]),
            "gelu": lambda: F.gelu(x[0]), "exp": lambda: torch.exp(x[0]),
            "log": lambda: torch.log(x[0]), "sqrt": lambda: torch.sqrt(x[0]),
            "sin": lambda: torch.sin(x[0]), "cos": lambda: torch.cos(x[0]),
            "log1p": lambda: torch.log1p(x[0]), "expm1": lambda: torch.expm1(x[0]),
            "detach": lambda: self.frozen.get(n.id, x[0]).detach(),
            "expand": lambda: x[0].expand(n.shape).clone(), "reshape": lambda: x[0].reshape(n.shape),
            "sum": lambda: x[0].sum(), "mean": lambda: x[0].mean(),
            "sum_to": lambda: sum_to(x[0], n.shape),
            "bce_logits": lambda: F.binary_cross_entropy_with_logits(x[0], x[1].expand_as(x[0]), reduction="none"),
            "relu_grad": lambda: x[1] * (x[0] > 0),
            "sigmoid_grad": lambda: x[1] * x[0] * (1 - x[0]),
            "tanh_grad": lambda: x[1] * (1 - x[0] * x[0]),
            "gelu_grad": lambda: vjp(F.gelu, x[0], x[1]),
            "bce_logits_grad": lambda: x[2] * (torch.sigmoid(x[0]) - x[1]),
            "gelu_tanh": lambda: F.gelu(x[0], approximate="tanh"),
            "gelu_tanh_grad": lambda: vjp(lambda t: F.gelu(t, approximate="tanh"), x[0], x[1]),
            "silu": lambda: F.silu(x[0]), "silu_grad": lambda: vjp(F.silu, x[0], x[1]),
            "softmax": lambda: torch.softmax(x[0], axis),
            "softmax_bwd": lambda: x[0] * (x[1] - (x[1] * x[0]).sum(axis, keepdim=True)),
            "log_softmax": lambda: F.log_softmax(x[0], axis),
            # log_softmax's Jacobian depends on its input t only through softmax(t) = exp(y), and
            # log_softmax(y) = y, so torch's vjp at y is the one at t
            "log_softmax_bwd": lambda: vjp(lambda t: F.log_softmax(t, axis), x[0], x[1]),
        }
        if op in simple: return simple[op]()
        if op == "cast": return x[0].long() if n.dtype in INT_DTYPES else x[0].to(self.dtype)
        if op == "dropout": return x[0] * self.mask(n, x[0].shape)
        if op == "dropout_grad": return x[0] * self.mask(n, x[0].shape)
        if op == "matmul":
            p, q = x
            if "trans_a" in a: p = p.transpose(-1, -2)
            if "trans_b" in a: q = q.transpose(-1, -2)
            return p @ q
        if op in ("permute", "permute_view"): return x[0].permute(ints(a["perm"]))
        if op == "layout": return x[0]  # another order of the same elements in memory
        if op == "loss_scale": return torch.tensor(self.loss_scale, dtype=self.dtype)
        if op == "slice": return x[0].narrow(int(a["axis"][0]), int(a["start"][0]), n.shape[int(a["axis"][0])])
        if op == "slice_bwd":
            dx = torch.zeros(n.shape, dtype=x[0].dtype)
            dx.narrow(int(a["axis"][0]), int(a["start"][0]), x[0].shape[int(a["axis"][0])]).copy_(x[0])
            return dx
        if op == "concat": return torch.cat([x[0], x[1]], int(a["axis"][0]))
        if op == "max": return x[0].amax(int(a["axis"][0]), keepdim=True)
        if op == "max_bwd":  # dy at the first maximal element (argmax returns the first)
            axis = int(a["axis"][0])
            first = x[0].argmax(axis, keepdim=True)
            return torch.zeros(n.shape, dtype=x[1].dtype).scatter(axis, first, x[1])
        if op == "conv2d": return F.conv2d(x[0], x[1], **self.conv_args(n))
        if op == "conv2d_bwd_data": return torch.nn.grad.conv2d_input(n.shape, x[1], x[0], **self.conv_args(n))
        if op == "conv2d_bwd_filter": return torch.nn.grad.conv2d_weight(x[0], n.shape, x[1], **self.conv_args(n))
        if op == "maxpool2d": return F.max_pool2d(x[0], **self.pool_args(n))
        if op == "maxpool2d_bwd": return vjp(lambda t: F.max_pool2d(t, **self.pool_args(n)), x[0], x[1])
        if op == "avgpool2d": return F.avg_pool2d(x[0], **self.pool_args(n))
        if op == "avgpool2d_bwd":
            return vjp(lambda t: F.avg_pool2d(t, **self.pool_args(n)), torch.zeros(n.shape, dtype=self.dtype), x[0])
        smoothing = a.get("smoothing", [0.0])[0]
        ignore = ignored_label(n, -100)  # without one, PyTorch's default
        if op == "xent":  # logits [..., C], labels [...]: PyTorch's per-position loss, 0 where ignored
            classes = x[0].shape[-1]
            return F.cross_entropy(x[0].reshape(-1, classes), x[1].reshape(-1), reduction="none",
                                   label_smoothing=smoothing, ignore_index=ignore).reshape(x[1].shape)
        if op == "xent_bwd":
            classes = x[0].shape[-1]
            keep = (x[1] != ignore).to(self.dtype)[..., None]
            onehot = F.one_hot(torch.where(x[1] == ignore, 0, x[1]), classes).to(self.dtype)
            target = (1 - smoothing) * onehot + smoothing / classes
            return keep * x[2][..., None] * (torch.softmax(x[0], -1) - target)
        if op == "gather": return F.embedding(x[1], x[0])
        if op == "gather_bwd":
            dim = n.shape[1]
            return torch.zeros(n.shape, dtype=self.dtype).index_add_(0, x[0].reshape(-1), x[1].reshape(-1, dim))
        if op == "iota":
            axis = int(a["axis"][0])
            view = [1] * len(n.shape)
            view[axis] = n.shape[axis]
            return torch.arange(n.shape[axis]).reshape(view).expand(n.shape).clone()
        compare = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}
        if op in compare: return compare[op](x[0], x[1]).to(torch.uint8)
        if op == "where": return torch.where(x[0] != 0, x[1], x[2]).expand(n.shape).clone()
        if op.startswith("bn_") or op == "row": return self.batchnorm(n, x)
        if op.startswith("attention"): return self.attention(n, x)
        if op == "part":
            at = int(a["part"][0])
            return x[0].reshape(-1)[at:at + math.prod(n.shape)].reshape(n.shape)
        if "norm" in op: return self.norm(n, x)
        if op == "accuracy":  # of a sequence, divided by the positions per sample; or counted
            right = x[0].argmax(-1) == x[1]
            if top_k(n) > 1:  # the label among the k largest: fewer than k above it (equal and earlier counts)
                label = x[1].clamp(0, x[0].shape[-1] - 1)
                at = x[0].gather(-1, label.unsqueeze(-1))
                first = torch.arange(x[0].shape[-1]) < label.unsqueeze(-1)
                above = ((x[0] > at) | ((x[0] == at) & first)).sum(-1)
                right = (above < top_k(n)) & (x[1] >= 0) & (x[1] < x[0].shape[-1])
            if ignored_label(n) is not None:  # the right ones among the labels not ignored (rt_main.c divides)
                return (right & (x[1] != ignored_label(n))).to(self.dtype).sum()
            return right.to(self.dtype).sum() / (x[1][0].numel() if x[1].dim() > 1 else 1)
        raise SystemExit(f"ir_gradcheck: no reference for operator '{op}'")

    @staticmethod
    def sdpa(q, k, v, mask, causal, scale, drop=None):
        """softmax(q k^T * scale + mask) v as torch composes it (torch.nn.functional's
        scaled_dot_product_attention is newer than this torch); causal is top-left aligned (key j
        > query i out), an integer mask keeps where it is not 0; a row with no key left is 0.
        Grouped-query attention (k and v with fewer heads) repeats them, as Hugging Face's
        repeat_kv: query head h reads key/value head h // (heads of q / heads of k). With attention
        dropout, drop (the kept probabilities' 1 / (1 - p), 0 elsewhere) multiplies the
        probabilities before v."""
        if q.dim() > 2 and k.shape[-3] != q.shape[-3]:
            k, v = (t.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3) for t in (k, v))
        s = q @ k.transpose(-1, -2) * scale
        keep = torch.ones(s.shape[-2:], dtype=torch.bool)
        if causal:
            keep = keep.tril()
        keep = keep.expand(s.shape)
        if mask is not None and mask.is_floating_point():
            s = s + mask
        elif mask is not None:
            keep = keep & (mask != 0)
        s = s.masked_fill(~keep, -math.inf)
        live = torch.isfinite(s).any(-1, keepdim=True)
        p = torch.softmax(torch.where(live, s, torch.zeros_like(s)), -1)
        p = torch.where(live, p, torch.zeros_like(p))
        return (p if drop is None else p * drop) @ v

    def attention(self, n, x):
        """attention and attention_masked; their gradient packs dq, dk, dv and the kernels'
        scratch (2 floats per query row, zeros here: nothing reads them). With heads read from
        tokens (attributes heads, head_dim, cols: fold_attention_heads), an operand i with
        heads[i] > 0 is [B, heads, T, head_dim], a view of columns of its operand [B, T, W] (one
        with heads[i] = 0 is read as it is), the result is [B, T, heads * e], and the gradient
        packs one gradient per operand, the operands read from tokens of one base sharing one."""
        causal, scale = "causal" in n.attr, n.attr["scale"][0]
        tokens = "heads" in n.attr
        H, d, c = ([int(v) for v in n.attr[key]] for key in ("heads", "head_dim", "cols")) if tokens else ([0] * 3,) * 3
        first = [next((j for j in range(i) if H[i] and H[j] and n.ins[j] == n.ins[i]), i) for i in range(3)]
        slots = [i for i in range(3) if first[i] == i]  # ir_attention_first: one gradient each
        leaves = [x[i].detach().requires_grad_(True) for i in slots]

        def qkv():
            ts = [leaves[slots.index(first[i])] for i in range(3)]
            return [t[..., c[i]:c[i] + H[i] * d[i]].reshape(t.shape[0], t.shape[1], H[i], d[i]).transpose(1, 2)
                    if H[i] else t for i, t in enumerate(ts)]

        def forward():
            q, k, v = qkv()  # dropout: one fixed mask of the probabilities' shape per seed id
            drop = self.mask(n, (*q.shape[:-1], k.shape[-2])) if "p" in n.attr else None
            mask = x[3] if len(x) > 3 and not n.op.endswith("_bwd") else x[5] if len(x) > 5 else None
            y = self.sdpa(q, k, v, mask, causal, scale, drop)
            return y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1) if tokens else y

        if not n.op.endswith("_bwd"):
            return forward().detach()
        grads = torch.autograd.grad(forward(), leaves, x[4], allow_unused=True)
        q = qkv()[0]
        rows = q.numel() // q.shape[-1]
        return torch.cat([(g if g is not None else torch.zeros_like(t)).reshape(-1) for g, t in zip(grads, leaves)]
                         + [torch.zeros(2 * rows, dtype=q.dtype)])

    def norm(self, n, x):
        """Layer norm (torch's F.layer_norm) and RMS norm (LlamaRMSNorm's formula) over the last
        axis; their gradients as torch's autograd computes them (vjp), the reference the
        backward operators must match."""
        eps = n.attr["eps"][0]
        D = x[0].shape[-1]
        ln = lambda t, w, b: F.layer_norm(t, (D,), w, b, eps)  # noqa: E731
        rms = lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w  # noqa: E731
        if n.op == "layernorm": return ln(*x)
        if n.op == "rmsnorm": return rms(*x)
        ones = torch.ones(D, dtype=self.dtype)

        def params(op, t, dy):
            if op == "layernorm":
                w = ones.clone().requires_grad_(True)
                b = torch.zeros(D, dtype=self.dtype, requires_grad=True)
                return torch.stack(torch.autograd.grad(ln(t, w, b), (w, b), dy))
            return vjp(lambda w: rms(t, w), ones, dy)
        if n.op in ("layernorm_bwd", "rmsnorm_bwd"):
            f = (lambda t: ln(t, x[1], None)) if n.op == "layernorm_bwd" else (lambda t: rms(t, x[1]))  # noqa: E731
            dx = vjp(f, x[0], x[2])
            if not n.attr.get("params"): return dx
            # attr.norm_params: dx, then the parameter gradients, flat
            return torch.cat([dx.flatten(), params(n.op[:-4], x[0], x[2]).flatten()])
        if n.op in ("layernorm_bwd_params", "rmsnorm_bwd_params"): return params(n.op[:-11], x[0], x[1])
        raise SystemExit(f"ir_gradcheck: no reference for operator '{n.op}'")

    def batchnorm(self, n, x):
        """Batch norm in training mode: the statistics are the batch's (biased variance), or for a
        frozen one (batchnorm2d frozen=true) the running statistics, constants of the step."""
        if n.op == "row": return x[0][int(n.attr["row"][0])]
        t = x[0]
        axes = tuple(i for i in range(t.dim()) if i != 1)
        per_c = lambda c: c.reshape((1, -1) + (1,) * (t.dim() - 2))  # noqa: E731
        if n.op == "bn_stats" and (n.attr.get("frozen") or self.evaluating):
            running = self.param_order[int(n.attr["running"][0])]
            mean, var = self.params[running], self.params[running.replace("running_mean", "running_var")]
            return torch.stack([mean, 1 / torch.sqrt(var + n.attr["eps"][0])])
        if n.op == "bn_stats":
            mean = t.mean(dim=axes)
            var = t.var(dim=axes, unbiased=False)
            return torch.stack([mean, 1 / torch.sqrt(var + n.attr["eps"][0])])
        if n.op == "bn_bwd_sums":  # operands (x, stats, dy), stats bn_stats' [mean, invstd]
            xhat = (t - per_c(x[1][0])) * per_c(x[1][1])
            return torch.stack([x[2].sum(dim=axes), (x[2] * xhat).sum(dim=axes)])
        xhat = (t - per_c(x[1])) * per_c(x[2])  # operands (x, mean, invstd, ...)
        if n.op == "bn_apply": return xhat * per_c(x[3]) + per_c(x[4])
        if n.op == "bn_bwd_data":
            w, sum_dy, sum_dy_xhat, dy = x[3], x[4], x[5], x[6]
            m = t.numel() / t.shape[1]
            return per_c(w * x[2]) * (dy - (per_c(sum_dy) + xhat * per_c(sum_dy_xhat)) / m)
        raise SystemExit(f"ir_gradcheck: no reference for operator '{n.op}'")

    def run(self, upto):
        v = []
        for n in self.nodes[:upto]:
            r = self.eval_node(n, v)
            if n.dtype in HALF:  # a half-precision value: its float32 rounded as the device does
                r = r.to(torch.float32).to(HALF[n.dtype]).to(self.dtype)
            if tuple(r.shape) != n.shape:
                raise SystemExit(f"ir_gradcheck: %{n.id} = {n.op}: value of shape {tuple(r.shape)}, "
                                 f"IR says {n.shape}")
            v.append(r)
        return v


def metric_nodes(nodes, correct):
    """The accuracy nodes of the metrics: the `correct` node itself, or the items its reshapes and
    concats join (metrics = [...]), in order."""
    n = nodes[correct]
    if n.op == "accuracy":
        return [correct]
    if n.op in ("reshape", "concat"):
        return [a for i in n.ins for a in metric_nodes(nodes, i)]
    raise SystemExit(f"ir_gradcheck: the metrics' counts come from {n.op}, not accuracy")


def metric_key(n, i):
    """Metric i's key in the trainer's log (rt_main.c's metric_key)."""
    if i == 0:
        return "accuracy"
    return f"top{top_k(n)}_accuracy" if top_k(n) > 1 else f"accuracy_{i + 1}"


def accuracy_check(nodes, values, correct, got):
    """The evaluation's accuracy (rt_main.c's accuracy_of) against the reference's `correct`
    node: the right predictions per sample (per position averaged over the sample's), or with
    ignore_index the right ones over the labels not ignored. A prediction whose two largest
    logits are within float32's reach of each other (1e-4 relative: the loss agrees to 1e-5)
    may go either way, and each such one may move the accuracy by one position's share.
    Returns the error as a fraction of its tolerance (where no tie was near, exactly equal)."""
    n = nodes[correct]
    logits, labels = (values[i] for i in n.ins)
    k = top_k(n)   # a near tie is between the k-th largest logit and the next
    top = logits.topk(k + 1, dim=-1).values if logits.shape[-1] > k else logits.topk(k, dim=-1).values
    near = ((top[..., k - 1] - top[..., k]) <= 1e-4 * top[..., k - 1].abs().clamp(min=1)
            if logits.shape[-1] > k else torch.zeros(top.shape[:-1], dtype=torch.bool))
    if ignored_label(n) is not None:
        counted = labels != ignored_label(n)
        share = 1 / max(int(counted.sum()), 1)
        want = values[correct].item() * share
        near &= counted
    else:
        want = values[correct].item() / labels.shape[0]
        share = 1 / labels.numel()
    tol = int(near.sum()) * share + 1e-6   # plus the log's digits
    print(f"  evaluation accuracy: trainer {got:.8g}, reference {want:.8g} ({int(near.sum())} near ties)")
    return abs(got - want) / tol


def predict_check(exe, work, name, init, files, it, values, output):
    """The trainer's --predict of the batch (the files of the inputs the output reads) against
    the reference's output node in evaluation: every element, in the logical layout, where the
    evaluation loss is one number (a mean of sin, say, which no order of the elements changes).
    Returns the largest error as a fraction of its tolerance."""
    reads, seen, todo = set(), {output}, [output]
    while todo:
        n = it.nodes[todo.pop()]
        if n.op == "input":
            reads.add(n.name)
        todo += [i for i in n.ins if i not in seen]
        seen.update(n.ins)
    out = os.path.join(work, name + "-predict.npy")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([exe, "--init", init, *[x for k in sorted(reads) for x in ("--predict", f"{k}={files[k]}")],
                    "--predict-out", out, "--quiet"], check=True)
    got = np.load(out).astype(np.float64)
    want = values[output].numpy()
    if got.shape != want.shape:
        print(f"  --predict: shape {got.shape}, the reference's output {want.shape}")
        return math.inf
    # float32 through the forward pass, each operator's rounding ~6e-8 relative, relative to the
    # element where it is large and to the value's scale where an element is a small difference
    # of large ones (x - mean(x), a normalised value) or a product of such
    tol = 1e-4 * np.abs(want) + 1e-5 * np.abs(want).max() + 1e-7
    if it.half:  # a product's result, rounded the other way (trainer_check)
        tol += TIP[it.half] * np.abs(want)
    error = float((np.abs(got - want) / tol).max(initial=0))
    print(f"  --predict: {want.size} output elements, the largest error {error:.2g} of its tolerance")
    return error


def eval_check(exe, work, name, init, args, it, loss, n_fwd, marks):
    """The trainer's evaluation (--eval-only) of the --init parameters on the batch against the
    reference's loss with batch norm from the running statistics: the forward pass the trainer
    generates apart for evaluation (convolution + batch norm folded, no batch statistics); and
    its accuracy where the model has the metric (accuracy_check), then again with every other
    label (of those not ignored) made the reference's prediction, so that the accuracy is far
    from 0 and a prediction or count gone wrong shows. Returns the largest error as a fraction
    of its tolerance."""
    log = os.path.join(work, name + "-eval.jsonl")
    correct = marks.get("correct")
    files = dict(a.split("=", 1) for a in args if "=" in a)  # input name -> its .npy file

    def evaluate(args, tag):
        if os.path.exists(log):
            os.remove(log)
        subprocess.run([exe, "--init", init, "--eval-only", *["--eval-data" if a == "--data" else a for a in args],
                        "--quiet", "--log", log], check=True)
        record = json.loads(open(log).read().splitlines()[-1])
        got = record["loss"]
        it.evaluating = True
        values = it.run(n_fwd)
        it.evaluating = False
        want = values[loss].item()
        # the log's 8 digits (5e-9 relative), and float32 through the forward pass: each operator's
        # rounding is ~6e-8 relative, summed over up to a few thousand elements per mean
        tol = 1e-5 * abs(want) + 1e-6
        print(f"  evaluation loss{tag}: trainer {got:.8g}, reference {want:.8g} "
              f"({abs(got - want) / tol:.2g} of its tolerance)")
        error = abs(got - want) / tol
        if correct is None:
            return error, values
        for i, m in enumerate(metrics):
            key = metric_key(it.nodes[m], i)
            if key not in record:
                print(f"  the evaluation logged no {key}, where the model has the metric")
                return math.inf, values
            error = max(error, accuracy_check(it.nodes, values, m, record[key]))
        return error, values

    metrics = metric_nodes(it.nodes, correct) if correct is not None else []
    error, values = evaluate(args, "")
    if "output" in marks:
        error = max(error, predict_check(exe, work, name, init, files, it, values, marks["output"]))
    if correct is None:
        return error
    correct = metrics[0]  # the labels of the first metric (every one's, with ignore_index) relabeled
    logits_id, labels_id = it.nodes[correct].ins
    while it.nodes[labels_id].op == "cast":  # labels of a narrower integer type, widened
        labels_id = it.nodes[labels_id].ins[0]
    if it.nodes[labels_id].op != "input":  # labels computed in the model: as they are
        return error
    label_input = it.nodes[labels_id].name
    labels = it.inputs[label_input]
    relabeled = labels.clone().reshape(-1)
    take = torch.arange(relabeled.numel()) % 2 == 0
    if ignored_label(it.nodes[correct]) is not None:
        take &= relabeled != ignored_label(it.nodes[correct])
    relabeled[take] = values[logits_id].argmax(-1).reshape(-1)[take]
    relabeled = relabeled.reshape(labels.shape)
    path = os.path.join(work, f"{name}-{label_input}-relabeled.npy")
    np.save(path, relabeled.numpy().astype(np.load(files[label_input]).dtype))  # the input's own type (i32, u8)
    it.inputs[label_input] = relabeled
    error = max(error, evaluate([f"{label_input}={path}" if a.startswith(label_input + "=") else a for a in args],
                                " (labels relabeled)")[0])
    it.inputs[label_input] = labels
    return error


def float32_spread(it, n):
    """The same graph evaluated again in float32 (PyTorch's operators, the reference's order of
    values, half-precision values rounded as before): how far float32 rounding alone moves each
    of the first n values from the float64 reference. Most nets keep it near float32's 6e-8
    relative; a net whose loss amplifies rounding (sin of a product of large values through
    batch statistics of a handful of elements, random_nets.py's net 1758) moves its gradients
    by up to half a percent, as much in PyTorch as in the trainer."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # the tensors the interpreter creates itself too
    try:
        it32 = Interp(it.nodes, {k: v if v.dtype == torch.long else v.float() for k, v in it.inputs.items()},
                      {k: v.float() for k, v in it.params.items()}, dtype=torch.float32)
        it32.half, it32.loss_scale = it.half, it.loss_scale
        return [v.double() if torch.is_floating_point(v) else v for v in it32.run(n)]
    finally:
        torch.set_default_dtype(default)


def trainer_check(netc, model, work, nodes, params, pvals, batch, values, flags, it, loss, n_fwd, marks,
                  emulated=None):
    """The compiled trainer's gradient (from one SGD step) against the reference's, and its
    evaluation (eval_check)."""
    values32 = float32_spread(it, len(nodes))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    from netc_testlib import st_load, st_save
    if any(n.op == "dropout" for n in nodes):
        raise SystemExit("ir_gradcheck --trainer: dropout masks differ between the trainer and the reference")
    lr = re.search(r"sgd\(([0-9.e-]+)\)", open(model).read())
    if not lr:
        raise SystemExit("ir_gradcheck --trainer: the model must use plain sgd(LR) (no momentum or decay)")
    lr = float(lr.group(1))
    name = os.path.splitext(os.path.basename(model))[0]
    os.makedirs(work, exist_ok=True)
    exe, init, out = (os.path.join(work, name + s) for s in ("-trainer", "-init.safetensors", "-out.safetensors"))
    st_save(init, {k: v.float().numpy() for k, v in pvals.items()})
    args = []
    for k, a in batch.items():
        np.save(os.path.join(work, f"{name}-{k}.npy"), a)
        args += ["--data", f"{k}={os.path.join(work, f'{name}-{k}.npy')}"]
    if emulated:  # a trainer built elsewhere from these flags (emu_vs_cpu.sh --reference)
        exe = emulated
    else:
        subprocess.run([netc, model, "-o", exe, *flags], check=True)
    scale = ["--loss-scale", f"{it.loss_scale:g}"] if it.half == "fp16" else []
    subprocess.run([exe, *args, "--init", init, "--steps", "1", "--no-shuffle", "--quiet", "--save", out, *scale],
                   check=True)
    got = st_load(out)
    checked = failed = nonzero = 0
    worst = 0.0  # the largest error as a fraction of its tolerance
    for pname, nid, trainable, gid in params:
        if not trainable:
            continue
        want = values[gid].reshape(-1).numpy() / (it.loss_scale if it.half == "fp16" else 1)
        p0 = pvals[pname].float().reshape(-1).numpy()
        applied = (p0.astype(np.float64) - got[pname].reshape(-1)) / lr
        # float32 rounding of p - lr * g is ~6e-8 * |p| / lr per element; the step itself runs
        # in float32 (~1e-6 relative through these small models); in half precision the
        # reference rounds where the trainer does, and a gradient that is a product's result
        # (a filter's) may have rounded the other way, by one unit in its last place (the
        # module's docstring)
        tol = 1e-3 * np.abs(want) + 1e-6 * np.abs(p0) / lr + 1e-5 * np.abs(want).max()
        # and what float32 rounding does to this gradient in PyTorch (float32_spread): the
        # trainer rounds at other places and in other orders, so its error is of the same size,
        # not at the same elements: the tensor's largest spread, four times over (the trainer's
        # largest error was 0.5 to 1.15 times PyTorch's in net 1758's tensors)
        spread = float((values32[gid] - values[gid]).abs().max()) if want.size else 0.0
        tol += 4 * spread / (it.loss_scale if it.half == "fp16" else 1)
        if it.half:
            tol += TIP[it.half] * np.abs(want)
        bad = np.abs(applied - want) > tol
        worst = max(worst, float((np.abs(applied - want) / tol).max(initial=0)))
        checked += want.size
        nonzero += int(np.count_nonzero(want))
        failed += int(bad.sum())
        for i in np.flatnonzero(bad)[:5]:
            print(f"  {pname}[{i}]: trainer {applied[i]:.9g}, reference {want[i]:.9g}")
    eval_error = eval_check(exe, work, name, init, args, it, loss, n_fwd, marks)
    print(f"ir_gradcheck --trainer: {os.path.basename(model)}: {checked} gradient elements checked "
          f"({nonzero} not zero), {failed} failed (the largest error {worst:.2g} of its tolerance); "
          f"evaluation {eval_error:.2g} of its tolerance")
    if not nonzero:  # a trainer that applied no step at all would pass
        print("ir_gradcheck --trainer: every checked gradient is zero: nothing trainable reaches the loss")
    sys.exit(1 if failed or not nonzero or eval_error > 1 else 0)


def main():
    trainer = len(sys.argv) >= 5 and sys.argv[1] == "--trainer"
    if len(sys.argv) != 3 and not trainer:
        raise SystemExit("usage: ir_gradcheck.py NETC MODEL.net | --trainer NETC MODEL.net WORKDIR [NETC_FLAG ...]")
    netc, model = sys.argv[1 + trainer:3 + trainer]
    flags, emulated = sys.argv[5:], None
    if flags[:1] == ["--exe"]:
        emulated, flags = flags[1], flags[2:]
    precision = flags[flags.index("--precision") + 1] if "--precision" in flags[:-1] else "fp32"
    half = precision if precision in ("bf16", "fp16") else None
    # in half precision, the graph after autocast (its casts, and the products' bf16 results)
    dump = subprocess.run([netc, model, "--dump=layout", *flags] if half else [netc, model, "--dump=grad"],
                          capture_output=True, text=True)
    if dump.returncode != 0:
        sys.stderr.write(dump.stdout + dump.stderr)
        raise SystemExit(f"ir_gradcheck: netc failed with status {dump.returncode}")
    nodes, params, loss, n_fwd = parse_dump(dump.stdout)
    batch = make_data.make_batch(model)
    inputs = {k: torch.from_numpy(np.asarray(a)).long() if a.dtype.kind in "iu"
              else torch.from_numpy(a.astype(np.float64))
              for k, a in batch.items()}
    g = torch.Generator().manual_seed(1)
    pvals = {name: torch.randn(nodes[nid].shape, generator=g) for name, nid, _, _ in params}
    for name in pvals:  # a variance, which a frozen batch norm divides by, is positive
        if name.endswith(".running_var"):
            pvals[name] = pvals[name].abs() + 0.5
    if trainer:  # the reference runs on the very float32 values the trainer starts from
        pvals = {k: v.float().double() for k, v in pvals.items()}
        inputs = {k: v if v.dtype == torch.long else v.float().double() for k, v in inputs.items()}
    it = Interp(nodes, inputs, pvals)
    it.half = half
    values = it.run(len(nodes))
    while half == "fp16" and it.loss_scale > 1 and not all(bool(torch.isfinite(x).all()) for x in values):
        it.loss_scale /= 2  # the scaled gradients overflow fp16: the trainer would skip the step
        values = it.run(len(nodes))
    if trainer:
        # the accuracy metric's node and the model's output (--predict), where the model has them
        marks = {k: int(v) for k, v in re.findall(r"^(correct|output) = %(\d+)$", dump.stdout, re.M)}
        trainer_check(netc, model, sys.argv[4], nodes, params, pvals, batch, values, flags, it, loss, n_fwd,
                      marks, emulated)
    checked = failed = 0
    h = 1e-6
    # detach(u) is u held at the point the gradient is taken: the finite differences read it there
    it.frozen = {n.id: values[n.id] for n in nodes[:n_fwd] if n.op == "detach"}
    for name, nid, trainable, gid in params:
        if not trainable:
            assert gid is None, f"frozen param {name} has a gradient"
            continue
        analytic = values[gid].reshape(-1)
        flat = pvals[name].view(-1)
        for i in range(min(64, flat.numel())):
            old = flat[i].item()
            flat[i] = old + h
            up = it.run(n_fwd)[loss].item()
            flat[i] = old - h
            down = it.run(n_fwd)[loss].item()
            flat[i] = old
            numeric = (up - down) / (2 * h)
            ok = math.isclose(analytic[i].item(), numeric, rel_tol=1e-5, abs_tol=1e-6)
            checked += 1
            if not ok:
                failed += 1
                print(f"  {name}[{i}]: autodiff {analytic[i].item():.9g}, finite difference {numeric:.9g}")
    print(f"ir_gradcheck: {os.path.basename(model)}: {checked} checked, {failed} failed")
    sys.exit(1 if failed or not checked else 0)


if __name__ == "__main__":
    main()
