#!/usr/bin/env bash
# netc's command line: -D overrides, bad flags, output names with spaces/quotes/semicolons
# (netc never runs a shell), atomic output, --emit-dir and --dump.
#   cli_test.sh NETC WORKDIR
set -uo pipefail
netc=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work"
. "$(dirname "$0")/checks.sh"

check "-D overrides batch" 0 "$netc" "$root/models/mlp.net" -D batch=32 --dump=ir
contains "batch=32"
contains "f32[32, 1, 28, 28]"
check "-D unknown constant" 1 "$netc" "$root/models/mlp.net" -D bacth=32 --check
contains "bacth"
check "-D bad value" 1 "$netc" "$root/models/mlp.net" -D batch=abc --check
contains "batch=abc"
check "-D without value" 2 "$netc" "$root/models/mlp.net" -D batch
check "unknown option" 2 "$netc" "$root/models/mlp.net" --frobnicate
contains "--frobnicate"
check "unknown dump stage" 2 "$netc" "$root/models/mlp.net" --dump=bogus
check "bad --layout" 2 "$netc" "$root/models/lenet.net" --layout=nchw
contains "channels-last or row-major"
check "--precision without cuda" 2 "$netc" "$root/models/mlp.net" --precision bf16
contains "--precision is an option of --backend cuda"
check "bad --precision" 2 "$netc" "$root/models/mlp.net" --backend cuda --precision fp8
contains "--precision takes fp32, tf32, bf16 or fp16, found 'fp8'"
check "fp16 without cuda" 2 "$netc" "$root/models/mlp.net" --precision fp16
contains "--precision is an option of --backend cuda"
check "bad --arch" 2 "$netc" "$root/models/mlp.net" --backend cuda --arch sm_70
contains "--arch takes a comma-separated list like sm_80,sm_90"
check "--arch twice" 2 "$netc" "$root/models/mlp.net" --backend cuda --arch sm_90,sm_90
contains "names an architecture twice"
check "--dump=cu on cpu" 2 "$netc" "$root/models/mlp.net" --dump=cu
contains "--dump=cu needs a backend with kernels"
# the messages that list targets take them from the target table (driver/toolchain.c)
contains "--dump=cu needs a backend with kernels (--backend cuda)"
check "unknown backend" 2 "$netc" "$root/models/mlp.net" --backend gpu
contains "unknown backend 'gpu' (available: cpu, cuda)"
check "--precision on cpu" 2 "$netc" "$root/models/mlp.net" --backend cpu --precision tf32
contains "--precision is an option of --backend cuda (the CPU backend computes in float32)"
check "--precision on an unknown backend" 2 "$netc" "$root/models/mlp.net" --backend gpu --precision tf32
contains "--precision is an option of --backend cuda (the CPU backend computes in float32)"
check "bf16 autocast" 0 "$netc" "$root/models/lenet.net" --backend cuda --precision bf16 --dump=fused
contains "conv2d(%4, %6) bf16"
check "--frozen-half without a half precision" 2 "$netc" "$root/tests/cuda/emu/lora.net" --backend cuda --frozen-half
contains "--frozen-half keeps frozen weights in the type the products compute in; give --backend cuda --precision bf16"
check "--frozen-half, nothing frozen" 1 "$netc" "$root/models/mlp.net" --backend cuda --precision bf16 --frozen-half \
  --dump=layout
contains "models/mlp.net: --frozen-half: model 'mlp' has no frozen parameters"
check "--frozen-half" 0 "$netc" "$root/tests/cuda/emu/lora.net" --backend cuda --precision bf16 --frozen-half \
  --dump=layout
contains '%3 = param "fc1.weight" bf16[24, 12]'
contains '%4 = param "fc1.bias" f32[24]'
contains "note: --frozen-half: 3 of the 6 frozen parameters stay float32 (read by more than products and convolutions): fc1.bias,"
check "resnet50 -D lars=true" 0 "$netc" "$root/models/resnet50.net" -D lars=true -D image_size=32 -D batch=2 --dump=c
contains "rt_lars_apply_kept(hk, sk, factor, p, u, state, floats, j)"
contains ".kind = RT_SCHED_POLY"
check "resnet50 -D target=0.759" 0 "$netc" "$root/models/resnet50.net" -D target=0.759 -D image_size=32 -D batch=2 --dump=c
contains ".target_accuracy = 0.759,"
check "poly with a negative end_lr" 1 "$netc" "$root/models/resnet50.net" -D lars=true -D end_lr=-1 --check
contains "'end_lr' of poly must be a number in [0, 1e+06], found -1"
check "--dump=layout" 0 "$netc" "$root/models/lenet.net" --dump=layout
contains "nhwc"
check "--layout=row-major" 0 "$netc" "$root/models/lenet.net" --layout=row-major --dump=layout
if grep -q nhwc <<<"$out"; then echo "FAIL: --layout=row-major left channels-last values"; fails=$((fails+1)); else passes=$((passes+1)); fi
check "bad --cpu" 2 "$netc" "$root/models/mlp.net" --cpu native
contains "--cpu takes x86-64, x86-64-v3, x86-64-v4 or host, found 'native'"
check "--cpu on cuda" 2 "$netc" "$root/models/mlp.net" --backend cuda --cpu x86-64
contains "--cpu x86-64: an option of --backend cpu"
check "--print-toolchain --cpu" 0 "$netc" --print-toolchain --cpu x86-64
contains "x86-64 (--cpu), runtime libnetrt.a"
contains "oneDNN             /"
mkdir -p "$work/rt-x86-64-only"
rt_lib=$("$netc" --print-toolchain | awk '$1 == "runtime" && $2 != "headers" {print $2}')
cp "$root"/runtime/*.h "$rt_lib/libnetrt.a" "$work/rt-x86-64-only/"
check "a runtime without the level's build" 1 "$netc" "$root/models/mlp.net" --runtime-dir "$work/rt-x86-64-only" \
  --cpu x86-64-v3 -o "$work/never"
contains "has no libnetrt-x86-64-v3.a, its build for x86-64-v3 CPUs (--cpu)"
contains "hint: copy it there from the build's runtime/ folder, or compile the trainer for every x86-64 CPU with --cpu x86-64"
check "no input" 2 "$netc"
check "missing file" 1 "$netc" "$work/nope.net"
contains "nope.net"
check "help" 0 "$netc" --help
contains "--emit-dir"

weird="$work/we ird;'\"\$(touch pwned)"
mkdir -p "$weird"
cp "$root/models/mlp.net" "$weird/m l;p'\$(x).net"
check "names with spaces, quotes and ;" 0 "$netc" "$weird/m l;p'\$(x).net" -o "$weird/tr ain;er" --emit-dir "$weird/c src"
[ -x "$weird/tr ain;er" ] && passes=$((passes+1)) || { echo "FAIL: trainer not written"; fails=$((fails+1)); }
[ -f "$weird/c src/tr ain;er.c" ] && passes=$((passes+1)) || { echo "FAIL: --emit-dir source missing"; fails=$((fails+1)); }
[ ! -e pwned ] && [ ! -e "$work/pwned" ] && passes=$((passes+1)) || { echo "FAIL: a shell ran"; fails=$((fails+1)); }
check "trainer --help" 0 "$weird/tr ain;er" --help
contains "image"
ls "$weird" | grep -q '\.tmp\.' && { echo "FAIL: temporary output left behind"; fails=$((fails+1)); } || passes=$((passes+1))

check "bad NETC_GEMM" 2 env NETC_GEMM=blas "$weird/tr ain;er" --list-params
contains "NETC_GEMM is 'blas': expected auto, by-size, onednn or reference"
check "bad NETC_CONV" 2 env NETC_CONV=fft "$weird/tr ain;er" --list-params
contains "NETC_CONV is 'fft': expected auto, direct or winograd"
check "trainer --list-params" 0 "$weird/tr ain;er" --list-params
contains "fc1.weight"
contains "101770"   # 784*128 + 128 + 128*10 + 10

# the allocator: a CPU trainer links the jemalloc --print-toolchain names, when it names one, and
# with --system-malloc never
malloc_lib=$("$netc" --print-toolchain | awk '$1 == "malloc" {print $2}')
links_jemalloc() { readelf -d "$1" | grep -q 'NEEDED.*libjemalloc'; }
check "--system-malloc" 0 "$netc" "$root/models/mlp.net" --system-malloc -o "$work/mlp-system-malloc"
check "--system-malloc trainer" 0 "$work/mlp-system-malloc" --list-params
if links_jemalloc "$work/mlp-system-malloc"; then
  echo "FAIL: --system-malloc linked jemalloc"; fails=$((fails+1))
else passes=$((passes+1)); fi
if [ "${malloc_lib:0:1}" = / ] && ! links_jemalloc "$weird/tr ain;er"; then
  echo "FAIL: --print-toolchain names $malloc_lib, yet the trainer does not link it"; fails=$((fails+1))
elif [ "${malloc_lib:0:1}" != / ] && links_jemalloc "$weird/tr ain;er"; then
  echo "FAIL: --print-toolchain names no jemalloc, yet the trainer links one"; fails=$((fails+1))
else passes=$((passes+1)); fi

# running statistics are listed as buffers, apart from the parameters
check "batch-norm model" 0 "$netc" "$root/tests/gradcheck/batchnorm2d.net" -o "$work/bn"
check "--list-params with buffers" 0 "$work/bn" --list-params
contains "running_mean"
contains "  buffer"
contains "buffer values (running statistics)"

# warnings (tests/golden/warnings has their text): they do not stop the build, -w turns them
# off, and no stock model has one (a warning there would be a false one)
check "warnings build" 0 "$netc" "$root/tests/golden/warnings/unused.net" -o "$work/unused"
contains "warning: layer 'fc2' gets no gradient"
[ -x "$work/unused" ] && passes=$((passes+1)) || { echo "FAIL: no trainer beside the warnings"; fails=$((fails+1)); }
check "-w" 0 "$netc" "$root/tests/golden/warnings/unused.net" --check -w
lacks "warning"
lacks "hint"
for m in "$root"/models/*.net; do
  check "no warning in $(basename "$m")" 0 "$netc" "$m" --check
  lacks "warning"
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
