#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU checks and the GPU benchmark, on a machine with an NVIDIA GPU, in
# steps that each end well inside 10 minutes; each step writes its own log; a summary table at the
# end; exit 1 if any check failed (README.md beside this).
#
#   tests/gpu/run.sh [--pack DIR] [--only STEP,...] [--models mlp,lenet,...] [--work DIR]
#                    [--bench-args "ARGS"] [--timeout S] [--deadline S] [--self-test]
#
# Steps (--only; default: check,dist):
#   check           per model, the CPU and the CUDA trainer from the same .net, init and data end
#                   with the same parameters within float rounding, and the CUDA trainer gives the
#                   same bits with graph replay, without it (--no-graph) and run after run
#   dist            MLP, LeNet, ResNet-18: the distributed CUDA trainer (netc --distributed, NCCL)
#                   started as one rank (Open MPI's singleton, the pack's mpi.tar.xz) gives the
#                   plain trainer's bits, with and without --shard-optimizer
#   converge        on learnable data the GPU's loss falls like the CPU's (fp32, bf16, fp16), the
#                   fp32 run with --eval-async gives its bits, and LeNet learns Fashion-MNIST
#   referee         random nets' GPU trainers in fp32, bf16 and fp16 against the float64 interpreter
#                   (tests/gradcheck/ir_gradcheck.py; half precision rounded as the device rounds):
#                   one step's gradient, the evaluation and --predict, to float32's tolerances
#   sanitize        per model, two steps of the GPU trainer under compute-sanitizer's memcheck
#                   (with --leak-check full), racecheck and initcheck: no error reported
#   bench-lenet, bench-resnet50    bench/gpu_vs_torch.py for one model
#   all             every step, in this order
# --pack DIR: the folder tests/gpu/pack.sh made on a CPU machine (netc, its runtime, the CPU
#   references, the GPU trainers): nothing is compiled here. Without it, netc from build/.
# First the libraries: cuDNN, cuBLASLt, NVRTC and NCCL from $CUDA_HOME (default /usr/local/cuda)
# or PyTorch's site-packages/nvidia/*/lib, checked with ldd; a MISSING line for each one absent.
# --timeout S: a trainer run still going after S seconds (default 180) is killed as a hang and FAILs.
# --deadline S: nothing starts S seconds after run.sh did (rows FAILED-TO-RUN) and nothing runs on
#   past it, so that one command on a machine lent for minutes always ends with its table
#   (tests/gpu/README.md: --deadline 480 inside a 10-minute command).
# --self-test: no GPU needed; a CPU trainer stands in for the CUDA one (checks the scripts).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
models="" only=check,dist bench_args="" work="" pack="" selftest=() timeout="" deadline=""
while (($#)); do
  case $1 in
    --pack) pack=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --models) models=${2//,/ }; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;  # e.g. "--compile-modes= --repeat 1" for a quicker run
    --work) work=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --self-test) selftest=(--self-test); shift ;;
    --no-bench) shift ;;  # the old spelling: the benchmark is a step of its own now
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$timeout" "$deadline"; do
  [[ -z $v || $v =~ ^[0-9]+$ ]] || { echo "run.sh: --timeout and --deadline take whole seconds, not '$v'" >&2; exit 2; }
done
limits=()
[ -n "$timeout" ] && limits+=(--timeout "$timeout")
end=""
if [ -n "$deadline" ]; then end=$(($(date +%s) + deadline)); limits+=(--deadline "$end"); fi
[ "$only" = all ] && only=check,dist,converge,referee,sanitize,bench-lenet,bench-resnet50
for s in ${only//,/ }; do
  case $s in check|dist|converge|referee|sanitize|bench-lenet|bench-resnet50) ;;
    *) echo "run.sh: unknown step '$s' (check, dist, converge, referee, sanitize, bench-lenet, bench-resnet50, all)" >&2
       exit 2 ;;
  esac
done
[ -n "$models" ] || models=$(for f in models/*.net; do basename "$f" .net; done)
work=${work:-build/gpu-check}
mkdir -p "$work"
work=$(cd "$work" && pwd)
setup_log=$work/setup.log
: >"$setup_log"
note() { echo "run.sh: $*" | tee -a "$setup_log"; }

if [ -z "${PYTHON:-}" ] && ! "$PY" -c "import numpy" 2>/dev/null; then PY=/usr/bin/python3; fi
"$PY" -c "import numpy" 2>/dev/null || { echo "run.sh: $PY has no numpy; set PYTHON=/path/to/python3" >&2; exit 1; }

# ---- netc: the pack's, or build/'s
trainers=()
if [ -n "$pack" ]; then
  [ -f "$pack/PACK.txt" ] || { echo "run.sh: $pack is not a folder made by tests/gpu/pack.sh" >&2; exit 1; }
  pack=$(cd "$pack" && pwd)
  netc=$pack/netc
  trainers=(--trainers "$pack/trainers")
  # the prepared CPU references, copied beside this run's results (the pack stays as it came)
  [ -d "$pack/work" ] && cp -a "$pack/work/." "$work/"
  note "pack $pack: $(head -1 "$pack/PACK.txt")"
else
  netc=$PWD/build/compiler/netc
  if [ ! -x "$netc" ]; then
    echo "run.sh: no build/compiler/netc; building it (cmake -S . -B build)"
    { cmake -S . -B build >/dev/null && cmake --build build -j "$(nproc)" >/dev/null; } || {
      echo "run.sh: FAILED: could not build netc here (this machine may lack flex/bison, OpenBLAS or" \
           "oneDNN): run tests/gpu/pack.sh on a CPU machine and pass its folder with --pack" >&2
      exit 1
    }
  fi
fi

# ---- libraries: $CUDA_HOME, then PyTorch's wheels (site-packages/nvidia/*/lib), then the pack's
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
libdirs=()
for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"}; do [ -d "$d" ] && libdirs+=("$d"); done
while IFS= read -r d; do libdirs+=("$d"); done < <("$PY" - <<'EOF' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")  # PyTorch's CUDA wheels: nvidia/cudnn/lib, nvidia/cu13/lib, ...
for base in (spec.submodule_search_locations if spec else []):
    for d in sorted(glob.glob(os.path.join(base, "*", "lib"))):
        print(d)
EOF
)
[ -n "$pack" ] && libdirs+=("$pack/runtime")
# Open MPI for the distributed trainers: the pack's, where it has one (this machine may have none),
# unpacked beside this run's results
if [ -n "$pack" ] && [ -f "$pack/mpi.tar.xz" ]; then
  rm -rf "$work/mpi" && mkdir -p "$work/mpi" && tar -C "$work/mpi" -xJf "$pack/mpi.tar.xz" &&
    libdirs+=("$work/mpi/lib") && export OPAL_PREFIX=$work/mpi
fi
old_ifs=$IFS; IFS=:
export LD_LIBRARY_PATH="${libdirs[*]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
IFS=$old_ifs
note "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
[ -n "${OPAL_PREFIX:-}" ] && note "Open MPI from the pack: OPAL_PREFIX=$OPAL_PREFIX"
where() {  # the first folder of LD_LIBRARY_PATH, else of the loader's cache, that holds $1
  local d
  for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
  ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l && !found++ {print $NF}' | grep . && return 0
  return 1
}
missing=0
for lib in libcudnn.so.9 libcublasLt.so.13 libnvrtc.so.13 libnccl.so.2; do
  if p=$(where "$lib"); then note "found $lib: $p"
  elif [ "$lib" = libnccl.so.2 ]; then note "no $lib (only distributed GPU trainers, netc --distributed, need it)"
  else note "MISSING: $lib: not in \$CUDA_HOME (${CUDA_HOME:-unset}), PyTorch's site-packages/nvidia/*/lib" \
              "or the loader's cache; set LD_LIBRARY_PATH to its folder"; missing=1
  fi
done
# ldd: every library netc and a GPU trainer need must resolve; the pack's fallback/ copies of
# libgomp and zlib are used only for one this machine lacks
probe=""
if [ -n "$pack" ]; then
  first=$(ls "$pack"/trainers/mlp-*.xz 2>/dev/null | head -1)
  [ -n "$first" ] && probe=$work/ldd-probe && "$PY" -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$first" "$probe" && chmod +x "$probe"
fi
ldd_check() {
  local exe=$1 what=$2 lib
  for lib in $(ldd "$exe" 2>&1 | awk '/not found/ {print $1}' | sort -u); do
    if [ -n "$pack" ] && [ -e "$pack/runtime/fallback/$lib" ] && [[ ":$LD_LIBRARY_PATH:" != *":$pack/runtime/fallback:"* ]]; then
      export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$pack/runtime/fallback
      note "$lib (needed by $what) is not installed here: using the pack's copy"
    fi
  done
  for lib in $(ldd "$exe" 2>&1 | awk '/not found/ {print $1}' | sort -u); do
    note "MISSING: $lib (needed by $what, ldd $exe)"
    missing=1
  done
  ldd "$exe" 2>&1 | grep -i "version .* not found" | sed 's/^/run.sh: MISSING: /' | tee -a "$setup_log" | grep -q . && missing=1
  return 0
}
ldd_check "$netc" netc
[ -n "$probe" ] && ldd_check "$probe" "the GPU trainers"
torch_versions=$("$PY" -c "import torch; print(f'PyTorch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}')" 2>/dev/null) &&
  note "$torch_versions (the trainers: $(sed -n 's/^built with //p' "${pack:-/nonexistent}/PACK.txt" 2>/dev/null || echo "built here"))"
if command -v "${CC:-cc}" >/dev/null; then note "C compiler: $(command -v "${CC:-cc}")"
else note "no C compiler (${CC:-cc}): only the pack's trainers can run here; netc cannot link new ones"; fi
"$netc" --print-toolchain --backend cuda >>"$setup_log" 2>&1 || note "netc --print-toolchain --backend cuda: something is missing (above in $setup_log); the pack's trainers need none of it"
if ((!${#selftest[@]})); then
  nvidia-smi -L 2>/dev/null | grep -q GPU || note "NO GPU on this machine (nvidia-smi -L lists none): every GPU check will FAIL"
fi
((missing)) && note "libraries are MISSING (above): GPU trainers will fail to start"

# ---- the steps
crashed=0
left() {  # seconds to the deadline (a large number without one)
  if [ -n "$end" ]; then echo $((end - $(date +%s))); else echo 1000000; fi
}
not_run() {  # LOG CHECK MODEL: the row of a check the deadline kept from starting
  printf 'RESULT\t%s\t%s\tFAILED-TO-RUN\tnot started: the --deadline of %s s had passed\n' "$2" "$3" "$deadline" |
    tee -a "$1" | cut -f2- | sed 's/^/  /'
}
step() {  # LOG ARGS...: one gpu_check.py command; its RESULT lines go to the table, the rest to LOG
  local log=$1
  shift
  if (($(left) <= 1)); then
    local m
    m=$(sed -n 's/.*--model \([^ ]*\).*/\1/p' <<<"$*")
    not_run "$log" "$1" "${m:--}"
    return
  fi
  # gpu_check.py stops its own runs at the deadline; timeout(1) is the backstop for the rest
  # (netc, a comparison), with a margin for the rows of a run killed at the deadline
  timeout -k 5 $(($(left) + 30)) "$PY" tests/gpu/gpu_check.py "$@" --work "$work" --netc "$netc" \
    "${trainers[@]}" "${selftest[@]}" "${limits[@]}" 2>&1 | tee -a "$log" | grep -v '^RESULT' | sed 's/^/  /'
  local rc=${PIPESTATUS[0]}
  ((rc == 0 || rc == 1)) || { crashed=1; echo "  gpu_check.py $* crashed (exit $rc)" | tee -a "$log"; }
}
bench() {  # LOG MODEL
  local log=$1 model=$2
  if ((${#selftest[@]})); then
    printf 'benchmark\t%s\tNOT-RUN\t--self-test has no GPU to time\n' "$model" >>"$results"
    return
  fi
  if (($(left) <= 1)); then not_run "$log" benchmark "$model"; return; fi
  # shellcheck disable=SC2086  # bench_args is a list of words
  if timeout -k 5 "$(left)" "$PY" bench/gpu_vs_torch.py --models "$model" --netc "$netc" "${trainers[@]}" --work "$work/bench" \
       $bench_args 2>&1 | tee -a "$log"; then
    printf 'benchmark\t%s\tPASS\tran; table above (%s)\n' "$model" "$log" >>"$results"
  else
    printf 'benchmark\t%s\tFAIL\tbench/gpu_vs_torch.py failed (%s)\n' "$model" "$log" >>"$results"
  fi
}
results=$work/results.tsv
: >"$results"
start=$SECONDS
for s in ${only//,/ }; do
  log=$work/$s.log
  : >"$log"
  t0=$SECONDS
  echo "== step $s (log: $log)"
  case $s in
    check) for m in $models; do step "$log" check --model "$m"; done ;;
    dist) for m in $models; do step "$log" dist --model "$m"; done ;;  # gpu_check.py's DIST_MODELS
    converge)
      for m in $models; do step "$log" converge --model "$m"; done
      # bf16 and fp16 mixed precision must learn like fp32 (same margins against the CPU's fp32 run)
      ((${#selftest[@]})) || for p in bf16 fp16; do
        for m in $models; do step "$log" converge --model "$m" --precision "$p"; done
      done
      step "$log" fashion ;;
    referee) step "$log" referee ;;  # its own nets (gpu_check.py's REFEREE_NETS), not --models
    sanitize) for m in $models; do step "$log" sanitize --model "$m"; done ;;
    bench-lenet) bench "$log" lenet ;;
    bench-resnet50) bench "$log" resnet50 ;;
  esac
  grep '^RESULT' "$log" | cut -f2- >>"$results"
  echo "== step $s: $((SECONDS - t0)) s"
done

echo
echo "== summary ($((SECONDS - start)) s; steps: $only; logs in $work: setup.log, <step>.log)"
printf '%-18s %-15s %-14s %s\n' check model status detail
sort -s -t$'\t' -k1,1 "$results" | while IFS=$'\t' read -r check model status detail; do
  printf '%-18s %-15s %-14s %s\n' "$check" "$model" "$status" "$detail"
done
fails=$(cut -f3 "$results" | grep -c '^FAIL$')
notrun=$(cut -f3 "$results" | grep -c '^FAILED-TO-RUN$')
((crashed)) && echo "a helper crashed without reporting (see above)"
((missing)) && echo "libraries were MISSING (see setup.log)"
echo "$(grep -c . "$results") results: $fails failed, $notrun failed to run (not counted as failures)"
((fails == 0 && crashed == 0))
