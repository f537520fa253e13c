#!/bin/sh
# fused_vs_unfused.sh NETC WORKDIR MODEL STEPS [-D ...]
#
# Every pass keeps the program's meaning: compile MODEL (models/MODEL.net) twice, with the
# fusion pass and with --no-fuse, train both for STEPS steps from the same initial weights on
# the same synthetic batch stream (seeded, in file order), and require the same saved
# parameters: bit-identical, since a fused loop evaluates the same float operations in the
# same order as the separate loops, only keeping intermediates in registers; or, where a
# matrix product got an epilogue (its rows computed block by block), within float rounding. Also checks that fusion did something (the fused trainer launches fewer kernels, per
# --report) and that both trainers' generated C differ.
set -eu
netc=$1 work=$2 model=$3 steps=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mkdir -p "$work"
src="$root/models/$model.net"

"$netc" "$src" "$@" -o "$work/$model-fused"
"$netc" "$src" "$@" --no-fuse -o "$work/$model-unfused"
fused=$("$netc" "$src" "$@" --report | sed -n 's/^  fused: *\([0-9]*\).*/\1/p')
unfused=$("$netc" "$src" "$@" --report | sed -n 's/^  unfused: *\([0-9]*\).*/\1/p')
[ -n "$fused" ] && [ "$fused" -lt "$unfused" ] ||
  { echo "fused_vs_unfused: $model: fusion removed no kernels ($fused vs $unfused)" >&2; exit 1; }

# synthetic data shaped like the model's inputs (read from its --help)
/usr/bin/python3 - "$work/$model-fused" "$work" "$model" <<'PY'
import re, subprocess, sys
import numpy as np
exe, work, model = sys.argv[1:]
text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
rng = np.random.default_rng(7)
for name, dt, dims in re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\]", text, re.M):
    shape = (64,) + tuple(int(d) for d in dims.split(",") if d.strip())
    arr = rng.integers(0, 10, shape) if dt == "i64" else rng.normal(size=shape) * 50
    np.save(f"{work}/{model}-{name}.npy", arr.astype(np.int64 if dt == "i64" else np.float32))
PY
args=$(ls "$work"/"$model"-*.npy | sed "s|^$work/$model-\(.*\)\.npy$|--data \1=&|")
for v in fused unfused; do
  # shellcheck disable=SC2086
  "$work/$model-$v" $args --steps "$steps" --no-shuffle --seed 3 --threads 2 --quiet \
    --save "$work/$model-$v.safetensors"
done
if cmp -s "$work/$model-fused.safetensors" "$work/$model-unfused.safetensors"; then
  echo "fused_vs_unfused: $model: $fused kernels per step fused, $unfused unfused; parameters after $steps steps identical"
  exit 0
fi
PYTHONPATH="$root/tests/tools" /usr/bin/python3 - "$work/$model-fused.safetensors" "$work/$model-unfused.safetensors" <<'PY'
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
    # Element-wise fusion alone is bit-exact; a matrix product with an epilogue runs as one
    # single-threaded OpenBLAS call per block of rows, whose kernels may sum in another order
    # than the whole-matrix call: float32 rounding (~1e-7) per step. 1e-5 after a few steps is
    # far below any real error.
    assert err <= 1e-5, f"{k}: relative difference {err:.3g}"
print(f"fused_vs_unfused: parameters agree within rounding (worst relative difference {worst:.3g}): "
      "a blocked matrix product summed in another order")
PY
echo "fused_vs_unfused: $model: $fused kernels per step fused, $unfused unfused"
