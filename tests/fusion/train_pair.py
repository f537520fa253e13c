"""Train two compiled variants of one model on the same synthetic data and compare their saved
parameters (tests/gpu/gpu_check.py uses its data).

    train_pair.py WORKDIR STEPS TOLERANCE TRAINER_A TRAINER_B

Writes 64 samples shaped like the model's inputs (read from TRAINER_A --help; floats N(0, 50^2)
in the input's type, u8 inputs 0..255, other integer inputs 0..9) to WORKDIR, trains both trainers for STEPS steps from the same initial
weights (--seed 3, no shuffling), and requires every saved tensor to agree: bit for bit when
TOLERANCE is 0, else within TOLERANCE relative to max(1, the tensor's largest magnitude). Prints
"identical" or the worst relative difference.
"""
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from netc_testlib import st_load  # noqa: E402


NPY_TYPES = {"f32": np.float32, "f16": np.float16, "i64": np.int64, "i32": np.int32, "u8": np.uint8}


def write_data(exe, work):
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    rng = np.random.default_rng(7)
    args = []
    for name, dt, dims, classes in re.findall(r"^  (\w+) +(\w+)\[([^\]]*)\](?:  indices in \[0, (\d+)\))?",
                                              text, re.M):
        shape = (64,) + tuple(int(d) for d in dims.split(",") if d.strip())
        if dt not in NPY_TYPES:
            raise ValueError(f"{exe}: input {name} has type {dt}, which write_data does not know")
        if dt == "u8" and not classes:
            arr = rng.integers(0, 256, shape)  # pixels, or a boolean mask (0: left out)
        elif dt in ("i64", "i32", "u8"):
            arr = rng.integers(0, min(10, int(classes)) if classes else 10, shape)  # an index input: its classes
        else:
            arr = rng.normal(size=shape) * 50
        path = os.path.join(work, f"data-{name}.npy")
        np.save(path, arr.astype(NPY_TYPES[dt]))
        args += ["--data", f"{name}={path}"]
    return args


def train_and_save(exe, data, steps, out, *extra):
    """Train `steps` steps on `data` (write_data's arguments) in file order with seed 3 and 2
    threads, and save the parameters to `out`; `extra` are more trainer options."""
    subprocess.run([exe, *data, "--steps", str(steps), "--no-shuffle", "--seed", "3", "--threads", "2", "--quiet",
                    "--save", out, *extra], check=True)


def saved_by_variant(netc, src, opts, variants, work, name, steps=3):
    """Compile `src` with the netc options `opts` plus each entry of `variants` (a list of more
    options each), train each trainer `steps` steps from the same weights on the same data
    (write_data's for the first) and return the bytes each saved, in the order of `variants`."""
    saved, data = [], None
    for k, extra in enumerate(variants):
        exe = os.path.join(work, f"{name}-{k}")
        subprocess.run([netc, src, *opts, *extra, "-o", exe], check=True)
        data = data or write_data(exe, work)  # the variants change no input
        out = exe + ".safetensors"
        train_and_save(exe, data, steps, out)
        saved.append(open(out, "rb").read())
    return saved


def main():
    work, steps, tol, exe_a, exe_b = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
    os.makedirs(work, exist_ok=True)
    data = write_data(exe_a, work)
    saved = []
    for exe in (exe_a, exe_b):
        out = exe + ".safetensors"
        train_and_save(exe, data, steps, out)
        saved.append(out)
    a, b = st_load(saved[0]), st_load(saved[1])
    assert a.keys() == b.keys(), "the two trainers saved different tensors"
    worst = 0.0
    for k in a:
        x, y = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
        err = np.abs(x - y).max() / max(1.0, np.abs(y).max()) if x.size else 0.0
        worst = max(worst, err)
        assert err <= tol, f"{k}: relative difference {err:.3g} (tolerance {tol:g})"
    print("identical" if worst == 0 else f"worst relative difference {worst:.3g}")


if __name__ == "__main__":
    main()
