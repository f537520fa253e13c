#!/usr/bin/env bash
# The stub's order of the work finds the unordered accesses of order_test.c, and passes the
# ordered ones:
#   order_test.sh WORK
# with NETC_STUB_CC_FLAGS (the CUDA include directories) from tests/cuda/CMakeLists.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$1
: "${NETC_STUB_CC_FLAGS:?set by tests/cuda/CMakeLists.txt}"
mkdir -p "$work"
# shellcheck disable=SC2086 # a flag list
gcc -std=gnu11 -O1 -Wall -Wextra -Werror -Wno-deprecated-declarations $NETC_STUB_CC_FLAGS \
  "$here/order_test.c" "$here/cuda_stub.c" -ldl -o "$work/order_test"
fail=0
for c in copy-then-read refill query graph side-arena; do
  if "$work/order_test" "$c" 2>"$work/$c.err"; then
    echo "ordered, passed: $c"
  else
    echo "FAIL: $c is ordered, but the stub refused it: $(cat "$work/$c.err")"; fail=1
  fi
done
for c in no-wait no-sync graph-no-wait; do
  set +e; { "$work/order_test" "$c"; } 2>"$work/$c.err"; rc=$?; set -e  # the shell's "Aborted" there too
  if [ "$rc" -ne 0 ] && grep -q '^cuda_stub: unordered: ' "$work/$c.err"; then
    echo "unordered, refused: $c: $(grep '^cuda_stub: ' "$work/$c.err")"
  else
    echo "FAIL: $c is unordered, but the stub let it pass (exit status $rc): $(cat "$work/$c.err")"; fail=1
  fi
done
exit $fail
