"""The fused attention kernels against the same attention composed of matmul, transpose,
softmax, where and iota (attention_compose.net): the same weights, the same batches, a few SGD steps, then
every parameter compared, causal and causal with an additive mask from the data. The forward
pass and all three gradients (dq, dk, dv) reach the parameters, so a wrong block, mask or
gradient term in either path shows.

usage: fused_vs_composed.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, st_load, st_save  # noqa: E402

# Relative difference ||fused - composed|| / max(||composed||, 1) per tensor. The two paths round
# differently (the fused kernel's online softmax over key blocks and its exp, the composed
# path's whole rows), each within a few float32 ulps per value, ~1e-7 relative after a handful
# of steps (measured: 1e-7 and less); a wrong mask, an off-by-one causal boundary or a missing gradient term moves the
# parameters by 1e-2 and more.
TOLERANCE = 1e-5
STEPS, B, T, C, CLASSES = 4, 4, 37, 16, 5


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(7)
    init = {f"{n}.weight": rng.standard_normal((C, C)) * 0.4 for n in "qkv"}
    init.update({f"{n}.bias": rng.standard_normal(C) * 0.1 for n in "qkv"})
    init["head.weight"] = rng.standard_normal((CLASSES, T * C)) * 0.05
    init["head.bias"] = np.zeros(CLASSES)
    st_save(os.path.join(work, "init.safetensors"), {k: v.astype(np.float32) for k, v in init.items()})
    data = {"x": rng.standard_normal((STEPS * B, T, C)).astype(np.float32),
            # an additive mask: mostly small values, some keys pushed far out
            "mask": np.where(rng.random((STEPS * B, 1, T, T)) < 0.2, -1e4,
                             rng.standard_normal((STEPS * B, 1, T, T))).astype(np.float32),
            "label": rng.integers(0, CLASSES, STEPS * B).astype(np.int64)}
    for k, v in data.items():
        np.save(os.path.join(work, f"{k}.npy"), v)

    def train(fused, masked):
        tag = f"{'fused' if fused else 'composed'}-{'masked' if masked else 'causal'}"
        exe, out = os.path.join(work, tag), os.path.join(work, tag + ".safetensors")
        subprocess.run([netc, os.path.join(HERE, "attention_compose.net"), "-o", exe, "-D", f"fused={str(fused).lower()}",
                        "-D", f"masked={str(masked).lower()}"], check=True)
        cmd = [exe, "--init", os.path.join(work, "init.safetensors"), "--steps", str(STEPS), "--no-shuffle",
               "--quiet", "--threads", "2", "--save", out]
        for k in data:
            cmd += ["--data", f"{k}={work}/{k}.npy"]
        subprocess.run(cmd, check=True)
        return st_load(out)

    check = Checks()
    for masked in (False, True):
        a, b = train(True, masked), train(False, masked)
        for name in sorted(init):
            moved = np.linalg.norm(b[name] - init[name]) / max(np.linalg.norm(init[name]), 1.0)
            err = np.linalg.norm(a[name] - b[name]) / max(np.linalg.norm(b[name]), 1.0)
            print(f"{'masked' if masked else 'causal'} {name:12s} relative difference {err:.2e} (moved {moved:.2e})")
            check(err <= TOLERANCE, f"{name} ({'masked' if masked else 'causal'}): {err:.2e} > {TOLERANCE}")
            if name != "k.bias":  # adds q . b to a whole row of scores: no gradient in exact arithmetic
                check(moved > 100 * TOLERANCE, f"{name} ({'masked' if masked else 'causal'}) barely moved: {moved:.2e}")
    print(f"fused_vs_composed: {check.count} checks, {len(check.failures)} failed")
    sys.exit(1 if check.failures else 0)


if __name__ == "__main__":
    main()
