"""More data (docs/trainer.md, "Data" and "Augmentation"): each case compiles the small models in
this folder, writes its files with numpy, and drives the trainers.

usage: data_test.py CASE NETC WORKDIR AUGMENT_DRIVER
  npy_gz    a .npy.gz written by numpy and gzip (format versions 1 and 2) trains to the same
            weights as the plain .npy;
            truncated, corrupt and over-long ones are refused naming the file
  csv       a CSV file (with and without a header) trains to the same weights as the same
            numbers in .npy; a bad value, a wrong column count, an empty file, a row that does
            not fit the input and a non-integer label are refused with file, line and column
  cifar     synthetic CIFAR-10 files (two concatenated) train to the same weights as the same
            images and labels in .npy; a size that is not a multiple of 3073, an input that is
            neither images nor labels, and --save naming one of the files are refused
  augment   the loader's crops and flips equal a numpy reference of the documented draws, for
            u8 and f32; with the same --init, the same seed gives identical weights and another
            seed different ones (without --augment the seed then changes nothing); a run stopped
            and resumed gives the bits of an uninterrupted one, with --augment repeated or taken
            from the checkpoint; another --augment at --resume and bad --augment are refused (2)
"""
import gzip
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, compile_model, run_cases  # noqa: E402

check = Checks()
M64 = (1 << 64) - 1


def run(exe, *argv):
    return subprocess.run([exe, "--threads", "1", "--quiet", *argv], capture_output=True, text=True, timeout=120)


def trains(exe, work, tag, *argv):
    """The saved weights' bytes of a run that must succeed."""
    out = os.path.join(work, tag + ".safetensors")
    r = run(exe, *argv, "--save", out)
    if not check(r.returncode == 0, f"{tag}: exit {r.returncode}\n{r.stderr}"):
        return None
    with open(out, "rb") as f:
        return f.read()


def refused(exe, what, argv, *needles, status=1):
    r = run(exe, *argv)
    msg = r.stderr + r.stdout
    ok = check(r.returncode == status, f"{what}: exit {r.returncode}, want {status}\n{msg}")
    missing = [n for n in needles if n not in msg]
    if ok and check(not missing, f"{what}: message lacks {missing}:\n{msg}"):
        print(f"ok   {what}: {msg.strip().splitlines()[0]}")


def save_gz(path, arr):
    with gzip.open(path, "wb") as f:
        np.save(f, arr)
    return path


def image_data(work, n=16, size=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 3, size, size)).astype(np.uint8)
    y = rng.integers(0, 10, n).astype(np.int64)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "y.npy"), y)
    return x, y


# ---- cases

def case_npy_gz(netc, work):
    exe = compile_model(netc, HERE, work, "tiny_image")
    x, y = image_data(work)
    plain = ["--data", f"image={work}/x.npy", "--data", f"label={work}/y.npy", "--steps", "4"]
    gz = ["--data", "image=" + save_gz(f"{work}/x.npy.gz", x), "--data", "label=" + save_gz(f"{work}/y.npy.gz", y),
          "--steps", "4"]
    a, b = trains(exe, work, "plain", *plain), trains(exe, work, "gz", *gz)
    check(a is not None and a == b, ".npy.gz trains to the same weights as .npy")
    with gzip.open(f"{work}/x2.npy.gz", "wb") as f:  # format version 2: a 4-byte header length
        np.lib.format.write_array(f, x, version=(2, 0))
    c = trains(exe, work, "gz2", "--data", f"image={work}/x2.npy.gz", *gz[2:])
    check(a is not None and a == c, ".npy.gz of format version 2 trains to the same weights")
    raw = open(f"{work}/x.npy.gz", "rb").read()
    mid = len(raw) // 2
    damaged = {"truncated": (raw[:mid], "truncated"), "corrupt": (raw[:mid] + bytes([raw[mid] ^ 0xFF]) + raw[mid + 1:],
                                                                  "corrupt")}
    for name, (body, why) in damaged.items():
        path = f"{work}/{name}.npy.gz"
        open(path, "wb").write(body)
        refused(exe, f"{name} .npy.gz", ["--data", f"image={path}", "--data", f"label={work}/y.npy"], "input 'image'",
                path, why)
    longer = gzip.compress(gzip.decompress(raw) + b"\0" * 8)
    open(f"{work}/long.npy.gz", "wb").write(longer)
    refused(exe, "over-long .npy.gz", ["--data", f"image={work}/long.npy.gz", "--data", f"label={work}/y.npy"],
            f"{work}/long.npy.gz", "holds more data")
    save_gz(f"{work}/shape.npy.gz", x[:, :2])
    refused(exe, ".npy.gz of the wrong shape", ["--data", f"image={work}/shape.npy.gz", "--data", f"label={work}/y.npy"],
            "[2, 8, 8]", "[3, 8, 8]")


def case_csv(netc, work):
    exe = compile_model(netc, HERE, work, "tiny_table")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1, 2, 2, 1], np.int64)
    np.save(f"{work}/x.npy", x)
    np.save(f"{work}/y.npy", y)
    np.savetxt(f"{work}/x.csv", x, delimiter=",", fmt="%.9g")
    np.savetxt(f"{work}/y.csv", y, fmt="%d")
    with open(f"{work}/xh.csv", "w") as f:
        f.write("a, b, c, d, e\r\n" + open(f"{work}/x.csv").read().replace("\n", "\r\n"))
    ref = trains(exe, work, "npy", "--data", f"x={work}/x.npy", "--data", f"label={work}/y.npy")
    got = trains(exe, work, "csv", "--data", f"x={work}/x.csv", "--data", f"label={work}/y.csv")
    hdr = trains(exe, work, "csvh", "--data", f"x={work}/xh.csv", "--data", f"label={work}/y.csv")
    check(ref is not None and ref == got, "CSV trains to the same weights as .npy")
    check(ref is not None and ref == hdr, "CSV with a header line and CRLF trains to the same weights")
    bad = {"value": ("1,2,3,4,5\n1,2,x3,4,5\n", "line 2, column 3", "'x3'"),
           "empty field": ("1,2,3,4,5\n1,,3,4,5\n", "line 2, column 2", "expected a number"),
           "columns": ("1,2,3,4,5\n1,2,3,4\n", "line 2", "4 value(s), but line 1 has 5"),
           "empty": ("", "no samples"),
           "fit": ("1,2,3,4\n1,2,3,4\n", "line 1", "4 value(s) per line", "needs 5")}
    for name, (body, *needles) in bad.items():
        path = f"{work}/bad-{name.replace(' ', '_')}.csv"
        open(path, "w").write(body)
        refused(exe, f"CSV {name}", ["--data", f"x={path}", "--data", f"label={work}/y.csv"], path, *needles)
    open(f"{work}/frac.csv", "w").write("0\n1\n2.5\n1\n")
    refused(exe, "CSV label 2.5", ["--data", f"x={work}/x.csv", "--data", f"label={work}/frac.csv"],
            "line 3, column 1", "2.5 is not an integer")


def case_cifar(netc, work):
    exe = compile_model(netc, HERE, work, "tiny_image", "size=32")
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 10, 12).astype(np.uint8)
    images = rng.integers(0, 256, (12, 3, 32, 32)).astype(np.uint8)
    records = np.concatenate([labels[:, None], images.reshape(12, -1)], axis=1)
    records[:8].tofile(f"{work}/data_batch_1.bin")
    records[8:].tofile(f"{work}/data_batch_2.bin")
    np.save(f"{work}/x.npy", images)
    np.save(f"{work}/y.npy", labels.astype(np.int64))
    files = f"cifar:{work}/data_batch_1.bin,{work}/data_batch_2.bin"
    ref = trains(exe, work, "npy", "--data", f"image={work}/x.npy", "--data", f"label={work}/y.npy", "--no-shuffle")
    got = trains(exe, work, "cifar", "--data", f"image={files}", "--data", f"label={files}", "--no-shuffle")
    check(ref is not None and ref == got, "two CIFAR-10 files train to the same weights as their .npy")
    open(f"{work}/short.bin", "wb").write(records.tobytes()[:-1])
    refused(exe, "CIFAR size not a multiple of 3073",
            ["--data", f"image=cifar:{work}/short.bin", "--data", f"label={work}/y.npy"], "short.bin", "3073",
            str(12 * 3073 - 1))
    before = open(f"{work}/data_batch_2.bin", "rb").read()
    refused(exe, "--save naming a CIFAR-10 input", ["--data", f"image={files}", "--data", f"label={files}", "--save",
                                                     f"{work}/data_batch_2.bin"], "data_batch_2.bin", status=2)
    check(open(f"{work}/data_batch_2.bin", "rb").read() == before, "a CIFAR-10 input named as --save is untouched")
    small = compile_model(netc, HERE, work, "tiny_image")
    refused(small, "CIFAR for an input of another size",
            ["--data", f"image=cifar:{work}/data_batch_1.bin", "--data", f"label={work}/y.npy"], "'image'", "3072")
    refused(exe, "CIFAR missing file", ["--data", f"image=cifar:{work}/nope.bin", "--data", f"label={work}/y.npy"],
            "nope.bin")


def mix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference(x, pad, flip, seed, epoch, samples):
    """docs/trainer.md's crop and flip with the documented draws, in numpy."""
    out = np.empty_like(x)
    c, h, w = x.shape[1:]
    for r, s in enumerate(samples):
        d = mix(mix(mix(seed ^ 0xA06) ^ epoch) ^ s)
        dy, dx = d % (2 * pad + 1), (d >> 20) % (2 * pad + 1)
        padded = np.pad(x[r], ((0, 0), (pad, pad), (pad, pad)))
        crop = padded[:, dy:dy + h, dx:dx + w]
        out[r] = crop[:, :, ::-1] if flip and (d >> 40) & 1 else crop
    return out


def driver_matches(driver, work, dtype, ops, pad, flip, seed, epoch):
    rng = np.random.default_rng(seed)
    x = (rng.integers(0, 256, (9, 3, 7, 6)) if dtype == "u8" else rng.standard_normal((9, 3, 7, 6)))
    x = x.astype(np.uint8 if dtype == "u8" else np.float32)
    samples = [int(s) for s in rng.integers(0, 50000, 9)]
    x.tofile(f"{work}/in.raw")
    subprocess.run([driver, dtype, "3", "7", "6", ops, str(seed), str(epoch), f"{work}/in.raw", f"{work}/out.raw",
                    *map(str, samples)], check=True)
    got = np.fromfile(f"{work}/out.raw", x.dtype).reshape(x.shape)
    want = reference(x, pad, flip, seed, epoch, samples)
    return np.array_equal(got, want) and not np.array_equal(got, x)


def case_augment(netc, work):
    driver = sys.argv[4]
    for dtype in ("u8", "f32"):
        for ops, pad, flip in (("crop:3,flip", 3, True), ("crop:1", 1, False), ("flip", 0, True)):
            for seed, epoch in ((0, 1), (12345678901, 7)):
                check(driver_matches(driver, work, dtype, ops, pad, flip, seed, epoch),
                      f"{dtype} {ops} seed {seed} epoch {epoch}: the loader's batch equals the numpy reference")
    exe = compile_model(netc, HERE, work, "tiny_image")
    image_data(work, n=16)
    data = ["--data", f"image={work}/x.npy", "--data", f"label={work}/y.npy", "--epochs", "3"]
    init = trains(exe, work, "init", *data, "--steps", "1")
    open(f"{work}/init.safetensors", "wb").write(init or b"")
    fixed = [*data, "--init", f"{work}/init.safetensors", "--no-shuffle"]
    aug = ["--augment", "image=crop:2,flip"]
    a1, a1b = trains(exe, work, "a1", *fixed, *aug, "--seed", "1"), trains(exe, work, "a1b", *fixed, *aug, "--seed", "1")
    a2 = trains(exe, work, "a2", *fixed, *aug, "--seed", "2")
    p1, p2 = trains(exe, work, "p1", *fixed, "--seed", "1"), trains(exe, work, "p2", *fixed, "--seed", "2")
    check(a1 is not None and a1 == a1b, "--augment: the same seed gives identical weights")
    check(a1 is not None and a1 != a2, "--augment: another seed gives different weights")
    check(p1 is not None and p1 == p2, "without --augment the seed changes nothing here (so the difference is the crops)")
    check(a1 is not None and a1 != p1, "--augment changes the weights")
    full = trains(exe, work, "full", *data, *aug, "--seed", "5")
    ckpt = f"{work}/run.ckpt"
    r = run(exe, *data, *aug, "--seed", "5", "--checkpoint", ckpt, "--stop-at", "6")
    check(r.returncode == 4, f"stopped run: exit {r.returncode}\n{r.stderr}")
    resumed = trains(exe, work, "resumed", *data, *aug, "--resume", ckpt, "--checkpoint", ckpt)
    check(full is not None and full == resumed, "--augment: a stopped and resumed run is bit-identical")
    r = run(exe, *data, *aug, "--seed", "5", "--checkpoint", ckpt, "--stop-at", "6")
    check(r.returncode == 4, f"stopped run: exit {r.returncode}\n{r.stderr}")
    refused(exe, "--resume with another --augment", [*data, "--augment", "image=flip", "--resume", ckpt],
            "image=flip", "image=crop:2,flip", ckpt, status=2)
    recorded = trains(exe, work, "recorded", *data, "--resume", ckpt)
    check(full is not None and full == recorded, "--resume without --augment takes the checkpoint's augmentation")
    refused(exe, "--augment on a label", [*data, "--augment", "label=flip"], "'label'", "rank 1", status=2)
    refused(exe, "--augment crop too large", [*data, "--augment", "image=crop:9"], "from 1 to 8", "'9'", status=2)
    refused(exe, "--augment unknown op", [*data, "--augment", "image=crop:2,flop"], "'flop'", status=2)
    refused(exe, "--augment unknown input", [*data, "--augment", "img=flip"], "no input 'img'", status=2)


CASES = {"npy_gz": case_npy_gz, "csv": case_csv, "cifar": case_cifar, "augment": case_augment}

if __name__ == "__main__":
    sys.exit(run_cases(CASES, "data", check, sys.argv))
