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
# A distributed trainer (--distributed among the netc options) also links libnetrt_nccl, and the
# stub answers NCCL's calls for one rank: NETC_STUB_DIST_LINK (libnetrt_nccl.a, libnetrt_mpi.a,
# MPI) and NETC_STUB_DIST_CFLAGS (-I for nccl.h).
stub_flags=() dist_link=
for a in "$@"; do
  if [ "$a" = --distributed ]; then
    : "${NETC_STUB_DIST_LINK:?set by tests/cuda/CMakeLists.txt}"
    # shellcheck disable=SC2206 # a list of words
    stub_flags=(-DNETC_STUB_NCCL ${NETC_STUB_DIST_CFLAGS:-}) dist_link=$NETC_STUB_DIST_LINK
  fi
done
name=$(basename "$model" .net)
dir=$work/$name
rm -rf "$dir" && mkdir -p "$dir"
"$netc" "$model" --backend cuda --arch sm_80,sm_90 --emit-dir "$dir/src" -o "$dir/$name" "$@"
# shellcheck disable=SC2086 # flag lists
{
  gcc -std=gnu11 -O1 $NETC_STUB_CC_FLAGS -c "$dir/src/$name.c" -o "$dir/host.o"
  gcc -std=gnu11 -O1 $NETC_STUB_CC_FLAGS -c "$dir/src/${name}_images.c" -o "$dir/images.o"
  gcc -std=gnu11 -O1 -Wall -Wextra -Werror -Wno-deprecated-declarations $NETC_STUB_CC_FLAGS \
    "${stub_flags[@]}" -c "$here/cuda_stub.c" -o "$dir/cuda_stub.o"
  gcc -fopenmp "$dir/host.o" "$dir/images.o" $dist_link $NETC_STUB_LINK "$dir/cuda_stub.o" -lz -lpthread -lm -ldl \
    -o "$dir/$name-stub"
}
# Nothing of the real CUDA libraries may be linked: every call must reach the stub.
if ldd "$dir/$name-stub" | grep -E 'libcudart|libcublas|libcudnn|libcuda\.so|libnccl'; then
  echo "FAIL: $name-stub links a real CUDA library"; exit 1
fi
exec /usr/bin/python3 "$here/startup_test.py" "$dir" "$dir/$name-stub" "$@"
