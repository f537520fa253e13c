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
netc=$1 work=$2/layouts model=$3 steps=$4 max_conv=$5 # its own directory: fused_vs_unfused.sh lists *.npy
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
/usr/bin/python3 - "$work/$model-nhwc" "$work" "$model" <<'PY'
import re, subprocess, sys
import numpy as np
exe, work, model = sys.argv[1:]
text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
rng = np.random.default_rng(11)
for name, dt, dims in re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\]", text, re.M):
    shape = (64,) + tuple(int(d) for d in dims.split(",") if d.strip())
    arr = rng.integers(0, 10, shape) if dt == "i64" else rng.normal(size=shape) * 50
    np.save(f"{work}/{model}-{name}.npy", arr.astype(np.int64 if dt == "i64" else np.float32))
PY
args=$(ls "$work"/"$model"-*.npy | sed "s|^$work/$model-\(.*\)\.npy$|--data \1=&|")
for v in nhwc nchw; do
  # shellcheck disable=SC2086
  "$work/$model-$v" $args --steps "$steps" --no-shuffle --seed 3 --threads 2 --quiet \
    --save "$work/$model-$v.safetensors"
done
PYTHONPATH="$root/tests/tools" /usr/bin/python3 - "$work/$model-nhwc.safetensors" "$work/$model-nchw.safetensors" <<'PY'
import sys
import numpy as np
from netc_testlib import st_load
a, b = st_load(sys.argv[1]), st_load(sys.argv[2])
assert a.keys() == b.keys()
worst = 0.0
for k in a:
    x, y = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
    err = np.abs(x - y).max() / max(1.0, np.abs(y).max()) if x.size else 0.0
    worst = max(worst, err)
    # The two trainers differ only in summation order (oneDNN's convolution blocking against
    # im2col + SGEMM, blocked batch-norm sums): float32 rounding, ~1e-6 relative per step,
    # grown by a few SGD steps through batch norm over small batches. 1e-3 is far below what a
    # wrong index or a transposed tensor gives (O(1)).
    assert err <= 1e-3, f"{k}: relative difference {err:.3g}"
print(f"layouts_agree: parameters agree, worst relative difference {worst:.3g}")
PY
