#!/usr/bin/env bash
# Kernels are shared by the nodes that differ only in where their operands lie:
#   shared_kernels.sh NETC WORK MODEL.net LAYERS_CONSTANT
# The model is generated (--dump, no NVRTC) at 2 and at 3 layers. The third layer must add
# launches of the attention and norm kernels but no kernel that calls them, and no kernel at all
# (its nodes, element-wise ones included, launch the others' kernels with their own offsets); and
# every launch must pass what its kernel's signature takes: an RtKAt for a kernel that reads `at`,
# none for one that does not (a kernel read through a missing RtKAt would fault on a GPU).
# tests/cuda/emu checks the offsets' values.
set -euo pipefail
netc=$1 work=$2 model=$3 layers=$4
name=$(basename "$model" .net)
dir=$work/shared-$name
rm -rf "$dir" && mkdir -p "$dir"
for n in 2 3; do
  "$netc" "$model" --backend cuda -D "$layers=$n" --dump=cu >"$dir/$n.cu"
  "$netc" "$model" --backend cuda -D "$layers=$n" --dump=c >"$dir/$n.c"
done

fail() { echo "FAIL: $name: $*"; exit 1; }
# the kernels whose bodies call a device function, and the launches of those kernels
defining() { # FILE.cu FUNCTION: the names of the kernels that call it
  awk -v f="$2" '/^extern "C" __global__/ {k = $6; sub(/\(.*/, "", k)}
    (index($0, f "(") || index($0, f "<")) && k != "" {print k; k = ""}' "$1"
}
for fn in rt_k_attention_fwd rt_k_attention_bwd_rows rt_k_attention_bwd_keys rt_k_norm_fwd rt_k_norm_bwd; do
  k2=$(defining "$dir/2.cu" "$fn" | sort -u)
  k3=$(defining "$dir/3.cu" "$fn" | sort -u)
  [ -n "$k2" ] || fail "no kernel calls $fn"
  # (named after their first node, which in the backward pass is the last layer's)
  [ "$(echo "$k2" | wc -w)" -eq "$(echo "$k3" | wc -w)" ] ||
    fail "more kernels call $fn at 3 layers: [$k2] against [$k3]"
  l2=0 l3=0
  for k in $k2; do l2=$((l2 + $(grep -c "(cu, K_$k," "$dir/2.c"))); done
  for k in $k3; do l3=$((l3 + $(grep -c "(cu, K_$k," "$dir/3.c"))); done
  [ "$l3" -gt "$l2" ] || fail "$fn: $l2 launches at 2 layers and $l3 at 3, expected more"
  echo "$name: $fn in $(echo "$k2" | wc -w) kernel(s), launched $l2 times at 2 layers, $l3 at 3"
done

d2=$(grep -c '^extern "C" __global__' "$dir/2.cu")
d3=$(grep -c '^extern "C" __global__' "$dir/3.cu")
l2=$(grep -c 'rt_cuda_launch\(_at\)\?(cu, K_' "$dir/2.c")
l3=$(grep -c 'rt_cuda_launch\(_at\)\?(cu, K_' "$dir/3.c")
[ "$d2" -eq "$d3" ] || fail "a third layer adds kernels: $d2 at 2 layers, $d3 at 3"
[ "$l3" -gt "$l2" ] || fail "$l2 launches at 2 layers and $l3 at 3, expected more"
echo "$name: $d2 kernels at 2 layers and at 3, launched $l2 and $l3 times"

for n in 2 3; do
  with=$(sed -n 's/^extern "C" __global__ void __launch_bounds__([0-9]*) \([A-Za-z0-9_]*\)(unsigned char \*base, const RtKAt at) {$/\1/p' "$dir/$n.cu" | sort -u)
  without=$(sed -n 's/^extern "C" __global__ void __launch_bounds__([0-9]*) \([A-Za-z0-9_]*\)(unsigned char \*base) {$/\1/p' "$dir/$n.cu" | sort -u)
  defined=$(grep -c '^extern "C" __global__' "$dir/$n.cu")
  [ "$defined" -eq $(($(echo "$with" | wc -w) + $(echo "$without" | wc -w))) ] ||
    fail "$n layers: a kernel signature that is neither (base) nor (base, RtKAt)"
  at=$(sed -n 's/.*rt_cuda_launch_at(cu, K_\([A-Za-z0-9_]*\),.*/\1/p' "$dir/$n.c" | sort -u)
  plain=$(sed -n 's/.*rt_cuda_launch(cu, K_\([A-Za-z0-9_]*\),.*/\1/p' "$dir/$n.c" | sort -u)
  wrong=$(comm -23 <(echo "$at") <(echo "$with"))
  [ -z "$wrong" ] || fail "$n layers: launched with an RtKAt, but its kernel takes none: $wrong"
  wrong=$(comm -23 <(echo "$plain") <(echo "$without"))
  [ -z "$wrong" ] || fail "$n layers: launched without an RtKAt, but its kernel takes one: $wrong"
done
echo "PASS: $name"
