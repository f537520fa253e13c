#!/bin/sh
# fused_vs_unfused.sh NETC WORKDIR MODEL STEPS TOLERANCE [-D ...]
#
# Every pass keeps the program's meaning: compile MODEL (models/MODEL.net) twice, with the
# fusion pass and with --no-fuse, train both for STEPS steps from the same initial weights on
# the same synthetic batch stream (seeded, in file order), and require the same saved
# parameters: bit-identical (TOLERANCE 0), since a fused loop evaluates the same float
# operations in the same order as the separate loops, only keeping intermediates in registers;
# or, where a matrix product's epilogue splits it into blocks of rows that OpenBLAS may sum in
# another order, within TOLERANCE (relative; see tests/fusion/CMakeLists.txt). Also checks that fusion did something (the fused trainer launches fewer kernels, per
# --report) and that both trainers' generated C differ.
set -eu
netc=$1 work=$2 model=$3 steps=$4 tol=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
src="$root/models/$model.net"

"$netc" "$src" "$@" -o "$work/$model-fused"
"$netc" "$src" "$@" --no-fuse -o "$work/$model-unfused"
fused=$("$netc" "$src" "$@" --report | sed -n 's/^  fused: *\([0-9]*\).*/\1/p')
unfused=$("$netc" "$src" "$@" --report | sed -n 's/^  unfused: *\([0-9]*\).*/\1/p')
[ -n "$fused" ] && [ "$fused" -lt "$unfused" ] ||
  { echo "fused_vs_unfused: $model: fusion removed no kernels ($fused vs $unfused)" >&2; exit 1; }

# both trained on the same synthetic data; parameters compared (train_pair.py)
result=$(/usr/bin/python3 "$here/train_pair.py" "$work/$model-data" "$steps" "$tol" \
  "$work/$model-fused" "$work/$model-unfused")
echo "fused_vs_unfused: $model: $fused kernels per step fused, $unfused unfused; parameters after $steps steps: $result"
