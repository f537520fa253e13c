"""models/llama.net -D lora_r=R (LoRA fine-tuning) against PEFT's LoRA written out in PyTorch:
the configuration of llama_crosscheck.py with rank-4 adapters (alpha 8, no dropout) on q_proj,
k_proj, v_proj and o_proj of both layers, a float64 reference in which each adapted Linear
computes W x + (alpha / r) B (A x) as peft's LoraLayer does, only the adapters trainable, the
same initial weights (the base model's and A random, B zero, given to the trainer with --init),
the same batches and STEPS AdamW steps (betas (0.9, 0.95), weight decay 0.1 on the adapters,
clip_grad_norm 0.05, cosine schedule with warm-up).

Checked:
- every step's loss, learning rate and gradient norm before clipping (the adapters' gradients);
- every adapter after the run, against the reference; every base tensor bit-identical to the
  initial one (frozen: LoRA must not move the base);
- the trainer's own initialisation (--init of the base alone, --lr 0): B exactly zero, A uniform
  in +-1/sqrt(in) as torch.nn.Linear's, the base untouched;
- --save-adapter: adapter_model.safetensors holds exactly base_model.model.<layer>.lora_A.weight
  and lora_B.weight for every adapted layer, equal to the adapters of --save, and
  adapter_config.json says peft_type LORA, r, lora_alpha, lora_dropout and target_modules;
- --adapter reads that directory back: --predict with --init of the base and --adapter gives the
  reference's logits on the trained adapters;
- --save-merged: W + (alpha / r) B A (against float64), no adapter tensors, and in a model without
  LoRA (llama_torch.Llama, strict load) the logits of the LoRA model.
When `transformers` and `peft` are importable (the GPU machine), the base loads into
transformers.LlamaForCausalLM and the adapter directory into peft.PeftModel.from_pretrained,
whose logits must equal the reference's; that part is skipped with a line when they are absent,
and is not counted as a check then.

usage: lora_crosscheck.py NETC WORK [STEPS]
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from llama_torch import Llama, add_lora, hf_llama  # noqa: E402
from lm_check import (begin, causal_lm_reference, compare_logits, compare_params, compare_steps, compile_model,  # noqa: E402
                      nudged_init, predicted_logits, save_inputs, tensors64, token_windows, train)
from netc_testlib import Checks, st_load, st_save  # noqa: E402

check = Checks()
CFG = dict(vocab=64, n_layer=2, n_head=4, n_kv_head=2, hidden=32, intermediate=64, rms_eps=1e-5,
           rope_theta=10000.0)
SEQ, BATCH, LR, WD, CLIP, WARMUP, BETAS, EPS = 16, 4, 1e-2, 0.1, 0.05, 2, (0.9, 0.95), 1e-8
R, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # models/llama.net's list
PREFIX = "base_model.model."

# Tolerances: llama_crosscheck.py's reasoning holds unchanged (the same float32 forward and
# backward passes, with two more products of at most 32 terms per adapted layer, and Adam's
# update keeping a gradient's relative error), measured there at 1e-7 .. 2.5e-7; the margin is
# the same. Measured (6 steps): losses 5.4e-8, gradient norms 8.1e-8, adapters 8.7e-8 .. 5.6e-7,
# logits 2.9e-7. A missing scale, an adapter on the wrong side of the product or a base weight
# that moves shows at 1e-2 and more. The merged weight W + (alpha/r) B A is computed in double and rounded once: within
# half an ulp of float32 (2^-24 relative) of the float64 merge of the same float32 factors.
LOSS_TOL = 1e-6      # relative, per step (loss, grad_norm)
PARAM_TOL = 5e-6     # ||netc - torch|| / ||torch|| per adapter
LOGIT_TOL = 5e-6     # largest |difference| / largest |logit|
LR_TOL = 1e-7        # the logged rate is the double rate rounded to float
MERGE_TOL = 2 ** -24  # |merged - exact| / |exact|, elementwise, plus a float32 denormal's worth


def lora_llama(weights=None):
    net = add_lora(Llama(**CFG), TARGETS, R, ALPHA)
    if weights is not None:
        net = net.double()
        net.load_state_dict(tensors64(weights), strict=True)
    return net


def adapter_groups(net):
    """The optimizer's groups: every adapter decayed (models/llama.net's no_decay names norms)."""
    return [p for p in net.parameters() if p.requires_grad], []


def check_own_init(exe, inputs, base_file, base, work):
    """The trainer's own adapters: --init of the base alone, one step at --lr 0 (AdamW's update
    and decay are then exactly nothing), --save."""
    out = os.path.join(work, "own_init.safetensors")
    files = sum((["--data", f"{k}={v}"] for k, v in inputs.items()), [])
    subprocess.run([exe, *files, "--init", base_file, "--steps", "1", "--lr", "0", "--save", out, "--quiet"],
                   check=True)
    own = st_load(out)
    for name, want in base.items():
        check(np.array_equal(own[name], want), f"own init: base tensor {name} changed")
    for name, x in own.items():
        if name.endswith("lora_B.weight"):
            check(not x.any(), f"own init: {name} is not zero")
        elif name.endswith("lora_A.weight"):
            bound = 1 / np.sqrt(x.shape[1])
            # U(-b, b) has standard deviation b/sqrt(3); a [4, 32] draw's is within 30% of it
            ok = np.abs(x).max() <= bound and abs(x.std() / (bound / np.sqrt(3)) - 1) < 0.3
            check(ok, f"own init: {name} is not U(+-{bound:.3f}): max {np.abs(x).max():.3f} std {x.std():.3f}")
    check(sum(".lora_" in n for n in own) == 4 * CFG["n_layer"] * 2, f"own init: adapters {sorted(own)}")


def check_adapter_dir(adir, saved):
    """The PEFT directory: exactly the adapters, under PEFT's names, and PEFT's configuration."""
    files = st_load(os.path.join(adir, "adapter_model.safetensors"))
    want = {PREFIX + k for k in saved if ".lora_" in k}
    check(set(files) == want, f"adapter file names: extra {sorted(set(files) - want)} missing {sorted(want - set(files))}")
    for name, x in files.items():
        check(np.array_equal(x, saved.get(name[len(PREFIX):])), f"{name} differs from --save's tensor")
    conf = json.load(open(os.path.join(adir, "adapter_config.json")))
    print("adapter_config.json:", json.dumps(conf, sort_keys=True))
    for key, value in (("peft_type", "LORA"), ("r", R), ("lora_alpha", ALPHA), ("lora_dropout", 0),
                       ("bias", "none"), ("fan_in_fan_out", False)):
        check(conf.get(key) == value, f"adapter_config.json: {key} is {conf.get(key)!r}, want {value!r}")
    check(sorted(conf.get("target_modules", [])) == sorted(TARGETS), f"target_modules {conf.get('target_modules')}")


def check_merged(merged, saved, tokens, lora64):
    """--save-merged against W + (alpha / r) B A in float64, and as a plain Llama."""
    check(not any(".lora_" in k for k in merged), f"merged file holds adapters: {sorted(merged)}")
    worst = 0.0
    for name, w in merged.items():
        want = saved[name].astype(np.float64)
        a = saved.get(name.replace(".weight", ".lora_A.weight"))
        if a is not None:
            b = saved[name.replace(".weight", ".lora_B.weight")]
            want = want + ALPHA / R * (b.astype(np.float64) @ a.astype(np.float64))
        worst = max(worst, float(np.max(np.abs(w - want) / (np.abs(want) + 1e-38))))
    print(f"merged weights: worst relative error {worst:.2e} against the float64 merge")
    check(worst <= MERGE_TOL, f"merged weights off by {worst:.2e} > {MERGE_TOL:.2e}")
    plain = Llama(**CFG).double()
    plain.load_state_dict(tensors64(merged), strict=True)
    x = torch.from_numpy(tokens[:BATCH])
    with torch.no_grad():
        compare_logits(check, plain(x).numpy(), lora64(x).numpy(), LOGIT_TOL)


def peft_check(base, adir, lora64, tokens):
    """The base in transformers.LlamaForCausalLM and the adapters through peft: the reference's logits."""
    try:
        import peft
        import transformers
    except ImportError:
        print("transformers or peft is not installed: the PeftModel load and comparison are skipped (not counted)")
        return
    hf = hf_llama(transformers, CFG, SEQ)
    hf.load_state_dict(tensors64(base), strict=True)
    model = peft.PeftModel.from_pretrained(hf, adir).double().eval()
    x = torch.from_numpy(tokens[:BATCH])
    with torch.no_grad():
        a, b = model(input_ids=x).logits, lora64(x)
    # HF computes its rotary tables in float32 even in a float64 model: ~1e-7 of the angle
    err = float((a - b).abs().max() / b.abs().max())
    print(f"peft {peft.__version__}, transformers {transformers.__version__}: logits differ by {err:.2e}")
    check(err < 1e-5, f"PeftModel's logits differ from the reference's by {err:.2e}")


def main():
    netc, work, steps = begin(sys.argv, 1234)
    tokens, targets = token_windows(BATCH * steps, SEQ, CFG["vocab"], seed=11)
    inputs = save_inputs(work, "lora", {"tokens": tokens, "targets": targets})
    base_file, init_file = os.path.join(work, "base.safetensors"), os.path.join(work, "init.safetensors")
    base = nudged_init(Llama(**CFG), base_file, lambda name: name.endswith("norm.weight"))
    net = lora_llama()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in base.items()}, strict=False)
    init = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    st_save(init_file, init)

    exe = os.path.join(work, "llama_lora")
    compile_model(netc, os.path.join(ROOT, "models", "llama.net"), exe,
                  dict(CFG, seq=SEQ, batch=BATCH, lr=LR, weight_decay=WD, grad_clip=CLIP, warmup_steps=WARMUP,
                       lora_r=R, lora_alpha=ALPHA, lora_dropout=0))
    check_own_init(exe, inputs, base_file, base, work)

    adir, merged_file = os.path.join(work, "adapter"), os.path.join(work, "merged.safetensors")
    logged, saved = train(exe, inputs, init_file, steps, exe, ["--save-adapter", adir, "--save-merged", merged_file])

    net64 = lora_llama(init)
    decay, no_decay = adapter_groups(net64)
    rows = causal_lm_reference(net64, (decay, no_decay), tokens, targets, steps, BATCH, CFG["vocab"], CLIP, WARMUP,
                               LR, WD, betas=BETAS, eps=EPS)
    compare_steps(check, logged, rows, CLIP, LOSS_TOL, LR_TOL)
    ref = {k: v.detach().numpy() for k, v in net64.state_dict().items()}
    compare_params(check, {k: v for k, v in saved.items() if ".lora_" in k},
                   {k: v for k, v in ref.items() if ".lora_" in k}, init, PARAM_TOL)
    for name, want in base.items():
        check(np.array_equal(saved[name], want), f"base tensor {name} is not bit-identical to the initial one")

    check_adapter_dir(adir, saved)
    trained64 = lora_llama(saved).eval()
    # the base from --init and the adapters from the PEFT directory: the reference's logits
    got = predicted_logits(exe, base_file, {"tokens": inputs["tokens"]}, os.path.join(work, "adapted.npy"),
                           ["--adapter", adir])
    with torch.no_grad():
        compare_logits(check, got, trained64(torch.from_numpy(tokens)).numpy(), LOGIT_TOL)
    check_merged(st_load(merged_file), saved, tokens, trained64)
    peft_check(base, adir, trained64, tokens)
    print(f"lora_crosscheck: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
