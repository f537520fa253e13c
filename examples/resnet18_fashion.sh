#!/usr/bin/env bash
# Train models/resnet18_cifar.net on Fashion-MNIST padded to 32x32 and report test accuracy.
#   examples/resnet18_fashion.sh [WIDTH] [EPOCHS] [TRAIN_SAMPLES] [TRAINER OPTIONS...]
#                                                                   defaults: 16 2 20000
# Further arguments go to the trainer, e.g. `--augment image=crop:4,flip` (examples/resnet18_cifar.sh).
# WIDTH is the first stage's channel count (torchvision's ResNet-18 is 64; 16 trains in
# minutes on two CPU cores). examples/resnet18_cifar.sh trains on CIFAR-10 where you have it.
set -euo pipefail
cd "$(dirname "$0")/.."
width=${1:-16}
epochs=${2:-2}
samples=${3:-20000}
shift $(($# < 3 ? $# : 3))
scripts/setup.sh
mkdir -p out/fashion32
[ -f out/fashion32/test-label.npy ] && [ "$(cat out/fashion32/samples 2>/dev/null)" = "$samples" ] ||
  { /usr/bin/python3 examples/pad_fashion.py out/fashion32 "$samples" && echo "$samples" > out/fashion32/samples; }
build/compiler/netc models/resnet18_cifar.net -o out/resnet18_cifar -D width="$width" -D batch=64 \
  -D lr=0.05 -D epochs="$epochs" --emit-dir out
d=out/fashion32
out/resnet18_cifar --data image=$d/train-image.npy --data label=$d/train-label.npy \
  --eval-data image=$d/test-image.npy --eval-data label=$d/test-label.npy \
  --log out/resnet18_cifar.jsonl --save out/resnet18_cifar.safetensors "$@"
echo "log: out/resnet18_cifar.jsonl   weights: out/resnet18_cifar.safetensors"
