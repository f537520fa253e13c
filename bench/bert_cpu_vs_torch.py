"""BERT-base masked-LM pretraining (models/bert.net) at sequence 128 on the CPU: netc's trainer
against the same model in PyTorch eager (tests/torch/bert_torch.py: Hugging Face's names, the
decoder tied), same sizes, rows per batch, threads and data, each with padded rows and with
sequence packing (first-fit decreasing, a block-diagonal attention mask), in one run. Prints
sequences/s (rows/s times the sequences a row holds), peak memory and the ratios.

usage: /usr/bin/python3 bench/bert_cpu_vs_torch.py [--netc build/compiler/netc] [--threads N]
           [--batch 8] [--steps 4] [--repeat 3] [--n-layer 12] [--python PYTHON] [TEXT_FILE...]

The sequences: the text files (default: Debian's fortunes, when installed, else a synthetic
text whose documents have their lengths), cut by scripts/prepare_text.py --mlm into documents
at `%` lines, [CLS] piece [SEP] of at most 128 byte tokens, 15% masked; --pack packs the same
sequences. Both sides train without dropout (bert_torch.py has none); netc with its recipe,
LAMB, PyTorch with AdamW (it has no LAMB; netc's LAMB update, a pass more than AdamW's, is
about 3 % of its BERT-base step at 2 threads on a 2-core EPYC, by perf).
Each run trains 2 warm-up steps plus --steps timed steps (netc: from its JSON log; PyTorch:
timed around its loop); runs alternate so that noise on a shared machine hits all four; medians
are compared. Peak memory is each process's maximum resident set.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from bench_runs import ROOT, TORCH_PRELUDE, TORCH_TIMING, WARMUP, run_args, run_netc, run_torch, torch_blas

SEQ, VOCAB = 128, 30522
PACKED_INPUTS = ["input_ids", "token_type_ids", "position_ids", "sequence_ids", "labels"]
PLAIN_INPUTS = ["input_ids", "token_type_ids", "attention_mask", "labels"]

TORCH_LOOP = TORCH_PRELUDE + r"""
from bert_torch import Bert, lamb_groups
packed = cfg.pop("packed")
names = ["input_ids", "token_type_ids"] + (["position_ids", "sequence_ids"] if packed else ["attention_mask"])
x = {n: torch.from_numpy(np.load(f"{data}/train_{n}.npy").astype(np.int64)) for n in names + ["labels"]}
net = Bert(**cfg)
decay, no_decay = lamb_groups(net)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
def step(s):
    idx = slice(s * batch, (s + 1) * batch)
    opt.zero_grad(set_to_none=True)
    logits = net(**{n: x[n][idx] for n in names})
    y = x["labels"][idx]
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
""" + TORCH_TIMING + r"""
print(json.dumps({"rows_per_s": steps * batch / dt, "version": torch.__version__,
                  "peak_kib": peak_kib}))
"""


def corpus(files, work):
    """The text files, or the fortunes when none are given and they are installed, else a text of
    documents with the lengths of a fortune file's (lognormal, median ~100 bytes)."""
    if files:
        return files, "the given text"
    fortunes = [f[:-4] for f in sorted(glob.glob("/usr/share/games/fortunes/*.dat")) if os.path.isfile(f[:-4])]
    if fortunes:
        return fortunes, "Debian's fortunes"
    rng = np.random.default_rng(0)
    path = os.path.join(work, "synthetic.txt")
    with open(path, "wb") as f:
        for n in np.clip(rng.lognormal(4.6, 0.9, 20000), 5, 2000).astype(int):
            f.write(bytes(rng.integers(97, 123, n, dtype=np.uint8)) + b"\n%\n")
    return [path], "a synthetic text (no fortunes installed)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*", help="text files (default: the fortunes)")
    run_args(ap, batch=8, steps=4)
    ap.add_argument("--n-layer", type=int, default=12)
    a = ap.parse_args()
    sizes = dict(vocab=VOCAB, seq=SEQ, n_layer=a.n_layer, n_head=12, hidden=768, intermediate=3072)
    runs = {k: [] for k in ("netc plain", "netc packed", "torch plain", "torch packed")}
    with tempfile.TemporaryDirectory() as work:
        files, source = corpus(a.files, work)
        per_row, data, exes = {}, {}, {}
        for packed in (False, True):
            kind = "packed" if packed else "plain"
            data[kind] = os.path.join(work, kind)
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_text.py"), "--mlm", "--seq", str(SEQ),
                            "--split-at", "%", "-o", data[kind], *(["--pack"] if packed else []), *files],
                           check=True, capture_output=True)
            meta = json.load(open(os.path.join(data[kind], "meta.json")))["train"]
            per_row[kind] = meta["sequences"] / meta["rows"]
            if meta["rows"] < a.batch * (a.steps + WARMUP):
                sys.exit(f"bench: {meta['rows']} rows of data, fewer than the run's {a.batch * (a.steps + WARMUP)}")
            exes[kind] = os.path.join(work, f"bert_{kind}")
            cmd = [a.netc, os.path.join(ROOT, "models", "bert.net"), "-o", exes[kind], "-D", f"batch={a.batch}",
                   "-D", "dropout=0", "-D", f"packed={'true' if packed else 'false'}"]
            for k, v in sizes.items():
                cmd += ["-D", f"{k}={v}"]
            subprocess.run(cmd, check=True)
        for _ in range(a.repeat):
            for kind in ("plain", "packed"):
                names = PACKED_INPUTS if kind == "packed" else PLAIN_INPUTS
                args = sum((["--data", f"{n}={data[kind]}/train_{n}.npy"] for n in names), [])
                r = run_netc(exes[kind], args, a.threads, a.steps, a.batch, work)
                runs[f"netc {kind}"].append(dict(r, rows_per_s=r["samples_per_s"]))
                cfg = dict(sizes, threads=a.threads, batch=a.batch, steps=a.steps, data=data[kind],
                           packed=kind == "packed")
                runs[f"torch {kind}"].append(run_torch(a.python, TORCH_LOOP, os.path.join(ROOT, "tests", "torch"),
                                                       json.dumps(cfg)))
    seqs = {k: statistics.median(r["rows_per_s"] for r in v) * per_row[k.split()[1]] for k, v in runs.items()}
    mem = {k: max(r["peak_kib"] for r in v) / 1024 for k, v in runs.items()}
    print(f"BERT ({a.n_layer} layers, width 768, 12 heads, vocab {VOCAB}) masked-LM training at sequence {SEQ}, "
          f"{a.batch} rows a step, {a.threads} threads, {a.steps} timed steps, median of {a.repeat}; PyTorch "
          f"{runs['torch plain'][0]['version']} ({a.python}), eager{torch_blas(a.python)[1]}")
    print(f"sequences from {source}: {per_row['plain']:.2f} a row padded, {per_row['packed']:.2f} packed")
    print("| | sequences/s | peak RSS |")
    print("|---|---|---|")
    for k in runs:
        print(f"| {k} | {seqs[k]:.2f} | {mem[k]:.0f} MiB |")
    for kind in ("plain", "packed"):
        print(f"netc / PyTorch, {kind}: speed **{seqs['netc ' + kind] / seqs['torch ' + kind]:.2f}x**, "
              f"memory {mem['netc ' + kind] / mem['torch ' + kind]:.2f}x")
    for side in ("netc", "torch"):
        print(f"{side}: packed / padded: {seqs[side + ' packed'] / seqs[side + ' plain']:.2f}x the sequences a second")


if __name__ == "__main__":
    main()
