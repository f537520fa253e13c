"""A Llama-style decoder in PyTorch with Hugging Face's parameter names (LlamaForCausalLM's state
dict), written out here so the tests need no `transformers`: the reference of llama_crosscheck.py.

    model.embed_tokens.weight [vocab, C]
    model.layers.{i}.input_layernorm.weight [C]          (RMSNorm)
    .self_attn.q_proj.weight [H d, C]  .k_proj.weight [G d, C]  .v_proj.weight [G d, C]
    .self_attn.o_proj.weight [C, H d]  (no biases; G key/value heads, H / G query heads each)
    .post_attention_layernorm.weight [C]
    .mlp.gate_proj.weight [I, C]  .up_proj.weight [I, C]  .down_proj.weight [C, I]
    model.norm.weight [C]              lm_head.weight [vocab, C]   (not tied)

Rotary embeddings as LlamaRotaryEmbedding and apply_rotary_pos_emb (rotate_half: the first and
second halves of a head form the pairs), computed in the module's dtype (float64 in the tests,
where HF's float32 tables are rounded), and k, v repeated per query head as repeat_kv.
add_lora puts PEFT's LoRA adapters on chosen projections (lora_crosscheck.py, bench/).
"""
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotary_tables(T, d, theta, dtype):
    """cos, sin [T, d]: position p, pair i (of i and i + d/2) at angle p * theta^(-2i/d)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=dtype) / d)
    freqs = torch.arange(T, dtype=dtype)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, C, n_head, n_kv_head, theta):
        super().__init__()
        self.H, self.G, self.d, self.theta = n_head, n_kv_head, C // n_head, theta
        self.q_proj = nn.Linear(C, n_head * self.d, bias=False)
        self.k_proj = nn.Linear(C, n_kv_head * self.d, bias=False)
        self.v_proj = nn.Linear(C, n_kv_head * self.d, bias=False)
        self.o_proj = nn.Linear(n_head * self.d, C, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.G, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.G, self.d).transpose(1, 2)
        cos, sin = rotary_tables(T, self.d, self.theta, x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = (t.repeat_interleave(self.H // self.G, dim=1) for t in (k, v))  # repeat_kv
        s = q @ k.transpose(-2, -1) / self.d ** 0.5
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.d))


class MLP(nn.Module):
    def __init__(self, C, inter):
        super().__init__()
        self.gate_proj = nn.Linear(C, inter, bias=False)
        self.up_proj = nn.Linear(C, inter, bias=False)
        self.down_proj = nn.Linear(inter, C, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, C, n_head, n_kv_head, inter, eps, theta):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = Attention(C, n_head, n_kv_head, theta)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.mlp = MLP(C, inter)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab, n_layer, n_head, n_kv_head, hidden, intermediate, rms_eps=1e-5, rope_theta=10000.0):
        super().__init__()
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(vocab, hidden),
            layers=nn.ModuleList(DecoderLayer(hidden, n_head, n_kv_head, intermediate, rms_eps, rope_theta)
                                 for _ in range(n_layer)),
            norm=RMSNorm(hidden, rms_eps)))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        for m in self.modules():  # LlamaPreTrainedModel._init_weights: N(0, 0.02)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0, 0.02)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def decay_groups(model):
    """no_decay = ["norms"]: the RMSNorm weights without weight decay, every matrix with it."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("norm.weight") else decay).append(p)
    return decay, no_decay


class LoraLinear(nn.Linear):
    """PEFT's LoraLayer on a Linear, with the adapters as sub-modules of the Linear itself so that
    the state_dict names are netc's: q_proj.weight, q_proj.lora_A.weight, q_proj.lora_B.weight."""

    def forward(self, x):
        return super().forward(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def add_lora(net, targets, r, alpha, dropout=0.0):
    """Adapters on the Linear layers PEFT's target_modules rule picks (a name that is a target or
    ends in '.' + target), A as torch.nn.Linear initialises it, B zero, dropout on the adapters'
    input; everything else frozen."""
    for name, mod in list(net.named_modules()):
        if isinstance(mod, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            mod.__class__ = LoraLinear
            mod.lora_A = nn.Linear(mod.in_features, r, bias=False, dtype=mod.weight.dtype)
            mod.lora_B = nn.Linear(r, mod.out_features, bias=False, dtype=mod.weight.dtype)
            nn.init.zeros_(mod.lora_B.weight)
            mod.lora_dropout = nn.Dropout(dropout)
            mod.scaling = alpha / r
    for name, p in net.named_parameters():
        p.requires_grad_(".lora_" in name)
    return net


def hf_llama(transformers, cfg, seq):
    """transformers.LlamaForCausalLM of the sizes cfg gives Llama (eager attention, untied head,
    no biases), in float64."""
    conf = transformers.LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"],
                                    intermediate_size=cfg["intermediate"], num_hidden_layers=cfg["n_layer"],
                                    num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_kv_head"],
                                    max_position_embeddings=seq, rms_norm_eps=cfg["rms_eps"],
                                    rope_theta=cfg["rope_theta"], tie_word_embeddings=False, attention_bias=False,
                                    mlp_bias=False, hidden_act="silu", attn_implementation="eager")
    return transformers.LlamaForCausalLM(conf).double()
