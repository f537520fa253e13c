#!/usr/bin/env bash
# Rewrite every golden file from the current netc (after a deliberate change; review the diff).
set -euo pipefail
cd "$(dirname "$0")/.."
netc=${NETC:-build/compiler/netc}
for model in mlp lenet; do
  for stage in ir grad memplan; do
    tests/golden/run_golden.sh --update $stage "$netc" models/$model.net tests/golden/ir/$model.$stage
  done
done
for net in language views; do
  tests/golden/run_golden.sh --update ir "$netc" tests/golden/ir/$net.net tests/golden/ir/$net.ir
done
for stage in cuda-c cuda-cu; do
  tests/golden/run_golden.sh --update $stage "$netc" models/mlp.net tests/golden/ir/mlp.$stage
done
for f in tests/golden/errors/*.net; do
  tests/golden/run_golden.sh --update err "$netc" "$f" "${f%.net}.err"
done
for f in tests/golden/warnings/*.net; do
  tests/golden/run_golden.sh --update warn "$netc" "$f" "${f%.net}.warn"
done
