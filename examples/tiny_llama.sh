#!/usr/bin/env bash
# Pretrain a small Llama (models/llama.net) on the CPU on the fortune cookies of Debian's
# `fortunes` package, byte by byte, and report the validation loss in bits per byte (beside the
# first logged training loss).
#   examples/tiny_llama.sh [STEPS] [TEXT_FILE...]      defaults: 600, /usr/share/games/fortunes
# With text files, those are the corpus instead. The sizes: vocab 256 (bytes), context 128,
# 4 layers, 4 query heads on 2 key/value heads of 32, width 128, SwiGLU width 352, batch 16:
# 0.80M parameters, 2048 tokens a step.
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
  mapfile -t files < <(examples/fortunes.sh tiny_llama)
  ((${#files[@]})) || exit 1
fi
mkdir -p out
data=out/tiny_llama_data
# byte-level tokens, windows of 128 + 1 bytes, the last 10% of the text for validation (256 of
# its windows, spread over it, are evaluated)
"$py" scripts/prepare_text.py --seq 128 --max-val-windows 256 -o "$data" "${files[@]}"
build/compiler/netc models/llama.net -o out/tiny_llama --emit-dir out -D seq=128 -D batch=16 -D lr=1e-3 \
  -D warmup_steps=100
echo "compiled models/llama.net -> out/tiny_llama (generated code in out/tiny_llama.c)"
out/tiny_llama --data tokens=$data/train_tokens.npy --data targets=$data/train_targets.npy \
  --steps "$steps" --log-every 50 --log out/tiny_llama.jsonl --save out/tiny_llama.safetensors
out/tiny_llama --init out/tiny_llama.safetensors --eval-only --eval-data tokens=$data/val_tokens.npy \
  --eval-data targets=$data/val_targets.npy --log out/tiny_llama_eval.jsonl --quiet
# nats per token; a token is a byte, so / ln 2 is bits per byte
"$py" - out/tiny_llama.jsonl out/tiny_llama_eval.jsonl <<'PY'
import json, math, sys
first = next(r for r in map(json.loads, open(sys.argv[1])) if "loss" in r and not r.get("eval"))
val = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval")][-1]
print(f"training loss at step {first['step']}: {first['loss'] / math.log(2):.3f} bits per byte "
      f"(a uniform guess over 256 bytes: 8 bits)")
print(f"validation loss after training: {val['loss']:.4f} nats per byte = {val['loss'] / math.log(2):.3f} bits per byte")
PY
echo "log: out/tiny_llama.jsonl   weights: out/tiny_llama.safetensors (Hugging Face LlamaForCausalLM names)"
