"""The comparisons gpt2_crosscheck.py and bert_crosscheck.py share: a trainer's logged steps
against the float64 reference's, and its saved parameters against the reference's."""
import json

import numpy as np


def logged_steps(log):
    """The training lines of a --log file (--log-every 1: one per step)."""
    return [r for r in map(json.loads, open(log)) if "loss" in r and not r.get("eval")]


def compare_steps(check, logged, rows, clip, loss_tol, lr_tol):
    """Per step, the logged loss, learning rate and gradient norm before clipping against the
    reference's rows (loss, lr, norm); and clipping must have acted in some step."""
    clipped = sum(norm > clip for _, _, norm in rows)
    print(f"torch: gradient norms {[round(r[2], 4) for r in rows]}: clipped in {clipped} of {len(rows)} steps")
    check(clipped > 0, f"clip_grad_norm {clip} is never active (norms {[r[2] for r in rows]})")
    check(len(logged) == len(rows), f"{len(logged)} log lines, want {len(rows)}")
    worst = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0}
    for r, (loss, lr, norm) in zip(logged, rows):
        for key, want in (("loss", loss), ("lr", lr), ("grad_norm", norm)):
            worst[key] = max(worst[key], abs(r[key] - want) / abs(want))
    print("per step, worst relative error: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    check(worst["loss"] <= loss_tol and worst["grad_norm"] <= loss_tol, f"losses or norms differ: {worst}")
    check(worst["lr"] <= lr_tol, f"learning rates differ: {worst['lr']:.2e}")


def compare_params(check, saved, ref, init, tol, noise=None):
    """Every saved tensor within tol of the reference's (relative 2-norm of the difference), the
    same names on both sides. noise(name, got, want, start), when given, checks a tensor's part
    that only rounding noise moves and returns the arrays left to compare (None: nothing)."""
    check(sorted(saved) == sorted(ref), f"names: netc {sorted(set(saved) - set(ref))} torch {sorted(set(ref) - set(saved))}")
    for name in sorted(ref):
        if name not in saved:
            continue
        arrays = (saved[name], ref[name], init[name])
        if noise:
            arrays = noise(name, *arrays)
            if arrays is None:
                continue
        got, want, start = arrays
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        moved = np.linalg.norm(want - start) / np.linalg.norm(want)
        print(f"{name:55s} relative error {rel:.2e} (moved {moved:.2e})")
        check(saved[name].shape == ref[name].shape and rel <= tol, f"{name}: relative error {rel:.2e} > {tol}")
