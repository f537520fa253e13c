#!/usr/bin/env bash
# tests/gpu/pack.sh - on a CPU machine, everything tests/gpu/run.sh needs on a GPU machine that
# cannot build netc (no flex/bison), CPU trainers (no OpenBLAS, oneDNN, cJSON) or reach a network,
# in one folder under 64 MiB (README.md beside this):
#
#   tests/gpu/pack.sh [--out DIR] [--build DIR] [--models mlp,lenet,...] [--no-fashion]
#                     [--no-bench] [--referee] [--toolchain-only]
#
#   DIR/netc, DIR/runtime/   netc and its runtime (found by netc beside itself): netrt.h, libnetrt.a
#                            (and libnetrt-x86-64-v3.a, -v4.a for CPU trainers of those levels),
#                            libnetrt_mpi.a, cuda/ (libnetrt_cuda.a, libnetrt_nccl.a, the CUDA headers a trainer's host C includes,
#                            libcudart_static.a), libcjson; fallback/: libgomp, libz for a machine
#                            that lacks them (run.sh adds it only then)
#   DIR/mpi.tar.xz           Open MPI's run-time (libmpi and its components in OPAL_PREFIX's layout;
#                            9 MB, 2.2 MB packed) for the distributed trainers' check (run.sh's dist)
#   DIR/trainers/            every GPU trainer the checks and the benchmark run, built here
#                            (xz-compressed), so the GPU machine needs no C compiler and no NVRTC
#   DIR/work/                the CPU references (gpu_check.py prepare, converge and fashion CPU runs);
#                            work/fashion/data/: the Fashion-MNIST check's 10000 training and 5000
#                            test images (6.3 MiB), written from NETC_FASHION_DIR's files
#   DIR/PACK.txt             what is in it: commit, netc --print-toolchain, sizes
#
# --referee: the referee step's GPU trainers too (run.sh --only referee: 8 random nets in fp32,
#   bf16 and fp16, 24 trainers, 15 MiB); too many beside every model, so with a few models
#   (--models mlp --no-fashion --no-bench); without them, run.sh builds them where it can.
#
# --toolchain-only: netc and its runtime alone (seconds; the relocation test uses it).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu-pack build=build models="" fashion=1 bench=1 full=1 referee=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --no-fashion) fashion=0; shift ;;
    --no-bench) bench=0; shift ;;
    --referee) referee=(--referee); shift ;;
    --toolchain-only) full=0; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | grep '^#'; exit 0 ;;
    *) echo "pack.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$models" ] || models=$(for f in models/*.net; do basename "$f" .net; done | paste -sd,)
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && ! "$PY" -c "import numpy" 2>/dev/null; then PY=/usr/bin/python3; fi
"$PY" -c "import numpy" 2>/dev/null || { echo "pack.sh: $PY has no numpy; set PYTHON=/path/to/python3" >&2; exit 1; }
netc=$build/compiler/netc
[ -x "$netc" ] || { echo "pack.sh: no $netc: build netc first (scripts/setup.sh)" >&2; exit 1; }
if ! "$netc" --print-toolchain --backend cuda >/dev/null 2>&1; then
  "$netc" --print-toolchain --backend cuda || true
  echo "pack.sh: this netc cannot build GPU trainers (above); build it with NETC_CUDA=ON" >&2
  exit 1
fi
if [ -e "$out" ] && [ ! -f "$out/PACK.txt" ]; then
  echo "pack.sh: $out exists and is not a pack; not touching it" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/runtime/cuda/include" "$out/runtime/fallback"

# netc and its runtime, as netc --print-toolchain names them
field() { "$netc" --print-toolchain --backend cuda | awk -v k="$1" 'index($0, k) == 1 {print $NF}'; }
cp "$netc" "$out/netc"
rt_lib=$("$netc" --print-toolchain | awk '$1 == "runtime" && $2 != "headers" {print $2}')
rt_inc=$("$netc" --print-toolchain | awk '$1 == "runtime" && $2 == "headers" {print $3}')
rt_inc=${rt_inc:-$rt_lib}
cp "$rt_inc"/netrt.h "$rt_inc"/rt_bits.h "$rt_inc"/rt_recipe.h "$rt_lib"/libnetrt.a "$out/runtime/"
cp "$rt_inc"/cuda/netrt_cuda.h "$rt_inc"/cuda/rt_devstate.h "$rt_inc"/cuda/netrt_*.cuh \
   "$rt_lib"/cuda/libnetrt_cuda.a "$out/runtime/cuda/"
# the runtime built for newer CPUs (netc --cpu x86-64-v3, -v4), where this build has it
for lib in "$rt_lib"/libnetrt-x86-64-v*.a; do if [ -f "$lib" ]; then cp "$lib" "$out/runtime/"; fi; done
# a distributed trainer's collectives (netc --distributed), where this build has them
[ -f "$rt_lib"/libnetrt_mpi.a ] && cp "$rt_lib"/libnetrt_mpi.a "$out/runtime/"
[ -f "$rt_lib"/cuda/libnetrt_nccl.a ] && cp "$rt_lib"/cuda/libnetrt_nccl.a "$out/runtime/cuda/"
cjson=$(readlink -f "$(field cJSON)")
cp "$cjson" "$out/runtime/libcjson.so"
cp "$cjson" "$out/runtime/libcjson.so.1"
cp "$(field 'CUDA runtime')" "$out/runtime/cuda/"
# the CUDA headers that netrt_cuda.h includes (the trainer's host C includes no others)
cuda_inc=$(field 'CUDA headers')
printf '#include "netrt_cuda.h"\n' >"$out/probe.c"
gcc -M -I "$rt_inc" -I "$rt_inc/cuda" -I "$cuda_inc" "$out/probe.c" | tr ' \\' '\n\n' |
  grep "^$cuda_inc/" | sort -u | while read -r h; do
    mkdir -p "$out/runtime/cuda/include/$(dirname "${h#"$cuda_inc"/}")"
    cp "$h" "$out/runtime/cuda/include/${h#"$cuda_inc"/}"
  done
rm "$out/probe.c"
# libraries a trainer needs at run time that a machine may lack (used only where it does)
for lib in libgomp.so.1 libz.so.1; do
  p=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ && !found++ {print $NF}')
  [ -n "$p" ] && cp "$(readlink -f "$p")" "$out/runtime/fallback/$lib"
done
# zlib for the link step (-lz) where only libz.so.1 is installed
cp "$out/runtime/fallback/libz.so.1" "$out/runtime/libz.so"
# Open MPI's run-time, for a distributed trainer started as one rank without mpirun (a singleton):
# its libraries in mpi/lib, its components and help texts where OPAL_PREFIX=DIR/mpi makes it look
# (this Open MPI's libdir and pkgdatadir below its prefix)
mpi_lib=$(ldconfig -p | awk '$1 == "libmpi.so.40" && /x86-64/ && !found++ {print $NF}')
if [ -n "$mpi_lib" ] && command -v ompi_info >/dev/null; then
  prefix=$(ompi_info --path prefix --parsable | cut -d: -f3-)
  libdir=$(ompi_info --path libdir --parsable | cut -d: -f3-)
  pkglibdir=$(ompi_info --path pkglibdir --parsable | cut -d: -f3-)
  pkgdatadir=$(ompi_info --path pkgdatadir --parsable | cut -d: -f3-)
  mpi=$out/mpi.tmp
  mkdir -p "$mpi/lib" "$mpi/${libdir#"$prefix"/}" "$mpi/${pkgdatadir#"$prefix"/}"
  for lib in $(ldd "$mpi_lib" | awk '$3 ~ /^\// {print $1}') libmpi.so.40; do
    case $lib in libc.so*|libm.so*|libz.so*|ld-linux*) continue ;; esac  # every machine has these
    cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ && !found++ {print $NF}')" "$mpi/lib/$lib"
  done
  cp -rL "$pkglibdir" "$mpi/${libdir#"$prefix"/}/"
  for f in "$libdir"/libmca_common_*.so; do  # the components' shared code, under its soname
    soname=$(objdump -p "$f" | awk '$1 == "SONAME" {print $2}')
    cp -L "$f" "$mpi/lib/${soname:-$(basename "$f")}"
  done
  cp -rL "$pkgdatadir/." "$mpi/${pkgdatadir#"$prefix"/}/"
  tar -C "$mpi" -cJf "$out/mpi.tar.xz" .
  rm -rf "$mpi"
else
  echo "pack.sh: no Open MPI here (libmpi.so.40, ompi_info): the pack has no distributed trainers" >&2
fi

{
  echo "netc GPU pack, made $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname) from $(git rev-parse --short HEAD)" \
       "$(git diff --quiet HEAD -- compiler codegen runtime || echo '(with uncommitted changes)')"
  echo "models: $models"
  # what the trainers were linked against: the GPU machine's cuDNN and cuBLASLt must be as new
  inc=$(field 'CUDA headers')
  echo "built with CUDA $(awk '/define CUDART_VERSION/ {print int($3 / 1000) "." ($3 % 1000) / 10}' \
    "$inc/cuda_runtime_api.h"), cuDNN $(awk '/define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / {printf "%s%s", s, $3; s="."}' \
    "$inc/cudnn_version.h" 2>/dev/null)"
  echo
  (cd "$out" && ./netc --print-toolchain --backend cuda)
} >"$out/PACK.txt"

if ((full)); then
  # Fashion-MNIST: gpu_check.py writes the check's subset (10000 training, 5000 test images)
  # into work/fashion/data from NETC_FASHION_DIR's files
  fashion_flag=()
  ((fashion)) || fashion_flag=(--no-fashion)
  # the CPU references and the checks' GPU trainers, built by the packed netc itself
  "$PY" tests/gpu/gpu_check.py pack --models "$models" --netc "$out/netc" --work "$out/work" \
    --trainers "$out/trainers" "${fashion_flag[@]}" "${referee[@]}" | grep -v '^RESULT' || {
    echo "pack.sh: preparing the CPU side failed (above)" >&2; exit 1; }
  # the trainers are in trainers/ (GPU) or useless there (CPU), and the convergence checks read
  # only the CPU run's log
  find "$out/work" -type f \( -name cpu -o -name gpu -o -name 'gpu-*' -o -name trainer \) -delete
  rm -f "$out"/work/*/converge/cpu.safetensors "$out/work/fashion/cpu.safetensors"
  if ((bench)); then
    "$PY" bench/gpu_vs_torch.py --prebuild --netc "$out/netc" --trainers "$out/trainers"
  fi
fi
{
  echo
  echo "sizes:"
  du -sh "$out"/* | sed 's/^/  /'
  du -sh "$out" | sed 's/^/  total /'
} >>"$out/PACK.txt"
# what a GPU machine is sent: the repository's files and the pack, at most 64 MiB (1 MiB kept spare)
total=$(du -sb "$out" | cut -f1)
repo=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
mib() { echo "$(($1 / 1048576)).$(($1 % 1048576 * 10 / 1048576))"; }
cat "$out/PACK.txt"
if ((total + repo > 63 * 1048576)); then
  echo "pack.sh: $out is $(mib "$total") MiB and the repository $(mib "$repo") MiB: together over the 63 MiB" \
       "that leave room within the 64 MiB a GPU machine is sent (--no-fashion saves 6 MiB)" >&2
  exit 1
fi
echo "pack.sh: $out ready: $(mib "$total") MiB, with the repository $(mib $((total + repo))) MiB of 64." \
     "On the GPU machine: tests/gpu/run.sh --pack $out [--only STEP]"
