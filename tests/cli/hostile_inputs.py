"""What a hostile or careless user can feed a trainer (docs/trainer.md, "What the trainer
promises"): counts that overflow, data whose values do not fit the input's dtype or class range,
compressed files that do not match their header, and data files that change while the trainer
reads them. Each must end in a clear message naming the file or option and a non-zero exit,
never a signal, a wrong answer or exit 0.

usage: hostile_inputs.py NETC WORKDIR
"""
import os
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import bad_files  # noqa: E402
from bad_files import expect_fail, expect_ok, idx, npy  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def counts(exe, train):
    """Counts from the command line are checked before they are multiplied or narrowed."""
    expect_fail("--epochs whose step count overflows", train("--epochs", str(1 << 61)),
                "--epochs 2305843009213693952", "steps")
    expect_fail("--threads past an int", train("--threads", str((1 << 32) + 1)), "--threads 4294967297", "1024")


def gradcheck_short(exe, work, train):
    """--gradcheck on fewer samples than a batch: refused, not false failures."""
    x4 = npy(f"{work}/gx4.npy", np.zeros((4, 28, 28), np.uint8))
    y4 = npy(f"{work}/gy4.npy", np.zeros(4, np.int64))
    expect_fail("--gradcheck on less than a batch", [exe, "--data", f"image={x4}", "--data", f"label={y4}", "--gradcheck"],
                "gx4.npy", "--gradcheck", "fewer than one batch of 8")


def gzip_stream(path, head, body_chunks):
    """A gzip file of `head` and then the chunks, compressed as they come."""
    with open(path, "wb") as f:
        z = zlib.compressobj(6, zlib.DEFLATED, 31)
        f.write(z.compress(head))
        for chunk in body_chunks:
            f.write(z.compress(chunk))
        f.write(z.flush())
    return path


def gzip_idx(work, train):
    """A gzipped IDX file is inflated only as far as its header declares."""
    imgs = np.zeros((32, 28, 28), np.uint8)
    head = struct.pack(">BBBBIII", 0, 0, 8, 3, 32, 28, 28)
    # 256 MiB of zeros behind a header that declares 25 KB: refused after one byte too many
    bomb = gzip_stream(f"{work}/bomb.idx.gz", head, (bytes(1 << 20) for _ in range(256)))
    expect_fail("gzip IDX that inflates past its header", train(x=bomb), "bomb.idx.gz", "more data than", "25088")
    short = gzip_stream(f"{work}/short.idx.gz", head, [imgs.tobytes()[:-1]])
    expect_fail("gzip IDX shorter than its header", train(x=short), "short.idx.gz", "truncated", "25088")
    plain_long = idx(f"{work}/long.idx", imgs)
    with open(plain_long, "ab") as f:
        f.write(b"\0")
    expect_fail("plain IDX longer than its header", train(x=plain_long), "long.idx", "25088", "25089")
    # 255 TiB declared: the allocation fails, which is an error, not a silent exit 0
    huge = gzip_stream(f"{work}/huge.idx.gz", struct.pack(">BBBBIII", 0, 0, 8, 3, 65535, 65535, 65535),
                       [bytes(4096)])
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1")
    expect_fail("gzip IDX declaring more than memory", train(x=huge), "huge.idx.gz", "out of memory",
                env=env)
    ok = idx(f"{work}/ok.idx.gz", imgs, gz=True)
    expect_ok("gzip IDX of exactly its declared size", train(x=ok))


U8_MODEL = """model u8in
const batch = 4
input x : u8[batch, 3]
input label : i64[batch]
logits = fc: dense(f32(x) / 255, 5)
train {
  loss = cross_entropy(logits, label)
  optimizer = sgd(0.1)
}
"""


def values(netc, work, train):
    """Values the input's dtype or class range cannot hold are refused when the file is opened,
    naming the file, the sample and the value; whole floats and in-range values are converted."""
    good_y = np.arange(32) % 10
    for name, y, needles in [
            ("float label", np.where(np.arange(32) == 5, 2.9, good_y).astype(np.float32), ["sample 5", "2.9", "integer"]),
            ("negative float label", np.where(np.arange(32) == 7, -0.5, good_y), ["sample 7", "-0.5"]),
            ("NaN label", np.where(np.arange(32) == 3, np.nan, good_y).astype(np.float32), ["sample 3", "nan"]),
            ("label past the classes", np.where(np.arange(32) == 9, 10, good_y).astype(np.int64),
             ["sample 9", "the value 10", "[0, 10)"]),
            ("negative label", np.where(np.arange(32) == 0, -1, good_y).astype(np.int32), ["sample 0", "-1", "[0, 10)"])]:
        path = npy(f"{work}/{name.replace(' ', '_')}.npy", y)
        expect_fail(f"{name} (training data)", train(y=path), os.path.basename(path), "label", *needles)
    # evaluation data is checked when it is opened, before the first epoch, naming its file
    bad_eval = npy(f"{work}/eval_y99.npy", np.full(32, 99, np.int64))
    expect_fail("evaluation label past the classes", train("--eval-data", f"image={work}/x.npy",
                                                           "--eval-data", f"label={bad_eval}"),
                "eval_y99.npy", "99", "[0, 10)")
    expect_ok("whole float labels", train(y=npy(f"{work}/whole.npy", good_y.astype(np.float64))))
    # a u8 input: NaN, 300 and -1 do not fit; 0..255 in an f32 file do
    src = os.path.join(work, "u8in.net")
    with open(src, "w") as f:
        f.write(U8_MODEL)
    exe = os.path.join(work, "u8in")
    subprocess.run([netc, src, "-o", exe], check=True)
    y = npy(f"{work}/u8_y.npy", np.arange(8) % 5)

    def run_u8(x):
        return [exe, "--data", f"x={x}", "--data", f"label={y}", "--steps", "1", "--quiet"]
    pixels = np.tile(np.array([0, 128, 255], np.float32), (8, 1))
    for name, at, v, needles in [("NaN", 4, np.nan, ["nan", "u8"]), ("300", 5, 300, ["300", "[0, 255]"]),
                                 ("-1", 6, -1, ["-1", "[0, 255]"])]:
        x = pixels.copy()
        x[at, 1] = v
        path = npy(f"{work}/u8_{name}.npy", x)
        expect_fail(f"u8 input given {name}", run_u8(path), os.path.basename(path), f"sample {at}, element 1", *needles)
    expect_ok("u8 input given 0..255 as f32", run_u8(npy(f"{work}/u8_ok.npy", pixels)))


def change_while_training(exe, work, what, change, *needles):
    """Start a long run with a checkpoint, change a data file once it has logged, and expect exit 1
    with a message naming the file (never SIGBUS) and the checkpoint written."""
    bad_files.cases += 1
    rng = np.random.default_rng(1)
    x = npy(f"{work}/live_x.npy", rng.integers(0, 255, (4096, 28, 28), dtype=np.uint8))
    y = npy(f"{work}/live_y.npy", rng.integers(0, 10, (4096,), dtype=np.int64))
    log, ck = f"{work}/live.log", f"{work}/live.ckpt"
    for f in (log, ck):
        if os.path.exists(f):
            os.remove(f)
    proc = subprocess.Popen([exe, "--data", f"image={x}", "--data", f"label={y}", "--epochs", "100000",
                             "--threads", "1", "--log", log, "--log-every", "1", "--checkpoint", ck, "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (os.path.exists(log) and os.path.getsize(log)):
        time.sleep(0.01)
    change(x, y)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    msg = err + out
    missing = [n for n in needles if n not in msg]
    if proc.returncode != 1 or missing or not os.path.exists(ck) or "live.ckpt" not in msg:
        bad_files.failures.append(f"{what}: exit status {proc.returncode} (want 1), checkpoint "
                                  f"{'written' if os.path.exists(ck) else 'missing'}, message lacks {missing}:\n{msg}")
    else:
        print(f"ok   {what}: {msg.strip().splitlines()[0]}")


def changing_files(exe, work):
    def truncate_x(x, y):
        with open(x, "r+b") as f:
            f.truncate(128)  # the header only: the mapped pages are gone

    def rewrite_y(x, y):
        time.sleep(0.05)  # past the file system's timestamp granularity since the file was written
        with open(y, "r+b") as f:  # same size, new labels: seen at the next epoch
            f.seek(-8, os.SEEK_END)
            f.write(np.int64(3).tobytes())
    change_while_training(exe, work, "data file truncated while training", truncate_x, "live_x.npy")
    change_while_training(exe, work, "data file rewritten while training", rewrite_y, "live_y.npy", "changed")


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "mlp")
    subprocess.run([netc, os.path.join(ROOT, "models", "mlp.net"), "-o", exe, "-D", "batch=8"], check=True)
    rng = np.random.default_rng(0)
    good_x = npy(f"{work}/x.npy", rng.integers(0, 255, (32, 28, 28), dtype=np.uint8))
    good_y = npy(f"{work}/y.npy", rng.integers(0, 10, (32,), dtype=np.int64))

    def train(*extra, x=good_x, y=good_y):
        return [exe, "--data", f"image={x}", "--data", f"label={y}", "--steps", "2", "--quiet", *extra]

    counts(exe, lambda *extra: [a for a in train(*extra) if a not in ("--steps", "2")])
    gradcheck_short(exe, work, train)
    gzip_idx(work, train)
    values(netc, work, train)
    changing_files(exe, work)
    print(f"{bad_files.cases} hostile-input cases, {len(bad_files.failures)} failed")
    for f in bad_files.failures:
        print("FAIL", f)
    return 1 if bad_files.failures else 0


if __name__ == "__main__":
    sys.exit(main())
