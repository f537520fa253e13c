#!/usr/bin/env python3
"""Generate text from a GPT-2 trained by netc (models/gpt2.net), with numpy alone.

    sample_gpt.py gpt2.safetensors --n-head 4 --meta data/meta.json --prompt "The " --tokens 200

Reads the weights in Hugging Face's GPT-2 names, as models/gpt2.net's trainer saves them
(transformer.wte.weight [vocab, n_embd], transformer.wpe.weight [seq, n_embd],
transformer.h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj, with the
Conv1D layout weight [in, out], transformer.ln_f; lm_head tied to wte unless lm_head.weight is
in the file). The number of layers, the vocabulary, the width and the context come from the
shapes; the number of heads cannot, so it is given (--n-head). The forward pass is
GPT2LMHeadModel's in float64: layer norms with eps 1e-5, causal attention scaled by
1/sqrt(head dim), GELU's tanh approximation.

Decoding follows --meta (prepare_text.py's meta.json): byte-level tokens are the bytes (decoded
as UTF-8, invalid sequences replaced), GPT-2 tokens go through tiktoken and the ranks file the
meta names. Without --meta, byte-level. Generation is greedy with --temperature 0, else it
samples from softmax(logits / temperature), optionally among the --top-k largest, from a
generator seeded with --seed. The context is the last `seq` tokens.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": None, "I64": np.int64}


def load_safetensors(path):
    """{name: float64 array} from a safetensors file (F32, F64, F16 or BF16 tensors)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _DTYPES:
            arr = np.frombuffer(raw, dtype=_DTYPES[info["dtype"]])
        else:
            sys.exit(f"sample_gpt.py: error: {path}: tensor {name} has dtype {info['dtype']}")
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


class GPT:
    """GPT-2 from a dictionary of weights in Hugging Face's names."""

    def __init__(self, w, n_head):
        if "transformer.wte.weight" not in w or "transformer.wpe.weight" not in w:
            sys.exit("sample_gpt.py: error: the weights lack transformer.wte.weight or transformer.wpe.weight; "
                     "is this a GPT-2 in Hugging Face's names (models/gpt2.net)?")
        self.w = w
        self.vocab, self.n_embd = w["transformer.wte.weight"].shape
        self.seq = w["transformer.wpe.weight"].shape[0]
        self.n_layer = 0
        while f"transformer.h.{self.n_layer}.ln_1.weight" in w:
            self.n_layer += 1
        if self.n_embd % n_head:
            sys.exit(f"sample_gpt.py: error: n_embd {self.n_embd} is not a multiple of --n-head {n_head}")
        self.n_head = n_head
        self.lm_head = w.get("lm_head.weight", w["transformer.wte.weight"])

    def _p(self, name):
        return self.w[name]

    @staticmethod
    def layernorm(x, weight, bias, eps=1e-5):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * weight + bias

    @staticmethod
    def gelu(x):  # approximate="tanh", GPT-2's gelu_new
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def linear(self, x, name):  # Conv1D: y = x @ W + b, W [in, out]
        return x @ self._p(name + ".weight") + self._p(name + ".bias")

    def logits(self, idx):
        """idx [B, T] (T <= seq) -> logits [B, T, vocab]."""
        idx = np.asarray(idx)
        B, T = idx.shape
        C, H = self.n_embd, self.n_head
        d = C // H
        x = self._p("transformer.wte.weight")[idx] + self._p("transformer.wpe.weight")[:T]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"transformer.h.{i}."
            h = self.layernorm(x, self._p(p + "ln_1.weight"), self._p(p + "ln_1.bias"))
            q, k, v = np.split(self.linear(h, p + "attn.c_attn"), 3, axis=-1)
            q, k, v = (t.reshape(B, T, H, d).transpose(0, 2, 1, 3) for t in (q, k, v))
            s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            y = (s / s.sum(-1, keepdims=True)) @ v
            y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + self.linear(y, p + "attn.c_proj")
            h = self.layernorm(x, self._p(p + "ln_2.weight"), self._p(p + "ln_2.bias"))
            x = x + self.linear(self.gelu(self.linear(h, p + "mlp.c_fc")), p + "mlp.c_proj")
        x = self.layernorm(x, self._p("transformer.ln_f.weight"), self._p("transformer.ln_f.bias"))
        return x @ self.lm_head.T

    def generate(self, prompt_ids, n, temperature=0.8, top_k=None, rng=None):
        ids = list(prompt_ids)
        rng = rng or np.random.default_rng(0)
        for _ in range(n):
            ctx = np.asarray(ids[-self.seq:], dtype=np.int64)[None, :]
            z = self.logits(ctx)[0, -1]
            if temperature <= 0:
                nxt = int(np.argmax(z))
            else:
                z = z / temperature
                if top_k:
                    kth = np.sort(z)[-min(top_k, len(z))]
                    z = np.where(z < kth, -np.inf, z)
                pr = np.exp(z - z.max())
                nxt = int(rng.choice(len(pr), p=pr / pr.sum()))
            ids.append(nxt)
        return ids


def codec(meta):
    """(encode, decode) for the tokenizer meta.json names (byte-level without one)."""
    if not meta or meta.get("tokenizer", "byte") == "byte":
        return (lambda s: list(s.encode("utf-8"))), (lambda ids: bytes(int(t) % 256 for t in ids).decode(
            "utf-8", errors="replace"))
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from prepare_text import gpt2_encoding
    enc = gpt2_encoding(meta.get("gpt2_ranks"), meta.get("gpt2_encoder"))
    return enc.encode_ordinary, enc.decode


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights", help="safetensors file of a GPT-2 (the trainer's --save)")
    ap.add_argument("--n-head", type=int, required=True, help="attention heads (the model's n_head)")
    ap.add_argument("--meta", help="prepare_text.py's meta.json: the tokenizer (default: byte-level)")
    ap.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    ap.add_argument("--tokens", type=int, default=200, help="tokens to generate per sample")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    meta = None
    if a.meta:
        with open(a.meta) as f:
            meta = json.load(f)
    encode, decode = codec(meta)
    model = GPT(load_safetensors(a.weights), a.n_head)
    if meta and meta.get("vocab") not in (None, model.vocab):
        sys.exit(f"sample_gpt.py: error: {a.meta} has vocab {meta['vocab']}, the weights {model.vocab}")
    rng = np.random.default_rng(a.seed)
    prompt = encode(a.prompt)
    for i in range(a.samples):
        ids = model.generate(prompt, a.tokens, a.temperature, a.top_k, rng)
        if a.samples > 1:
            print(f"---- sample {i + 1}")
        print(decode(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
