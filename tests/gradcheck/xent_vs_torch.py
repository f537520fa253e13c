#!/usr/bin/python3
"""The loss the IR of a sequence cross-entropy computes, against PyTorch's own reduction.

    xent_vs_torch.py NETC

ir_gradcheck.py evaluates each xent node with F.cross_entropy(reduction="none") and follows the
graph sema built around it (the mean over the positions; with ignore_index, the ratio of two
means). This checks that composition against F.cross_entropy(reduction="mean", ignore_index,
label_smoothing) on the same logits, in float64: the two must agree to rounding (1e-12
relative: a wrong count or a missing mask is off by a factor, not in the last bits).
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ir_gradcheck as ig  # noqa: E402
import make_data  # noqa: E402

CASES = [("xent_ignore.net", dict(ignore_index=-1, label_smoothing=0.05)),
         ("xent_seq.net", dict(label_smoothing=0.1))]


def main():
    netc = sys.argv[1]
    failed = 0
    for name, kw in CASES:
        model = os.path.join(HERE, name)
        dump = subprocess.run([netc, model, "--dump=ir"], capture_output=True, text=True, check=True).stdout
        nodes, params, loss, n_fwd = ig.parse_dump(dump)
        inputs = {k: torch.from_numpy(np.asarray(a)).long() for k, a in make_data.make_batch(model).items()}
        g = torch.Generator().manual_seed(1)
        pvals = {p: torch.randn(nodes[nid].shape, generator=g) for p, nid, _, _ in params}
        v = ig.Interp(nodes, inputs, pvals).run(n_fwd)
        xent = next(n for n in nodes[:n_fwd] if n.op == "xent")
        logits, labels = v[xent.ins[0]], v[xent.ins[1]]
        want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="mean", **kw).item()
        got = v[loss].item()
        ok = abs(got - want) <= 1e-12 * abs(want)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: IR loss {got:.17g}, torch {want:.17g}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
