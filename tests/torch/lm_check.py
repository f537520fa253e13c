"""What gpt2_crosscheck.py, bert_crosscheck.py and llama_crosscheck.py share: compiling a model
and training it from given weights on given batches, the float64 reference's steps, and comparing
the logged steps, saved parameters and predicted logits with the reference's."""
import json
import math
import os
import subprocess

import numpy as np
import torch

from netc_testlib import st_load, st_save


def begin(argv, seed):
    """A cross-check's command line NETC WORK [STEPS] (6 steps by default): WORK made, torch seeded
    with seed and held to the 2 threads the trainer uses. Returns (netc, work, steps)."""
    netc, work = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    return netc, work, int(argv[3]) if len(argv) > 3 else 6


def cosine_warmup(k, total, warmup):
    """rt_lr_at's factor for cosine(min_lr = 0) with warmup_steps = warmup, over `total` steps."""
    g = (1 + math.cos(math.pi * min(k / total, 1.0))) / 2
    return g * ((k + 1) / warmup if k < warmup else 1.0)


def token_windows(n, seq, vocab, seed):
    """n [seq] windows of a random token stream and the next tokens: prepare_text.py's layout."""
    rng = np.random.default_rng(seed)
    stream = rng.integers(0, vocab, size=n * seq + 1)
    w = stream[np.arange(n)[:, None] * seq + np.arange(seq + 1)[None, :]]
    return w[:, :-1].astype(np.int64), w[:, 1:].astype(np.int64)


def tensors64(weights):
    """{name: array} as float64 torch tensors, for load_state_dict."""
    return {k: torch.from_numpy(v.astype(np.float64)) for k, v in weights.items()}


def as_float64(net, weights):
    """net in float64 holding weights ({name: array}), loaded strictly."""
    net = net.double()
    net.load_state_dict(tensors64(weights), strict=True)
    return net


def causal_lm_reference(net, groups, tokens, targets, steps, batch, vocab, clip, warmup, lr, weight_decay, **adamw):
    """STEPS steps of a causal language model in float64 (net, its weights loaded) on consecutive
    batches of token windows, logits over vocab: AdamW(lr, **adamw) with weight_decay on groups' first list and none
    on its second (decay, no_decay), the gradients clipped to clip, the cosine schedule with warm-up
    over the run. Each step's (loss, learning rate, gradient norm before clipping)."""
    decay, no_decay = groups
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, **adamw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: cosine_warmup(k, steps, warmup))

    def loss_of(k):
        x, y = (torch.from_numpy(t[k * batch:(k + 1) * batch]) for t in (tokens, targets))
        return torch.nn.functional.cross_entropy(net(x).reshape(-1, vocab), y.reshape(-1))
    return reference_steps(net, opt, sched, steps, loss_of, clip)


def reference_steps(net, opt, sched, steps, loss_of, clip):
    """STEPS steps of the float64 reference, loss_of(k) giving step k's loss, the gradients
    clipped to clip: each step's (loss, learning rate, gradient norm before clipping)."""
    rows = []
    for k in range(steps):
        opt.zero_grad()
        loss = loss_of(k)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), clip))
        rows.append((float(loss), opt.param_groups[0]["lr"], norm))
        opt.step()
        sched.step()
    return rows


def predicted_logits(exe, weights, inputs, out, extra=()):
    """The trainer's own forward pass (--predict) on weights for inputs ({name: .npy path}), with
    the extra options."""
    subprocess.run([exe, "--init", weights, "--predict-out", out, "--quiet", *extra] +
                   sum((["--predict", f"{k}={v}"] for k, v in inputs.items()), []), check=True)
    return np.load(out)


def compare_logits(check, got, want, tol, where=None):
    """The largest |difference| over the largest |logit| (at positions where, if given) <= tol."""
    got = got.reshape(want.shape)
    diff = np.abs(got - want)
    err = (diff[where].max() / np.abs(want[where]).max() if where is not None else diff.max() / np.abs(want).max())
    print(f"--predict logits: largest difference {err:.2e} of the largest logit")
    check(err <= tol, f"the trainer's logits differ by {err:.2e} > {tol}")


def compile_model(netc, model, exe, defines):
    """netc MODEL -o EXE with -D NAME=VALUE for each of defines."""
    cmd = [netc, model, "-o", exe]
    for k, v in defines.items():
        cmd += ["-D", f"{k}={v}"]
    subprocess.run(cmd, check=True)


def nudged_init(net, path, nudged):
    """net's weights, those whose name nudged() accepts (biases, norms) moved off 0 and 1 by
    N(0, 0.05) so a missing one shows, saved to path: the {name: array} saved."""
    with torch.no_grad():
        for name, p in net.named_parameters():
            if nudged(name):
                p.add_(torch.randn_like(p) * 0.05)
    init = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    st_save(path, init)
    return init


def save_inputs(work, tag, data):
    """Each input's array ({name: array}) as WORK/TAG_NAME.npy: {name: path}."""
    paths = {}
    for k, v in data.items():
        paths[k] = os.path.join(work, f"{tag}_{k}.npy")
        np.save(paths[k], v)
    return paths


def train(exe, inputs, init_file, steps, out, extra=()):
    """STEPS steps of a trainer on inputs ({name: .npy path}, in order) from init_file, logging
    every step to OUT.jsonl and saving OUT.safetensors (and the outputs of the extra options):
    its logged steps and saved weights."""
    files = sum((["--data", f"{k}={v}"] for k, v in inputs.items()), [])
    subprocess.run([exe, *files, "--init", init_file, "--no-shuffle", "--steps", str(steps), "--log-every", "1",
                    "--log", out + ".jsonl", "--save", out + ".safetensors", "--quiet", *extra], check=True)
    return logged_steps(out + ".jsonl"), st_load(out + ".safetensors")


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


def key_bias_noise(check, name, got, want, start, width, bound):
    """The key part (the middle third, `width` values) of an attention's fused q, k, v bias: its
    gradient is 0 in exact arithmetic (softmax ignores a shift of a query's scores), so both sides
    follow rounding noise there, which AdamW normalises into steps of up to lr: held to
    |diff| <= bound (steps * lr). Returns the query and value parts (with start) to compare."""
    diff = np.abs(got[width:2 * width] - want[width:2 * width]).max()
    check(diff <= bound, f"{name}: the key bias differs by {diff:.2e} > steps * lr")
    print(f"{name}: key part largest difference {diff:.2e} (rounding noise, bound {bound:g})")
    return tuple(np.concatenate([t[:width], t[2 * width:]]) for t in (got, want, start))
