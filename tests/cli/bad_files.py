"""Bad data files and bad weight files: each must be refused with a clear message (naming the
input or tensor and the file) and a non-zero exit, and a failed --save must not touch the old
file.

usage: bad_files.py NETC WORKDIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import st_load, st_save  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
failures = []
cases = 0


def npy(path, arr):
    np.save(path, arr)
    return path


def idx(path, arr, gz=False):
    codes = {np.uint8: 0x08, np.int32: 0x0C, np.float32: 0x0D}
    head = struct.pack(">BBBB", 0, 0, codes[arr.dtype.type], arr.ndim)
    head += struct.pack(">" + "I" * arr.ndim, *arr.shape)
    body = arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    if gz:
        import gzip
        with gzip.open(path, "wb") as f:
            f.write(head + body)
    else:
        with open(path, "wb") as f:
            f.write(head + body)
    return path


def expect_fail(what, cmd, *needles, env=None):
    global cases
    cases += 1
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    msg = r.stderr + r.stdout
    if r.returncode == 0 or r.returncode >= 128 or r.returncode < 0:
        failures.append(f"{what}: exit status {r.returncode} (want a clean non-zero exit)\n{msg}")
        return
    missing = [n for n in needles if n not in msg]
    if missing:
        failures.append(f"{what}: message lacks {missing}:\n{msg}")
    else:
        print(f"ok   {what}: {msg.strip().splitlines()[0] if msg.strip() else ''}")


def expect_ok(what, cmd):
    global cases
    cases += 1
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{what}: exit status {r.returncode}, want 0\n{r.stderr}{r.stdout}")
    else:
        print(f"ok   {what}")


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "mlp")
    subprocess.run([netc, os.path.join(ROOT, "models", "mlp.net"), "-o", exe, "-D", "batch=8"],
                   check=True)
    rng = np.random.default_rng(0)
    good_x = npy(f"{work}/x.npy", rng.integers(0, 255, (32, 28, 28), dtype=np.uint8))
    good_y = npy(f"{work}/y.npy", rng.integers(0, 10, (32,), dtype=np.int64))

    def train(*extra, x=good_x, y=good_y):
        return [exe, "--data", f"image={x}", "--data", f"label={y}", "--steps", "2", "--quiet", *extra]

    # data files
    expect_fail("wrong per-sample shape", train(x=npy(f"{work}/x29.npy", np.zeros((32, 28, 29), np.uint8))),
                "image", "x29.npy", "[28, 29]", "[1, 28, 28]")
    expect_fail("sample counts differ", train(y=npy(f"{work}/y31.npy", np.zeros(31, np.int64))),
                "image", "label", "31", "32")
    raw = open(good_x, "rb").read()
    with open(f"{work}/trunc.npy", "wb") as f:
        f.write(raw[: len(raw) // 2])
    expect_fail("truncated npy", train(x=f"{work}/trunc.npy"), "trunc.npy")
    with open(f"{work}/garbage.npy", "wb") as f:
        f.write(b"not a numpy file at all" * 10)
    expect_fail("bad npy magic", train(x=f"{work}/garbage.npy"), "garbage.npy")
    expect_fail("unsupported npy dtype", train(x=npy(f"{work}/c.npy", np.zeros((32, 28, 28), np.complex64))),
                "c.npy")
    imgs = rng.integers(0, 255, (32, 28, 28), dtype=np.uint8)
    idx(f"{work}/x.idx.gz", imgs, gz=True)
    blob = open(f"{work}/x.idx.gz", "rb").read()
    with open(f"{work}/corrupt.idx.gz", "wb") as f:
        f.write(blob[:20] + bytes(b ^ 0x5A for b in blob[20:60]) + blob[60:])
    expect_fail("corrupt gzip IDX", train(x=f"{work}/corrupt.idx.gz"), "corrupt.idx.gz")
    with open(f"{work}/cut.idx.gz", "wb") as f:  # loses only the gzip trailer (CRC and length)
        f.write(blob[:-4])
    expect_fail("gzip IDX without its trailer", train(x=f"{work}/cut.idx.gz"), "cut.idx.gz")
    head_only = idx(f"{work}/short.idx", imgs)
    with open(head_only, "r+b") as f:
        f.truncate(100)
    expect_fail("truncated IDX", train(x=head_only), "short.idx")
    expect_fail("missing data file", train(x=f"{work}/does-not-exist.npy"), "does-not-exist.npy")
    expect_fail("unknown input name", [exe, "--data", f"pixels={good_x}", "--data", f"label={good_y}"], "pixels")
    expect_fail("missing input", [exe, "--data", f"image={good_x}", "--steps", "1"], "label")
    expect_fail("fewer samples than a batch",
                train(x=npy(f"{work}/x4.npy", np.zeros((4, 28, 28), np.uint8)),
                      y=npy(f"{work}/y4.npy", np.zeros(4, np.int64))), "x4.npy")
    expect_fail("label out of range", train(y=npy(f"{work}/y99.npy", np.full(32, 99, np.int64))), "99")

    # weight files
    saved = f"{work}/w.safetensors"
    subprocess.run(train("--save", saved), check=True)
    w = st_load(saved)
    missing = dict(w)
    del missing["fc2.bias"]
    st_save(f"{work}/missing.safetensors", missing)
    expect_fail("--init missing tensor", train("--init", f"{work}/missing.safetensors"), "fc2.bias")
    extra = dict(w, **{"fc3.weight": np.zeros((2, 2), np.float32)})
    st_save(f"{work}/extra.safetensors", extra)
    expect_fail("--init unexpected tensor", train("--init", f"{work}/extra.safetensors"), "fc3.weight")
    wrong = dict(w, **{"fc1.weight": np.zeros((128, 783), np.float32)})
    st_save(f"{work}/shape.safetensors", wrong)
    expect_fail("--init wrong shape", train("--init", f"{work}/shape.safetensors"), "fc1.weight", "783")
    header = json.dumps({"fc1.bias": {"dtype": "F32", "shape": [128], "data_offsets": [0, 512]}})
    dup = header[:-1] + ', "fc1.bias": ' + json.dumps({"dtype": "F32", "shape": [128], "data_offsets": [0, 512]}) + "}"
    with open(f"{work}/dup.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(dup)) + dup.encode() + bytes(512))
    expect_fail("--init tensor named twice", train("--init", f"{work}/dup.safetensors"), "fc1.bias", "twice")
    blob = open(saved, "rb").read()
    with open(f"{work}/trunc.safetensors", "wb") as f:
        f.write(blob[: len(blob) - 1000])
    expect_fail("--init truncated file", train("--init", f"{work}/trunc.safetensors"), "trunc.safetensors")
    with open(f"{work}/header.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{}")
    expect_fail("--init absurd header length", train("--init", f"{work}/header.safetensors"), "header.safetensors")
    with open(f"{work}/json.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 8) + b"{not js}")
    expect_fail("--init bad JSON", train("--init", f"{work}/json.safetensors"), "json.safetensors")
    # torch.save's zip archive (PyTorch >= 1.6) and its older bare pickle are named as such
    for name, head in (("zip.pt", b"PK\x03\x04"), ("pickle.pt", b"\x80\x02")):
        with open(f"{work}/{name}", "wb") as f:
            f.write(head + bytes(64))
        expect_fail(f"--init {name}", train("--init", f"{work}/{name}"), "PyTorch pickle", "safetensors.torch")
    # ... but a safetensors file may begin with the same two bytes: a header of 0x280 bytes
    # (JSON padded with spaces, as the format allows) starts 80 02, and must load as weights
    raw = open(saved, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n <= 0x280, n
    with open(f"{work}/h640.safetensors", "wb") as f:
        f.write(struct.pack("<Q", 0x280) + raw[8:8 + n] + b" " * (0x280 - n) + raw[8 + n:])
    expect_ok("--init a safetensors file whose header is 0x280 bytes", train("--init", f"{work}/h640.safetensors"))

    # a failed save leaves the old file untouched
    ro = f"{work}/readonly"
    os.makedirs(ro, exist_ok=True)
    shutil.copy(saved, f"{ro}/w.safetensors")
    before = open(f"{ro}/w.safetensors", "rb").read()
    os.chmod(ro, 0o555)
    try:
        if os.geteuid() != 0:  # root ignores directory permissions; use a missing directory instead
            expect_fail("--save into unwritable directory", train("--save", f"{ro}/w.safetensors"), "w.safetensors")
        expect_fail("--save into missing directory", train("--save", f"{work}/no/such/dir/w.safetensors"),
                    "no/such/dir")
    finally:
        os.chmod(ro, 0o755)
    assert open(f"{ro}/w.safetensors", "rb").read() == before, "old weights changed"

    print(f"{cases} bad-input cases, {len(failures)} failed")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
