#!/usr/bin/python3
"""Write one batch of input data for a gradcheck model, as .npy files.

    make_data.py MODEL.net OUTDIR [--seed N]

Reads the model's `const` and `input` lines and a comment line that says how to fill each input:

    # data: x=normal t=unit label=int:10

and writes OUTDIR/<input>.npy with `batch` samples (the first axis of the input), then prints
the trainer arguments that bind them, one `--data name=path` pair per line.

Distributions (chosen per input to keep the checked function smooth near the data):
    normal     N(0, 1)
    uniform    U(0.5, 1.5), strictly positive
    away       +-U(0.5, 1.5): at least 0.5 away from 0 (relu kinks)
    unit       U(0, 1) (binary cross-entropy targets)
    perm       each sample a permutation of distinct values 0.1 apart, centred on 0 (max-pool
               inputs without near-ties)
    int:K      integers uniform in [0, K) (class labels)
    int:A:K    integers uniform in [A, K) (labels with an ignore index A < 0 among them)
Inputs without an entry are `normal` if they are float and an error if they are integers.
"""
import argparse
import os
import re
import sys
import zlib

import numpy as np

FLOAT_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}
INT_DTYPES = {"i32": np.int32, "i64": np.int64, "u8": np.uint8}


def split_top(s, sep=","):
    """Split s at `sep` outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def strip_comment(line):
    return line.split("#", 1)[0].strip()


def evaluate(expr, consts):
    return eval(expr, {"__builtins__": {}}, dict(consts))  # test files only: trusted input


def parse_model(path):
    """(inputs, spec): inputs = [(name, dtype, shape)], spec = {name: distribution}."""
    consts, inputs, spec = {}, [], {}
    with open(path) as f:
        for raw in f:
            m = re.match(r"\s*#\s*data:(.*)", raw)
            if m:
                for item in m.group(1).split():
                    k, v = item.split("=", 1)
                    spec[k] = v
                continue
            line = strip_comment(raw)
            if line.startswith("const "):
                for item in split_top(line[len("const "):]):
                    k, v = item.split("=", 1)
                    consts[k.strip()] = evaluate(v.strip(), consts)
            m = re.match(r"input\s+(\w+)\s*:\s*(\w+)\s*\[(.*)\]$", line)
            if m:
                dims = tuple(int(evaluate(d, consts)) for d in split_top(m.group(3)))
                inputs.append((m.group(1), m.group(2), dims))
    return inputs, spec


def sample(rng, dist, dtype, shape):
    n = shape[0]
    per = int(np.prod(shape[1:], dtype=np.int64))
    if dist.startswith("int:"):
        lo, _, k = dist[4:].rpartition(":")
        return rng.integers(int(lo or 0), int(k), size=shape).astype(INT_DTYPES.get(dtype, np.int64))
    if dtype not in FLOAT_DTYPES:
        sys.exit(f"make_data: integer input needs an int:K distribution, found '{dist}'")
    if dist == "normal":
        v = rng.standard_normal(shape)
    elif dist == "uniform":
        v = rng.uniform(0.5, 1.5, shape)
    elif dist == "away":
        v = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    elif dist == "unit":
        v = rng.uniform(0.0, 1.0, shape)
    elif dist == "perm":
        v = np.stack([(rng.permutation(per) - per / 2) * 0.1 for _ in range(n)]).reshape(shape)
    else:
        sys.exit(f"make_data: unknown distribution '{dist}'")
    return v.astype(FLOAT_DTYPES[dtype])


def make_batch(path, seed=0):
    """{input name: array} for one batch of the model at `path`."""
    inputs, spec = parse_model(path)
    unknown = set(spec) - {name for name, _, _ in inputs}
    if unknown:
        sys.exit(f"make_data: '# data:' names unknown inputs {sorted(unknown)}")
    # one stream per model, so adding a model never changes another one's data
    rng = np.random.default_rng([seed, zlib.crc32(os.path.basename(path).encode())])
    batch = {}
    for name, dtype, shape in inputs:
        default = "normal" if dtype in FLOAT_DTYPES else "?"
        batch[name] = sample(rng, spec.get(name, default), dtype, shape)
    return batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for name, arr in make_batch(args.model, args.seed).items():
        out = os.path.join(args.outdir, name + ".npy")
        np.save(out, arr)
        print("--data")
        print(f"{name}={out}")


if __name__ == "__main__":
    main()
