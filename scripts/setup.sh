#!/usr/bin/env bash
# Install what netc needs (Debian packages) and build it into build/.
#   scripts/setup.sh            install missing packages, configure and build
# Environment: BUILD_DIR (default build), NETC_WERROR=ON for warnings as errors, NETC_CUDA=ON to
# require the CUDA backend (the CUDA toolkit and cuDNN, e.g. under /usr/local/cuda; AUTO, the
# default, builds it when they are found).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  gcc make cmake flex bison          # the compiler and its generated parser
  zlib1g-dev libcjson-dev            # gzip'd IDX data, safetensors headers
  libopenblas-openmp-dev             # matrix products and row-major convolutions
  libdnnl-dev python3-pip            # channels-last convolutions (oneDNN 2.6; pip fetches 3.2 below)
  libjemalloc-dev                    # the allocator CPU trainers link (docs/trainer.md)
  libcmocka-dev                      # C unit tests
  openmpi-bin libopenmpi-dev         # distributed trainers (netc --distributed) and their tests
  clang valgrind                     # the libFuzzer run of the front end, memcheck over training
  python3 python3-numpy python3-torch python3-torchvision # test data and the PyTorch cross-checks
  python3-matplotlib                 # scripts/plot.py, the curves of a run's log
  graphviz                           # renders netc --dump=dot in its test
  dataset-fashion-mnist              # the real data the examples and tests train on
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
# oneDNN 3.2 from its PyPI wheels where they can be fetched (faster AVX2 convolutions), Debian's
# 2.6 otherwise; the trainers netc builds use the same one (scripts/fetch_onednn.sh).
onednn=$(realpath -m "$BUILD_DIR")/onednn
if scripts/fetch_onednn.sh "$onednn"; then
  dnnl=(-DDNNL_INCLUDE_DIR="$onednn/include" -DDNNL_LIBRARY="$onednn/lib/libdnnl.so")
else
  echo "setup: could not fetch oneDNN 3.2; building with Debian's oneDNN 2.6 (slower convolutions on AVX2 CPUs)"
  dnnl=(-DDNNL_INCLUDE_DIR=DNNL_INCLUDE_DIR-NOTFOUND -DDNNL_LIBRARY=DNNL_LIBRARY-NOTFOUND)  # found again
fi
cmake -S . -B "$BUILD_DIR" -DNETC_WERROR="${NETC_WERROR:-OFF}" -DNETC_SANITIZE="${NETC_SANITIZE:-OFF}" \
      -DNETC_CUDA="${NETC_CUDA:-AUTO}" "${dnnl[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
