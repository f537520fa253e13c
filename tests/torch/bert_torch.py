"""BERT for masked-language-model pretraining in PyTorch with Hugging Face's parameter names
(BertForMaskedLM's state dict without the tied cls.predictions.decoder), written out here so
the tests need no `transformers`: the reference of bert_crosscheck.py (models/bert.net).

    bert.embeddings.{word,position,token_type}_embeddings.weight, bert.embeddings.LayerNorm.*
    bert.encoder.layer.{i}.attention.self.{query,key,value}.*   (nn.Linear: [out, in])
    bert.encoder.layer.{i}.attention.output.{dense,LayerNorm}.*
    bert.encoder.layer.{i}.intermediate.dense.*, .output.{dense,LayerNorm}.*
    cls.predictions.transform.{dense,LayerNorm}.*, cls.predictions.bias
    decoder: tied to the word embeddings (logits = t @ word_embeddings.weight^T + bias)
No dropout (the tests compare with it off); post-norm layers, GELU in its erf form, layer norms
with eps 1e-12, padding keys left out of every query's softmax (or, for packed rows, every key
of another sequence).
"""
import math

import torch
from torch import nn

EPS = 1e-12


class SelfAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))


class Output(nn.Module):
    def __init__(self, n_in, hidden):
        super().__init__()
        self.dense = nn.Linear(n_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=EPS)

    def forward(self, h, residual):
        return self.LayerNorm(self.dense(h) + residual)


class Attention(nn.Module):
    def __init__(self, hidden, n_head):
        super().__init__()
        self.n_head = n_head
        self.self = SelfAttention(hidden)
        self.output = Output(hidden, hidden)

    def forward(self, x, keep):
        B, T, C = x.shape
        H, d = self.n_head, C // self.n_head
        q, k, v = (lin(x).view(B, T, H, d).transpose(1, 2) for lin in (self.self.query, self.self.key, self.self.value))
        keep = keep[:, None, None, :] if keep.dim() == 2 else keep[:, None]  # [B, T] keys or [B, T, T] pairs
        s = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~keep, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.output(y, x)


class Intermediate(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)


class Layer(nn.Module):
    def __init__(self, hidden, n_head, intermediate):
        super().__init__()
        self.attention = Attention(hidden, n_head)
        self.intermediate = Intermediate(hidden, intermediate)
        self.output = Output(intermediate, hidden)

    def forward(self, x, keep):
        a = self.attention(x, keep)
        return self.output(nn.functional.gelu(self.intermediate.dense(a)), a)


class Bert(nn.Module):
    def __init__(self, vocab, seq, n_layer, n_head, hidden, intermediate, max_position=512, type_vocab=2):
        super().__init__()
        self.bert = nn.Module()
        self.bert.embeddings = nn.Module()
        e = self.bert.embeddings
        e.word_embeddings = nn.Embedding(vocab, hidden)
        e.position_embeddings = nn.Embedding(max_position, hidden)
        e.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        e.LayerNorm = nn.LayerNorm(hidden, eps=EPS)
        self.bert.encoder = nn.Module()
        self.bert.encoder.layer = nn.ModuleList(Layer(hidden, n_head, intermediate) for _ in range(n_layer))
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        p = self.cls.predictions
        p.transform = nn.Module()
        p.transform.dense = nn.Linear(hidden, hidden)
        p.transform.LayerNorm = nn.LayerNorm(hidden, eps=EPS)
        p.bias = nn.Parameter(torch.zeros(vocab))
        for m in self.modules():  # BertPreTrainedModel._init_weights: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, input_ids, token_type_ids, attention_mask=None, position_ids=None, sequence_ids=None):
        """attention_mask [B, T] (1 on tokens), or packed rows: position_ids and sequence_ids
        [B, T], a token attending only to the tokens of its own sequence (models/bert.net's
        -D packed=true)."""
        e = self.bert.embeddings
        if sequence_ids is None:
            pos = torch.arange(input_ids.shape[1])[None]
            keep = attention_mask != 0
        else:
            pos = position_ids
            keep = sequence_ids[:, :, None] == sequence_ids[:, None, :]
        x = e.word_embeddings(input_ids) + e.position_embeddings(pos) + e.token_type_embeddings(token_type_ids)
        x = e.LayerNorm(x)
        for layer in self.bert.encoder.layer:
            x = layer(x, keep)
        p = self.cls.predictions
        t = p.transform.LayerNorm(nn.functional.gelu(p.transform.dense(x)))
        return t @ e.word_embeddings.weight.T + p.bias


def lamb_groups(model):
    """MLPerf BERT's split for no_decay = ["biases", "norms"]: every bias and every LayerNorm's
    weight and bias without weight decay or trust ratio; the matrices and embeddings with both."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith(".bias") or ".LayerNorm." in name else decay).append(p)
    return decay, no_decay
