#!/bin/sh
# layouts_agree.sh NETC WORKDIR MODEL STEPS MAX_CONVERSIONS [-D ...]
#
# Layout selection keeps the program's meaning: compile MODEL (models/MODEL.net) with the
# default channels-last layout and with --layout=row-major, train both for STEPS steps from the
# same initial weights on the same synthetic batches, and require the same parameters and
# running statistics within float rounding. Also checks that the channels-last trainer really
# stores values NHWC, that it has at most MAX_CONVERSIONS layout conversions (the boundaries),
# and that no conversion sits between two channels-last operators.
set -eu
netc=$1 work=$2/layouts model=$3 steps=$4 max_conv=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
src="$root/models/$model.net"

"$netc" "$src" "$@" --dump=layout > "$work/$model-layout.txt"
/usr/bin/python3 - "$work/$model-layout.txt" "$max_conv" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
nodes = {}
for m in re.finditer(r"^  %(\d+) = (\w+)\(([^)]*)\) \S+\[[^\]]*\]( nhwc)?", text, re.M):
    nodes[int(m.group(1))] = (m.group(2), [int(a) for a in re.findall(r"%(\d+)", m.group(3))], bool(m.group(4)))
nhwc = sum(1 for op, _, c in nodes.values() if c)
conversions = [i for i, (op, _, _) in nodes.items() if op == "layout"]
assert nhwc > 0, "no channels-last values"
assert len(conversions) <= int(sys.argv[2]), f"{len(conversions)} conversions, expected at most {sys.argv[2]}"
for i in conversions:
    src = nodes.get(nodes[i][1][0])
    # a conversion's operand is never itself a conversion, and it never turns a channels-last
    # value into a channels-last one
    assert src is None or src[0] != "layout", f"%{i} converts a conversion"
    assert not (src and src[2] and nodes[i][2]), f"%{i} sits between two channels-last values"
print(f"layouts_agree: {nhwc} channels-last values, {len(conversions)} conversions")
PY

"$netc" "$src" "$@" -o "$work/$model-nhwc"
"$netc" "$src" "$@" --layout=row-major -o "$work/$model-nchw"
# The two trainers differ only in summation order (oneDNN's convolution blocking against
# im2col + SGEMM, blocked batch-norm sums): float32 rounding, ~1e-6 relative per step, grown by
# a few SGD steps through batch norm over small batches. 1e-3 is far below what a wrong index
# or a transposed tensor gives (O(1)).
result=$(/usr/bin/python3 "$here/train_pair.py" "$work/$model-data" "$steps" 1e-3 "$work/$model-nhwc" "$work/$model-nchw")
echo "layouts_agree: $model: parameters after $steps steps agree: $result"
