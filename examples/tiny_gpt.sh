#!/usr/bin/env bash
# Train a small GPT-2 (models/gpt2.net) on the CPU on the fortune cookies of Debian's `fortunes`
# package, byte by byte, then report the validation loss in bits per byte and print samples.
#   examples/tiny_gpt.sh [STEPS] [TEXT_FILE...]        defaults: 600, /usr/share/games/fortunes
# With text files, those are the corpus instead (UTF-8 text; at least a few hundred kB for the
# model to learn more than letter frequencies). The sizes: vocab 256 (bytes), context 128,
# 4 layers, 4 heads, width 128, batch 16: 0.84M parameters, 2048 tokens a step; measured 1400
# tokens/s on one core of a busy machine (bench/gpt2_cpu_vs_torch.py --threads 1), so 600 steps
# take about 15 minutes on one core and a few on several.
# scripts/setup.sh builds netc (and installs what is missing); the fortunes come from apt too.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-600}
shift $(($# < 1 ? $# : 1))
py=/usr/bin/python3
[ -x "$py" ] || py=python3
scripts/setup.sh
files=("$@")
if ((${#files[@]} == 0)); then
  mapfile -t files < <(examples/fortunes.sh tiny_gpt)
  ((${#files[@]})) || exit 1
fi
mkdir -p out
data=out/tiny_gpt_data
# byte-level tokens, windows of 128 + 1 bytes, the last 10% of the text for validation (256 of
# its windows, spread over it, are evaluated)
"$py" scripts/prepare_text.py --seq 128 --max-val-windows 256 -o "$data" "${files[@]}"
sizes=(-D vocab=256 -D seq=128 -D n_layer=4 -D n_head=4 -D n_embd=128 -D batch=16)
build/compiler/netc models/gpt2.net -o out/tiny_gpt --emit-dir out "${sizes[@]}" -D lr=1e-3 -D warmup_steps=100 \
  -D dropout=0
echo "compiled models/gpt2.net -> out/tiny_gpt (generated code in out/tiny_gpt.c)"
out/tiny_gpt --data tokens=$data/train_tokens.npy --data targets=$data/train_targets.npy \
  --steps "$steps" --log-every 50 --log out/tiny_gpt.jsonl --save out/tiny_gpt.safetensors
# the validation loss of the trained weights: nats per token; a token is a byte, so / ln 2 is bits per byte
out/tiny_gpt --init out/tiny_gpt.safetensors --eval-only --eval-data tokens=$data/val_tokens.npy \
  --eval-data targets=$data/val_targets.npy --log out/tiny_gpt_eval.jsonl --quiet
"$py" - out/tiny_gpt_eval.jsonl <<'PY'
import json, math, sys
r = [json.loads(s) for s in open(sys.argv[1]) if '"eval"' in s][-1]
print(f"validation loss {r['loss']:.4f} nats per byte = {r['loss'] / math.log(2):.3f} bits per byte "
      f"(a uniform guess over 256 bytes: 8 bits)")
PY
echo "samples (temperature 0.8):"
"$py" scripts/sample_gpt.py out/tiny_gpt.safetensors --n-head 4 --meta $data/meta.json --prompt $'%\n' \
  --tokens 300 --samples 3 --temperature 0.8 --seed 1
echo "log: out/tiny_gpt.jsonl   weights: out/tiny_gpt.safetensors (Hugging Face GPT-2 names)"
