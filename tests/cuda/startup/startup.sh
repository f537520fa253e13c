#!/usr/bin/env bash
# The real start-up path of a GPU trainer, as far as it goes without a GPU:
#   startup.sh NETC WORK MODEL.net [NETC_ARGS...]
# with NETC_STUB_CC_FLAGS (the CUDA include directories, -I...) and NETC_STUB_LINK (libnetrt_cuda.a,
# libnetrt.a and their CPU libraries) from tests/cuda/CMakeLists.txt.
#
# netc compiles MODEL for sm_80 and sm_90 (NVRTC: two cubins and sm_80 PTX), and the generated
# host C and image table are linked with the real libnetrt_cuda against cuda_stub.c instead of
# cudart, cuBLASLt and cuDNN. startup_test.py then runs that trainer on stub devices of several
# architectures and reads what the stub saw.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
netc=$1 work=$2 model=$3
shift 3
: "${NETC_STUB_CC_FLAGS:?set by tests/cuda/CMakeLists.txt}" "${NETC_STUB_LINK:?set by tests/cuda/CMakeLists.txt}"
name=$(basename "$model" .net)
dir=$work/$name
rm -rf "$dir" && mkdir -p "$dir"
"$netc" "$model" --backend cuda --arch sm_80,sm_90 --emit-dir "$dir/src" -o "$dir/$name" "$@"
# shellcheck disable=SC2086 # flag lists
{
  gcc -std=gnu11 -O1 $NETC_STUB_CC_FLAGS -c "$dir/src/$name.c" -o "$dir/host.o"
  gcc -std=gnu11 -O1 $NETC_STUB_CC_FLAGS -c "$dir/src/${name}_images.c" -o "$dir/images.o"
  gcc -std=gnu11 -O1 -Wall -Wextra -Werror -Wno-deprecated-declarations $NETC_STUB_CC_FLAGS \
    -c "$here/cuda_stub.c" -o "$dir/cuda_stub.o"
  gcc -fopenmp "$dir/host.o" "$dir/images.o" $NETC_STUB_LINK "$dir/cuda_stub.o" -lz -lpthread -lm -ldl \
    -o "$dir/$name-stub"
}
# Nothing of the real CUDA libraries may be linked: every call must reach the stub.
if ldd "$dir/$name-stub" | grep -E 'libcudart|libcublas|libcudnn|libcuda\.so'; then
  echo "FAIL: $name-stub links a real CUDA library"; exit 1
fi
exec /usr/bin/python3 "$here/startup_test.py" "$dir" "$dir/$name-stub" "$@"
