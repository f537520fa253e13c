#!/usr/bin/env bash
# Train LeNet-5 (or another model from models/) on Fashion-MNIST and report test accuracy (the
# test loss of models/autoencoder.net, which reconstructs the images).
#   examples/fashion_mnist.sh [MODEL] [EPOCHS] [NETC OPTIONS...]      defaults: lenet 5
# Builds netc first (scripts/setup.sh installs what is missing, including the data set).
# Further arguments go to netc, e.g. `lenet 5 --backend cuda --precision bf16` for a GPU
# trainer (docs/cuda.md; it exits with status 5 where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-lenet}
epochs=${2:-5}
shift $(($# < 2 ? $# : 2))
scripts/setup.sh
data=/usr/share/datasets/fashion-mnist
mkdir -p out
build/compiler/netc "models/$model.net" -o "out/$model" --emit-dir out "$@"
echo "compiled models/$model.net -> out/$model (generated code in out/$model.c, and out/$model.cu for a GPU trainer)"
files=(--data image=$data/train-images-idx3-ubyte.gz --eval-data image=$data/t10k-images-idx3-ubyte.gz)
if grep -q '^input label' "models/$model.net"; then  # a classifier (the autoencoder reads images alone)
  files+=(--data label=$data/train-labels-idx1-ubyte.gz --eval-data label=$data/t10k-labels-idx1-ubyte.gz)
fi
"out/$model" "${files[@]}" --epochs "$epochs" --log "out/$model.jsonl" --save "out/$model.safetensors"
echo "log: out/$model.jsonl   weights: out/$model.safetensors"
