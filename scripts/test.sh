#!/usr/bin/env bash
# Set up, build with warnings as errors, and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
NETC_WERROR=ON scripts/setup.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
