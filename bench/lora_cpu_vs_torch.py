"""LoRA fine-tuning against full fine-tuning of the same Llama (models/llama.net) on the CPU, in
netc and in PyTorch eager (tests/torch/llama_torch.py, with add_lora's PEFT-style adapters), same
sizes, batch, threads, recipe (AdamW, clip_grad_norm 1.0; LoRA rank 8, alpha 32, dropout 0.1 on
q_proj, k_proj, v_proj and o_proj) and synthetic tokens, in one run. Prints tokens/s and peak
memory of the four runs, LoRA's peak memory over full fine-tuning's (the target: at most half)
and netc over PyTorch.

usage: /usr/bin/python3 bench/lora_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
           [--vocab 256] [--seq 128] [--n-layer 4] [--n-head 8] [--n-kv-head 4] [--hidden 512]
           [--intermediate 1408] [--batch 4] [--steps 10] [--repeat 3] [--python PYTHON]

The default sizes (12.6M parameters, 512 tokens a step) make the weights, their gradients and
AdamW's two moments the larger part of full fine-tuning's memory, as in the models LoRA is for
(a 7B model's weights are 28 GB in float32, its activations at a small batch a fraction of
that); with smaller widths and longer sequences the activations, which LoRA does not shrink,
dominate both. Each run trains 2 warm-up steps plus --steps timed steps (netc: from its JSON log,
one line per step; PyTorch: timed around its loop); the runs alternate so that noise on a shared
machine hits all six; medians are compared. Peak memory is each process's maximum resident set,
which includes the runtime's libraries (OpenBLAS, oneDNN; PyTorch's, larger).

netc's two trainers are also built with --system-malloc (the "system malloc" rows): the C
library's malloc instead of the jemalloc netc links when its build found it (the first line
printed says which). oneDNN's sgemm allocates its packing buffers page-aligned at every call, in
whichever thread multiplies, and the small blocks glibc's malloc cuts off to align them stay in
its per-thread cache, so the thread's heap keeps growing around them (docs/trainer.md, "Memory
beyond the plan").
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

from bench_runs import ROOT, TORCH_PRELUDE, TORCH_TIMING, WARMUP, run_args, run_netc, run_torch, token_files, torch_blas
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # models/llama.net's list
R, ALPHA, DROPOUT = 8, 32, 0.1

TORCH_LOOP = TORCH_PRELUDE + r"""
from llama_torch import Llama, add_lora
lora = cfg.pop("lora")
x_all = torch.from_numpy(np.load(data + "/tokens.npy").astype(np.int64))
y_all = torch.from_numpy(np.load(data + "/targets.npy").astype(np.int64))
net = Llama(**cfg)
if lora:
    add_lora(net, lora["targets"], lora["r"], lora["alpha"], lora["dropout"])
trainable = [p for p in net.parameters() if p.requires_grad]
opt = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    logits = net(x_all[idx])
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y_all[idx].reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    opt.step()
""" + TORCH_TIMING + r"""
print(json.dumps({"tokens_per_s": steps * batch * x_all.shape[1] / dt, "version": torch.__version__,
                  "peak_kib": peak_kib,
                  "params": sum(p.numel() for p in net.parameters()), "trainable": sum(p.numel() for p in trainable)}))
"""


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, batch=4, steps=10)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=8)
    ap.add_argument("--n-kv-head", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1408)
    a = ap.parse_args()
    sizes = dict(vocab=a.vocab, n_layer=a.n_layer, n_head=a.n_head, n_kv_head=a.n_kv_head, hidden=a.hidden,
                 intermediate=a.intermediate)
    runs = {k: [] for k in ("netc lora", "netc full", "torch lora", "torch full", "netc lora, system malloc",
                            "netc full, system malloc")}
    malloc = subprocess.run([a.netc, "--print-toolchain"], capture_output=True, text=True).stdout
    print("netc's trainers link malloc:", re.search(r"^malloc +(.*)$", malloc, re.M).group(1))
    with tempfile.TemporaryDirectory() as work:
        token_files(work, a.batch * (a.steps + WARMUP), a.seq, a.vocab)
        exes = {}
        for kind, extra in (("lora", {"lora_r": R, "lora_alpha": ALPHA, "lora_dropout": DROPOUT}), ("full", {})):
            for suffix, flags in (("", []), (", system malloc", ["--system-malloc"])):
                exes[kind + suffix] = os.path.join(work, f"llama_{kind}{suffix.replace(', ', '_').replace(' ', '_')}")
                cmd = [a.netc, os.path.join(ROOT, "models", "llama.net"), "-o", exes[kind + suffix], *flags, "-D",
                       f"batch={a.batch}", "-D", f"seq={a.seq}", "-D", "lr=1e-4", "-D", "weight_decay=0"]
                for k, v in dict(sizes, **extra).items():
                    cmd += ["-D", f"{k}={v}"]
                subprocess.run(cmd, check=True)
        args = ["--data", f"tokens={work}/tokens.npy", "--data", f"targets={work}/targets.npy"]
        lora = dict(targets=TARGETS, r=R, alpha=ALPHA, dropout=DROPOUT)
        for _ in range(a.repeat):
            for kind in ("lora", "full"):
                for suffix in ("", ", system malloc"):
                    r = run_netc(exes[kind + suffix], args, a.threads, a.steps, a.batch, work)
                    runs[f"netc {kind}{suffix}"].append(dict(r, tokens_per_s=r["samples_per_s"] * a.seq))
                cfg = dict(sizes, threads=a.threads, batch=a.batch, steps=a.steps, data=work,
                           lora=lora if kind == "lora" else None)
                runs[f"torch {kind}"].append(run_torch(a.python, TORCH_LOOP, os.path.join(ROOT, "tests", "torch"),
                                                       json.dumps(cfg)))
    tps = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    mem = {k: max(r["peak_kib"] for r in v) / 1024 for k, v in runs.items()}
    t = runs["torch lora"][0]
    print(f"llama fine-tuning ({a.n_layer} layers, {a.n_head} heads on {a.n_kv_head} key/value heads, width {a.hidden}, "
          f"SwiGLU {a.intermediate}, context {a.seq}, vocab {a.vocab}: {t['params'] / 1e6:.2f}M parameters), batch "
          f"{a.batch}, {a.threads} threads, {a.steps} timed steps, median of {a.repeat}")
    print(f"LoRA: rank {R}, alpha {ALPHA}, dropout {DROPOUT} on {', '.join(TARGETS)}: {t['trainable']} trainable "
          f"parameters ({100 * t['trainable'] / t['params']:.2f}%); PyTorch {t['version']} ({a.python}), eager"
          f"{torch_blas(a.python)[1]}")
    print("| | tokens/s | peak RSS |")
    print("|---|---|---|")
    for k in runs:
        print(f"| {k} | {tps[k]:.0f} | {mem[k]:.0f} MiB |")
    for side, suffix in (("netc", ""), ("netc", ", system malloc"), ("torch", "")):
        lora, full = f"{side} lora{suffix}", f"{side} full{suffix}"
        print(f"{side}{suffix}: LoRA / full fine-tuning: peak memory **{mem[lora] / mem[full]:.2f}x**, "
              f"speed {tps[lora] / tps[full]:.2f}x")
    for kind in ("lora", "full"):
        print(f"netc / PyTorch, {kind}: speed **{tps['netc ' + kind] / tps['torch ' + kind]:.2f}x**, "
              f"memory {mem['netc ' + kind] / mem['torch ' + kind]:.2f}x")


if __name__ == "__main__":
    main()
