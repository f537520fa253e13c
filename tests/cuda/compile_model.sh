#!/usr/bin/env bash
# What CI can check of the CUDA backend without a GPU, for one model:
#   compile_model.sh NETC WORK MODEL.net [-D NAME=VALUE]...
# netc --backend cuda --arch sm_80,sm_90 must succeed with nothing on stderr (NVRTC compiled
# every kernel for both architectures, and PTX, without a warning; the host C compiled with
# -Wall -Wextra -Werror and linked against cudart, cuBLASLt and cuDNN); the image table must
# hold both cubins and the PTX; and the trainer, started where no GPU is visible, must stop
# with exit status 5 and a message naming the problem before it reads any data (the data
# files named here do not exist).
set -euo pipefail
netc=$1 work=$2 model=$3
shift 3
name=$(basename "$model" .net)
dir=$work/$name
rm -rf "$dir" && mkdir -p "$dir"
if ! "$netc" "$model" --backend cuda --arch sm_80,sm_90 --emit-dir "$dir/src" -o "$dir/$name" "$@" 2>"$dir/netc.err"; then
  cat "$dir/netc.err"; echo "FAIL: netc --backend cuda failed on $model"; exit 1
fi
if [ -s "$dir/netc.err" ]; then
  cat "$dir/netc.err"; echo "FAIL: netc wrote to stderr (NVRTC or C compiler warnings) for $model"; exit 1
fi
for f in "$dir/src/$name.c" "$dir/src/$name.cu" "$dir/src/${name}_images.c"; do
  [ -s "$f" ] || { echo "FAIL: $f is missing"; exit 1; }
done
for img in "{80, 0, cubin_80" "{90, 0, cubin_90" "{80, 1, ptx_80"; do
  grep -qF "$img" "$dir/src/${name}_images.c" || { echo "FAIL: no image '$img' in the table"; exit 1; }
done
kernels=$(grep -c '^extern "C" __global__' "$dir/src/$name.cu")
launched=$(grep -c 'rt_cuda_launch(cu, K_' "$dir/src/$name.c")
echo "$name: $kernels distinct kernels, $launched launches per training + evaluation step"
[ "$kernels" -gt 3 ] || { echo "FAIL: only $kernels kernels"; exit 1; }

# No GPU visible (CUDA_VISIBLE_DEVICES empty hides any there is): exit 5 before reading data.
set +e
inputs=$("$dir/$name" --help | sed -n '/^model inputs/,/^$/p' | awk 'NR > 1 && NF {print $1}')
args=()
for i in $inputs; do args+=(--data "$i=$dir/no-such-file.npy"); done
CUDA_VISIBLE_DEVICES= "$dir/$name" "${args[@]}" >/dev/null 2>"$dir/run.err"
rc=$?
set -e
cat "$dir/run.err"
[ $rc -eq 5 ] || { echo "FAIL: the trainer without a GPU exited with $rc, expected 5"; exit 1; }
grep -q "^error: this trainer runs on a cuda device: " "$dir/run.err" || { echo "FAIL: no clear message"; exit 1; }
grep -q "no-such-file" "$dir/run.err" && { echo "FAIL: the trainer looked at its data before the device"; exit 1; }
echo "PASS: $name"
