#!/usr/bin/env bash
# --arch takes every architecture this NVRTC compiles for, three-digit ones too, and refuses the
# others before any work:
#   arch_check.sh NETC WORK MODEL.net
# sm_100 and sm_120 (Blackwell) give their own cubins beside sm_90's, with sm_90's PTX; sm_105,
# which no NVRTC knows, is refused with exit status 2 and the list NVRTC gives, and nothing is
# written (not the trainer, not the --emit-dir).
set -euo pipefail
netc=$1 work=$2 model=$3
name=$(basename "$model" .net)
dir=$work/arch-$name
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

"$netc" "$model" --backend cuda --arch sm_120,sm_90,sm_100 --emit-dir "$dir/src" -o "$dir/$name" 2>"$dir/err" ||
  { cat "$dir/err"; fail "--arch sm_120,sm_90,sm_100 did not compile"; }
for img in "{90, 0, cubin_90" "{100, 0, cubin_100" "{120, 0, cubin_120" "{90, 1, ptx_90"; do
  grep -qF "$img" "$dir/src/${name}_images.c" || fail "no image '$img' in the table"
done
[ "$(grep -c '^    {[1-9][0-9]*, [01], ' "$dir/src/${name}_images.c")" -eq 4 ] || fail "images beside the four expected"

set +e
"$netc" "$model" --backend cuda --arch sm_90,sm_105 --emit-dir "$dir/no-src" -o "$dir/no-$name" 2>"$dir/err105"
rc=$?
set -e
cat "$dir/err105"
[ $rc -eq 2 ] || fail "--arch sm_105 exited with $rc, expected 2"
grep -q "^netc: error: --arch: NVRTC [0-9]*\.[0-9]* cannot compile for sm_105; it compiles for sm_75, .*sm_90" \
  "$dir/err105" || fail "no clear message for sm_105"
if [ -e "$dir/no-$name" ] || [ -e "$dir/no-src" ]; then fail "netc wrote output before refusing sm_105"; fi
echo "PASS: $name"
