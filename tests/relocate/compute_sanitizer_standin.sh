#!/usr/bin/env bash
# compute_sanitizer_standin.sh - stands in for compute-sanitizer where there is no GPU
# (gpu_pack_selftest.sh): takes the options gpu_check.py's sanitize passes (--tool T,
# --leak-check full, --error-exitcode N, --log-file F), runs the command after them and writes a
# report in compute-sanitizer's form to F: no errors, or, when STANDIN_ERROR_TOOL is T, one
# invalid read, and then exits N.
set -u
tool=memcheck code=1 log=/dev/stderr
while (($#)); do
  case $1 in
    --tool) tool=$2; shift 2 ;;
    --error-exitcode) code=$2; shift 2 ;;
    --log-file) log=$2; shift 2 ;;
    --leak-check) shift 2 ;;
    --*) echo "compute_sanitizer_standin.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
"$@"
rc=$?
if [ "${STANDIN_ERROR_TOOL:-}" = "$tool" ]; then
  printf '%s\n' "========= COMPUTE-SANITIZER" "========= Invalid __global__ read of size 16 bytes" \
    "=========     at k8_add_relu_l10+0x70" "=========     by thread (3,0,0) in block (0,0,0)" \
    "========= " "========= ERROR SUMMARY: 1 error" >"$log"
  exit "$code"
fi
printf '%s\n' "========= COMPUTE-SANITIZER" "========= ERROR SUMMARY: 0 errors" >"$log"
exit "$rc"
