"""GPT-2 (models/gpt2.net) training on the CPU: netc's trainer against the same model in PyTorch
eager (tests/torch/gpt2_torch.py: Hugging Face's GPT-2 with the tied head), same sizes, batch,
threads, recipe (AdamW betas (0.9, 0.95), weight decay on the decay group, clip_grad_norm 1.0)
and synthetic tokens, in one run; prints tokens/s, peak memory and each side's FLOP utilisation.

usage: /usr/bin/python3 bench/gpt2_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
           [--vocab 256] [--seq 128] [--n-layer 4] [--n-head 4] [--n-embd 128] [--batch 16]
           [--steps 10] [--repeat 3] [--python PYTHON]

FLOP utilisation: the training FLOPs of a token, 6 N + 12 L T C (N the parameters, the tied
embedding counted once; the second term attention's scores and weighted sums, forward and
backward: PaLM's count, nanoGPT's estimate_mfu), times tokens/s, divided by a measured peak: the
best rate of a float32 [2048 x 2048] @ [2048 x 2048] product in PyTorch with the same threads
(printed; the BLAS PyTorch links, which for Debian's python3-torch is OpenBLAS, run with
kernels for the CPU's instruction set where it would run older ones: bench_runs.torch_blas).

Each run trains 2 warm-up steps plus --steps timed steps (netc: from its JSON log, one line per
step; PyTorch: timed around its loop). Runs alternate netc / PyTorch so that noise on a shared
machine hits both; the medians are compared. Peak memory is each process's maximum resident set.
"""
import argparse
import json
import os
import subprocess
import tempfile

from bench_runs import (ROOT, TORCH_MATMUL_PEAK, TORCH_PRELUDE, TORCH_TIMING, WARMUP, flop_table, run_args, run_netc,
                        run_torch, token_files, torch_blas)

TORCH_LOOP = TORCH_PRELUDE + r"""
from gpt2_torch import GPT2, decay_groups
x_all = torch.from_numpy(np.load(data + "/tokens.npy").astype(np.int64))
y_all = torch.from_numpy(np.load(data + "/targets.npy").astype(np.int64))
net = GPT2(**cfg)
decay, no_decay = decay_groups(net)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    logits = net(x_all[idx])
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y_all[idx].reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
""" + TORCH_TIMING + TORCH_MATMUL_PEAK + r"""
print(json.dumps({"tokens_per_s": steps * batch * x_all.shape[1] / dt, "version": torch.__version__,
                  "peak_kib": peak_kib, "matmul_flops": matmul_flops,
                  "params": sum(p.numel() for p in net.parameters())}))
"""


def main():
    ap = argparse.ArgumentParser()
    run_args(ap, batch=16, steps=10)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    a = ap.parse_args()
    sizes = dict(vocab=a.vocab, seq=a.seq, n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd)
    with tempfile.TemporaryDirectory() as work:
        token_files(work, a.batch * (a.steps + WARMUP), a.seq, a.vocab)
        exe = os.path.join(work, "gpt2")
        cmd = [a.netc, os.path.join(ROOT, "models", "gpt2.net"), "-o", exe, "-D", f"batch={a.batch}", "-D", "dropout=0",
               "-D", "grad_clip=1.0"]
        for k, v in sizes.items():
            cmd += ["-D", f"{k}={v}"]
        subprocess.run(cmd, check=True)
        args = ["--data", f"tokens={work}/tokens.npy", "--data", f"targets={work}/targets.npy"]
        cfg = dict(sizes, threads=a.threads, batch=a.batch, steps=a.steps, data=work)
        netc, torch = [], []
        for _ in range(a.repeat):
            r = run_netc(exe, args, a.threads, a.steps, a.batch, work)
            netc.append(dict(r, tokens_per_s=r["samples_per_s"] * a.seq))
            torch.append(run_torch(a.python, TORCH_LOOP, os.path.join(ROOT, "tests", "torch"), json.dumps(cfg)))
    peak = max(r["matmul_flops"] for r in torch)
    params = torch[0]["params"]
    per_token = 6 * params + 12 * a.n_layer * a.seq * a.n_embd
    print(f"gpt2 training ({a.n_layer} layers, {a.n_head} heads, width {a.n_embd}, context {a.seq}, vocab "
          f"{a.vocab}: {params / 1e6:.2f}M parameters), batch {a.batch}, {a.threads} threads, {a.steps} timed "
          f"steps, median of {a.repeat}")
    print(f"PyTorch {torch[0]['version']} ({a.python}), eager{torch_blas(a.python)[1]}")
    print(f"{per_token / 1e6:.1f} MFLOP per token "
          f"(6 N + 12 L T C); float32 matmul peak measured {peak / 1e9:.1f} GFLOP/s (PyTorch, 2048^3)")
    flop_table("token", per_token, peak, netc, "tokens_per_s", torch, "tokens_per_s")


if __name__ == "__main__":
    main()
