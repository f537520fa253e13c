"""models/bert.net against a BERT in PyTorch (bert_torch.py: Hugging Face's BertForMaskedLM
names), trained as MLPerf's BERT is: a small configuration through -D (vocab 64, seq 16, 2
layers, 2 heads, hidden 32, intermediate 64, batch 4), the same initial weights (torch's, saved
to safetensors, given to the trainer with --init), the same batches in the same order
(--no-shuffle), and STEPS LAMB steps (optim_ref.Lamb: betas (0.9, 0.999), eps 1e-6, weight decay
0.01 and the trust ratio on the decay group only; no_decay = biases and LayerNorms),
clip_grad_norm 1.0 (active: checked) and a linear warm-up of 2 steps. The reference runs in
float64.

The batches are masked-LM batches as a BERT data pipeline makes them: sequences of 9 to 16 real
tokens padded to 16 (attention_mask 0 on the padding), two segments (token_type_ids 0, then 1),
and about 15% of the real positions masked: input token 3 ([MASK]), label the original token;
every other label -100 (ignored by the loss).

Checked: every step's loss, learning rate and gradient norm before clipping; every parameter
after the run; the trainer's logits (--predict) against the reference's forward on the trained
weights, at the real positions; netc's saved file loads into the PyTorch module with
strict=True; and padding matters (the reference with every key kept differs).

With `packing` instead of STEPS: sequence packing (-D packed=true). Twelve sequences of 3 to 9
tokens, each its own padded row in the plain trainer (batch 12), are packed first-fit
decreasing into rows of 16 (position_ids restarting per sequence, sequence_ids 1, 2, ...), and
the packed trainer at that batch must log the same loss and gradient norm and save the same
parameters after two LAMB steps on the same sequences, within rounding (the sums run in another
order); and the packed batch without its block-diagonal mask (every sequence id 1) must not.

usage: bert_crosscheck.py NETC WORK [STEPS | packing]
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from bert_torch import Bert, lamb_groups  # noqa: E402
from lm_check import (as_float64, compare_logits, compare_params, compare_steps, compile_model, nudged_init,  # noqa: E402
                      predicted_logits, reference_steps, save_inputs, train)
from netc_testlib import Checks  # noqa: E402
from optim_ref import Lamb  # noqa: E402

check = Checks()
CFG = dict(vocab=64, seq=16, n_layer=2, n_head=2, hidden=32, intermediate=64)
BATCH, LR, WD, CLIP, WARMUP, BETAS, EPS, MASK = 4, 1e-3, 0.01, 1.0, 2, (0.9, 0.999), 1e-6, 3
INPUTS = ("input_ids", "token_type_ids", "attention_mask")

# Tolerances, as gpt2_crosscheck.py's and for the same reasons: netc computes in float32, the
# reference in float64; a forward pass rounds each value a few times at 2^-24 = 6e-8 through sums
# of at most 64 terms, layer norms and softmaxes over 16 keys, so losses and gradients are off by
# ~1e-6 of their size, and LAMB's update (Adam's direction, which keeps a gradient's relative
# error, times a ratio of two norms) keeps that: after STEPS steps each tensor is off by ~1e-6 of
# its size. A missing term (a bias, the tied decoder's gradient, a padding key attended, the
# trust ratio, decay on a norm) moves a tensor by 1e-3 of its size and more.
#
# One exception, as in GPT-2: attention.self.key.bias. Its gradient is 0 in exact arithmetic (a
# query's scores all shift by q . b_k, which softmax ignores), so both sides see rounding noise
# that Adam normalises into updates of up to lr each (it is a bias: no trust ratio). It is held
# to |diff| <= steps * lr.
LOSS_TOL = 1e-6      # relative, per step (loss, grad_norm)
PARAM_TOL = 5e-6     # ||netc - torch|| / ||torch|| per tensor
LOGIT_TOL = 5e-6     # largest |difference| / largest |logit|, at real positions
LR_TOL = 1e-7        # the logged rate is the double rate rounded to float


def key_bias_noise(name, got, want, start, steps):
    """attention.self.key.bias (see the tolerances): |diff| <= steps * lr, nothing else compared."""
    if not name.endswith("attention.self.key.bias"):
        return got, want, start
    diff = np.abs(got - want).max()
    print(f"{name}: largest difference {diff:.2e} (rounding noise, bound {steps * LR:g})")
    check(diff <= steps * LR, f"{name}: differs by {diff:.2e} > steps * lr")
    return None


def batches(n, seed=7):
    """n masked-LM samples: {input: [n, seq]} (i64), labels with -100 where nothing is masked."""
    rng = np.random.default_rng(seed)
    V, T = CFG["vocab"], CFG["seq"]
    tokens = rng.integers(5, V, size=(n, T))
    lengths = rng.integers(9, T + 1, size=n)
    real = np.arange(T)[None, :] < lengths[:, None]
    types = (np.arange(T)[None, :] >= (lengths[:, None] + 1) // 2).astype(np.int64) * real
    masked = real & (rng.random((n, T)) < 0.15)
    masked[:, 1] = True  # at least one masked position per sample
    labels = np.where(masked, tokens, -100)
    ids = np.where(masked, MASK, np.where(real, tokens, 0))
    return {"input_ids": ids.astype(np.int64), "token_type_ids": types.astype(np.int64),
            "attention_mask": real.astype(np.int64), "labels": labels.astype(np.int64)}


def forward(net, data, lo, hi):
    return net(*(torch.from_numpy(data[k][lo:hi]) for k in INPUTS))


def reference(init, data, steps, keep_all=False):
    net = as_float64(Bert(**CFG), init)
    decay, no_decay = lamb_groups(net)
    opt = Lamb([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0, "adapt": False}],
               lr=LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: (k + 1) / WARMUP if k < WARMUP else 1.0)
    if keep_all:
        data = dict(data, attention_mask=np.ones_like(data["attention_mask"]))

    def loss_of(k):
        logits = forward(net, data, k * BATCH, (k + 1) * BATCH)
        y = torch.from_numpy(data["labels"][k * BATCH:(k + 1) * BATCH])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, CFG["vocab"]), y.reshape(-1), ignore_index=-100)
    return net, reference_steps(net, opt, sched, steps, loss_of, CLIP)


def compile_bert(netc, exe, **defines):
    compile_model(netc, os.path.join(ROOT, "models", "bert.net"), exe,
                  dict(CFG, lr=LR, weight_decay=WD, grad_clip=CLIP, warmup_steps=WARMUP, dropout=0, **defines))


def is_nudged(name):
    """The biases and LayerNorms (nudged_init moves them off 0 and 1)."""
    return name.endswith(".bias") or ".LayerNorm." in name


def pack(lengths, T):
    """First-fit decreasing: rows of at most T tokens, each a list of sequence indices."""
    rows = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row in rows:
            if sum(lengths[j] for j in row) + lengths[i] <= T:
                row.append(i)
                break
        else:
            rows.append([i])
    return rows


def packing(netc, work):
    rng = np.random.default_rng(11)
    T, n, steps = CFG["seq"], 12, 2
    lengths = rng.integers(3, 10, size=2 * n)
    seqs = [rng.integers(5, CFG["vocab"], size=L) for L in lengths]
    masked = [rng.random(L) < 0.3 for L in lengths]
    for m in masked:
        m[0] = True
    # the plain batches: sequence i is row i, padded; two steps of n sequences each
    plain = {k: np.zeros((2 * n, T), np.int64) for k in ("input_ids", "token_type_ids", "attention_mask")}
    plain["labels"] = np.full((2 * n, T), -100, np.int64)
    for i, (sq, m) in enumerate(zip(seqs, masked)):
        L = len(sq)
        plain["input_ids"][i, :L] = np.where(m, MASK, sq)
        plain["token_type_ids"][i, (L + 1) // 2:L] = 1
        plain["attention_mask"][i, :L] = 1
        plain["labels"][i, :L] = np.where(m, sq, -100)
    # each step's n sequences packed into rows; both steps padded to the larger row count
    steps_rows = [pack(lengths[s * n:(s + 1) * n], T) for s in range(steps)]
    R = max(len(r) for r in steps_rows)
    packed = {k: np.zeros((steps * R, T), np.int64) for k in ("input_ids", "token_type_ids", "position_ids",
                                                               "sequence_ids")}
    packed["labels"] = np.full((steps * R, T), -100, np.int64)
    for s, rows in enumerate(steps_rows):
        for r, row in enumerate(rows):
            at = 0
            for sid, i in enumerate(row, 1):
                L, i = lengths[s * n + i], s * n + i
                for k in ("input_ids", "token_type_ids", "labels"):
                    packed[k][s * R + r, at:at + L] = plain[k][i, :L]
                packed["position_ids"][s * R + r, at:at + L] = np.arange(L)
                packed["sequence_ids"][s * R + r, at:at + L] = sid
                at += L
    slots = steps * n * T
    print(f"packing: {steps * n} sequences, {int(lengths.sum())} tokens: {slots} token slots unpacked, "
          f"{steps * R * T} packed ({R} rows a step instead of {n}; {1 - R / n:.0%} of the rows removed)")
    check(R < n, f"packing removed no rows ({R} of {n})")

    torch.manual_seed(99)
    init_file = os.path.join(work, "packing_init.safetensors")
    nudged_init(Bert(**CFG), init_file, is_nudged)
    plain_exe, packed_exe = os.path.join(work, "plain"), os.path.join(work, "packed")
    compile_bert(netc, plain_exe, batch=n)
    compile_bert(netc, packed_exe, batch=R, packed="true")
    plog, pw = train(plain_exe, save_inputs(work, "plain", plain), init_file, steps, plain_exe)
    klog, kw = train(packed_exe, save_inputs(work, "packed", packed), init_file, steps, packed_exe)
    worst = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(plog, klog) for k in ("loss", "grad_norm"))
    print(f"packed vs plain: losses and gradient norms within {worst:.2e}")
    check(len(plog) == len(klog) == steps and worst <= LOSS_TOL, f"packed and plain steps differ by {worst:.2e}")
    far = max(np.linalg.norm(kw[k] - pw[k]) / np.linalg.norm(pw[k]) for k in pw)
    print(f"packed vs plain: parameters within {far:.2e}")
    check(far <= PARAM_TOL, f"the packed run's parameters differ from the plain run's by {far:.2e}")
    # without the block-diagonal mask the packed sequences see each other
    leaky = save_inputs(work, "leaky", dict(packed, sequence_ids=np.ones_like(packed["sequence_ids"])))
    _, lw = train(packed_exe, leaky, init_file, steps, os.path.join(work, "leaky"))
    off = max(np.linalg.norm(lw[k] - pw[k]) / np.linalg.norm(pw[k]) for k in pw)
    print(f"packed rows attending across sequences: parameters {off:.2e} away")
    check(off > 100 * PARAM_TOL, f"attending across packed sequences moves the parameters by only {off:.2e}")


def main():
    netc, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    if len(sys.argv) > 3 and sys.argv[3] == "packing":
        packing(netc, work)
        print(f"bert_crosscheck packing: {check.count} checks, {len(check.failures)} failed")
        return 1 if check.failures else 0
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(1234)
    torch.set_num_threads(2)
    data = batches(BATCH * steps)
    inputs = save_inputs(work, "bert", data)
    init_net = Bert(**CFG)
    with torch.no_grad():
        # the word embeddings (and tied decoder) at std 0.1: gradient norms above 1 in the first
        # steps (measured in the reference), so clip_grad_norm 1.0 acts
        torch.nn.init.normal_(init_net.bert.embeddings.word_embeddings.weight, 0, 0.1)
    init_file = os.path.join(work, "init.safetensors")
    init = nudged_init(init_net, init_file, is_nudged)

    exe = os.path.join(work, "bert")
    compile_bert(netc, exe, batch=BATCH)
    logged, saved = train(exe, inputs, init_file, steps, exe)
    saved_file = exe + ".safetensors"

    net64, rows = reference(init, data, steps)
    compare_steps(check, logged, rows, CLIP, LOSS_TOL, LR_TOL)

    ref = {k: v.detach().numpy() for k, v in net64.state_dict().items()}
    compare_params(check, saved, ref, init, PARAM_TOL, lambda *a: key_bias_noise(*a, steps))

    # padding is left out: the same run attending every key ends far away
    net_all, _ = reference(init, data, steps, keep_all=True)
    far = max(np.linalg.norm(v.detach().numpy() - ref[k]) / np.linalg.norm(ref[k])
              for k, v in net_all.state_dict().items())
    print(f"every key attended: the parameters end {far:.2e} away")
    check(far > 100 * PARAM_TOL, f"attending the padding moves the parameters by only {far:.2e}")

    # the trainer's own forward pass on its trained weights (--predict writes the logits), against
    # the reference's forward on the same weights in float64, at the real positions (a padding
    # position's output is whatever its own query makes of the real keys, in both)
    trained64 = as_float64(Bert(**CFG), saved)
    got = predicted_logits(exe, saved_file, {k: inputs[k] for k in INPUTS}, os.path.join(work, "logits.npy"))
    with torch.no_grad():
        want = forward(trained64, data, 0, BATCH * steps).numpy()
    compare_logits(check, got, want, LOGIT_TOL, where=data["attention_mask"].astype(bool))

    fresh = Bert(**CFG)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)
    print(f"bert_crosscheck: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
