#!/usr/bin/env bash
# Set up, build with warnings as errors, and run the whole test suite (what CI runs).
#   scripts/test.sh [CTEST_ARGS...]              in build/ (BUILD_DIR)
#   scripts/test.sh --sanitize [CTEST_ARGS...]   in build-asan/ (BUILD_DIR): everything, the
#                                                trainers the tests build included, with ASan,
#                                                LeakSanitizer and UBSan (docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=OFF
if [ "${1:-}" = --sanitize ]; then
  sanitize=ON
  shift
  export BUILD_DIR=${BUILD_DIR:-build-asan}
fi
export NETC_SANITIZE=$sanitize
NETC_WERROR=ON scripts/setup.sh
build=${BUILD_DIR:-build}
# setup.sh installs the packages and builds; this sets NETC_SANITIZE in that build either way
cmake -S . -B "$build" -DNETC_SANITIZE=$sanitize >/dev/null
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
