#!/usr/bin/env bash
# Train a model from models/ on Fashion-MNIST and require a test accuracy.
#   train_fashion.sh NETC WORKDIR MODEL EPOCHS MIN_ACCURACY [netc -D options...]
# Passes when the last evaluation in the JSON Lines log reaches MIN_ACCURACY.
set -euo pipefail
netc=$1 work=$2 model=$3 epochs=$4 min_acc=$5
shift 5
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${NETC_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
mkdir -p "$work"
"$netc" "$root/models/$model.net" -o "$work/$model" "$@"
"$work/$model" --data image="$data/train-images-idx3-ubyte.gz" --data label="$data/train-labels-idx1-ubyte.gz" \
  --eval-data image="$data/t10k-images-idx3-ubyte.gz" --eval-data label="$data/t10k-labels-idx1-ubyte.gz" \
  --epochs "$epochs" --seed 1 --log "$work/$model.jsonl" --save "$work/$model.safetensors"
/usr/bin/python3 - "$work/$model.jsonl" "$min_acc" "$epochs" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
evals = [l for l in lines if l.get("eval")]
assert len(evals) == int(sys.argv[3]), f"expected one evaluation per epoch, got {len(evals)}"
steps = [l for l in lines if "step" in l and not l.get("eval")]
assert steps and all(k in steps[0] for k in ("step", "epoch", "loss", "lr", "samples_per_s")), steps[:1]
acc = evals[-1]["accuracy"]
print(f"final test accuracy {acc:.4f} (required {sys.argv[2]})")
sys.exit(0 if acc >= float(sys.argv[2]) else 1)
PY
