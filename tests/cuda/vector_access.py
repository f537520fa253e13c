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
unrolled and the vectors are registers, with no local memory (`.local`, which a struct left in
memory would need). At least MIN_KERNELS kernels must be four a thread and at least MIN_BROADCAST
of the loads must be of broadcast operands (P other than q), so that a change that stops
vectorising either fails here. Misaligned operands are checked by the emulation
(tests/cuda/emu/emu_vs_cpu.sh builds the kernels with -fsanitize=alignment).
"""
import os
import re
import subprocess
import sys


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

cu = open(f"{out}/src/{name}.cu").read()
kernels = {}  # name -> (loads, stores) of a four-a-thread kernel
broadcast = 0  # loads at an index other than q
for m in re.finditer(r'^extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*?)^}', cu, re.S | re.M):
    body = m.group(2)
    if "NETC_FOR32(q, " in body:
        at = re.findall(r"const Netc[FH]4 l\d+ = \(\(const Netc[FH]4 \*\)v\d+\)\[([^\]]+)\];", body)
        kernels[m.group(1)] = (len(at), len(re.findall(r"\(\(Netc[FH]4 \*\)v\d+\)\[q\] = s\d+;", body)))
        broadcast += sum(p != "q" for p in at)
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
    if ".local" in body:
        fail(f"{k}: uses local memory (its NetcF4 values are not registers)")
    loads, stores = loads + want_ld, stores + want_st
print(f"PASS: {' '.join([name] + options)}: {len(kernels)} kernels four elements a thread, {loads} vector loads "
      f"({broadcast} of broadcast operands) and {stores} stores, each one in the PTX")
