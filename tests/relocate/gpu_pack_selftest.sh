#!/usr/bin/env bash
# gpu_pack_selftest.sh SOURCE_DIR BUILD WORK - tests/gpu/pack.sh and run.sh --pack end to end,
# without a GPU, for one small model (mlp):
#  1. pack.sh prepares mlp's CPU references and the Fashion-MNIST check's (its subset of the
#     data set written into the pack) and builds their GPU trainers into a pack;
#  2. run.sh --pack --self-test (a CPU trainer stands in for the GPU one) passes check, dist
#     (the distributed trainer as one rank, through the pack's Open MPI), converge and
#     fashion-mnist with no Fashion-MNIST but the pack's (as on the GPU machine), and reuses the
#     pack's prepared CPU runs instead of redoing them;
#  2a. run.sh --pack --self-test --only referee: the random nets' stand-in trainers against the
#     float64 interpreter (ir_gradcheck.py), one PASS row each in float32, none in bf16 or fp16;
#  2b. run.sh --pack --self-test --only sanitize, with a stand-in compute-sanitizer
#     (compute_sanitizer_standin.sh) that reports one error under racecheck: memcheck and
#     initcheck PASS, racecheck FAILs with the error and where it was, and run.sh exits 1; with no
#     compute-sanitizer the rows are FAILED-TO-RUN;
#  3. run.sh --pack with a stand-in nvidia-smi that lists a GPU takes the GPU trainers from the
#     pack (nothing compiled) and reports each failing to start (no driver here: exit status 5)
#     as FAIL with the trainer's message, and exits 1;
#  4. run.sh --deadline 0 starts no check: each step's row is FAILED-TO-RUN, the table still printed.
set -euo pipefail
src=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
pack=$work/pack
"$src/tests/gpu/pack.sh" --build "$build" --out "$pack" --models mlp --no-bench >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log"; fail "pack.sh"; }
tail -8 "$work/pack.log"
ls "$pack"/trainers/mlp-*.xz >/dev/null || fail "no packed mlp trainers"
[ -f "$pack/work/mlp/cpu.safetensors" ] && [ -f "$pack/work/mlp/converge/cpu.jsonl" ] || fail "no prepared CPU runs"

ls "$pack"/work/fashion/data/*-ubyte.gz >/dev/null || fail "no Fashion-MNIST subset in the pack"
export NETC_FASHION_DIR=$work/no-fashion  # no data set but the pack's subset, as on the GPU machine
echo "== run.sh --pack --self-test"
if ! "$src/tests/gpu/run.sh" --pack "$pack" --self-test --only check,dist,converge --models mlp --work "$work/self" \
     >"$work/self.out" 2>&1; then cat "$work/self.out"; fail "run.sh --self-test"; fi
tail -12 "$work/self.out"
grep -q "reusing the prepared CPU run in .*mlp$" "$work/self/check.log" || fail "check did not reuse the packed reference"
grep -q "reusing the prepared CPU run in .*mlp/converge" "$work/self/converge.log" || fail "converge did not reuse it"
grep -q "^cpu-vs-gpu  *mlp  *PASS" "$work/self.out" || fail "no cpu-vs-gpu PASS row"
grep -q "^gpu-predict  *mlp  *PASS" "$work/self.out" || fail "no gpu-predict PASS row"
grep -q "^converge  *mlp  *PASS" "$work/self.out" || fail "no converge PASS row"
grep -q "^accumulate  *mlp  *PASS" "$work/self.out" || fail "no accumulate PASS row"
grep -q "^fashion-mnist  *lenet  *PASS" "$work/self.out" || fail "no fashion-mnist PASS row"
grep -q "reusing the prepared CPU run in .*fashion$" "$work/self/converge.log" ||
  fail "fashion-mnist did not reuse the packed reference"
grep -q "^dist-1-rank  *mlp  *PASS" "$work/self.out" || fail "no dist-1-rank PASS row"
grep -q "^shard-1-rank  *mlp  *PASS" "$work/self.out" || fail "no shard-1-rank PASS row (--shard-optimizer)"
grep -q "Open MPI from the pack: OPAL_PREFIX=$work/self/mpi" "$work/self/setup.log" || fail "the pack's Open MPI was not used"
[ -s "$work/self/setup.log" ] || fail "no setup.log"

echo "== run.sh --pack --self-test --only referee"
"$src/tests/gpu/run.sh" --pack "$pack" --self-test --only referee --work "$work/referee" >"$work/referee.out" 2>&1 ||
  { cat "$work/referee.out"; fail "run.sh --only referee"; }
tail -3 "$work/referee.out"
[ "$(grep -c "^referee-fp32  *random_[0-7]  *PASS  *gradients: 0 of [0-9]* off" "$work/referee.out")" = 8 ] ||
  { cat "$work/referee.out"; fail "not 8 referee-fp32 PASS rows"; }
grep -q "^referee-\(bf16\|fp16\)" "$work/referee.out" && fail "half-precision referee rows from the float32 stand-in"

echo "== run.sh --pack --self-test --only sanitize"
set +e
NETC_COMPUTE_SANITIZER=$src/tests/relocate/compute_sanitizer_standin.sh STANDIN_ERROR_TOOL=racecheck \
  "$src/tests/gpu/run.sh" --pack "$pack" --self-test --only sanitize --models mlp --work "$work/san" >"$work/san.out" 2>&1
rc=$?
set -e
tail -6 "$work/san.out"
[ $rc -eq 1 ] || fail "run.sh --only sanitize exited $rc, expected 1 (one tool reported an error)"
grep -q "^sanitize-memcheck  *mlp  *PASS  *2 steps: ERROR SUMMARY: 0 errors" "$work/san.out" || fail "no sanitize-memcheck PASS row"
grep -q "^sanitize-initcheck  *mlp  *PASS" "$work/san.out" || fail "no sanitize-initcheck PASS row"
grep -q "^sanitize-racecheck  *mlp  *FAIL  *Invalid __global__ read of size 16 bytes at k8_add_relu_l10+0x70; ERROR SUMMARY: 1 error" \
  "$work/san.out" || fail "the racecheck error is not reported with where it was"
NETC_COMPUTE_SANITIZER=$work/none "$src/tests/gpu/run.sh" --pack "$pack" --self-test --only sanitize --models mlp \
  --work "$work/san-none" >"$work/san-none.out" 2>&1 || fail "run.sh without compute-sanitizer exited non-zero"
[ "$(grep -c "^sanitize-[a-z]*  *mlp  *FAILED-TO-RUN  *no compute-sanitizer" "$work/san-none.out")" = 3 ] ||
  { cat "$work/san-none.out"; fail "without compute-sanitizer the three rows are not FAILED-TO-RUN"; }

echo "== run.sh --pack, a GPU listed but no driver"
mkdir -p "$work/fakebin"
printf '#!/bin/sh\necho "GPU 0: stand-in (UUID: GPU-0)"\n' >"$work/fakebin/nvidia-smi"
chmod +x "$work/fakebin/nvidia-smi"
set +e
PATH=$work/fakebin:$PATH "$src/tests/gpu/run.sh" --pack "$pack" --only check,dist --models mlp --work "$work/gpu" \
  >"$work/gpu.out" 2>&1
rc=$?
set -e
tail -12 "$work/gpu.out"
[ $rc -eq 1 ] || fail "run.sh exited $rc, expected 1"
grep -q "cached GPU trainer" "$work/gpu/check.log" || fail "the GPU trainer was not taken from the pack"
grep -q "built GPU trainer" "$work/gpu/check.log" && fail "a GPU trainer was compiled"
grep -q "cached distributed trainer" "$work/gpu/dist.log" || fail "the distributed GPU trainer was not taken from the pack"
grep -q "^dist-1-rank  *mlp  *FAIL  *training gpu-dist failed (exit 5): error: this trainer runs on a cuda device" "$work/gpu.out" ||
  fail "the distributed trainer's start-up failure is not reported"
grep -q "^shard-1-rank  *mlp  *FAIL  *training gpu-dist-shard failed (exit 5): error: this trainer runs on a cuda device" \
  "$work/gpu.out" || fail "the sharded distributed trainer's start-up failure is not reported"
grep -q "^gpu-deterministic  *mlp  *FAIL  *training gpu failed (exit 5)" "$work/gpu.out" ||
  fail "the trainer's start-up failure is not reported"
grep -q "no NVIDIA driver" "$work/gpu/check.log" || fail "the trainer's message is not in the log"
grep -q "found libcudnn.so.9" "$work/gpu/setup.log" || fail "setup.log does not say where cuDNN is"

echo "== run.sh --pack --self-test --deadline 0"
"$src/tests/gpu/run.sh" --pack "$pack" --self-test --only check,dist --models mlp --work "$work/late" --deadline 0 \
  >"$work/late.out" 2>&1 || { cat "$work/late.out"; fail "run.sh --deadline 0 exited non-zero"; }
tail -5 "$work/late.out"
grep -q "^check  *mlp  *FAILED-TO-RUN  *not started: the --deadline of 0 s had passed" "$work/late.out" ||
  fail "no FAILED-TO-RUN row for the check step"
grep -q "^dist  *mlp  *FAILED-TO-RUN" "$work/late.out" || fail "no FAILED-TO-RUN row for the dist step"
grep -q "trained" "$work/late/check.log" && fail "a trainer ran after the deadline"
grep -q "2 results: 0 failed, 2 failed to run" "$work/late.out" || fail "the summary does not count them"
echo "PASS"
