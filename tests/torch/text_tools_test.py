"""scripts/prepare_text.py and scripts/sample_gpt.py, on their own (they serve models/gpt2.net and
examples/tiny_gpt.sh).

Cases:
  prepare_text  byte-level tokens of two files: the windows are the text's bytes (seq + 1 tokens
                every stride), targets are tokens shifted by one, the validation part is the last
                10% of the stream and no window crosses the cut, --val-every takes every K-th
                window, the dtypes are integer .npy files, and a trainer with
                `input tokens : i64[batch, seq]` and `input targets : i64[batch, seq]` reads them
                (--data and --eval-data) and trains; --tokenizer gpt2 without tiktoken or
                without a ranks file is refused with a message naming what is missing.
  prepare_mlm   --mlm (and --pack) on fortune-style documents: the sequences are [CLS] piece [SEP]
                of the documents' bytes (unmasking with the labels gives the text back, pieces
                of at most seq - 2), 15% of each piece's bytes chosen (80/10/10 as BERT's), the
                packed rows hold exactly the unpacked sequences with the same masks, placed as
                a plain first-fit-decreasing loop places them, with positions from 0 and
                sequence numbers 1, 2, ... per row; models/bert.net reads both layouts
                (-D packed=false and true) and trains.
  sample_gpt    sample_gpt.py's numpy forward against the PyTorch GPT-2 of gpt2_torch.py (Hugging
                Face's names, random weights and biases) in float64: logits within 1e-10 relative
                (both float64; only the summation orders differ); greedy generation picks each
                argmax of torch's logits; the command line runs on a saved file with a byte-level
                meta.json.

usage: text_tools_test.py CASE NETC WORK
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
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, HERE)
from netc_testlib import Checks, run_cases, st_save  # noqa: E402

check = Checks()
PREPARE = os.path.join(ROOT, "scripts", "prepare_text.py")
SAMPLE = os.path.join(ROOT, "scripts", "sample_gpt.py")

# A model that reads token files as gpt2.net does, without the transformer's operators: the
# trainer's loading of the two inputs is what this checks.
TOKENS_NET = """model tokens
const batch = 4, seq = 16
input tokens  : i64[batch, seq]
input targets : i64[batch, seq]
x = f32(tokens) / 255
y = f32(targets) / 255
p = fc: dense(x, seq)
train {
  loss      = mean((p - y) * (p - y))
  optimizer = sgd(0.1)
  epochs    = 1
}
"""


def prep(work, *args):
    return subprocess.run([sys.executable, PREPARE, *args], capture_output=True, text=True, cwd=work)


def case_prepare_text(netc, work):
    rng = np.random.default_rng(3)
    texts = [bytes(rng.integers(32, 127, size=3000, dtype=np.uint8)), "héllo wörld\n".encode() * 50]
    files = []
    for i, t in enumerate(texts):
        files.append(os.path.join(work, f"t{i}.txt"))
        with open(files[-1], "wb") as f:
            f.write(t)
    stream = np.frombuffer(b"".join(texts), dtype=np.uint8).astype(np.int64)
    seq, stride = 16, 8
    out = os.path.join(work, "data")
    r = prep(work, "--seq", str(seq), "--stride", str(stride), "-o", out, *files)
    check(r.returncode == 0, f"prepare_text: exit {r.returncode}\n{r.stdout}{r.stderr}")
    ld = {n: np.load(os.path.join(out, f"{n}.npy")) for n in ("train_tokens", "train_targets", "val_tokens",
                                                            "val_targets")}
    meta = json.load(open(os.path.join(out, "meta.json")))
    check(meta["vocab"] == 256 and meta["seq"] == seq and meta["tokens"] == len(stream), f"meta.json {meta}")
    check(all(a.dtype.kind == "i" and a.ndim == 2 and a.shape[1] == seq for a in ld.values()),
          f"dtypes and shapes {[(a.dtype, a.shape) for a in ld.values()]}")
    cut = len(stream) - round(len(stream) * 0.1)
    train, val = stream[:cut], stream[cut:]
    n_train, n_val = (len(train) - seq - 1) // stride + 1, (len(val) - seq - 1) // stride + 1
    check(ld["train_tokens"].shape[0] == n_train and ld["val_tokens"].shape[0] == n_val,
          f"windows {ld['train_tokens'].shape[0]}, {ld['val_tokens'].shape[0]}; want {n_train}, {n_val}")
    ok = all(np.array_equal(ld["train_tokens"][k], train[k * stride:k * stride + seq]) and
             np.array_equal(ld["train_targets"][k], train[k * stride + 1:k * stride + seq + 1]) for k in range(n_train))
    ok = ok and all(np.array_equal(ld["val_tokens"][k], val[k * stride:k * stride + seq]) and
                    np.array_equal(ld["val_targets"][k], val[k * stride + 1:k * stride + seq + 1]) for k in range(n_val))
    check(ok, "every window is the text's bytes, targets shifted by one, split at the last 10%")

    out2 = os.path.join(work, "every")
    r = prep(work, "--seq", str(seq), "--val-every", "4", "-o", out2, *files)
    check(r.returncode == 0, f"--val-every: exit {r.returncode}\n{r.stderr}")
    tr, va = np.load(os.path.join(out2, "train_tokens.npy")), np.load(os.path.join(out2, "val_tokens.npy"))
    n = (len(stream) - seq - 1) // seq + 1
    check(len(va) == n // 4 and len(tr) == n - n // 4 and np.array_equal(va[0], stream[3 * seq:4 * seq]),
          f"--val-every 4: {len(tr)} + {len(va)} windows of {n}")

    for args, needle in ((["--tokenizer", "gpt2"], "tiktoken"), (["--seq", "0"], "at least 1")):
        a = ["--seq", "8", "-o", os.path.join(work, "bad"), *args, files[0]]
        r = prep(work, *a)
        has_tiktoken = subprocess.run([sys.executable, "-c", "import tiktoken"], capture_output=True).returncode == 0
        if needle == "tiktoken" and has_tiktoken:
            needle = "--gpt2-ranks"
        check(r.returncode != 0 and needle in r.stderr, f"{args}: exit {r.returncode}, wants '{needle}':\n{r.stderr}")

    # the trainer reads the files as they are
    net = os.path.join(work, "tokens.net")
    with open(net, "w") as f:
        f.write(TOKENS_NET)
    exe = os.path.join(work, "tokens")
    subprocess.run([netc, net, "-o", exe], check=True)
    r = subprocess.run([exe, "--data", f"tokens={out}/train_tokens.npy", "--data", f"targets={out}/train_targets.npy",
                        "--eval-data", f"tokens={out}/val_tokens.npy", "--eval-data",
                        f"targets={out}/val_targets.npy", "--quiet"], capture_output=True, text=True)
    check(r.returncode == 0, f"the trainer reads the token files: exit {r.returncode}\n{r.stdout}{r.stderr}")


def ffd_rows(lengths, seq):
    """First-fit decreasing, the plain way: each sequence, longest first (ties in order), into the
    first row with room."""
    rows, room = [], []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r in range(len(rows)) if room[r] >= lengths[i]), None)
        if r is None:
            rows.append([]), room.append(seq)
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= lengths[i]
    return rows


def unpacked_sequences(d, part):
    ids, labels, keep = (np.load(os.path.join(d, f"{part}_{k}.npy")) for k in ("input_ids", "labels", "attention_mask"))
    return [(tuple(ids[r][keep[r] == 1]), tuple(labels[r][keep[r] == 1])) for r in range(len(ids))]


def packed_rows(d, part):
    ids, labels, pos, sid = (np.load(os.path.join(d, f"{part}_{k}.npy"))
                             for k in ("input_ids", "labels", "position_ids", "sequence_ids"))
    rows = []
    for r in range(len(ids)):
        seqs = []
        for k in range(1, sid[r].max() + 1):
            at = sid[r] == k
            check(np.array_equal(pos[r][at], np.arange(at.sum())), f"row {r}: positions of sequence {k}")
            seqs.append((tuple(ids[r][at]), tuple(labels[r][at])))
        check(np.all(ids[r][sid[r] == 0] == 259) and np.all(labels[r][sid[r] == 0] == -100), f"row {r}: padding")
        rows.append(seqs)
    return rows


def case_prepare_mlm(netc, work):
    rng = np.random.default_rng(5)
    seq = 32
    docs = [bytes(rng.integers(33, 127, size=int(rng.integers(1, 100)), dtype=np.uint8)) for _ in range(600)]
    text = os.path.join(work, "fortunes")
    with open(text, "wb") as f:
        f.write(b"\n%\n".join(docs) + b"\n%\n")
    outs = {}
    for pack in (False, True):
        outs[pack] = os.path.join(work, "packed" if pack else "unpacked")
        r = prep(work, "--mlm", *(["--pack"] if pack else []), "--seq", str(seq), "--split-at", "%", "-o",
                 outs[pack], text)
        check(r.returncode == 0, f"--mlm{' --pack' if pack else ''}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    meta = json.load(open(os.path.join(outs[True], "meta.json")))
    check(meta["vocab"] == 260 and meta["documents"] == len(docs), f"meta.json {meta}")

    # the text back: labels undo the masking; [CLS] piece [SEP], pieces of at most seq - 2
    pieces = []
    for part in ("train", "val"):
        for ids, labels in unpacked_sequences(outs[False], part):
            ids, labels = np.array(ids), np.array(labels)
            check(ids[0] == 256 and ids[-1] == 257 and len(ids) <= seq, "[CLS] piece [SEP] within seq")
            orig = np.where(labels != -100, labels, ids)
            pieces.append(bytes(orig[1:-1].astype(np.uint8)))
    want = [d[k:k + seq - 2] for d in docs for k in range(0, len(d), seq - 2)]
    check(pieces == want, "the unpacked sequences are the documents' bytes in pieces of seq - 2, in order")

    # the masking: 15% of each piece (at least one) chosen; of those 80% [MASK], 10% random, 10% kept
    chosen = masked = kept = 0
    for part in ("train", "val"):
        for ids, labels in unpacked_sequences(outs[False], part):
            ids, labels = np.array(ids), np.array(labels)
            at = labels != -100
            check(at.sum() == max(1, round(0.15 * (len(ids) - 2))) and not at[0] and not at[-1], "15% chosen")
            chosen += at.sum()
            masked += (ids[at] == 258).sum()
            kept += (ids[at] == labels[at]).sum()
    # ~4000 chosen: a binomial's standard deviation is 0.6% of them at 80%; 3% is a margin of 5
    print(f"chosen {chosen}: [MASK] {masked / chosen:.3f}, kept {kept / chosen:.3f}")
    check(abs(masked / chosen - 0.8) < 0.03 and abs(kept / chosen - 0.1 - 0.1 / 256) < 0.03,
          f"80/10/10: [MASK] {masked / chosen:.3f}, kept {kept / chosen:.3f}")

    # packing: the same sequences with the same masks, in the rows a plain FFD loop makes
    for part in ("train", "val"):
        seqs = unpacked_sequences(outs[False], part)
        rows = packed_rows(outs[True], part)
        plain = ffd_rows([len(ids) for ids, _ in seqs], seq)
        check(len(rows) == len(plain), f"{part}: {len(rows)} packed rows, first-fit decreasing makes {len(plain)}")
        same = all(sorted(row) == sorted(seqs[i] for i in p) for row, p in zip(rows, plain))
        check(same, f"{part}: the packed rows hold the sequences first-fit decreasing puts there")
    t = meta["train"]
    print(f"train: {t['sequences']} sequences in {t['rows']} rows: padding {t['padding']:.3f} packed, "
          f"{t['padding_unpacked']:.3f} unpacked")

    for args, needle in ((["--pack"], "add --mlm"), (["--mlm", "--tokenizer", "gpt2"], "byte-level")):
        r = prep(work, "--seq", "8", "-o", os.path.join(work, "bad"), *args, text)
        check(r.returncode != 0 and needle in r.stderr, f"{args}: exit {r.returncode}, wants '{needle}':\n{r.stderr}")

    # models/bert.net reads both layouts and trains
    for pack in (False, True):
        exe = os.path.join(work, "bert_packed" if pack else "bert")
        subprocess.run([netc, os.path.join(ROOT, "models", "bert.net"), "-o", exe, "-D", "vocab=260", "-D", f"seq={seq}",
                        "-D", "n_layer=1", "-D", "n_head=2", "-D", "hidden=16", "-D", "intermediate=32", "-D", "batch=4",
                        "-D", f"packed={'true' if pack else 'false'}"], check=True)
        names = ["input_ids", "token_type_ids", *(["position_ids", "sequence_ids"] if pack else ["attention_mask"]),
                 "labels"]
        data = sum((["--data", f"{n}={outs[pack]}/train_{n}.npy", "--eval-data", f"{n}={outs[pack]}/val_{n}.npy"]
                    for n in names), [])
        r = subprocess.run([exe, *data, "--steps", "3", "--quiet"], capture_output=True, text=True)
        check(r.returncode == 0, f"bert{' packed' if pack else ''} reads the files: exit {r.returncode}\n{r.stdout}{r.stderr}")


def case_sample_gpt(netc, work):
    import gpt2_torch
    import sample_gpt
    torch.manual_seed(7)
    cfg = dict(vocab=256, seq=12, n_layer=2, n_head=2, n_embd=16)
    ref = gpt2_torch.GPT2(**cfg).double()
    with torch.no_grad():  # every parameter random, biases and norms included, at a visible scale
        for p in ref.parameters():
            p.normal_(0, 0.3)
    w = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    model = sample_gpt.GPT(w, cfg["n_head"])
    check((model.n_layer, model.seq, model.vocab) == (2, 12, 256), "shapes read from the weights")
    idx = np.random.default_rng(1).integers(0, 256, size=(3, 12))
    got = model.logits(idx)
    want = ref(torch.from_numpy(idx)).detach().numpy()
    err = np.abs(got - want).max() / np.abs(want).max()
    print(f"sample_gpt: logits' largest difference from torch, relative to the largest logit: {err:.2e}")
    check(err < 1e-10, f"logits differ from torch's GPT-2 by {err:.2e}")
    # greedy: each next token is torch's argmax after the sequence so far
    ids = model.generate([65, 66], 14, temperature=0)
    seqs_ok = True
    for t in range(2, len(ids)):
        ctx = torch.tensor([ids[max(0, t - 12):t]])
        seqs_ok &= int(ref(ctx)[0, -1].argmax()) == ids[t]
    check(seqs_ok and len(ids) == 16, "greedy generation follows torch's argmax, past the context length")
    # the command line, on a float32 file and a byte-level meta.json
    path = os.path.join(work, "gpt.safetensors")
    st_save(path, w)
    with open(os.path.join(work, "meta.json"), "w") as f:
        json.dump({"tokenizer": "byte", "vocab": 256, "seq": 12}, f)
    r = subprocess.run([sys.executable, SAMPLE, path, "--n-head", "2", "--meta", os.path.join(work, "meta.json"),
                        "--prompt", "Hi", "--tokens", "20", "--samples", "2", "--seed", "3"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.count("---- sample") == 2 and "Hi" in r.stdout,
          f"sample_gpt.py command line: exit {r.returncode}\n{r.stdout}{r.stderr}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(run_cases({"prepare_text": case_prepare_text, "prepare_mlm": case_prepare_mlm,
                        "sample_gpt": case_sample_gpt}, "text_tools", check,
                       sys.argv))
