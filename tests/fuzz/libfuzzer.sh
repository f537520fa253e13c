#!/usr/bin/env bash
# A coverage-guided run of the front-end fuzz driver (fuzz_frontend.c) under libFuzzer, with
# AddressSanitizer and UndefinedBehaviorSanitizer (docs/testing.md).
#
#   tests/fuzz/libfuzzer.sh [--time SECONDS | --runs N] [--build-only | --no-build] BUILD_DIR
#
# BUILD_DIR is a configured and built CMake build: its tests/fuzz/netc_core.txt (written by
# tests/fuzz/CMakeLists.txt) lists the netc_core sources, the generated lexer and parser
# included, and their include folders. They are compiled with clang into
# BUILD_DIR/tests/fuzz/libfuzzer/fuzz_frontend (--build-only: then stop; --no-build: run the
# one a previous call built), which runs for --time seconds (default 40) or --runs inputs over
# the seeds: models/*.net, tests/fuzz/corpus/, tests/fuzz/regressions/ and
# tests/golden/errors/*.net. What it learns stays in BUILD_DIR/tests/fuzz/libfuzzer/corpus/ for
# the next run.
#
# Exit status 0 when nothing was found. On a crash, a sanitizer report, a hang (60 s on one
# input) or an allocation past 2 GB it prints the report, copies the input to
# tests/fuzz/regressions/libfuzzer-KIND-HASH, which the ctest fuzz_regressions replays (after
# the next cmake run), and exits 1. Needs clang with libFuzzer (Debian's clang package).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
seconds=40 runs=-1 build_step=1 run_step=1
usage="usage: $0 [--time SECONDS | --runs N] [--build-only | --no-build] BUILD_DIR"
while (($#)); do
    case $1 in
    --time) seconds=$2; shift 2 ;;
    --runs) runs=$2; seconds=0; shift 2 ;;
    --build-only) run_step=0; shift ;;
    --no-build) build_step=0; shift ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
    esac
done
(($# == 1)) || { echo "$usage" >&2; exit 2; }
build=$(cd "$1" && pwd)
list=$build/tests/fuzz/netc_core.txt
[ -f "$list" ] || { echo "libfuzzer: $list is missing: configure and build $build first" >&2; exit 2; }
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null ||
    { echo "libfuzzer: '$CLANG' not found; install Debian's clang package (scripts/setup.sh)" >&2; exit 1; }

work=$build/tests/fuzz/libfuzzer
mkdir -p "$work/obj" "$work/corpus" "$work/artifacts"

# ---- build: each netc_core source with coverage instrumentation, then the driver
build_driver() {
    flags=(-std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all)
    incs=() srcs=()
    while read -r kind path; do
        case $kind in
        inc) incs+=("-I$path") ;;
        src) srcs+=("$path") ;;
        esac
    done <"$list"
    objs=()
    for s in "${srcs[@]}"; do
        o=$work/obj/$(basename "${s%.c}").o
        objs+=("$o")
        "$CLANG" "${flags[@]}" -fsanitize=fuzzer-no-link -w "${incs[@]}" -c "$s" -o "$o" &
        # two compilers at a time
        (($(jobs -rp | wc -l) < 2)) || wait -n
    done
    wait
    "$CLANG" "${flags[@]}" -fsanitize=fuzzer "${incs[@]}" "$here/fuzz_frontend.c" "${objs[@]}" -lm \
        -o "$work/fuzz_frontend"
}
if ((build_step)); then build_driver; fi
((run_step)) || { echo "libfuzzer: built $work/fuzz_frontend"; exit 0; }
[ -x "$work/fuzz_frontend" ] || { echo "libfuzzer: $work/fuzz_frontend is missing: run with --build-only first" >&2; exit 2; }

# ---- run
rm -rf "$work/seeds" "$work/artifacts"/*
mkdir -p "$work/seeds"
cp "$root"/models/*.net "$root"/tests/golden/errors/*.net "$here"/corpus/* "$work/seeds/"
[ -d "$here/regressions" ] && cp "$here"/regressions/* "$work/seeds/" 2>/dev/null || true
# A hang is an input still running after 60 s. Under ASan, UBSan and coverage the front end is
# some 20x slower than in netc, and the slowest seed (regressions/many_params_in_loop.net, 10000
# parameters) takes 15 s on a busy two-core machine: the limit must not depend on an idle one.
args=(-timeout=60 -report_slow_units=60 -rss_limit_mb=2048 -malloc_limit_mb=2048 -close_fd_mask=2 -print_final_stats=1
      -dict="$here/netc.dict" -artifact_prefix="$work/artifacts/")
if ((runs >= 0)); then args+=(-runs="$runs"); else args+=(-max_total_time="$seconds"); fi
if ((runs >= 0)); then what="$runs inputs"; else what="$seconds s"; fi
echo "libfuzzer: $what from $(ls "$work/seeds" | wc -l) seeds and $(ls "$work/corpus" | wc -l) learnt inputs"
rc=0
"$work/fuzz_frontend" "${args[@]}" "$work/corpus" "$work/seeds" >"$work/log" 2>&1 || rc=$?
# the report and the final statistics, without the progress lines
grep -v '^#[0-9].*\(NEW\|REDUCE\|pulse\)' "$work/log" |
    sed '/Recommended dictionary/,/End of recommended dictionary/d' | tail -n 80

# ---- keep what it found
found=0
for a in "$work"/artifacts/*; do
    [ -f "$a" ] || continue
    kind=$(basename "$a" | cut -d- -f1)
    dest=$here/regressions/libfuzzer-$kind-$(sha1sum "$a" | cut -c1-12)
    mkdir -p "$here/regressions"
    cp "$a" "$dest"
    echo "libfuzzer: kept the input as ${dest#"$root"/}"
    found=1
done
if ((rc != 0 || found)); then
    echo "libfuzzer: FAILED (exit $rc); replay with: $work/fuzz_frontend INPUT"
    exit 1
fi
echo "libfuzzer: nothing found"
