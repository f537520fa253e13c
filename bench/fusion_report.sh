#!/bin/sh
# Kernels per training step and memory traffic saved by fusion, from `netc --report`, for each
# model (default: resnet50 at batch 256, the MLPerf setting, plus resnet18_cifar, lenet, mlp).
#   bench/fusion_report.sh [NETC]
set -eu
netc=${1:-build/compiler/netc}
cd "$(dirname "$0")/.."
printf '| model | batch | kernels/step fused | unfused | ratio | traffic saved/step | arena peak |\n|---|---|---|---|---|---|---|\n'
for spec in "resnet50 256" "resnet18_cifar 128" "lenet 64" "mlp 64"; do
  set -- $spec
  r=$("$netc" "models/$1.net" -D batch="$2" --report)
  f=$(printf '%s\n' "$r" | sed -n 's/^  fused: *\([0-9]*\).*/\1/p')
  u=$(printf '%s\n' "$r" | sed -n 's/^  unfused: *\([0-9]*\).*/\1/p')
  t=$(printf '%s\n' "$r" | sed -n 's/^memory traffic saved by fusion: \(.*\) per step/\1/p')
  a=$(printf '%s\n' "$r" | sed -n 's/^memory plan: arena peak \([0-9.]* MiB\).*/\1/p')
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$f" "$u" "$(echo "$f $u" | awk '{printf "%.2f", $1/$2}')" "$t" "$a"
done
