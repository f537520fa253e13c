"""models/llama.net against a Llama in PyTorch (llama_torch.py: Hugging Face's LlamaForCausalLM
names): a small configuration through -D (vocab 64, seq 16, 2 layers, 4 query heads on 2
key/value heads of 8, width 32, SwiGLU width 64, batch 4), the same initial weights (torch's,
saved to safetensors, given to the trainer with --init), the same token windows in the same order
(--no-shuffle), and STEPS AdamW steps with betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every
matrix (no_decay = the RMSNorm weights), clip_grad_norm 0.5 (active: checked), a cosine schedule
over the run with warmup_steps = 2. The reference runs in float64.

Checked: every step's loss, learning rate and gradient norm before clipping (the log, with
--log-every 1); every parameter after the run; the trainer's logits (--predict) against the
reference's forward on the trained weights; netc's saved file loads into the PyTorch module with
strict=True. When `transformers` is importable, the file also loads into
transformers.LlamaForCausalLM, whose logits must equal the module's; that part is skipped with a
line when it is absent, and is not counted as a check then.

usage: llama_crosscheck.py NETC WORK [STEPS]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from llama_torch import Llama, decay_groups, hf_llama  # noqa: E402
from lm_check import (begin, as_float64, causal_lm_reference, compare_logits, compare_params, compare_steps,  # noqa: E402
                      compile_model, nudged_init, predicted_logits, save_inputs, tensors64, token_windows, train)
from netc_testlib import Checks  # noqa: E402

check = Checks()
CFG = dict(vocab=64, n_layer=2, n_head=4, n_kv_head=2, hidden=32, intermediate=64, rms_eps=1e-5,
           rope_theta=10000.0)
SEQ, BATCH, LR, WD, CLIP, WARMUP, BETAS, EPS = 16, 4, 1e-3, 0.1, 0.5, 2, (0.9, 0.95), 1e-8

# Tolerances. netc computes in float32, the reference in float64. One forward pass rounds each
# value a few times at float32's 2^-24 = 6e-8 relative, through sums of at most 64 terms (the
# MLP's down projection), RMS norms (which keep relative errors) and softmaxes over 16 keys; the
# rotary tables add an error of their own: netc computes the angle p * theta^(-2i/d) in float32
# (exp of a float32 product, then a product with the position), which is off by a few ulps of the
# angle, at most ~15 * 2e-7 = 3e-6 radians at position 15, where the reference's tables are
# exact. So the logits differ by a few 1e-7 .. 1e-6 of their size, and so do the losses and the
# gradients. AdamW's update m / (sqrt(v) + eps) keeps a gradient's relative error, so after STEPS
# steps each parameter tensor is off by ~1e-6 of its size.
# Measured (6 steps): losses 5.5e-8, gradient norms 6.9e-8, parameters 6.7e-8 .. 1.3e-7, the
# trained weights' logits 2.5e-7; the bounds leave a margin of 15 and more for another machine's
# BLAS and libm. A missing term (a wrong rotation, a key/value head read by the wrong
# query heads, no clipping, decay applied to a norm) moves a tensor by 1e-3 of its size and more
# (Adam's steps are lr-sized: 1e-3, against parameters that moved 1e-2 .. 1e-1).
LOSS_TOL = 1e-6      # relative, per step (loss, grad_norm)
PARAM_TOL = 5e-6     # ||netc - torch|| / ||torch|| per tensor
LOGIT_TOL = 5e-6     # largest |difference| / largest |logit|
LR_TOL = 1e-7        # the logged rate is the double rate rounded to float


def reference(init, tokens, targets, steps):
    net = as_float64(Llama(**CFG), init)
    return net, causal_lm_reference(net, decay_groups(net), tokens, targets, steps, BATCH, CFG["vocab"], CLIP, WARMUP,
                                    LR, WD, betas=BETAS, eps=EPS)


def transformers_check(saved, net64, tokens):
    """The saved file in transformers.LlamaForCausalLM, if there is one: logits equal the module's."""
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: the LlamaForCausalLM load and comparison are skipped (not counted)")
        return
    hf = hf_llama(transformers, CFG, SEQ).eval()
    res = hf.load_state_dict(tensors64(saved), strict=False)
    check(not res.missing_keys and not res.unexpected_keys,
          f"transformers {transformers.__version__}: missing {res.missing_keys}, unexpected {res.unexpected_keys}")
    x = torch.from_numpy(tokens[:BATCH])
    with torch.no_grad():
        a, b = hf(x).logits, net64(x)
    # HF computes its rotary tables in float32 even in a float64 model: ~1e-7 of the angle
    err = float((a - b).abs().max() / b.abs().max())
    print(f"transformers {transformers.__version__} LlamaForCausalLM: logits differ by {err:.2e}")
    check(err < 1e-5, f"LlamaForCausalLM's logits differ from the module's by {err:.2e}")


def main():
    netc, work, steps = begin(sys.argv, 4321)
    tokens, targets = token_windows(BATCH * steps, SEQ, CFG["vocab"], seed=7)
    inputs = save_inputs(work, "llama", {"tokens": tokens, "targets": targets})
    init_net = Llama(**CFG)
    init_file = os.path.join(work, "init.safetensors")
    init = nudged_init(init_net, init_file, lambda name: name.endswith("norm.weight"))

    exe = os.path.join(work, "llama")
    compile_model(netc, os.path.join(ROOT, "models", "llama.net"), exe,
                  dict(CFG, seq=SEQ, batch=BATCH, lr=LR, weight_decay=WD, grad_clip=CLIP, warmup_steps=WARMUP))
    logged, saved = train(exe, inputs, init_file, steps, exe)
    saved_file = exe + ".safetensors"

    net64, rows = reference(init, tokens, targets, steps)
    compare_steps(check, logged, rows, CLIP, LOSS_TOL, LR_TOL)
    ref = {k: v.detach().numpy() for k, v in net64.state_dict().items()}
    compare_params(check, saved, ref, init, PARAM_TOL)

    # the trainer's own forward pass on its trained weights (--predict writes the logits), against
    # the reference's forward on the same weights in float64
    trained64 = as_float64(Llama(**CFG), saved)
    got = predicted_logits(exe, saved_file, {"tokens": inputs["tokens"]}, os.path.join(work, "logits.npy"))
    with torch.no_grad():
        compare_logits(check, got, trained64(torch.from_numpy(tokens)).numpy(), LOGIT_TOL)

    fresh = Llama(**CFG)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)
    transformers_check(saved, trained64, tokens)
    print(f"llama_crosscheck: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
