"""Trainers built once on a CPU machine and carried to the GPU machine (tests/gpu/pack.sh).

A trainer is named by what it was built from: the netc binary, the .net file and netc's
arguments (not paths, so a pack can move), hashed. `build` takes it from the cache folder when
it is there (stored xz-compressed: a ResNet-50 trainer's cubins and PTX shrink from 9.7 MB to
0.6 MB) and otherwise runs netc, storing the result when the cache is being filled. netc's
runtime libraries are not in the name: a pack holds one netc with its own runtime.
"""
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import time


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def key(netc, src, args):
    """The cache name of `netc src *args` (args without -o)."""
    what = {"netc": _sha256(netc), "model": _sha256(src), "args": [str(a) for a in args]}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
    return f"{os.path.basename(src).rsplit('.', 1)[0]}-{digest}"


def build(netc, src, args, out, cache=None, fill=False):
    """Put the trainer `netc src *args` at `out`. From `cache` when it holds it; else netc runs
    (and with `fill`, the result is stored in `cache`). Returns (how, seconds), how = 'cached'
    or 'built'. Raises subprocess.CalledProcessError (with the output) when netc fails."""
    t0 = time.time()
    name = key(netc, src, args) if cache else None
    stored = os.path.join(cache, name + ".xz") if cache else None
    if stored and os.path.exists(stored):
        tmp = f"{out}.tmp.{os.getpid()}"
        with lzma.open(stored) as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        return "cached", time.time() - t0
    cmd = [netc, src, "-o", out, *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd, p.stdout, p.stderr)
    if stored and fill:
        os.makedirs(cache, exist_ok=True)
        tmp = f"{stored}.tmp.{os.getpid()}"
        with open(out, "rb") as f, lzma.open(tmp, "wb", preset=6) as g:
            shutil.copyfileobj(f, g)
        os.replace(tmp, stored)
    return "built", time.time() - t0
