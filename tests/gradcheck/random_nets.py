#!/usr/bin/python3
"""Random small networks of views, layouts and reductions, each checked as the gradcheck nets are.

    random_nets.py gen SEED [--recipe]          print net number SEED (as `emu` has it)
    random_nets.py check NETC WORKDIR FIRST COUNT [--flags "NETC FLAGS"] ...
    random_nets.py compile NETC WORKDIR FIRST COUNT
    random_nets.py emu NETC WORKDIR FIRST COUNT STEPS TOL [--ranks N] [NETC_FLAG ...]
    random_nets.py half NETC WORKDIR FIRST COUNT bf16|fp16 [NETC_FLAG ...]

`check` writes the nets FIRST .. FIRST + COUNT - 1 under WORKDIR and runs, for each,
`ir_gradcheck.py --trainer`: the compiled trainer's gradient (one SGD step) against the float64
reference interpreter on the IR after autodiff. Each `--flags` adds one more compilation of every
net (for example `--copy-views`, `--layout=row-major`, `--no-fuse`), checked the same way. A
failing net is left in WORKDIR with the command that reproduces it. `compile` takes each net
through the builds of BUILDS (CUDA, half precision, distributed, row-major, unfused) as far as
the generated code, without a C compiler: fast enough for hundreds of nets. `emu` compares each
net's CUDA trainer, emulated on the CPU, with its CPU trainer (emu_vs_cpu.sh), with dropout on
some values and another optimizer (with_recipe), which the float64 check cannot take; with
`--ranks N` both trainers are distributed and run as N ranks under mpirun, and the flags after
it (`--bucket-kib 1`, `--shard-optimizer`, `--sync-bn`) go to netc for both. `half` builds each
net's CUDA trainer with `--precision bf16` (or fp16) and checks it, emulated on the CPU, against
the float64 interpreter on netc's graph after autocast, whose half-precision values it rounds as
the device does (emu_vs_cpu.sh --reference, ir_gradcheck.py): the gradient of one SGD step, the
evaluation and --predict, to float32's tolerances.

Why random nets: the layout pass gives each value an order of its axes, permutes and reshapes
become views read in place in any of them, slices and concatenations are folded into the loops
that read them, and every reader (element-wise loops, reductions, norms, products, convolutions)
must either read that order correctly or be given a conversion. The hand-written gradcheck nets
cover each operator; these cover the combinations, which is where a reader that assumes
row-major or channels-last goes wrong (a batch norm over a transposed reshape, found by hand,
was one). The generator is deterministic: net SEED is the same text on every machine.

What a net holds: an input `x` f32[batch, ...] of rank 3 or 4 scaled by a parameter, or in about
a third of the nets token sequences: an embedding of `tokens` i64[batch, T] plus a float input
scaled by a parameter, and the loss gets a cross-entropy of next-token logits (a dense layer on
a [batch, T, ...] value) against `targets`, with ignore_index=-1 in most of them, and the metric
is their accuracy (ignoring the same; in a third of them with the top-2 to top-5 accuracy too). Then 5 to 10 steps, each on one or two live values
(mostly the newest, so chains form; sometimes an older one, so values have several readers):
element-wise functions and products (with a parameter broadcast along some axes, or with another
value), a value less its mean or times its maximum along an axis (kept and broadcast back),
permute, transpose, reshape (axes merged or split, up to rank 5), slice, split, concat of two or
three parts, indexing (`v[:, i]`, `v[i]`), sum / mean / var / max over an axis and sum / mean
over two, softmax and log_softmax along an axis, matmul (with a parameter, of a value with its
own transpose, or with a parameter whose batch axis broadcasts), dense, layernorm, rmsnorm,
attention over the last two axes (causal or not), `where` through a comparison, flatten, and on
values of rank 4 conv2d (1x1 and 3x3, strided, grouped; some followed by a batch norm alone,
which evaluation folds into them; some as a ResNet block's end, relu(batchnorm2d(conv2d(v)) +
v), which the compiler fuses), batchnorm2d (half of them frozen=true: the running statistics),
max and average pooling, whose channels-last results give the views their orders. About a fifth
of the nets freeze one or two layers (`freeze`, never the first), and a fifth of those with
dense layers that reach the loss train LoRA adapters on one or two of them (`lora`; in `emu`'s
nets some with dropout). The loss is the mean of sin of the last value plus terms of the first
value (so every element of the input reaches it) and of one other; the output (what `--predict`
writes) is the newest value whose first axis is as long as the batch. Axes are 2 to 5 long, in
three nets of ten one of them 7 to 17 (past a vector of 8 or 16 floats, so the loops' vector
bodies and their remainders both run), and no value holds more than MAX_ELEMENTS elements: a net
compiles and checks in seconds. Values are kept in range by tanh steps and parameters of std
0.5, so that float32 and float64 agree to the reference's tolerance (ir_gradcheck.py,
trainer_check). `input_scale` (1) scales the input: the CUDA emulation's data is N(0, 50^2),
which `-D input_scale=0.02` brings back to N(0, 1).
"""
import math
import os
import random
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_ELEMENTS = 3000     # per value (its whole shape): a step that would make more is not taken
N_STEPS = (5, 10)       # the fewest and the most steps of a net


def listed(xs):
    """Integers as the language writes a list of them: [2, 3, 4]."""
    return f"[{', '.join(map(str, xs))}]"


class Net:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.seed = seed
        # batch norms after convolutions, frozen ones and `freeze` lists, from a stream of their
        # own (as `tokens` below)
        self.more = random.Random(seed * 7919 + 3)
        self.res = random.Random(seed * 7919 + 4)      # residual blocks (conv)
        self.lines = []
        self.vals = []          # (name, shape) of the live values
        self.n = 0              # names given so far

    def fresh(self, expr, shape):
        if math.prod(shape) > MAX_ELEMENTS:
            return None
        name = f"v{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {expr}")
        self.vals.append((name, tuple(shape)))
        return name, tuple(shape)

    def label(self, kind):
        self.n += 1
        return f"{kind}{self.n}"

    def param(self, shape):
        """A parameter of `shape` (a tuple), N(0, 0.25)."""
        return f"{self.label('p')}: param({listed(shape)}, std=0.5)"

    # ---- the steps: each takes a live value (name, shape) and returns the new one, or None
    # when it does not apply to that shape

    def unary(self, v):
        f = self.rng.choice(["tanh", "sigmoid", "sin", "tanh", "silu", "gelu"])
        return self.fresh(f"{f}({v[0]})", v[1])

    def scale(self, v):
        """v times (or plus) a parameter broadcast along a random subset of its axes."""
        shape = v[1]
        pshape = [d if self.rng.random() < 0.5 else 1 for d in shape]
        lead = self.rng.randrange(len(shape))       # a parameter may have fewer axes
        pshape = pshape[lead:] or [shape[-1]]
        op = self.rng.choice(["*", "+", "*"])
        return self.fresh(f"{v[0]} {op} {self.param(pshape)}", shape)

    def binary(self, v):
        """v with another live value of the same shape."""
        same = [u for u in self.vals if u[1] == v[1] and u[0] != v[0]]
        if not same:
            return None
        u = self.rng.choice(same)
        op = self.rng.choice(["*", "+", "-"])
        return self.fresh(f"tanh({v[0]} {op} {u[0]})", v[1])

    def permute(self, v):
        r = len(v[1])
        perm = list(range(r))
        while perm == list(range(r)):
            self.rng.shuffle(perm)
        return self.fresh(f"permute({v[0]}, {listed(perm)})", [v[1][p] for p in perm])

    def transpose(self, v):
        r = len(v[1])
        a, b = self.rng.sample(range(r), 2)
        shape = list(v[1])
        shape[a], shape[b] = shape[b], shape[a]
        return self.fresh(f"transpose({v[0]}, {a}, {b})", shape)

    def reshape(self, v):
        shape = list(v[1])
        r = len(shape)
        splittable = [i for i, d in enumerate(shape) if any(d % f == 0 for f in (2, 3)) and d > 3]
        if r < 5 and splittable and self.rng.random() < 0.5:   # split an axis in two
            i = self.rng.choice(splittable)
            f = 2 if shape[i] % 2 == 0 else 3
            shape[i:i + 1] = [f, shape[i] // f] if self.rng.random() < 0.5 else [shape[i] // f, f]
        elif r > 2:                                             # merge two neighbours
            i = self.rng.randrange(r - 1)
            if shape[i] * shape[i + 1] > 24:
                return None
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        else:
            return None
        return self.fresh(f"reshape({v[0]}, {listed(shape)})", shape)

    def slice(self, v):
        axes = [i for i, d in enumerate(v[1]) if d >= 3]
        if not axes:
            return None
        a = self.rng.choice(axes)
        d = v[1][a]
        start = self.rng.randrange(d - 1)
        end = self.rng.randrange(start + 2, d + 1) if start + 2 <= d else d
        shape = list(v[1])
        shape[a] = end - start
        if self.rng.random() < 0.5:
            return self.fresh(f"slice({v[0]}, {a}, {start}, {end})", shape)
        end = f", {end - d}" if end < d else ""                # negative, or left out: to the end
        return self.fresh(f"slice({v[0]}, {a - len(v[1])}, {start - d}{end})", shape)

    def split(self, v):
        axes = [i for i, d in enumerate(v[1]) if d % 2 == 0 and d >= 4]
        if not axes:
            return None
        a = self.rng.choice(axes)
        k = self.rng.randrange(2)
        shape = list(v[1])
        shape[a] //= 2
        return self.fresh(f"split({v[0]}, 2, axis={a})[{k}]", shape)

    def concat(self, v):
        a = self.rng.randrange(len(v[1]))
        if v[1][a] > 4:
            return None
        others = [u for u in self.vals if len(u[1]) == len(v[1]) and u[0] != v[0] and u[1][a] <= 4 and
                  all(x == y for i, (x, y) in enumerate(zip(u[1], v[1])) if i != a)]
        u = self.rng.choice(others) if others else (f"tanh({v[0]})", v[1])
        shape = list(v[1])
        shape[a] += u[1][a]
        parts = [v[0], u[0]] if self.rng.random() < 0.5 else [u[0], v[0]]
        if self.rng.random() < 0.3:                 # three parts, one read twice
            parts.append(parts[0])
            shape[a] += v[1][a] if parts[0] == v[0] else u[1][a]
        return self.fresh(f"concat([{', '.join(parts)}], axis={a})", shape)

    def center(self, v):
        """v less its mean (or times its maximum) along an axis, kept as an axis of 1 and
        broadcast back."""
        a = self.rng.randrange(len(v[1]))
        if self.rng.random() < 0.6:
            return self.fresh(f"{v[0]} - mean({v[0]}, {a}, keepdim=true)", v[1])
        return self.fresh(f"{v[0]} * max({v[0]}, {a - len(v[1])}, keepdim=true)", v[1])

    def reduce_axes(self, v):
        """sum or mean over two axes at once."""
        if len(v[1]) < 4:
            return None
        axes = sorted(self.rng.sample(range(len(v[1])), 2))
        f = self.rng.choice(["sum", "mean"])
        shape = [d for i, d in enumerate(v[1]) if i not in axes]
        return self.fresh(f"tanh({f}({v[0]}, {listed(axes)}))", shape)

    def index(self, v):
        """one position of axis 1 (x[:, i]) or of axis 0 (x[i]), the axis removed."""
        if len(v[1]) < 3:
            return None
        if self.rng.random() < 0.7:
            i = self.rng.randrange(-v[1][1], v[1][1])
            return self.fresh(f"{v[0]}[:, {i}]", v[1][:1] + v[1][2:])
        i = self.rng.randrange(v[1][0])
        return self.fresh(f"{v[0]}[{i}]", v[1][1:])

    def reduce(self, v):
        if len(v[1]) < 3:
            return None
        a = self.rng.randrange(len(v[1]))
        keep = self.rng.random() < 0.4
        f = self.rng.choice(["sum", "mean", "var", "max", "mean"])
        if f == "var" and v[1][a] < 2:
            return None
        shape = list(v[1])
        if keep:
            shape[a] = 1
        else:
            del shape[a]
        extra = ", correction=0" if f == "var" and self.rng.random() < 0.5 else ""
        keepdim = ", keepdim=true" if keep else ""
        return self.fresh(f"{f}({v[0]}, {a}{keepdim}{extra})", shape)

    def softmax(self, v):
        a = self.rng.randrange(-len(v[1]), len(v[1]))
        f = self.rng.choice(["softmax", "log_softmax"])
        return self.fresh(f"{f}({v[0]}, axis={a})", v[1])

    def matmul(self, v):
        shape = v[1]
        k = shape[-1]
        if self.rng.random() < 0.5:                 # with a parameter [K, N]
            n = self.rng.randrange(2, 6)
            return self.fresh(f"tanh(matmul({v[0]}, {self.param((k, n))}))", shape[:-1] + (n,))
        # with its own transpose: [..., M, K] @ [..., K, M]
        if shape[-2] > 6:
            return None
        return self.fresh(f"tanh(matmul({v[0]}, transpose({v[0]})) * 0.5)", shape[:-1] + (shape[-2],))

    def batched(self, v):
        """v [..., H, M, K] @ a parameter [H, K, N]: batch axes that broadcast."""
        shape = v[1]
        if len(shape) < 3:
            return None
        n = self.rng.randrange(2, 5)
        return self.fresh(f"tanh(matmul({v[0]}, {self.param((shape[-3], shape[-1], n))}))", shape[:-1] + (n,))

    def attention(self, v):
        """v as the queries, keys and values of attention over its last two axes (the keys and
        values through their own element-wise functions), causal or not."""
        if len(v[1]) < 3 or v[1][-2] < 2:
            return None
        causal = ", causal=true" if self.rng.random() < 0.5 else ""
        k = self.rng.choice([v[0], f"tanh({v[0]})", f"sin({v[0]})"])
        return self.fresh(f"attention({v[0]}, {k}, {v[0]} * 0.5{causal})", v[1])

    def where(self, v):
        """a leaky relu through a comparison: no gradient through the condition."""
        return self.fresh(f"where({v[0]} > 0.1, {v[0]}, {v[0]} * 0.3)", v[1])

    def pool(self, v):
        if len(v[1]) != 4 or v[1][2] < 2 or v[1][3] < 2:
            return None
        n, c, h, w = v[1]
        f = self.rng.choice(["maxpool2d", "avgpool2d"])
        return self.fresh(f"{f}({v[0]}, 2)", (n, c, h // 2, w // 2))

    def flatten(self, v):
        if len(v[1]) < 3 or math.prod(v[1][1:]) > 40:
            return None
        return self.fresh(f"flatten({v[0]})", (v[1][0], math.prod(v[1][1:])))

    def dense(self, v):
        n = self.rng.randrange(2, 6)
        bias = "" if self.rng.random() < 0.7 else ", bias=false"
        return self.fresh(f"tanh({self.label('fc')}: dense({v[0]}, {n}{bias}))", v[1][:-1] + (n,))

    def norm(self, v):
        if v[1][-1] < 3:
            return None
        f = self.rng.choice(["layernorm", "rmsnorm"])
        return self.fresh(f"{self.label('ln')}: {f}({v[0]})", v[1])

    def conv(self, v):
        if len(v[1]) != 4 or v[1][1] > 6:
            return None
        n, c, h, w = v[1]
        out = self.rng.randrange(2, 5)
        k = 1 if min(h, w) < 3 or self.rng.random() < 0.4 else 3
        pad = self.rng.choice([0, 1]) if k == 3 else 0
        stride = 2 if self.rng.random() < 0.25 else 1
        groups = 2 if c % 2 == 0 and self.rng.random() < 0.25 else 1
        out *= groups
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if ho < 1 or wo < 1:
            return None
        if n * h * w >= 4 and self.res.random() < 0.5:
            return self.residual(v, k, groups)
        extra = (f", stride={stride}" if stride > 1 else "") + (f", groups={groups}" if groups > 1 else "")
        # some have a batch norm of the convolution alone, as in a ResNet (no bias between them):
        # evaluation folds the two
        bn = n * ho * wo >= 4 and self.more.random() < 0.3
        y = f"{self.label('conv')}: conv2d({v[0]}, {out}, k={k}, pad={pad}{extra}{', bias=false' if bn else ''})"
        return self.fresh(f"tanh({self.batchnorm_of(y) if bn else y})", (n, out, ho, wo))

    def residual(self, v, k, groups):
        """A ResNet block's end, relu(batchnorm(conv(v)) + v): the convolution keeps v's shape
        (stride 1, padding k // 2), and the batch norm, the addition and the relu are the
        pattern the compiler fuses (and its backward, relu's gradient and the two branches'
        sum, with the batch norm's sums), on either side of a layout change."""
        n, c, h, w = v[1]
        extra = f", groups={groups}" if groups > 1 else ""
        y = f"{self.label('conv')}: conv2d({v[0]}, {c}, k={k}, pad={k // 2}{extra}, bias=false)"
        return self.fresh(f"relu({self.batchnorm_of(y, self.res)} + {v[0]})", v[1])

    def batchnorm_of(self, expr, rng=None):
        rng = rng or self.more
        frozen = ", frozen=true" if rng.random() < 0.5 else ""   # the running statistics
        return f"{self.label('bn')}: batchnorm2d({expr}{frozen})"

    def batchnorm(self, v):
        if len(v[1]) != 4 or v[1][0] * v[1][2] * v[1][3] < 4:
            return None
        return self.fresh(self.batchnorm_of(v[0]), v[1])

    def live(self, terms):
        """The lines (and loss terms) whose values the loss reads."""
        value = re.compile(r"\b(?:v\d+|logits)\b")
        names = set(value.findall(" ".join(terms)))
        lines = []
        for line in reversed(self.lines):
            name, _, expr = line.partition(" = ")
            if name in names:
                names |= set(value.findall(expr))
                lines.append(line)
        return lines[::-1] + terms

    STEPS = [(unary, 2), (scale, 2), (binary, 2), (permute, 3), (transpose, 2), (reshape, 3), (slice, 2),
             (split, 1), (concat, 2), (reduce, 2), (softmax, 1), (matmul, 2), (dense, 1), (norm, 1),
             (conv, 3), (batchnorm, 2), (batched, 1), (attention, 2), (where, 1), (pool, 1), (flatten, 1),
             (center, 1), (reduce_axes, 1), (index, 1)]

    def build(self):
        rng = self.rng
        batch = rng.randrange(2, 4)
        rank = rng.choice([3, 4, 4])
        dims = [rng.randrange(2, 6) for _ in range(rank - 1)]
        if rng.random() < 0.3:          # one axis past a vector's width of floats (8 or 16)
            dims[rng.randrange(rank - 1)] = rng.randrange(7, 18)
        # a third of the nets are of token sequences, drawn from a stream of their own so that
        # the others are the same texts as before they were added
        tokens = random.Random(self.seed * 7919 + 1)
        seq = tokens.random() < 0.3
        if seq:  # 10 classes at least: the emulation's labels are 0 to 9
            t, vocab, width = tokens.randrange(2, 9), tokens.randrange(10, 14), tokens.randrange(2, 9)
            ignore = tokens.random() < 0.6      # cross-entropy with ignore_index=-1, -1 among the labels
            data = f"# data: tokens=int:{vocab} targets=int:{'-1:' if ignore else ''}{vocab} x=normal"
            inputs = [f"input tokens : i64[batch, {t}]", f"input targets : i64[batch, {t}]",
                      f"input x : f32[batch, {t}, {width}]"]
        else:
            data = "# data: x=normal"
            inputs = [f"input x : f32{listed(['batch'] + dims)}"]
        self.header = [f"# random net {self.seed} (tests/gradcheck/random_nets.py)", data,
                       f"model random_{self.seed}", f"const batch = {batch}", "const input_scale = 1", *inputs]
        if seq:
            # plus a float input, as the emulation's check of a NaN in the data needs one
            self.fresh(f"{self.label('emb')}: embedding(tokens, {vocab}, {width}, std=0.5) + "
                       f"x * input_scale * {self.param((width,))}", (batch, t, width))
        else:
            self.fresh(f"x * input_scale * {self.param(dims)}", [batch] + dims)
        steps, weights = zip(*self.STEPS)
        n_steps = rng.randrange(N_STEPS[0], N_STEPS[1] + 1)
        done = 0
        while done < n_steps:
            # mostly the newest value, sometimes an older one (a value read twice)
            v = self.vals[-1] if rng.random() < 0.7 else rng.choice(self.vals)
            step = rng.choices(steps, weights)[0]
            if step(self, v) is not None:
                done += 1
        last = self.vals[-1]
        terms = [f"mean(sin({last[0]}))"]
        for u in [self.vals[0]] + rng.sample(self.vals[1:-1], min(1, len(self.vals) - 2)):
            terms.append(f"mean({u[0]} * {u[0]}) * 0.1")
        metrics = []
        if seq:  # next-token logits from the newest value still [batch, t, ...], and their accuracy
            u = [u for u in self.vals if len(u[1]) == 3 and u[1][:2] == (batch, t)][-1]
            self.lines.append(f"logits = {self.label('head')}: dense({u[0]}, {vocab})")
            ignored = ", ignore_index=-1" if ignore else ""
            terms.append(f"cross_entropy(logits, targets{ignored})")
            # a third of them a top-k accuracy, drawn from a stream of its own
            top = random.Random(self.seed * 7919 + 6)
            metric = f"accuracy(logits, targets{ignored})"
            if top.random() < 0.3:  # the arg-max's and a top-k accuracy, metrics = [...]
                metric = f"[{metric}, accuracy(logits, targets{ignored}, top_k={top.randrange(2, 6)})]"
            metrics = [f"  metrics = {metric}"]
        # what --predict writes: the newest value of one row per sample (its first axis as long as
        # the batch), compared element by element where the loss sees only a mean of its sines
        rows = [u for u in self.vals if u[1] and u[1][0] == batch]
        output = [f"  output = {rows[-1][0]}"] if rows else []
        train = ["train {", f"  loss = {' + '.join(terms)}", "  optimizer = sgd(0.1)", *metrics, *output]
        # a quarter of the nets with two layers or more (about a fifth of all) freeze one or two,
        # never the first (a recipe's no_decay entry names it) and never all of the others
        layers = re.findall(r"\b([a-z]+\d+): ", "\n".join(self.lines + terms))[1:]
        if len(layers) >= 2 and self.more.random() < 0.25:
            frozen = self.more.sample(layers, min(self.more.choice([1, 2]), len(layers) // 2))
            train.append("  freeze = [" + ", ".join('"' + name + '"' for name in frozen) + "]")
        # a fifth of the nets with dense layers that reach the loss (or a classifier head) train
        # LoRA adapters on one or two of them, and nothing else
        lora = random.Random(self.seed * 7919 + 5)
        dense = re.findall(r"\b((?:fc|head)\d+): dense", "\n".join(self.live(terms)))
        if dense and lora.random() < 0.2:
            targets = lora.sample(dense, min(lora.choice([1, 2]), len(dense)))
            train.append("  lora = lora([" + ", ".join('"' + name + '"' for name in targets) + "], "
                         f"r={lora.randrange(1, 4)}, alpha={lora.choice([1, 2, 4])})")
        return "\n".join(self.header + self.lines + train + ["}"]) + "\n"


# The emulation's nets (gen with recipe=True): the optimizers and clipping the float64 check
# cannot take (it reads one plain SGD step), and dropout, whose masks the CPU and the emulated
# device draw alike but the float64 interpreter does not.
# Adam's and LAMB's eps is 1e-4, not 1e-8: an element whose gradient is rounding noise about 0
# (a parameter that barely matters) would otherwise step by about lr with the noise's sign on
# each side, and the two sides' sums differ in the last bits; with 1e-4 a difference d in a
# gradient moves the step by at most lr * d / eps.
OPTIMIZERS = ["sgd(0.05, momentum=0.9, nesterov=true, weight_decay=1e-3)",
              "adamw(0.01, betas=[0.9, 0.95], eps=1e-4, weight_decay=0.1)", "lamb(0.01, eps=1e-4, weight_decay=0.01)",
              "lars(0.5, momentum=0.9, weight_decay=1e-3, eta=0.02)"]


def with_recipe(text, seed):
    """`text` (a net from Net.build) with dropout on some of its values and another optimizer,
    drawn from a stream of their own (the net is the same otherwise)."""
    rng = random.Random(seed * 7919 + 2)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        name, eq, expr = line.partition(" = ")
        if eq and name.startswith("v") and name[1:].isdigit() and name != "v1" and rng.random() < 0.15:
            lines[i] = f"{name} = dropout({expr}, p={rng.choice([0.1, 0.25])})"
        elif line.startswith("  optimizer = "):
            lines[i] = f"  optimizer = {rng.choice(OPTIMIZERS)}"
            if rng.random() < 0.5:  # the first layer's parameters (a no_decay entry must match one)
                first = re.search(r"\b([a-z]+\d+): ", text).group(1)
                lines.insert(i + 1, f'  no_decay = ["{first}"]')
            if rng.random() < 0.4:
                lines.insert(i + 1, "  clip_grad_norm = 0.5")
        elif line.startswith("  lora = ") and rng.random() < 0.5:   # dropout on the adapters' input
            lines[i] = line[:-1] + f", dropout={rng.choice([0.1, 0.25])})"
    return "\n".join(lines) + "\n"


def gen(seed, recipe=False):
    text = Net(seed).build()
    return with_recipe(text, seed) if recipe else text


def run_nets(what, work, first, count, commands, quiet=False, recipe=False):
    """Write nets FIRST .. FIRST + COUNT - 1 under WORK and run, for each, the (tag, argv) pairs
    of commands(seed, path): a non-zero exit is a failure, printed with the command that
    reproduces it; with `quiet` the others print nothing."""
    os.makedirs(work, exist_ok=True)
    failed, runs = [], 0
    for seed in range(first, first + count):
        path = os.path.join(work, f"random_{seed}.net")
        with open(path, "w") as f:
            f.write(gen(seed, recipe))
        for tag, cmd in commands(seed, path):
            runs += 1
            r = subprocess.run(cmd, capture_output=True, text=True)
            tag = f"net {seed}" + (f" ({tag})" if tag else "")
            if r.returncode != 0:
                failed.append(tag)
                print(f"FAIL {tag}: status {r.returncode}: {' '.join(cmd)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}",
                      flush=True)
            elif not quiet:
                print(f"ok   {tag}: {(r.stdout.strip().splitlines() or [''])[-1][:200]}", flush=True)
    print(f"random_nets {what}: {count} nets, {runs} runs, {len(failed)} failed"
          + (": " + ", ".join(failed) if failed else ""))
    return 1 if failed else 0


def check(netc, work, first, count, variants):
    """Each net's trainer, built with each list of flags in `variants`, against the float64
    interpreter (ir_gradcheck.py --trainer)."""
    def commands(seed, path):
        for flags in variants:
            yield " ".join(flags), [sys.executable, os.path.join(HERE, "ir_gradcheck.py"), "--trainer", netc, path,
                                    os.path.join(work, f"t{seed}"), *flags]
    return run_nets("check", work, first, count, commands)


# compile: the builds each net goes through, to the generated code (--dump=c, no C compiler)
BUILDS = [[], ["--no-fuse"], ["--copy-views", "--no-remat"], ["--layout=row-major"], ["--distributed", "--bucket-kib", "1"],
          ["--backend", "cuda"], ["--backend", "cuda", "--precision", "bf16"],
          ["--backend", "cuda", "--precision", "fp16", "--layout=row-major"],
          ["--backend", "cuda", "--distributed", "--shard-optimizer", "--sync-bn"]]


def compile_only(netc, work, first, count):
    """Each net through every build of BUILDS up to its generated code: netc must accept it
    (an internal error or a failed IR verification exits with status 70, a refusal with 1)."""
    def commands(seed, path):
        for flags in BUILDS:
            yield " ".join(flags), [netc, path, "--dump=c", *flags]
    return run_nets("compile", work, first, count, commands, quiet=True)


def emu(netc, work, first, count, steps, tol, ranks=None, flags=()):
    """Each net's CUDA trainer emulated on the CPU against its CPU trainer (emu_vs_cpu.sh, which
    needs the environment tests/cuda/CMakeLists.txt gives it); with `ranks`, both distributed
    and run as that many ranks (emu_vs_cpu.sh --ranks); `flags` go to netc for both."""
    script = os.path.join(HERE, "..", "cuda", "emu", "emu_vs_cpu.sh")
    dist = ["--ranks", str(ranks)] if ranks else []
    def commands(seed, path):
        yield "", [script, *dist, netc, work, path, str(steps), str(tol), "-D", "input_scale=0.02", *flags]
    return run_nets("emu", work, first, count, commands, recipe=True)


def half(netc, work, first, count, precision, flags=()):
    """Each net's CUDA trainer in half precision, emulated on the CPU, against the float64
    interpreter that rounds as it does (emu_vs_cpu.sh --reference, which needs the environment
    tests/cuda/CMakeLists.txt gives it); `flags` go to netc."""
    script = os.path.join(HERE, "..", "cuda", "emu", "emu_vs_cpu.sh")
    def commands(seed, path):
        yield precision, [script, "--reference", precision, netc, work, path, *flags]
    return run_nets("half", work, first, count, commands)


def main():
    a = sys.argv[1:]
    if a[:1] == ["gen"] and (len(a) == 2 or a[2:] == ["--recipe"]):
        sys.stdout.write(gen(int(a[1]), len(a) == 3))
        return 0
    if len(a) >= 5 and a[0] == "check":
        variants, rest = [[]], a[5:]
        while rest:
            if rest[0] != "--flags" or len(rest) < 2:
                raise SystemExit(f"random_nets: expected --flags \"...\", found {rest[0]!r}")
            variants.append(rest[1].split())
            rest = rest[2:]
        return check(a[1], a[2], int(a[3]), int(a[4]), variants)
    if len(a) == 5 and a[0] == "compile":
        return compile_only(a[1], a[2], int(a[3]), int(a[4]))
    if len(a) >= 7 and a[0] == "emu":
        ranks, flags = None, a[7:]
        if flags[:1] == ["--ranks"]:
            if len(flags) < 2 or not flags[1].isdigit() or int(flags[1]) < 1:
                raise SystemExit(f"random_nets emu: --ranks takes a count of ranks from 1, found "
                                 f"{flags[1] if len(flags) > 1 else 'nothing'!r}")
            ranks, flags = int(flags[1]), flags[2:]
        return emu(a[1], a[2], int(a[3]), int(a[4]), int(a[5]), float(a[6]), ranks, flags)
    if len(a) >= 6 and a[0] == "half":
        if a[5] not in ("bf16", "fp16"):
            raise SystemExit(f"random_nets half: the precision is bf16 or fp16, found {a[5]!r}")
        return half(a[1], a[2], int(a[3]), int(a[4]), a[5], a[6:])
    raise SystemExit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    sys.exit(main())
