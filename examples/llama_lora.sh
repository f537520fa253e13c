#!/usr/bin/env bash
# Pretrain a small Llama (models/llama.net) byte by byte on the fortune cookies of Debian's
# `fortunes` package, then fine-tune it with LoRA on the Jargon File (Debian's `jargon-text`),
# and print the validation loss on both texts before and after, the trainable fraction, the
# training speed and the peak memory of LoRA against full fine-tuning of the same model.
#   examples/llama_lora.sh [PRETRAIN_STEPS] [FINETUNE_STEPS]      defaults: 600, 300
# The model: vocab 256 (bytes), context 128, 4 layers, 4 query heads on 2 key/value heads of 32,
# width 128, SwiGLU width 352, batch 16. LoRA: rank 8, alpha 32, dropout 0.1 on q_proj, k_proj,
# v_proj and o_proj (models/llama.net's list); the base is frozen. The adapters are saved in
# PEFT's format in out/llama_jargon_lora/ and the merged model in out/llama_jargon_merged.safetensors.
# scripts/setup.sh builds netc (and installs what is missing); the texts come from apt too.
set -euo pipefail
cd "$(dirname "$0")/.."
pre_steps=${1:-600}
ft_steps=${2:-300}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
scripts/setup.sh
mapfile -t fortunes < <(examples/fortunes.sh llama_lora)
((${#fortunes[@]})) || exit 1
jargon_gz=/usr/share/doc/jargon-text/jargon.txt.gz
[ -f "$jargon_gz" ] || examples/apt_install.sh llama_lora "the fine-tuning text" jargon-text
mkdir -p out
gzip -dc "$jargon_gz" > out/jargon.txt
# byte-level windows of 128 + 1 bytes; the last 10% of each text for validation (256 windows)
"$py" scripts/prepare_text.py --seq 128 --max-val-windows 256 -o out/llama_lora_fortunes "${fortunes[@]}" >/dev/null
"$py" scripts/prepare_text.py --seq 128 --max-val-windows 256 -o out/llama_lora_jargon out/jargon.txt >/dev/null
shape=(-D seq=128 -D batch=16)
build/compiler/netc models/llama.net -o out/llama_base "${shape[@]}" -D lr=1e-3 -D warmup_steps=100
build/compiler/netc models/llama.net -o out/llama_full "${shape[@]}" -D lr=3e-4 -D warmup_steps=30
build/compiler/netc models/llama.net -o out/llama_lora "${shape[@]}" -D lr=2e-3 -D warmup_steps=30 \
  -D weight_decay=0 -D lora_r=8 -D lora_alpha=32 -D lora_dropout=0.1
echo "compiled models/llama.net: out/llama_base (pretraining), out/llama_full (full fine-tuning), out/llama_lora (LoRA)"

# run NAME COMMAND...: the command, its log in out/NAME.jsonl; its peak resident memory in out/NAME.rss (MiB)
run() {
  local name=$1; shift
  "$py" -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024))
sys.exit(rc)' "out/$name.rss" "$@" --log "out/$name.jsonl"
}
# evaluate TRAINER WEIGHTS TEXT [OPTIONS...]: the validation loss on TEXT in bits per byte
evaluate() {
  local exe=$1 weights=$2 text=$3; shift 3
  local d=out/llama_lora_$text
  "$exe" --init "$weights" "$@" --eval-only --eval-data tokens=$d/val_tokens.npy \
    --eval-data targets=$d/val_targets.npy --log out/llama_lora_eval.jsonl --quiet
  "$py" -c 'import json, math, sys
print("%.3f" % ([r for r in map(json.loads, open(sys.argv[1])) if r.get("eval")][-1]["loss"] / math.log(2)))' \
    out/llama_lora_eval.jsonl
}
train_data() { echo --data tokens=out/llama_lora_$1/train_tokens.npy --data targets=out/llama_lora_$1/train_targets.npy; }

echo "pretraining on the fortunes: $pre_steps steps"
run llama_pretrain out/llama_base $(train_data fortunes) --steps "$pre_steps" --log-every 100 \
  --save out/llama_pretrained.safetensors
before_f=$(evaluate out/llama_base out/llama_pretrained.safetensors fortunes)
before_j=$(evaluate out/llama_base out/llama_pretrained.safetensors jargon)

echo "LoRA fine-tuning on the Jargon File: $ft_steps steps"
run llama_lora out/llama_lora $(train_data jargon) --init out/llama_pretrained.safetensors --steps "$ft_steps" \
  --log-every 100 --save-adapter out/llama_jargon_lora --save-merged out/llama_jargon_merged.safetensors
after_f=$(evaluate out/llama_lora out/llama_pretrained.safetensors fortunes --adapter out/llama_jargon_lora)
after_j=$(evaluate out/llama_lora out/llama_pretrained.safetensors jargon --adapter out/llama_jargon_lora)
merged_j=$(evaluate out/llama_base out/llama_jargon_merged.safetensors jargon)

echo "full fine-tuning on the Jargon File, for comparison: $ft_steps steps"
run llama_full out/llama_full $(train_data jargon) --init out/llama_pretrained.safetensors --steps "$ft_steps" \
  --log-every 100 --save out/llama_jargon_full.safetensors
full_f=$(evaluate out/llama_base out/llama_jargon_full.safetensors fortunes)
full_j=$(evaluate out/llama_base out/llama_jargon_full.safetensors jargon)

"$py" - "$before_f" "$before_j" "$after_f" "$after_j" "$merged_j" "$full_f" "$full_j" <<'PY'
import json, re, subprocess, sys
bf, bj, af, aj, mj, ff, fj = sys.argv[1:8]
print(f"validation loss, bits per byte      fortunes   jargon")
print(f"  pretrained                        {bf:>8}   {bj:>6}")
print(f"  LoRA-fine-tuned (base + adapter)  {af:>8}   {aj:>6}   (merged model on jargon: {mj})")
print(f"  fully fine-tuned                  {ff:>8}   {fj:>6}")
def listed(exe):
    out = subprocess.run([exe, "--list-params"], capture_output=True, text=True, check=True).stdout
    total, trainable = map(int, re.search(r"total (\d+) parameters \((\d+) trainable", out).groups())
    plan = float(re.search(r"; ([\d.]+) MiB in all", out).group(1))
    return total, trainable, plan
def speed(name):  # tokens a second: samples (windows of 128 bytes) a second, over the logged steps
    rows = [r["samples_per_s"] for r in map(json.loads, open(f"out/{name}.jsonl")) if "samples_per_s" in r]
    return 128 * sum(rows) / len(rows)
for name, run in (("LoRA", "llama_lora"), ("full", "llama_full")):
    total, trainable, plan = listed(f"out/{run}")
    rss = int(open(f"out/{run}.rss").read())
    print(f"{name:>5} fine-tuning: {trainable} of {total} parameters trainable ({100 * trainable / total:.2f}%), "
          f"{speed(run):.0f} tokens/s, memory plan {plan:.1f} MiB, peak resident {rss} MiB")
PY
echo "adapters in PEFT's format: out/llama_jargon_lora/ (adapter_model.safetensors, adapter_config.json)"
