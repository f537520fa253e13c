#!/usr/bin/env bash
# Golden tests: run netc on a .net file and diff what it prints with the expected file.
#   run_golden.sh [--update] STAGE NETC FILE.net EXPECTED
# STAGE is ir, grad or memplan (netc --dump=STAGE, stdout, must succeed), cuda-c or cuda-cu
# (netc --backend cuda --dump=c|cu: the generated host program and kernels), err (netc
# --check, stderr, must fail with exit status 1) or warn (netc --check, stderr, must succeed:
# its warnings). netc runs in the .net file's directory on its base
# name, so messages carry no machine-specific paths. --update rewrites EXPECTED instead.
set -uo pipefail
update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
stage=$1 netc=$2 file=$3 expected=$4
case "$netc" in /*) ;; *) netc=$PWD/$netc ;; esac
case "$expected" in /*) ;; *) expected=$PWD/$expected ;; esac
actual=$(mktemp)
trap 'rm -f "$actual"' EXIT
cd "$(dirname "$file")" || exit 2
if [ "$stage" = err ] || [ "$stage" = warn ]; then
  "$netc" "$(basename "$file")" --check >/dev/null 2>"$actual"
  rc=$?
  want=1
  [ "$stage" = warn ] && want=0
  if [ $rc -ne $want ]; then echo "expected exit status $want, got $rc"; cat "$actual"; exit 1; fi
else
  case "$stage" in
    cuda-*) args=(--backend cuda --dump="${stage#cuda-}") ;;
    *) args=(--dump="$stage") ;;
  esac
  "$netc" "$(basename "$file")" "${args[@]}" >"$actual"
  rc=$?
  if [ $rc -ne 0 ]; then echo "netc failed with exit status $rc"; exit 1; fi
fi
if [ $update = 1 ]; then cp "$actual" "$expected"; echo "updated $expected"; exit 0; fi
if [ ! -f "$expected" ]; then echo "missing expected file $expected (run with --update)"; cat "$actual"; exit 1; fi
diff -u "$expected" "$actual"
