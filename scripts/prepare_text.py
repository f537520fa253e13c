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

With --mlm the samples are BERT's masked-language-model sequences instead (models/bert.net,
byte-level only): each file is cut into documents at lines equal to --split-at (default: empty
lines; `%` for fortune files), each document into pieces of at most seq - 2 bytes, and each piece
becomes [CLS] piece [SEP] with 15% of its bytes chosen for prediction (BERT's recipe: 80% of
them replaced by [MASK], 10% by a random byte, 10% kept), seeded by --seed. The vocabulary is the
256 bytes and [CLS] 256, [SEP] 257, [MASK] 258, [PAD] 259 (vocab 260). Written per part:

    PART_input_ids, PART_token_type_ids (zeros), PART_attention_mask (1 on tokens), PART_labels
      (the original byte where one was chosen, -100 elsewhere): one sequence per row, padded;
    with --pack, instead of attention_mask: PART_position_ids (from 0 in each sequence) and
      PART_sequence_ids (1, 2, ... per row, 0 on padding): the sequences packed into rows of
      seq tokens by first-fit decreasing (longest first, each into the first row with room),
      models/bert.net -D packed=true's inputs. The same sequences get the same masks either way.

meta.json then holds the sequences, rows, real tokens and the padding of both layouts.

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


CLS, SEP, MASK, PAD, MLM_VOCAB = 256, 257, 258, 259, 260


def documents(files, split_at):
    """Each file's documents: its text cut at lines equal to split_at ("" - empty lines), the
    separating lines dropped, empty documents skipped; each as bytes."""
    docs = []
    for f in files:
        with open(f, "rb") as fh:
            lines = fh.read().split(b"\n")
        cur = []
        for line in lines + [split_at.encode()]:
            if line.rstrip(b"\r") == split_at.encode():
                text = b"\n".join(cur).strip()
                if text:
                    docs.append(text)
                cur = []
            else:
                cur.append(line)
    return docs


def mlm_sequences(docs, seq, rng):
    """[CLS] piece [SEP] for every piece of at most seq - 2 bytes of every document, and its
    labels: BERT's masking of 15% of the piece's bytes (at least one)."""
    out = []
    for d in docs:
        b = np.frombuffer(d, dtype=np.uint8).astype(np.int64)
        for k in range(0, len(b), seq - 2):
            ids = np.concatenate([[CLS], b[k:k + seq - 2], [SEP]])
            labels = np.full(len(ids), -100, np.int64)
            n = len(ids) - 2
            chosen = 1 + rng.choice(n, size=max(1, int(round(0.15 * n))), replace=False)
            labels[chosen] = ids[chosen]
            roll = rng.random(len(chosen))
            ids[chosen[roll < 0.8]] = MASK
            rand = chosen[(roll >= 0.8) & (roll < 0.9)]
            ids[rand] = rng.integers(0, 256, size=len(rand))
            out.append((ids, labels))
    return out


def pack_ffd(lengths, seq):
    """First-fit decreasing: the longest sequence first, each into the first row (in order of
    opening) with room for it. Returns the row of each sequence. A tree of the rows' free room
    finds the first row with room in log(rows) steps."""
    n = len(lengths)
    size = 1
    while size < max(n, 1):
        size *= 2
    room = [0] * (2 * size)  # room[size + r]: row r's free tokens (0 for a row not opened); inner: max
    opened, row_of = 0, [0] * n
    for i in sorted(range(n), key=lambda i: -lengths[i]):
        need = lengths[i]
        if room[1] >= need:  # descend to the leftmost row with room
            node = 1
            while node < size:
                node = 2 * node if room[2 * node] >= need else 2 * node + 1
            r = node - size
        else:
            r, opened = opened, opened + 1
            room[size + r] = seq
        row_of[i] = r
        node = size + r
        room[node] -= need
        node //= 2
        while node:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return row_of, opened


def mlm_arrays(samples, seq, pack):
    """The model's inputs for the samples: one per row, padded, or packed by pack_ffd."""
    lengths = [len(ids) for ids, _ in samples]
    row_of, rows = pack_ffd(lengths, seq) if pack else (list(range(len(samples))), len(samples))
    a = {k: np.zeros((rows, seq), np.int64) for k in ("input_ids", "token_type_ids", "labels")}
    a["input_ids"][:] = PAD
    a["labels"][:] = -100
    extra = ("position_ids", "sequence_ids") if pack else ("attention_mask",)
    for k in extra:
        a[k] = np.zeros((rows, seq), np.int64)
    fill = [0] * rows
    for (ids, labels), r in zip(samples, row_of):
        at, n = fill[r], len(ids)
        a["input_ids"][r, at:at + n] = ids
        a["labels"][r, at:at + n] = labels
        if pack:
            a["position_ids"][r, at:at + n] = np.arange(n)
            a["sequence_ids"][r, at:at + n] = a["sequence_ids"][r].max() + 1
        else:
            a["attention_mask"][r, :n] = 1
        fill[r] += n
    return a


def prepare_mlm(a, frac):
    """--mlm: BERT's masked-LM samples (see the module's text)."""
    if a.tokenizer != "byte":
        fail("--mlm makes byte-level samples: leave out --tokenizer gpt2")
    if a.seq < 3:
        fail("--mlm needs --seq of at least 3 ([CLS], one byte, [SEP])")
    if a.val_every is not None:
        fail("--mlm splits by --val-fraction (the last documents), not --val-every")
    docs = documents(a.files, a.split_at)
    cut = len(docs) - int(round(len(docs) * frac))
    rng = np.random.default_rng(a.seed)
    parts = {"train": mlm_sequences(docs[:cut], a.seq, rng), "val": mlm_sequences(docs[cut:], a.seq, rng)}
    if not parts["train"]:
        fail(f"no training sequence: {len(docs)} documents in the files (split at lines equal to {a.split_at!r})")
    os.makedirs(a.out, exist_ok=True)
    meta = {"tokenizer": "byte-mlm", "vocab": MLM_VOCAB, "seq": a.seq, "packed": a.pack, "documents": len(docs),
            "special": {"cls": CLS, "sep": SEP, "mask": MASK, "pad": PAD}, "files": a.files, "split_at": a.split_at}
    for part, samples in parts.items():
        arrays = mlm_arrays(samples, a.seq, a.pack)
        for k, v in arrays.items():
            np.save(os.path.join(a.out, f"{part}_{k}.npy"), v.astype(np.int16))
        tokens = sum(len(ids) for ids, _ in samples)
        rows = len(arrays["input_ids"])
        meta[part] = {"sequences": len(samples), "rows": rows, "tokens": tokens,
                      "padding": 1 - tokens / (rows * a.seq) if rows else 0,
                      "padding_unpacked": 1 - tokens / (len(samples) * a.seq) if samples else 0,
                      "masked": int(sum((labels != -100).sum() for _, labels in samples))}
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    t = meta["train"]
    print(f"{len(docs)} documents -> {t['sequences']} training sequences ({t['tokens']} tokens, mean length "
          f"{t['tokens'] / t['sequences']:.1f}) in {t['rows']} rows of {a.seq}: padding {100 * t['padding']:.1f}% "
          f"({'packed; unpacked ' + format(100 * t['padding_unpacked'], '.1f') + '%' if a.pack else 'unpacked'}); "
          f"{meta['val']['sequences']} validation sequences, in {a.out}")
    return 0


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
    ap.add_argument("--mlm", action="store_true", help="BERT's masked-LM samples instead of windows")
    ap.add_argument("--pack", action="store_true", help="with --mlm: pack the sequences (first-fit decreasing)")
    ap.add_argument("--split-at", default="", help="with --mlm: the line that ends a document (default: empty)")
    ap.add_argument("--seed", type=int, default=0, help="with --mlm: the masking's seed")
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
    if a.pack and not a.mlm:
        fail("--pack packs --mlm sequences; add --mlm")
    if a.mlm:
        return prepare_mlm(a, 0.1 if frac is None else frac)
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
