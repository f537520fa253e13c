"""models/gpt2.net against a GPT-2 in PyTorch (gpt2_torch.py: Hugging Face's parameter names), as
nanoGPT trains it: a small configuration through -D (vocab 64, seq 16, 2 layers, 2 heads, width
32, batch 4), the same initial weights (torch's, saved to safetensors, given to the trainer with
--init), the same token windows in the same order (--no-shuffle), and STEPS AdamW steps with
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the decay group only (no_decay = biases and
layer norms, nanoGPT's split), clip_grad_norm 1.0 (active: checked), a cosine schedule over the
run with warmup_steps = 2. The reference runs in float64.

Checked: every step's loss, learning rate and gradient norm before clipping (the log, with
--log-every 1); every parameter after the run; the trainer's logits (--predict) against the
reference's forward on the trained weights; and netc's saved file loads into the PyTorch module
with strict=True. When `transformers` is importable, the file also loads into
transformers.GPT2LMHeadModel, whose logits must equal the module's; that part is skipped with a
line when it is absent, and is not counted as a check then.

usage: gpt2_crosscheck.py NETC WORK [STEPS]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from gpt2_torch import GPT2, decay_groups  # noqa: E402
from lm_check import (begin, as_float64, causal_lm_reference, compare_logits, compare_params, compare_steps,  # noqa: E402
                      compile_model, nudged_init, predicted_logits, save_inputs, tensors64, token_windows, train)
from lm_check import key_bias_noise as lm_key_bias_noise  # noqa: E402
from netc_testlib import Checks  # noqa: E402

check = Checks()
CFG = dict(vocab=64, seq=16, n_layer=2, n_head=2, n_embd=32)
BATCH, LR, WD, CLIP, WARMUP, BETAS, EPS = 4, 1e-3, 0.1, 1.0, 2, (0.9, 0.95), 1e-8

# Tolerances. netc computes in float32, the reference in float64. One forward pass rounds each
# value a few times at float32's 2^-24 = 6e-8 relative, through sums of at most 4 * 32 = 128
# terms (the MLP's second product), layer norms (which divide by a standard deviation and so keep
# relative errors) and softmaxes over 16 keys: the logits differ by ~1e-6 of their size, and so do
# the losses and the gradients. AdamW's update m / (sqrt(v) + eps) keeps a gradient's relative
# error, so after STEPS steps each parameter tensor is off by ~1e-6 of its size, the same order
# Measured (the branches merged, 6 steps): losses and norms 4e-8, parameters 5e-8 .. 3.3e-7,
# the trained weights' logits 2e-7. The bounds leave a margin of 15 to 25 for another machine's
# BLAS and libm; a missing term (a bias, the tied head's gradient from the embedding, a wrong
# causal mask, no clipping, decay applied to a norm) moves a tensor by 1e-3 of its size and more
# (Adam's steps are lr-sized: 1e-3, against parameters that moved 2e-2 .. 2e-1).
#
# One exception: the key part of attn.c_attn.bias (its middle third). Its gradient is 0 in exact
# arithmetic (a query's scores all shift by q . b_k, which softmax ignores), so both sides see
# rounding noise (1e-17 in float64, 1e-9 in float32) that AdamW normalises into updates of up to
# lr each: no implementation can match another there. It is held to that, |diff| <= steps * lr,
# and the query and value parts to PARAM_TOL.
LOSS_TOL = 1e-6      # relative, per step (loss, grad_norm)
PARAM_TOL = 5e-6     # ||netc - torch|| / ||torch|| per tensor
LOGIT_TOL = 5e-6     # largest |difference| / largest |logit|
LR_TOL = 1e-7        # the logged rate is the double rate rounded to float


def key_bias_noise(name, got, want, start, steps):
    """attn.c_attn.bias's key part (see the tolerances): |diff| <= steps * lr; the rest compared."""
    if not name.endswith("attn.c_attn.bias"):
        return got, want, start
    return lm_key_bias_noise(check, name, got, want, start, CFG["n_embd"], steps * LR)


def reference(init, tokens, targets, steps):
    net = as_float64(GPT2(**CFG), init)
    return net, causal_lm_reference(net, decay_groups(net), tokens, targets, steps, BATCH, CFG["vocab"], CLIP, WARMUP,
                                    LR, WD, betas=BETAS, eps=EPS)


def transformers_check(saved, net64, tokens):
    """The saved file in transformers.GPT2LMHeadModel, if there is one: logits equal the module's."""
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: the GPT2LMHeadModel load and comparison are skipped "
              "(not counted)")
        return
    conf = transformers.GPT2Config(vocab_size=CFG["vocab"], n_positions=CFG["seq"], n_embd=CFG["n_embd"],
                                   n_layer=CFG["n_layer"], n_head=CFG["n_head"], activation_function="gelu_new",
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    hf = transformers.GPT2LMHeadModel(conf).double().eval()
    res = hf.load_state_dict(tensors64(saved), strict=False)
    missing = [k for k in res.missing_keys if k != "lm_head.weight" and not k.endswith((".attn.bias",
                                                                                       ".attn.masked_bias"))]
    check(not missing and not res.unexpected_keys,
          f"transformers {transformers.__version__}: missing {missing}, unexpected {res.unexpected_keys}")
    hf.tie_weights()
    x = torch.from_numpy(tokens[:BATCH])
    with torch.no_grad():
        a, b = hf(x).logits, net64(x)
    err = float((a - b).abs().max() / b.abs().max())
    print(f"transformers {transformers.__version__} GPT2LMHeadModel: logits differ by {err:.2e}")
    check(err < 1e-10, f"GPT2LMHeadModel's logits differ from the module's by {err:.2e} (both float64)")


def main():
    netc, work, steps = begin(sys.argv, 1234)
    tokens, targets = token_windows(BATCH * steps, CFG["seq"], CFG["vocab"], seed=5)
    inputs = save_inputs(work, "gpt2", {"tokens": tokens, "targets": targets})
    init_net = GPT2(**CFG)
    with torch.no_grad():
        # the embedding (and tied head) at std 0.05 instead of 0.02: gradient norms 1.1 .. 1.6 over
        # the 6 steps (measured in the reference), so clip_grad_norm 1.0 acts in every step
        torch.nn.init.normal_(init_net.transformer.wte.weight, 0, 0.05)
    init_file = os.path.join(work, "init.safetensors")
    init = nudged_init(init_net, init_file, lambda name: name.endswith(".bias") or ".ln_" in name)

    exe = os.path.join(work, "gpt2")
    compile_model(netc, os.path.join(ROOT, "models", "gpt2.net"), exe,
                  dict(CFG, batch=BATCH, lr=LR, weight_decay=WD, grad_clip=CLIP, warmup_steps=WARMUP, dropout=0))
    logged, saved = train(exe, inputs, init_file, steps, exe)
    saved_file = exe + ".safetensors"

    net64, rows = reference(init, tokens, targets, steps)
    compare_steps(check, logged, rows, CLIP, LOSS_TOL, LR_TOL)

    ref = {k: v.detach().numpy() for k, v in net64.state_dict().items()}
    compare_params(check, saved, ref, init, PARAM_TOL, lambda *a: key_bias_noise(*a, steps))

    # the trainer's own forward pass on its trained weights (--predict writes the logits), against
    # the reference's forward on the same weights in float64
    trained64 = as_float64(GPT2(**CFG), saved)
    got = predicted_logits(exe, saved_file, {"tokens": inputs["tokens"]}, os.path.join(work, "logits.npy"))
    with torch.no_grad():
        compare_logits(check, got, trained64(torch.from_numpy(tokens)).numpy(), LOGIT_TOL)

    fresh = GPT2(**CFG)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()}, strict=True)
    transformers_check(saved, trained64, tokens)
    print(f"gpt2_crosscheck: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
