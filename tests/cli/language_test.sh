#!/usr/bin/env bash
# The front end's messages about -D values and the command-line spellings of issue 19:
# a refused -D value is named as coming from -D, a bad -D causes no follow-on errors,
# `-O 2` as the docs write it, and --emit-dir creating its parent folders. Also dense's
# initialisation: U(-1/sqrt(in), 1/sqrt(in)) by default, N(0, std^2) and zero biases with std.
#   language_test.sh NETC WORKDIR
set -uo pipefail
netc=$1 work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
. "$(dirname "$0")/checks.sh"

cat >"$work/drop.net" <<'NET'
model drop
const batch = 4, p = 0.5, lr = 0.1
input x : f32[batch, 8]
input label : i64[batch]
logits = fc: dense(dropout(x, p=p), 10)
train {
  loss = cross_entropy(logits, label)
  optimizer = sgd(lr)
  freeze = ["fc.bias"]
}
NET
check "-D value refused" 1 "$netc" "$work/drop.net" -D p=1.5 --check
contains "'p' of dropout must be a number in [0, 1), found 1.5 (set by -D p=1.5)"
lacks "freeze"
check "-D value of an input dimension" 1 "$netc" "$work/drop.net" -D batch=2.5 --check
contains "a dimension must be an integer, found 2.5 (set by -D batch=2.5)"
check "bad -D value" 1 "$netc" "$work/drop.net" -D lr=abc --check
contains "-D lr=abc: the value must be"
lacks "'lr' is not defined"
check "-O 2 with a space" 0 "$netc" "$work/drop.net" -O 2 --check
check "-O3" 0 "$netc" "$work/drop.net" -O3 --check
check "-O without a level" 2 "$netc" "$work/drop.net" --check -O
contains "-O needs a level"
check "-O 7" 2 "$netc" "$work/drop.net" -O 7 --check
contains "found '7'"
check "--emit-dir creates its parents" 0 "$netc" "$work/drop.net" --emit-dir "$work/gen/c/src" -o "$work/drop"
if [ -f "$work/gen/c/src/drop.c" ] && [ -x "$work/drop" ]; then passes=$((passes+1));
else echo "FAIL: --emit-dir $work/gen/c/src did not receive drop.c"; fails=$((fails+1)); fi

cat >"$work/init.net" <<'NET'
model init
const batch = 4, std = 0.5
input x : f32[batch, 16]
input label : i64[batch]
logits = fc2: dense(relu(fc1: dense(x, 8)), 10, std = std)
train {
  loss = cross_entropy(logits, label)
  optimizer = sgd(0.1)
}
NET
# the parameter table of the generated trainer: name, rank, shape, offsets, init, init_a
check "dense initialisation" 0 "$netc" "$work/init.net" --dump=c
contains '{"fc1.weight", 2, {8, 16}, 0, 0, RT_INIT_UNIFORM, 0.25f,'
contains '{"fc1.bias", 1, {8}, 128, 128, RT_INIT_UNIFORM, 0.25f,'
contains '{"fc2.weight", 2, {10, 8}, 136, 136, RT_INIT_NORMAL, 0.5f,'
contains '{"fc2.bias", 1, {10}, 216, 216, RT_INIT_ZEROS,'
check "dense std refused" 1 "$netc" "$work/init.net" -D std=-1 --check
contains "'std' of dense must be a number in [0, 1e+06], found -1 (set by -D std=-1)"
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
