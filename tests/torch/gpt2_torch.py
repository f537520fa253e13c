"""GPT-2 in PyTorch with Hugging Face's parameter names (GPT2LMHeadModel's state dict without the
tied lm_head.weight), written out here so the tests need no `transformers`: the reference of
gpt2_crosscheck.py, test_text_tools.py (scripts/sample_gpt.py) and bench/gpt2_cpu_vs_torch.py.

    transformer.wte.weight [vocab, C]   transformer.wpe.weight [seq, C]
    transformer.h.{i}.ln_1.weight/bias  .attn.c_attn.weight [C, 3C] (Conv1D: y = x @ W + b) /bias
    .attn.c_proj.weight [C, C]/bias     .ln_2.weight/bias
    .mlp.c_fc.weight [C, 4C]/bias       .mlp.c_proj.weight [4C, C]/bias
    transformer.ln_f.weight/bias        lm_head: tied to wte (logits = x @ wte.weight^T)
"""
import math

import torch
from torch import nn


class Conv1D(nn.Module):
    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(0, 0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        H, d = self.n_head, C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(d)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(nn.functional.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, n_head)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, seq, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(seq, n_embd),
            h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)), ln_f=nn.LayerNorm(n_embd, eps=1e-5)))
        nn.init.normal_(self.transformer.wte.weight, 0, 0.02)
        nn.init.normal_(self.transformer.wpe.weight, 0, 0.01)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe.weight[:T]
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x) @ self.transformer.wte.weight.T


def decay_groups(model):
    """nanoGPT's split for no_decay = ["biases", "norms"]: every bias and every layer norm's
    weight and bias without weight decay; the matrices (embeddings included) with it."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith(".bias") or ".ln_" in name else decay).append(p)
    return decay, no_decay


def flops_per_token(n_params, n_layer, seq, n_embd):
    """Training FLOPs per token (forward + backward): 6 N plus attention's 12 L T C (PaLM's count,
    nanoGPT's estimate_mfu)."""
    return 6 * n_params + 12 * n_layer * seq * n_embd
