#!/usr/bin/env python3
"""Text files -> token .npy files for a language model's trainer (models/gpt2.net and the like).

    prepare_text.py --seq 128 -o data/ FILE...                      byte-level tokens (vocab 256)
    prepare_text.py --tokenizer gpt2 --gpt2-ranks gpt2.tiktoken --seq 1024 -o data/ FILE...

The files are read as UTF-8 bytes and concatenated in the order given (with the GPT-2 tokenizer,
each file ends with <|endoftext|>, as GPT-2's training documents do). The token stream is split
into a training part and a validation part (the last --val-fraction of the stream, default 10%;
or, with --val-every K, every K-th window), and each part is cut into windows of seq + 1 tokens
starting every --stride tokens (default seq: windows that share only their boundary token).
Window w gives one sample of each input:

    tokens[i]  = w[0 .. seq)     the model's input  `input tokens  : i64[batch, seq]`
    targets[i] = w[1 .. seq]     the next tokens    `input targets : i64[batch, seq]`

Written into the output folder: train_tokens.npy, train_targets.npy, val_tokens.npy,
val_targets.npy, each [windows, seq] (int16 for a vocabulary that fits, else int32: the trainer
converts any integer .npy to the input's i64 by value, docs/trainer.md), and meta.json (the
tokenizer, vocab, seq, stride, counts). Train with

    ./gpt2 --data tokens=data/train_tokens.npy --data targets=data/train_targets.npy \\
           --eval-data tokens=data/val_tokens.npy --eval-data targets=data/val_targets.npy

Tokenizers: `byte` (built in: token = byte value, vocab 256; decoding is bytes(tokens)), and
`gpt2`, GPT-2's byte-level BPE (vocab 50257) through the `tiktoken` package and a ranks file:
either tiktoken's `gpt2.tiktoken` format (base64 token and rank per line) or GPT-2's own
`vocab.bpe` given with `--gpt2-encoder encoder.json`. Only numpy is needed for `byte`.
"""
import argparse
import json
import os
import sys

import numpy as np

# GPT-2's pre-tokenisation pattern (tiktoken's "gpt2" encoding) and its end-of-text token.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT, GPT2_VOCAB = 50256, 50257


def fail(msg):
    sys.exit(f"prepare_text.py: error: {msg}")


def gpt2_encoding(ranks_file, encoder_json=None):
    """tiktoken's GPT-2 encoding from a local ranks file (no download); a clear error naming
    what is missing otherwise."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        fail("--tokenizer gpt2 needs the Python package 'tiktoken' (pip install tiktoken), which is not "
             "installed; the byte-level tokenizer (--tokenizer byte) needs nothing")
    if not ranks_file:
        fail("--tokenizer gpt2 needs --gpt2-ranks FILE: tiktoken's gpt2.tiktoken, or GPT-2's vocab.bpe "
             "with --gpt2-encoder encoder.json (this script downloads nothing)")
    for f in (ranks_file, encoder_json):
        if f and not os.path.isfile(f):
            fail(f"{f}: no such file")
    if encoder_json:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(ranks_file, encoder_json)
    else:
        ranks = tiktoken.load.load_tiktoken_bpe(ranks_file)
    if len(ranks) != GPT2_EOT:
        fail(f"{ranks_file}: {len(ranks)} ranks; GPT-2's vocabulary has {GPT2_EOT} besides <|endoftext|>")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT})


def tokenize(files, tokenizer, enc):
    parts = []
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        if tokenizer == "byte":
            parts.append(np.frombuffer(data, dtype=np.uint8).astype(np.int32))
        else:
            ids = enc.encode_ordinary(data.decode("utf-8", errors="replace"))
            parts.append(np.asarray(ids + [GPT2_EOT], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def windows(ids, seq, stride):
    """[n, seq + 1]: the windows ids[k * stride : k * stride + seq + 1] that fit."""
    if len(ids) < seq + 1:
        return np.zeros((0, seq + 1), ids.dtype)
    n = (len(ids) - (seq + 1)) // stride + 1
    idx = np.arange(n)[:, None] * stride + np.arange(seq + 1)[None, :]
    return ids[idx]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="text files, read as UTF-8 bytes, in this order")
    ap.add_argument("-o", "--out", required=True, help="output folder (made if missing)")
    ap.add_argument("--seq", type=int, required=True, help="tokens per sample (the model's seq)")
    ap.add_argument("--stride", type=int, help="tokens between window starts (default: seq)")
    ap.add_argument("--tokenizer", choices=["byte", "gpt2"], default="byte")
    ap.add_argument("--gpt2-ranks", help="GPT-2 BPE ranks: gpt2.tiktoken, or vocab.bpe with --gpt2-encoder")
    ap.add_argument("--gpt2-encoder", help="GPT-2's encoder.json, with --gpt2-ranks vocab.bpe")
    split = ap.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=None,
                       help="the last fraction of the token stream for validation (default 0.1)")
    split.add_argument("--val-every", type=int, help="every K-th window for validation instead")
    ap.add_argument("--max-windows", type=int, help="keep at most this many training windows (the first)")
    ap.add_argument("--max-val-windows", type=int, help="keep at most this many validation windows, evenly spread")
    a = ap.parse_args(argv)
    stride = a.stride or a.seq
    if a.seq < 1 or stride < 1:
        fail("--seq and --stride must be at least 1")
    if a.val_every is not None and a.val_every < 2:
        fail("--val-every must be at least 2")
    frac = 0.1 if a.val_fraction is None and a.val_every is None else a.val_fraction
    if frac is not None and not 0 <= frac < 1:
        fail("--val-fraction must lie in [0, 1)")
    for f in a.files:
        if not os.path.isfile(f):
            fail(f"{f}: no such file")
    enc = gpt2_encoding(a.gpt2_ranks, a.gpt2_encoder) if a.tokenizer == "gpt2" else None
    vocab = 256 if a.tokenizer == "byte" else GPT2_VOCAB
    ids = tokenize(a.files, a.tokenizer, enc)

    if a.val_every is not None:
        w = windows(ids, a.seq, stride)
        is_val = (np.arange(len(w)) % a.val_every) == a.val_every - 1
        train, val = w[~is_val], w[is_val]
    else:  # the stream is split first, so no window crosses from training into validation
        cut = len(ids) - int(round(len(ids) * frac))
        train, val = windows(ids[:cut], a.seq, stride), windows(ids[cut:], a.seq, stride)
    if a.max_windows is not None:
        train = train[:a.max_windows]
    if a.max_val_windows is not None and len(val) > a.max_val_windows:
        val = val[np.linspace(0, len(val) - 1, a.max_val_windows).round().astype(np.int64)]
    if len(train) == 0:
        fail(f"{len(ids)} tokens make no training window of seq + 1 = {a.seq + 1} tokens")

    dtype = np.int16 if vocab <= np.iinfo(np.int16).max + 1 else np.int32
    os.makedirs(a.out, exist_ok=True)
    for part, w in (("train", train), ("val", val)):
        np.save(os.path.join(a.out, f"{part}_tokens.npy"), np.ascontiguousarray(w[:, :-1], dtype=dtype))
        np.save(os.path.join(a.out, f"{part}_targets.npy"), np.ascontiguousarray(w[:, 1:], dtype=dtype))
    meta = {"tokenizer": a.tokenizer, "vocab": vocab, "seq": a.seq, "stride": stride, "tokens": int(len(ids)),
            "train_windows": int(len(train)), "val_windows": int(len(val)), "files": a.files,
            "split": f"every {a.val_every}th window" if a.val_every else f"last {frac:g} of the tokens"}
    if a.gpt2_ranks:
        meta["gpt2_ranks"] = os.path.abspath(a.gpt2_ranks)
        if a.gpt2_encoder:
            meta["gpt2_encoder"] = os.path.abspath(a.gpt2_encoder)
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{len(ids)} tokens ({a.tokenizer}, vocab {vocab}) -> {len(train)} training and {len(val)} validation "
          f"windows of {a.seq} in {a.out}")
    if len(val) == 0:
        print("note: no validation window (too little text for the split)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
