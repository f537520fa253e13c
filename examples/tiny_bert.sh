#!/usr/bin/env bash
# Pretrain a small BERT (models/bert.net, masked-LM with LAMB) byte by byte on the fortune
# cookies of Debian's `fortunes` package, with and without sequence packing, and report the
# padding packing removes, the speed-up it gives and the validation loss and masked-LM accuracy
# of both runs.
#   examples/tiny_bert.sh [STEPS]      default 200 optimizer steps for each run
# Each fortune is a document; scripts/prepare_text.py --mlm cuts it into [CLS] piece [SEP]
# sequences of at most 128 tokens and masks 15% of the bytes (BERT's 80/10/10), and --pack puts
# several sequences in a row by first-fit decreasing. The model: vocab 260 (bytes and [CLS],
# [SEP], [MASK], [PAD]), context 128, 4 layers, 4 heads, width 128, feed-forward 512, batch 16.
# Both runs see the same sequences with the same masks; a packed row holds more of them, so
# packing trains on more real tokens per step at the same cost per row.
# scripts/setup.sh builds netc (and installs what is missing); the fortunes come from apt too.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
scripts/setup.sh
mapfile -t files < <(examples/fortunes.sh tiny_bert)
((${#files[@]})) || exit 1
mkdir -p out
for layout in unpacked packed; do
  "$py" scripts/prepare_text.py --mlm $([ $layout = packed ] && echo --pack) --seq 128 --split-at % \
    -o out/tiny_bert_data_$layout "${files[@]}"
  build/compiler/netc models/bert.net -o out/tiny_bert_$layout -D vocab=260 -D seq=128 -D n_layer=4 -D n_head=4 \
    -D hidden=128 -D intermediate=512 -D batch=16 -D lr=2e-3 -D warmup_steps=30 \
    -D packed=$([ $layout = packed ] && echo true || echo false)
done
echo "compiled models/bert.net -> out/tiny_bert_unpacked, out/tiny_bert_packed"
for layout in unpacked packed; do
  d=out/tiny_bert_data_$layout
  if [ $layout = packed ]; then names=(input_ids token_type_ids position_ids sequence_ids labels)
  else names=(input_ids token_type_ids attention_mask labels); fi
  args=()
  for n in "${names[@]}"; do args+=(--data "$n=$d/train_$n.npy" --eval-data "$n=$d/val_$n.npy"); done
  echo "training $steps steps, $layout"
  out/tiny_bert_$layout "${args[@]}" --steps "$steps" --log-every 100 --log out/tiny_bert_$layout.jsonl
done
"$py" - "$steps" <<'PY'
import json, math, sys
steps = int(sys.argv[1])
rows = {}
for layout in ("unpacked", "packed"):
    meta = json.load(open(f"out/tiny_bert_data_{layout}/meta.json"))
    log = [json.loads(l) for l in open(f"out/tiny_bert_{layout}.jsonl")]
    rate = [r["samples_per_s"] for r in log if "samples_per_s" in r]
    evals = [r for r in log if r.get("eval")]
    t = meta["train"]
    rows[layout] = dict(rows=t["rows"], padding=t["padding"], tokens_per_row=t["tokens"] / t["rows"],
                        rows_per_s=sum(rate) / len(rate), val=evals[-1]["loss"] if evals else float("nan"),
                        acc=evals[-1].get("accuracy", float("nan")) if evals else float("nan"))
u, p = rows["unpacked"], rows["packed"]
t = json.load(open("out/tiny_bert_data_packed/meta.json"))["train"]
print(f"fortunes: {t['sequences']} training sequences, {t['tokens']} tokens (mean length {t['tokens'] / t['sequences']:.1f} of 128)")
print(f"after {steps} steps: validation masked-LM loss and accuracy")
print(f"{'':10} {'rows/epoch':>10} {'padding':>8} {'real tokens/row':>16} {'rows/s':>7} {'real tokens/s':>14} "
      f"{'val loss':>9} {'val MLM accuracy':>17}")
for name, r in rows.items():
    print(f"{name:10} {r['rows']:>10} {100 * r['padding']:>7.1f}% {r['tokens_per_row']:>16.1f} {r['rows_per_s']:>7.1f} "
          f"{r['rows_per_s'] * r['tokens_per_row']:>14.0f} {r['val']:>9.3f} {r['acc']:>17.3f}")
speed = (p["rows_per_s"] * p["tokens_per_row"]) / (u["rows_per_s"] * u["tokens_per_row"])
print(f"packing removes {100 * (u['padding'] - p['padding']):.1f} points of padding ({u['rows'] - p['rows']} fewer rows "
      f"an epoch): {speed:.2f}x the real tokens a second, an epoch in {1 / speed:.2f} of the time")
PY
