#!/bin/sh
# fused_vs_unfused.sh NETC WORKDIR MODEL [--silu] [-D ...]
#
# Every pass keeps the program's meaning: compile MODEL (models/MODEL.net) twice, with the
# fusion pass and with --no-fuse, and check that fusion did something (the fused trainer
# launches fewer kernels, per --report) and that both trainers take the same first SGD step
# within float32 rounding of the exact one: each trainer's applied gradient against the float64
# IR interpreter, within 4x PyTorch float32's distance to it (step_vs_float64.py says why).
#
# Not bit for bit: a fused loop evaluates the same float operations in the same order as the
# separate loops, but fusion also gives a matrix product its epilogue, which splits the product
# into one OpenBLAS call per thread's block of rows or columns, and OpenBLAS picks its kernels (and so its
# summation order) by the CPU and the matrix size: on AVX-512 (SkylakeX kernels) the MLP's two
# trainers differ in the last bits, and through ResNet-50's batch norm by 8e-4 after two steps.
#
# The trainers are compiled with weight_decay 0 and learning rate 1000 so that the step is
# p - 1000 g exactly (the step's own rounding then costs ~1 ulp of g); models with warmup need
# -D warmup=0 from the caller. --silu checks the model with SiLU for ReLU (silu.sh), where
# ReLU's kinks make the comparison meaningless (step_vs_float64.py).
set -eu
netc=$1 work=$2 model=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
src="$root/models/$model.net"
. "$here/silu.sh"
set -- "$@" -D weight_decay=0 -D lr=1000

"$netc" "$src" "$@" -o "$work/$model-fused"
"$netc" "$src" "$@" --no-fuse -o "$work/$model-unfused"
fused=$("$netc" "$src" "$@" --report | sed -n 's/^  fused: *\([0-9]*\).*/\1/p')
unfused=$("$netc" "$src" "$@" --report | sed -n 's/^  unfused: *\([0-9]*\).*/\1/p')
[ -n "$fused" ] && [ "$fused" -lt "$unfused" ] ||
  { echo "fused_vs_unfused: $model: fusion removed no kernels ($fused vs $unfused)" >&2; exit 1; }
echo "fused_vs_unfused: $model: $fused kernels per step fused, $unfused unfused"
/usr/bin/python3 "$here/step_vs_float64.py" $spread "$work/$model-step" 1000 "$work/$model-fused" "$work/$model-unfused" \
  -- "$netc" "$src" "$@"
