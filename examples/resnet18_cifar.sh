#!/usr/bin/env bash
# Train models/resnet18_cifar.net with augmentation (random crops of 4 pixels, horizontal flips)
# on CIFAR-10 when you have it, else on Fashion-MNIST padded to 32x32.
#   examples/resnet18_cifar.sh [CIFAR_DIR] [WIDTH] [EPOCHS]      defaults: $NETC_CIFAR_DIR 16 2
# CIFAR_DIR holds CIFAR-10's binary version (cifar-10-batches-bin: data_batch_1.bin ...
# data_batch_5.bin, test_batch.bin), read as it is (docs/trainer.md, "Data"); nothing is
# downloaded. Without it, examples/resnet18_fashion.sh trains on Fashion-MNIST with the same
# augmentation. WIDTH is the first stage's channel count (torchvision's ResNet-18 is 64).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${NETC_CIFAR_DIR:-}}
width=${2:-16}
epochs=${3:-2}
augment=(--augment image=crop:4,flip)
if [ -z "$dir" ] || [ ! -f "$dir/data_batch_1.bin" ]; then
  echo "no CIFAR-10 (give its folder as the first argument or in NETC_CIFAR_DIR): training on Fashion-MNIST"
  exec examples/resnet18_fashion.sh "$width" "$epochs" 20000 "${augment[@]}"
fi
scripts/setup.sh
mkdir -p out
# The pixels arrive as 0..255: conv1 is followed by batch norm, which makes the network's output
# independent of the input's scale, so the model is used unchanged.
build/compiler/netc models/resnet18_cifar.net -o out/resnet18_cifar10 -D width="$width" -D batch=128 \
  -D lr=0.1 -D epochs="$epochs" --emit-dir out
train=$(printf "$dir/data_batch_%d.bin," 1 2 3 4 5)
train=cifar:${train%,}
out/resnet18_cifar10 --data image="$train" --data label="$train" \
  --eval-data image="cifar:$dir/test_batch.bin" --eval-data label="cifar:$dir/test_batch.bin" "${augment[@]}" \
  --log out/resnet18_cifar10.jsonl --save out/resnet18_cifar10.safetensors --checkpoint out/resnet18_cifar10.ckpt \
  --checkpoint-every 1000
echo "log: out/resnet18_cifar10.jsonl   weights: out/resnet18_cifar10.safetensors"
