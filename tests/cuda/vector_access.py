#!/usr/bin/env python3
"""Element-wise kernels read and write four elements a thread with vector accesses:

    vector_access.py NETC WORK MODEL.net MIN_KERNELS MIN_BROADCAST [NETC OPTIONS...]

The model is compiled for sm_90 (NVRTC, no GPU) with the options (--precision bf16). In the
generated .cu a four-a-thread kernel loops over q (NETC_FOR32(q, ...)), loads each operand that
it reads in aligned runs of four as `const NetcF4 l<id> = ((const NetcF4 *)v<id>)[P];` (NetcH4
for float16 and bfloat16), where P is q for an operand element for element with the loop and an
index in q otherwise (`q % 16` for a per-channel operand of a channels-last value with 64
channels), and stores each output as `((NetcF4 *)v<id>)[q] = s<id>;`.
In the PTX that netc carries for the architecture, each such kernel must then have at least that
many `ld.global[.nc].v4.f32` (`.u32`, `.u16`) and `st.global.v4.f32` (likewise): the loop over j was
unrolled and the vectors are registers, not local memory (an 8- or 16-byte aligned `.local`
array, which a struct left in memory would need; sinf's and cosf's range reduction keeps a
4-byte aligned one of its own). At least MIN_KERNELS kernels must be four a thread and at least MIN_BROADCAST
of the loads must be of broadcast operands (P other than q), so that a change that stops
vectorising either fails here. Every vector access must lie inside its tensor: its index is
evaluated for every q of the loop against the tensor's element count (from `netc --dump=fused`,
whose ids are the .cu's, checked against the kernels' comments). Misaligned operands are checked by the emulation
(tests/cuda/emu/emu_vs_cpu.sh builds the kernels with -fsanitize=alignment).
"""
import os
import re
import subprocess
import sys

import numpy as np


def fail(msg):
    print(f"FAIL: {name}: {msg}")
    sys.exit(1)


netc, work, model, least, least_broadcast = sys.argv[1:6]
least, least_broadcast, options = int(least), int(least_broadcast), sys.argv[6:]
name = os.path.basename(model)[:-4]
out = os.path.join(work, "vector-" + "-".join([name] + [o.lstrip("-") for o in options]))
subprocess.run(["rm", "-rf", out], check=True)
os.makedirs(out)
r = subprocess.run([netc, model, "--backend", "cuda", "--arch", "sm_90", *options, "--emit-dir", f"{out}/src",
                    "-o", f"{out}/{name}"], capture_output=True, text=True)
if r.returncode:
    fail(f"netc exited with {r.returncode}:\n{r.stderr}")

# every node's element count, from the graph the .cu is written from (its ids are the .cu's)
r = subprocess.run([netc, model, "--backend", "cuda", *options, "--dump=fused"], capture_output=True, text=True)
if r.returncode:
    fail(f"netc --dump=fused exited with {r.returncode}:\n{r.stderr}")
def elements(dims):
    """The element count of a shape as netc prints it, `128, 64` (empty for a scalar)."""
    return int(np.prod([int(d) for d in dims.split(",") if d.strip()]))


numel = {int(m.group(1)): elements(m.group(2))
         for m in re.finditer(r"^\s*%(\d+) = .*?\b[a-z]+\d+\[([\d, ]*)\]", r.stdout, re.M)}

cu = open(f"{out}/src/{name}.cu").read()
kernels = {}  # name -> (loads, stores) of a four-a-thread kernel
broadcast = 0  # loads at an index other than q
for m in re.finditer(r'^extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)^}', cu, re.S | re.M):
    body = m.group(2)
    if "NETC_FOR32(q, " in body:
        at = re.findall(r"const Netc[FH]4 l\d+ = \(\(const Netc[FH]4 \*\)v(\d+)\)\[([^\]]+)\];", body)
        st = re.findall(r"\(\(Netc[FH]4 \*\)v(\d+)\)\[q\] = s\d+;", body)
        kernels[m.group(1)] = (len(at), len(st))
        broadcast += sum(p != "q" for _, p in at)
        # each access lies inside its tensor: the index over every q of the loop (C's / and % on
        # non-negative integers are Python's // and %), in units of four elements
        for c in re.finditer(r"// %(\d+) = .*?\b[a-z]+\d+\[([\d, ]*)\]", body):
            want = elements(c.group(2))
            if numel.get(int(c.group(1))) != want:
                fail(f"{m.group(1)}: %{c.group(1)} has {want} elements in the .cu's comment, "
                     f"{numel.get(int(c.group(1)))} in --dump=fused (the ids do not match)")
        q = np.arange(int(re.search(r"NETC_FOR32\(q, (\d+)\)", body).group(1)), dtype=np.int64)
        for v, p in at + [(v, "q") for v in st]:
            index = eval(p.replace("/", "//"), {"q": q})
            top, quads = int(np.max(index)), numel[int(v)] // 4
            if int(np.min(index)) < 0 or top >= quads:
                fail(f"{m.group(1)}: v{v}[{p}] reaches quad {top}, v{v} has {quads} ({numel[int(v)]} elements)")
if len(kernels) < least:
    fail(f"{len(kernels)} kernels take four elements a thread, expected at least {least}")
if broadcast < least_broadcast:
    fail(f"{broadcast} vector loads of broadcast operands, expected at least {least_broadcast}")

images = open(f"{out}/src/{name}_images.c").read()
m = re.search(r"static const unsigned char ptx_90\[\d+\] = \{(.*?)\};", images, re.S)
if not m:
    fail("no sm_90 PTX in the images")
ptx = bytes(int(b) for b in m.group(1).replace("\n", "").split(",") if b.strip()).rstrip(b"\0").decode()
entries = {e.group(1): e.group(2) for e in
           re.finditer(r"^\.visible \.entry (\w+)\((.*?)^}", ptx, re.S | re.M)}

loads = stores = 0
for k, (want_ld, want_st) in sorted(kernels.items()):
    if k not in entries:
        fail(f"kernel {k} is not in the PTX")
    body = entries[k]
    ld = len(re.findall(r"\bld\.global(?:\.nc)?\.v4\.(?:f32|[bu]32|[bu]16)\b", body))
    st = len(re.findall(r"\bst\.global\.v4\.(?:f32|[bu]32|[bu]16)\b", body))
    if ld < want_ld or st < want_st:
        fail(f"{k}: {ld} vector loads and {st} stores in the PTX, the .cu has {want_ld} and {want_st}")
    # a NetcF4 (NetcH4) left in memory is a 16 (8) byte aligned local array read and written
    # in vectors; sinf's and cosf's range reduction for large arguments keeps a 28-byte array of
    # words there, which is theirs
    if re.search(r"\.local \.align (?:8|16)\b|\b(?:ld|st)\.local\.v[24]\.", body):
        fail(f"{k}: keeps vectors in local memory (its NetcF4 values are not registers)")
    loads, stores = loads + want_ld, stores + want_st
print(f"PASS: {' '.join([name] + options)}: {len(kernels)} kernels four elements a thread, {loads} vector loads "
      f"({broadcast} of broadcast operands) and {stores} stores, each one in the PTX")
