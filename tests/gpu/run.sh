#!/usr/bin/env bash
# tests/gpu/run.sh - every GPU check and the GPU benchmark, in one command, on a machine with an
# NVIDIA GPU; prints a summary table and exits 1 if any check failed (README.md beside this).
#
#   tests/gpu/run.sh [--models mlp,lenet,...] [--no-bench] [--bench-args "ARGS"] [--work DIR] [--self-test]
#
# For each model in models/: the CPU and the CUDA trainer from the same .net, -D values,
# initial weights and data must end with the same parameters within float rounding, and the
# CUDA trainer must give the same bits with graph replay, without it (--no-graph) and run after
# run (gpu_check.py check); on learnable synthetic data its loss must fall like the CPU's
# (gpu_check.py converge); LeNet on Fashion-MNIST if the files are here (gpu_check.py fashion).
# Then bench/gpu_vs_torch.py. Uses the netc in build/ (built elsewhere and carried along: this
# machine may have no flex/bison), building it only if it is missing.
# --self-test: no GPU needed; a CPU trainer stands in for the CUDA one (checks the scripts).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
models="" bench=1 bench_args="" work=build/gpu-check selftest=()
while (($#)); do
  case $1 in
    --models) models=${2//,/ }; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --bench-args) bench_args=$2; shift 2 ;;  # e.g. "--compile-modes= --repeat 1" for a quicker run
    --work) work=$2; shift 2 ;;
    --self-test) selftest=(--self-test); bench=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$models" ] || models=$(for f in models/*.net; do basename "$f" .net; done)

if [ -z "${PYTHON:-}" ] && ! "$PY" -c "import numpy" 2>/dev/null; then PY=/usr/bin/python3; fi
"$PY" -c "import numpy" 2>/dev/null || { echo "run.sh: $PY has no numpy; set PYTHON=/path/to/python3" >&2; exit 1; }
if [ ! -x build/compiler/netc ]; then
  echo "run.sh: no build/compiler/netc; building it (cmake -S . -B build)"
  { cmake -S . -B build >/dev/null && cmake --build build -j "$(nproc)" >/dev/null; } || {
    echo "run.sh: FAILED: could not build netc here (this machine may lack flex/bison, OpenBLAS or" \
         "oneDNN): build it on a CPU machine and bring build/ (compiler/netc, runtime/*.a," \
         "runtime/cuda/libnetrt_cuda.a) along" >&2
    exit 1
  }
fi
if ((!${#selftest[@]})); then
  nvidia-smi -L 2>/dev/null | grep -q GPU ||
    echo "run.sh: NO GPU on this machine (nvidia-smi -L lists none): every GPU check will FAIL" >&2
  [ -f build/runtime/cuda/libnetrt_cuda.a ] ||
    echo "run.sh: warning: no build/runtime/cuda/libnetrt_cuda.a: netc --backend cuda will likely fail" >&2
fi

mkdir -p "$work"
log=$work/run.log results=$work/results.tsv
: >"$log"
crashed=0
step() {  # run one gpu_check.py command; its RESULT lines go to the table, the rest to the log
  "$PY" tests/gpu/gpu_check.py "$@" --work "$work" "${selftest[@]}" 2>&1 | tee -a "$log" | grep -v '^RESULT' | sed 's/^/  /'
  local rc=${PIPESTATUS[0]}
  ((rc == 0 || rc == 1)) || { crashed=1; echo "  gpu_check.py $* crashed (exit $rc)"; }
}
start=$SECONDS
for m in $models; do step check --model "$m"; done
for m in $models; do step converge --model "$m"; done
# bf16 mixed precision must learn like fp32 (same margins against the CPU's fp32 run)
((${#selftest[@]})) || for m in $models; do step converge --model "$m" --precision bf16; done
step fashion
grep '^RESULT' "$log" | cut -f2- >"$results"
printf 'fp16\tall\tNOT-CHECKED\tthe CUDA backend has no fp16 mode (dynamic loss scaling) yet\n' >>"$results"

if ((bench)); then
  echo "== bench/gpu_vs_torch.py"
  # shellcheck disable=SC2086  # bench_args is a list of words
  if "$PY" bench/gpu_vs_torch.py --work "$work/bench" $bench_args 2>&1 | tee "$work/bench.log"; then
    printf 'benchmark\tlenet,resnet50\tPASS\tran; table above (%s)\n' "$work/bench.log" >>"$results"
  else
    printf 'benchmark\tlenet,resnet50\tFAIL\tbench/gpu_vs_torch.py failed (%s)\n' "$work/bench.log" >>"$results"
  fi
fi

echo
echo "== summary ($((SECONDS - start)) s; details in $log)"
printf '%-18s %-15s %-14s %s\n' check model status detail
sort -s -t$'\t' -k1,1 "$results" | while IFS=$'\t' read -r check model status detail; do
  printf '%-18s %-15s %-14s %s\n' "$check" "$model" "$status" "$detail"
done
fails=$(cut -f3 "$results" | grep -c '^FAIL$')
notrun=$(cut -f3 "$results" | grep -c '^FAILED-TO-RUN$')
((crashed)) && echo "a helper crashed without reporting (see above)"
echo "$(grep -c . "$results") results: $fails failed, $notrun failed to run (not counted as failures)"
((fails == 0 && crashed == 0))
