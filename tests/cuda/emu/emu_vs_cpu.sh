#!/usr/bin/env bash
# emu_vs_cpu.sh NETC WORK MODEL STEPS TOL [-D NAME=VALUE]...
# emu_vs_cpu.sh --bf16 NETC WORK MODEL EPOCHS PARAM_TOL LOSS_TOL [-D NAME=VALUE]...
# emu_vs_cpu.sh --fp16 NETC WORK MODEL EPOCHS PARAM_TOL LOSS_TOL [-D NAME=VALUE]...
# emu_vs_cpu.sh --ranks N NETC WORK MODEL STEPS TOL [-D NAME=VALUE]...
# emu_vs_cpu.sh --frozen-half bf16|fp16 NETC WORK MODEL STEPS [-D NAME=VALUE]...
# emu_vs_cpu.sh --reference bf16|fp16 NETC WORK MODEL [NETC_FLAG]...
#
# The CUDA backend's trainer, run on the CPU, against the CPU backend's. MODEL (models/MODEL.net,
# or a path ending in .net) is compiled twice: as a CPU trainer, and with --backend cuda, whose
# host C (NAME.c) and kernels (NAME.cu) are then built into an emulated trainer: gcc for NAME.c,
# g++ with cuda_emu.h for NAME.cu, and rt_cuda_emu.c in place of libnetrt_cuda (see those
# files). emu_compare.py trains both the same way and compares parameters, checkpoints, logged
# losses and evaluations within TOL; then requires the same bits from the emulated run with its
# blocks in reverse order and stopped and resumed, and the same step from both on a NaN.
#
# This checks what netc generates for the device (offsets, kernels, index maps, the on-device
# step bookkeeping, optimizer, schedule and sums) and rt_main's device path. It does not run
# any CUDA, cuBLASLt or cuDNN call: those need a GPU (tests/gpu/).
#
# With --bf16 the device trainer is compiled with --precision bf16 (its products and
# convolutions on bfloat16 operands, accumulated in float32) and cannot match the float32 CPU
# trainer's bits: emu_compare.py --bf16 trains both EPOCHS epochs on learnable data and requires
# that they converge alike - final evaluation losses within LOSS_TOL, parameters within
# PARAM_TOL of the distance they travelled (see there). --fp16 is the same comparison with
# --precision fp16, then the dynamic loss scale's own checks (emu_compare.py main_fp16).
#
# With --frozen-half there is no CPU trainer: the device trainer compiled with --precision bf16 (or
# fp16) and the same compiled with --frozen-half too are emulated, and emu_compare.py
# --frozen-half requires the same bits from both (main_frozen_half).
#
# With --reference there is no CPU trainer either: the device trainer compiled with --precision
# bf16 (or fp16) and emulated is checked by tests/gradcheck/ir_gradcheck.py --trainer against the
# float64 interpreter run on netc's graph after autocast, which rounds every half-precision value
# as the device does (so only float32's own rounding, and the rare half-precision rounding it
# tips, part them): one SGD step's gradient, the evaluation and --predict.
#
# With --ranks N both trainers are distributed (netc --distributed) and run as N ranks under
# mpirun: the emulated one with the real runtime/cuda/rt_cuda_nccl.c (libnetrt_nccl: the NCCL
# collectives of the step, forked onto their own stream and joined) linked against nccl_emu.c,
# which maps NCCL's calls to MPI's. emu_compare.py --ranks compares them as above.
#
# Both trainers run with NETC_GEMM=reference: every matrix product one double sum per element
# over k in order (rt_gemm), so that their products give the same bits although the CPU trainer
# splits some into blocks of rows or columns (epilogues) that the device trainer computes whole.
# With a BLAS the bits of an element depend on the CPU's kernels and the call's shape: on an
# Intel Xeon (OpenBLAS 0.3.21, Prescott kernels for a CPU it does not know) the weights differed
# after one step in the last bits, and after 10 steps of ResNet-18 by 8 % (batch norm and ReLU
# amplify a one-ulp difference), where an AVX-512 EPYC's kernels happened to agree.
#
# Needs, from tests/cuda/CMakeLists.txt: NETC_EMU_CUDA_INCLUDE (cuda_runtime.h's directory, for
# netrt_cuda.h's types) and NETC_EMU_LINK (libnetrt.a and what it links); with --ranks,
# NETC_EMU_DIST_CFLAGS (-I for mpi.h and nccl.h) and NETC_EMU_DIST_LINK (libnetrt_mpi.a and MPI).
set -euo pipefail
export NETC_GEMM=reference
ranks=
if [ "${1:-}" = --ranks ]; then
  ranks=$2
  shift 2
fi
frozen_half='' reference=''
if [ "${1:-}" = --reference ]; then # ir_gradcheck.py's --trainer check of the emulated half trainer
  reference=1 netc=$3 work=$4 model=$5 precision=$2
  shift 5
elif [ "${1:-}" = --frozen-half ]; then # emu_compare.py's: STEPS, the plain half trainer against --frozen-half's
  frozen_half=1 netc=$3 work=$4 model=$5 precision=$2 compare=("$6")
  shift 6
elif [ "${1:-}" = --bf16 ] || [ "${1:-}" = --fp16 ]; then # emu_compare.py's half modes: EPOCHS PARAM_TOL LOSS_TOL
  netc=$2 work=$3 model=$4 precision=${1#--} compare=("$1" "$5" "$6" "$7")
  shift 7
else # STEPS TOL
  netc=$1 work=$2 model=$3 precision=fp32 compare=("$4" "$5")
  shift 5
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
: "${NETC_EMU_CUDA_INCLUDE:?set it to the CUDA include directory (tests/cuda/CMakeLists.txt does)}"
: "${NETC_EMU_LINK:?set it to libnetrt.a and its libraries (tests/cuda/CMakeLists.txt does)}"
case $model in
*.net) src=$(cd "$(dirname "$model")" && pwd)/$(basename "$model") model=$(basename "$model" .net) ;;
*) src=$root/models/$model.net ;;
esac
dir=$work/emu-$model
[ "$precision" = fp32 ] || dir=$dir-$precision
[ -z "$frozen_half" ] || dir=$dir-frozen-half
[ -z "$reference" ] || dir=$dir-reference
dist=()
if [ -n "$ranks" ]; then
  dir=$dir-ranks$ranks dist=(--distributed) compare=(--ranks "$ranks" "${compare[@]}")
fi
case " $* " in *" --sync-bn "*) dir=$dir-sync-bn ;; esac # beside the same model's other runs
case " $* " in *" --shard-optimizer "*) dir=$dir-shard ;; esac
[ -z "${NETC_EMU_NO_GELU_EPILOGUE:-}" ] || dir=$dir-no-gelu-epilogue # rt_cuda_emu.c: the fallback
[ -z "${NETC_EMU_NO_EPILOGUE:-}" ] || dir=$dir-no-epilogue
rm -rf "$dir" && mkdir -p "$dir"

# The emulated trainer of the CUDA trainer netc compiles with NETC_ARGS: DIR/$model-emu.
emu_build() { # DIR NETC_ARGS...
  local d=$1
  shift
  mkdir -p "$d/gen"
  "$netc" "$src" "$@" --backend cuda --emit-dir "$d/gen" -o "$d/gen/$model"

  # The kernels by name: the .cu and a table of its kernel_names (from the host C), one object
  # whose only global symbols are the table, so no kernel name can meet a library's symbol.
  local names
  names=$(sed -n '/kernel_names\[N_KERNELS\] = {/,/^};/s/^ *"\([A-Za-z_][A-Za-z0-9_]*\)",$/\1/p' "$d/gen/$model.c")
  [ -n "$names" ] || { echo "emu_vs_cpu: no kernel_names in $d/gen/$model.c" >&2; exit 1; }
  {
    echo "#include \"$model.cu\""
    # each entry calls its kernel as its signature has it: the base, or a shared kernel's base
    # and RtKAt (rt_cuda_emu.c's EmuKernel)
    echo 'static void emu_call(void (*f)(unsigned char *), unsigned char *b, const RtKAt *) { f(b); }'
    echo 'static void emu_call(void (*f)(unsigned char *, RtKAt), unsigned char *b, const RtKAt *a) { f(b, *a); }'
    echo 'static constexpr int emu_takes_at(void (*)(unsigned char *)) { return 0; }'
    echo 'static constexpr int emu_takes_at(void (*)(unsigned char *, RtKAt)) { return 1; }'
    echo 'extern "C" {'
    echo 'struct EmuKernel { const char *name; void (*fn)(unsigned char *, const RtKAt *); int takes_at; };'
    echo 'extern const EmuKernel emu_kernels[] = {'
    for k in $names; do
      echo "    {\"$k\", [](unsigned char *b, const RtKAt *a) { emu_call($k, b, a); }, emu_takes_at($k)},"
    done
    echo '};'
    echo "extern const int emu_n_kernels = $(echo "$names" | wc -l);"
    echo '}'
  } >"$d/kernels_emu.cpp"

  local flags=(-O2 -g -fopenmp -ffp-contract=off -I"$root/runtime" -I"$root/runtime/cuda" -I"$NETC_EMU_CUDA_INCLUDE")
  # -fsanitize=alignment: a kernel's access at an address its type's alignment does not divide
  # (a 16-byte NetcF4 load off a multiple of 16, a double off 8) stops the run, as it faults on a GPU
  g++ "${flags[@]}" -std=c++17 -Wall -Wno-unused-function -fsanitize=alignment -fno-sanitize-recover=alignment \
    -include "$here/cuda_emu.h" -I"$d/gen" -c "$d/kernels_emu.cpp" -o "$d/kernels_emu.o"
  objcopy --keep-global-symbol=emu_kernels --keep-global-symbol=emu_n_kernels "$d/kernels_emu.o"
  # NETC_EMU_SANITIZE: the sanitizer flags of a NETC_SANITIZE build, whose libnetrt needs them at
  # link time; the generated host C gets them too, the emulation itself (fibers) does not.
  # shellcheck disable=SC2086 # a list of words
  gcc "${flags[@]}" ${NETC_EMU_SANITIZE:-} -std=gnu11 -Wall -Wextra -Werror -c "$d/gen/$model.c" -o "$d/host.o"
  gcc "${flags[@]}" -std=gnu11 -Wall -Wextra -Werror -c "$here/rt_cuda_emu.c" -o "$d/rt_cuda_emu.o"
  # the host C points RtCudaModel.images at the NVRTC images (the emulation runs kernels by name)
  gcc "${flags[@]}" -std=gnu11 -c "$d/gen/${model}_images.c" -o "$d/images.o"
  local objs=("$d/host.o" "$d/images.o" "$d/kernels_emu.o" "$d/rt_cuda_emu.o")
  if [ -n "$ranks" ]; then # libnetrt_nccl's source, and NCCL as MPI
    : "${NETC_EMU_DIST_CFLAGS:?set it to -I for mpi.h and nccl.h (tests/cuda/CMakeLists.txt does)}"
    : "${NETC_EMU_DIST_LINK:?set it to libnetrt_mpi.a and MPI (tests/cuda/CMakeLists.txt does)}"
    # shellcheck disable=SC2086 # a list of words
    gcc "${flags[@]}" $NETC_EMU_DIST_CFLAGS -std=gnu11 -Wall -Wextra -Werror -c "$root/runtime/cuda/rt_cuda_nccl.c" \
      -o "$d/rt_cuda_nccl.o"
    # shellcheck disable=SC2086
    gcc "${flags[@]}" $NETC_EMU_DIST_CFLAGS -std=gnu11 -Wall -Wextra -Werror -c "$here/nccl_emu.c" -o "$d/nccl_emu.o"
    objs+=("$d/rt_cuda_nccl.o" "$d/nccl_emu.o")
  fi
  # shellcheck disable=SC2086 # NETC_EMU_LINK is a list of words
  g++ -fopenmp -fsanitize=alignment ${NETC_EMU_SANITIZE:-} "${objs[@]}" ${NETC_EMU_DIST_LINK:-} $NETC_EMU_LINK -o "$d/$model-emu"
}

emu_build "$dir" "$@" "${dist[@]}" --precision "$precision"
if [ -n "$reference" ]; then
  exec /usr/bin/python3 "$root/tests/gradcheck/ir_gradcheck.py" --trainer "$netc" "$src" "$dir/run" \
    --exe "$dir/$model-emu" --backend cuda --precision "$precision" "$@"
fi
if [ -n "$frozen_half" ]; then # the emulated trainer with --frozen-half against the plain one
  emu_build "$dir/frozen-half" "$@" --precision "$precision" --frozen-half
  exec /usr/bin/python3 "$here/emu_compare.py" "$dir/run" --frozen-half "${compare[@]}" "$dir/$model-emu" \
    "$dir/frozen-half/$model-emu"
fi
"$netc" "$src" "$@" "${dist[@]}" -o "$dir/$model-cpu"
/usr/bin/python3 "$here/emu_compare.py" "$dir/run" "${compare[@]}" "$dir/$model-cpu" "$dir/$model-emu"
