#!/usr/bin/env bash
# relocate_test.sh BUILD WORK CUDA_LIB_DIR SOURCE_DIR - netc away from the tree it was built in.
#
# tests/gpu/pack.sh --toolchain-only copies netc and its runtime into WORK/pack. In that copy of
# netc every path it was built with - the source and build trees, /usr/local/cuda (the CUDA
# libraries and NVRTC's RUNPATH), /usr/lib/x86_64-linux-gnu (cJSON, cuDNN) - is overwritten
# with a path of the same length that does not exist, so nothing can come from them. The CUDA
# libraries are offered the way PyTorch's pip wheels lay them out (site-packages/nvidia/cu13/lib,
# nvidia/cudnn/lib, versioned names only) on LD_LIBRARY_PATH, as tests/gpu/run.sh does there.
set -euo pipefail
build=$1 work=$2 cuda_lib=$3 src=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

"$src/tests/gpu/pack.sh" --toolchain-only --build "$build" --out "$work/pack" >"$work/pack.log" ||
  { cat "$work/pack.log"; fail "pack.sh --toolchain-only"; }
python3 - "$work/pack/netc" "$src" "$build" <<'PY'
import sys
path, hide = sys.argv[1], sys.argv[2:] + ["/usr/local/cuda", "/usr/lib/x86_64-linux-gnu"]
data = open(path, "rb").read()
for h in hide:
    h = h.encode()
    fake = (b"/nonexistent-" + b"x" * len(h))[:len(h)]
    data = data.replace(h, fake)
open(path, "wb").write(data)
PY
strings "$work/pack/netc" | grep -q -e "$src/runtime" -e /usr/local/cuda && fail "a build path survived in the copy"

site=$work/site/nvidia
mkdir -p "$site/cu13/lib" "$site/cudnn/lib"
ln -s "$cuda_lib/libcublasLt.so.13" "$cuda_lib/libnvrtc.so.13" "$cuda_lib"/libnvrtc-builtins.so.13.* "$site/cu13/lib/"
ln -s "$cuda_lib"/libcudnn*.so.9 "$site/cudnn/lib/"
export LD_LIBRARY_PATH=$site/cu13/lib:$site/cudnn/lib
unset CUDA_HOME CUDA_PATH LIBRARY_PATH NETC_RUNTIME_DIR
pack=$work/pack
cd "$work"

echo "== netc --print-toolchain, from the pack"
"$pack/netc" --print-toolchain --backend cuda | tee toolchain.txt || fail "--print-toolchain --backend cuda exited $?"
grep -qx "runtime  *$pack/runtime (beside netc)" toolchain.txt || fail "the runtime is not the one beside netc"
grep -qx "cJSON  *$pack/runtime/libcjson.so" toolchain.txt || fail "cJSON is not the pack's"
grep -qx "CUDA headers  *$pack/runtime/cuda/include" toolchain.txt || fail "the CUDA headers are not the pack's"
grep -qx "CUDA runtime  *$pack/runtime/cuda/libcudart_static.a" toolchain.txt || fail "cudart_static is not the pack's"
grep -qx "cuBLASLt  *$site/cu13/lib/libcublasLt.so.13" toolchain.txt || fail "cuBLASLt is not the one on LD_LIBRARY_PATH"
grep -qx "cuDNN  *$site/cudnn/lib/libcudnn.so.9" toolchain.txt || fail "cuDNN is not the one on LD_LIBRARY_PATH"
grep -q "^NVRTC .*$site/cu13/lib/libnvrtc.so.13" toolchain.txt || fail "NVRTC is not the one on LD_LIBRARY_PATH"

echo "== a GPU trainer built by the packed netc; the C compiler's command line logged"
# the compiler the tests were given ($CC: the sanitizer build's wrapper there), else gcc
printf '#!/bin/sh\necho "$@" >>"%s/cc.args"\nexec %s "$@"\n' "$work" "${CC:-gcc}" >cc-log && chmod +x cc-log
"$pack/netc" "$src/models/mlp.net" --backend cuda --cc ./cc-log -o mlp-gpu 2>netc.err || { cat netc.err; fail "netc"; }
[ -s netc.err ] && { cat netc.err; fail "netc wrote to stderr"; }
grep -q -e "-Werror" cc.args && fail "the trainer was compiled with -Werror without --werror"
readelf -d mlp-gpu | grep -q "RUNPATH.*$site/cudnn/lib" || fail "the trainer's RUNPATH lacks the cuDNN folder netc used"
ldd mlp-gpu | grep "not found" && fail "the trainer's libraries do not all resolve"
set +e
CUDA_VISIBLE_DEVICES= ./mlp-gpu --data image=none.npy --data label=none.npy >/dev/null 2>run.err
rc=$?
set -e
cat run.err
[ $rc -eq 5 ] || fail "the trainer without a GPU exited $rc, expected 5"
grep -q "^error: this trainer runs on a cuda device: " run.err || fail "no clear message from the trainer"
: >cc.args
"$pack/netc" "$src/models/mlp.net" --backend cuda --cc ./cc-log --werror -o mlp-gpu-werror || fail "netc --werror"
grep -q -e "-Werror" cc.args || fail "--werror did not reach the C compiler"

echo "== what is missing is named"
expect_error() {  # expect_error WHAT PATTERN COMMAND...: exit 1 and PATTERN on stderr
  local what=$1 pattern=$2
  shift 2
  set +e
  "$@" >/dev/null 2>err.txt
  local rc=$?
  set -e
  cat err.txt
  [ $rc -eq 1 ] || fail "$what: exit $rc, expected 1"
  grep -q -e "$pattern" err.txt || fail "$what: no '$pattern' in the message"
}
LD_LIBRARY_PATH=$site/cu13/lib expect_error "no cuDNN" "cannot find cuDNN (libcudnn.so.9): looked in .*/nonexistent-" \
  "$pack/netc" "$src/models/mlp.net" --backend cuda -o never
grep -q "hint: set CUDA_HOME" err.txt || fail "no hint for a missing cuDNN"
LD_LIBRARY_PATH=$site/cu13/lib expect_error "print-toolchain, no cuDNN" "cannot find cuDNN" \
  "$pack/netc" --print-toolchain --backend cuda
NETC_RUNTIME_DIR=$work/nowhere expect_error "a wrong NETC_RUNTIME_DIR" \
  "the runtime ($work/nowhere, from \$NETC_RUNTIME_DIR) has no $work/nowhere/netrt.h" \
  "$pack/netc" "$src/models/mlp.net" --backend cuda -o never
mv "$pack/runtime" "$work/runtime-moved"
expect_error "no runtime" "cannot find netc's runtime (netrt.h, libnetrt.a): looked in $pack/runtime, the build tree" \
  "$pack/netc" "$src/models/mlp.net" --backend cuda -o never
NETC_RUNTIME_DIR=$work/runtime-moved "$pack/netc" --print-toolchain --backend cuda |
  grep -qx "runtime  *$work/runtime-moved (\$NETC_RUNTIME_DIR)" || fail "NETC_RUNTIME_DIR is not used"
[ ! -e never ] || fail "a trainer was written despite the errors"
echo "PASS"
