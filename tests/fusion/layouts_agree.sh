#!/bin/sh
# layouts_agree.sh NETC WORKDIR MODEL MAX_CONVERSIONS [--silu] [-D ...]
#
# Layout selection keeps the program's meaning: compile MODEL (models/MODEL.net) with the
# default channels-last layout and with --layout=row-major, and require both trainers' first
# SGD step within float32 rounding of the float64 one (below). Also checks that the
# channels-last trainer really stores values NHWC, that it has at most MAX_CONVERSIONS layout conversions (the boundaries),
# and that no conversion sits between two channels-last operators.
#
# --silu checks the model with SiLU for ReLU (silu.sh), for a batch of real size, where ReLU's
# kinks make the comparison meaningless (step_vs_float64.py).
set -eu
netc=$1 work=$2/layouts model=$3 max_conv=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
src="$root/models/$model.net"
. "$here/silu.sh"

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

# Both trainers' first step against the float64 IR interpreter, each within 4x PyTorch float32's
# distance to it (step_vs_float64.py says why): the channels-last trainer runs oneDNN, the
# row-major one im2col + OpenBLAS, and both must be as accurate as PyTorch, on every CPU
# (oneDNN under the instruction set it picks for this CPU: AVX-512 where it has it).
set -- "$@" -D weight_decay=0 -D lr=1000
"$netc" "$src" "$@" -o "$work/$model-nhwc"
"$netc" "$src" "$@" --layout=row-major -o "$work/$model-nchw"
/usr/bin/python3 "$here/step_vs_float64.py" $spread "$work/$model-step" 1000 "$work/$model-nhwc" "$work/$model-nchw" \
  -- "$netc" "$src" "$@"
