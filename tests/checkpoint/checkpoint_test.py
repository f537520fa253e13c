"""Checkpoints and resuming (docs/trainer.md, "Checkpoints"): each case compiles the small models
in this folder with netc, makes their data with numpy and drives the trainers.

usage: checkpoint_test.py CASE NETC WORKDIR
  resume     runs stopped (--stop-at) and resumed several times, mid-epoch and at an epoch
             boundary, end bit-identical (`cmp`) to an uninterrupted run: SGD with momentum and a
             cosine schedule, AdamW with batchnorm and a frozen layer, dropout; a longer run
             resumed from a finished one; --init from a checkpoint
  signals    SIGTERM/SIGINT stop after the step (or evaluation) with exit status 4 and a
             checkpoint that resumes bit-identically; a second signal exits at once (128 + 15)
  kill9      kill -9 at random moments while a checkpoint is written every step: the file is
             always absent (before the first) or complete and at least as new as the log says
  bad_files  damaged, foreign and mismatched checkpoints, unwritable destinations, a NaN loss:
             a clear message naming the file, the documented exit status, no file changed

Every run uses --threads 1: the same thread count is part of what makes runs bit-identical.
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, compile_model, run_cases, st_load  # noqa: E402

META_KEYS = {"format", "netc_checkpoint", "model", "fingerprint", "optimizer", "batch", "step", "epoch",
             "batch_in_epoch", "eval_done", "total_steps", "epochs", "steps", "samples", "seed", "shuffle",
             "threads", "crc32"}
BEST_KEYS = {"best_quality", "best_epoch", "best_step"}  # once the run has evaluated
STOPPED = 4  # exit status of a run stopped before its end (signal or --stop-at)

check = Checks()
expect = check.expect


# ---- the checkpoint format, read independently of the C code

def read_checkpoint(path):
    """(tensor entries, metadata, tensor bytes) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    return header, meta, data[8 + n:]


def checkpoint_crc(body, meta):
    """CRC-32 of the tensor bytes, then of "key=value\\n" for every other metadata entry by key."""
    crc = zlib.crc32(body)
    for key in sorted(meta):
        if key != "crc32":
            crc = zlib.crc32(f"{key}={meta[key]}\n".encode(), crc)
    return f"{crc:08x}"


def verify(path):
    """The metadata of a complete, valid checkpoint; raises AssertionError otherwise."""
    try:
        header, meta, body = read_checkpoint(path)
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise AssertionError(f"{path}: {e!r}")
    keys = set(meta)
    assert META_KEYS <= keys <= META_KEYS | BEST_KEYS and keys & BEST_KEYS in (set(), BEST_KEYS), \
        f"{path}: metadata keys {sorted(meta)}"
    assert meta["netc_checkpoint"] == "1"
    assert max(t["data_offsets"][1] for t in header.values()) == len(body), f"{path}: size"
    assert checkpoint_crc(body, meta) == meta["crc32"], f"{path}: crc32"
    return meta


def rewrite(path, out, meta_changes=None, body=None):
    """Write a copy of checkpoint `path` with metadata changed and its CRC recomputed."""
    header, meta, old_body = read_checkpoint(path)
    meta.update(meta_changes or {})
    body = old_body if body is None else body
    meta["crc32"] = checkpoint_crc(body, meta)
    text = json.dumps(dict(header, __metadata__=meta)).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)


# ---- models, data and runs

def make_data(work, tag, shape, n, seed=0, nan_at=None):
    """--data arguments for n random samples of per-sample `shape` and 4 classes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + shape).astype(np.float32)
    if nan_at is not None:
        x[nan_at] = np.nan
    y = rng.integers(0, 4, n).astype(np.int64)
    xp, yp = os.path.join(work, f"{tag}_x.npy"), os.path.join(work, f"{tag}_y.npy")
    np.save(xp, x)
    np.save(yp, y)
    return [f"x={xp}", f"label={yp}"]


def args(train, evaluation=None):
    out = ["--threads", "1"]
    for a in train:
        out += ["--data", a]
    for a in evaluation or []:
        out += ["--eval-data", a]
    return out


def run(exe, *argv, timeout=120):
    return subprocess.run([exe, *argv], capture_output=True, text=True, timeout=timeout)


def same_file(a, b, what):
    same = os.path.exists(a) and os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()
    return check(same, f"{what}: {a} and {b} differ")


def temp_files(work):
    return [f for f in os.listdir(work) if ".tmp." in f]


# ---- resume: bit-identical to an uninterrupted run

# Model, per-sample shape, and settings given only to the first run: a resumed run must take
# them (the length, the seed, the order) from the checkpoint.
MODELS = [("sgd_momentum", (16,), ["--epochs", "4"]), ("adamw_bn", (2, 4, 4), ["--seed", "3", "--no-shuffle"]),
          ("dropout", (16,), ["--seed", "7"])]


def segments(exe, common, first, ck, stops, *final):
    """Run stopped at each step in `stops`, then to its end with `final` arguments."""
    for k, stop in enumerate(stops):
        given = ["--resume", ck] if k else first
        r = run(exe, *common, "--checkpoint", ck, "--checkpoint-every", "5", "--stop-at", str(stop), *given)
        expect(r, STOPPED, f"{exe} --stop-at {stop}", f"after step {stop} of", f"--resume {ck}")
        check(verify(ck)["step"] == str(stop), f"{ck}: step after --stop-at {stop}")
    return run(exe, *common, "--checkpoint", ck, "--resume", ck, *final)


def resume_model(netc, work, name, shape, first):
    exe = compile_model(netc, HERE, work, name)
    common = args(make_data(work, name, shape, 100), make_data(work, name + "_eval", shape, 20, seed=1))
    common += ["--quiet", "--log", os.path.join(work, name + ".jsonl")]
    full, full_ck = os.path.join(work, name + "_full.st"), os.path.join(work, name + "_full.ckpt")
    expect(run(exe, *common, *first, "--save", full, "--checkpoint", full_ck), 0, f"{name} uninterrupted")
    # 100 samples, batch 8: 12 steps an epoch, 36 or 48 in all. 5 and 30 are mid-epoch, 12 ends
    # epoch 1 before its evaluation, 24 ends epoch 2, 25 is the first step of epoch 3.
    for stops in ([5, 12, 30], [12, 24, 25, 35]):
        ck, out = os.path.join(work, f"{name}_seg.ckpt"), os.path.join(work, f"{name}_seg.st")
        if os.path.exists(ck):
            os.unlink(ck)
        expect(segments(exe, common, first, ck, stops, "--save", out), 0, f"{name} resumed after {stops}")
        same_file(full, out, f"{name}: weights after stops at {stops} vs uninterrupted")
        same_file(full_ck, ck, f"{name}: final checkpoint after stops at {stops} vs uninterrupted")
    # the log of the last series (its first run replaced the log, the others appended): every
    # step taken is in one training line, a stop inside an interval (25, 35) ending one
    steps = [json.loads(line)["step"] for line in open(os.path.join(work, name + ".jsonl")) if "samples_per_s" in line]
    check(steps == sorted(set(steps)) and {12, 24, 25, 35} <= set(steps),
          f"{name}: training lines of a run stopped at {stops}: after steps {steps}")
    events = [json.loads(line) for line in open(os.path.join(work, name + ".jsonl")) if '"checkpoint"' in line]
    check(all(e["step"] % 5 == 0 or e["step"] in (12, 24, 25, 30, 35, 36, 48) for e in events),
          f"{name}: --checkpoint-every 5 writes at global multiples of 5: {[e['step'] for e in events]}")
    # the final checkpoint holds the saved weights under their names, and is a weight file for --init
    saved, tensors = st_load(full), st_load(full_ck)
    check(all(np.array_equal(saved[k], tensors[k]) for k in saved), f"{name}: checkpoint tensors vs --save")
    a, b = os.path.join(work, name + "_init_a.st"), os.path.join(work, name + "_init_b.st")
    expect(run(exe, *common, *first, "--steps", "3", "--init", full_ck, "--save", a), 0, f"{name} --init checkpoint")
    expect(run(exe, *common, *first, "--steps", "3", "--init", full, "--save", b), 0, f"{name} --init weights")
    same_file(a, b, f"{name}: --init from a checkpoint vs from its weights")
    # control: the comparison can fail (another seed gives other weights)
    other = os.path.join(work, name + "_seed1.st")
    run(exe, *common, *first, "--seed", "1", "--save", other)
    check(open(other, "rb").read() != open(full, "rb").read(), f"{name}: --seed 1 gave the same weights")


def case_resume(netc, work):
    for name, shape, first in MODELS:
        resume_model(netc, work, name, shape, first)
    # a finished run resumed with a longer one equals that longer run (the step schedule does not
    # depend on the length); with a cosine schedule a different length is refused
    exe = compile_model(netc, HERE, work, "adamw_bn")
    common = args(make_data(work, "adamw_bn", (2, 4, 4), 100)) + ["--quiet"]
    ck, longer, ref = (os.path.join(work, f) for f in ("short.ckpt", "longer.st", "ref30.st"))
    expect(run(exe, *common, "--steps", "20", "--checkpoint", ck), 0, "--steps 20")
    expect(run(exe, *common, "--steps", "30", "--resume", ck, "--save", longer), 0, "resume with --steps 30")
    expect(run(exe, *common, "--steps", "30", "--save", ref), 0, "--steps 30 uninterrupted")
    same_file(ref, longer, "20 steps resumed to 30 vs 30 uninterrupted")
    expect(run(exe, *common, "--steps", "10", "--resume", ck), 2, "resume past the new length", "step 20")
    cos = compile_model(netc, HERE, work, "sgd_momentum")
    common = args(make_data(work, "sgd_momentum", (16,), 100)) + ["--quiet"]
    ck = os.path.join(work, "cos.ckpt")
    expect(run(cos, *common, "--checkpoint", ck, "--stop-at", "7"), STOPPED, "cosine --stop-at 7")
    expect(run(cos, *common, "--resume", ck, "--epochs", "5"), 2, "cosine resume with --epochs 5", "cosine", ck)
    expect(run(cos, *common, "--resume", ck, "--epochs", "3"), 0, "cosine resume with its own --epochs 3")


# ---- signals

def start(exe, *argv):
    return subprocess.Popen([exe, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_line(path, needle, proc, timeout=30):
    """Wait until the JSON Lines log at path has a line containing needle; False if the run ended."""
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and any(needle in line for line in open(path)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def signalled_run(exe, common, work, tag, needle, sig, *extra):
    """Start a run, signal it once its log shows `needle`; (exit status, output)."""
    log = os.path.join(work, tag + ".jsonl")
    p = start(exe, *common, "--log", log, *extra)
    if not check(wait_for_line(log, needle, p), f"{tag}: the run ended before it could be signalled"):
        p.kill()
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, out + err


def case_signals(netc, work):
    exe = compile_model(netc, HERE, work, "wide")
    train = make_data(work, "wide", (16,), 64)  # 8 steps an epoch
    # SIGTERM during training steps: exit 4, a checkpoint, and a resume equal to the whole run
    common = args(train) + ["--steps", "800", "--log-every", "20"]
    ck, ref, out = (os.path.join(work, f) for f in ("term.ckpt", "ref.st", "resumed.st"))
    rc, msg = signalled_run(exe, common, work, "term", '"step": 20', signal.SIGTERM, "--checkpoint", ck)
    if check(rc == STOPPED and "stopped by SIGTERM" in msg and "--resume" in msg, f"SIGTERM: exit {rc}\n{msg}"):
        step = int(verify(ck)["step"])
        check(20 <= step < 800, f"SIGTERM: checkpoint at step {step}")
        expect(run(exe, *common, "--resume", ck, "--save", out), 0, "resume after SIGTERM")
        expect(run(exe, *common, "--save", ref), 0, "uninterrupted 800 steps")
        same_file(ref, out, f"SIGTERM at step {step} and resumed vs uninterrupted")
    # SIGINT with no --checkpoint: exit 4, and it says that nothing is saved
    rc, msg = signalled_run(exe, common, work, "int", '"step": 20', signal.SIGINT)
    check(rc == STOPPED and "nothing is saved" in msg, f"SIGINT without --checkpoint: exit {rc}\n{msg}")
    # SIGTERM during an evaluation (20000 samples, the most of each epoch's time): the evaluation
    # ends, then the checkpoint; the resumed run ends as the uninterrupted one
    evaluation = make_data(work, "wide_eval", (16,), 20000, seed=1)
    common = args(train, evaluation) + ["--epochs", "4"]
    ck = os.path.join(work, "eval.ckpt")
    rc, msg = signalled_run(exe, common, work, "eval", '"eval"', signal.SIGTERM, "--checkpoint", ck)
    if check(rc == STOPPED, f"SIGTERM near an evaluation: exit {rc}\n{msg}"):
        meta = verify(ck)
        expect(run(exe, *common, "--resume", ck, "--save", out), 0, "resume after SIGTERM near an evaluation")
        expect(run(exe, *common, "--save", ref), 0, "uninterrupted 4 epochs")
        same_file(ref, out, f"SIGTERM at step {meta['step']} (eval_done {meta['eval_done']}), resumed")
    second_signal(exe, train, work)
    check(not temp_files(work), f"temporary files left: {temp_files(work)}")


def second_signal(exe, train, work):
    """A second signal during a long evaluation exits at once, with 128 + SIGTERM, leaving the
    last periodic checkpoint as it was."""
    evaluation = make_data(work, "wide_long_eval", (16,), 150000, seed=2)
    ck, log = os.path.join(work, "twice.ckpt"), os.path.join(work, "twice.jsonl")
    for attempt in range(3):  # the first signal may land in the few training steps: try again
        for f in (ck, log):
            if os.path.exists(f):
                os.unlink(f)
        p = start(exe, *args(train, evaluation), "--epochs", "50", "--checkpoint", ck, "--checkpoint-every", "8",
                  "--log", log)
        if not check(wait_for_line(log, '"eval"', p), "second signal: the run ended early"):
            p.kill()
            return
        time.sleep(0.2)  # past epoch 2's steps (a few ms), into its evaluation (about 1 s)
        before = open(ck, "rb").read()
        p.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        took = time.time() - t0
        print(f"second signal, attempt {attempt + 1}: exit {p.returncode} after {took:.3f} s")
        if p.returncode == 128 + signal.SIGTERM:
            break
    check(p.returncode == 128 + signal.SIGTERM, f"second signal: exit {p.returncode}\n{out}{err}")
    check(took < 1.0, f"second signal: the run took {took:.2f} s to exit (an evaluation takes over 1 s)")
    check(open(ck, "rb").read() == before, "second signal: the last checkpoint changed")


# ---- kill -9 while checkpoints are written

def last_logged_checkpoint(log):
    """The step of the last checkpoint the log reports as written (a killed run may leave half a line)."""
    step = None
    if os.path.exists(log):
        for line in open(log):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "checkpoint" in entry:
                step = entry["step"]
    return step


def case_kill9(netc, work, trials=20):
    exe = compile_model(netc, HERE, work, "wide")
    common = args(make_data(work, "wide", (16,), 64)) + ["--steps", "3000"]
    ck, log = os.path.join(work, "k.ckpt"), os.path.join(work, "k.jsonl")
    rng = random.Random(20261123)
    lost, mid_write, done = 0, 0, 0
    for trial in range(trials):
        resume = ["--resume", ck] if os.path.exists(ck) else []
        temps = set(temp_files(work))
        p = start(exe, *common, "--checkpoint", ck, "--checkpoint-every", "1", "--log", log, *resume)
        time.sleep(rng.uniform(0.05, 0.25))
        p.kill()
        out, err = p.communicate(timeout=60)
        if not check(p.returncode == -signal.SIGKILL, f"trial {trial}: exit {p.returncode} before the kill\n{err}"):
            break
        done += 1
        mid_write += bool(set(temp_files(work)) - temps)
        logged = last_logged_checkpoint(log)
        try:
            step = int(verify(ck)["step"]) if os.path.exists(ck) else None
        except AssertionError as e:
            step = None
            print(f"trial {trial}: invalid checkpoint: {e}")
        if logged is not None and (step is None or step < logged):
            lost += 1
            print(f"trial {trial}: the log reports step {logged} written, the file holds {step}")
    print(f"kill -9: {done} trials, {lost} lost data, {mid_write} killed while writing (a temp file left)")
    check(done == trials and lost == 0, f"kill -9: {lost} of {done} trials lost data")
    out, ref = os.path.join(work, "k.st"), os.path.join(work, "ref.st")
    expect(run(exe, *common, "--resume", ck, "--save", out), 0, "resume after the kills, beside stale temp files")
    expect(run(exe, *common, "--save", ref), 0, "uninterrupted 3000 steps")
    same_file(ref, out, f"{trials} kill -9 and resumes vs uninterrupted")


# ---- bad checkpoints and destinations

def case_bad_files(netc, work):
    exe = compile_model(netc, HERE, work, "sgd_momentum")
    train = make_data(work, "m", (16,), 100)
    common = args(train) + ["--quiet"]
    good = os.path.join(work, "good.ckpt")
    expect(run(exe, *common, "--checkpoint", good, "--stop-at", "7"), STOPPED, "the good checkpoint")
    blob = open(good, "rb").read()
    header_len = 8 + struct.unpack("<Q", blob[:8])[0]

    def bad(name, content=None, status=1, needles=(), extra=(), data=common):
        """--resume a bad file, also as its own --checkpoint: it must stay as it was."""
        path = os.path.join(work, name)
        if content is not None:
            with open(path, "wb") as f:
                f.write(content)
        before = sorted(os.listdir(work)), open(path, "rb").read() if os.path.exists(path) else None
        r = run(exe, *data, "--resume", path, "--checkpoint", path, *extra)
        expect(r, status, f"bad checkpoint {name}", path, *needles)
        after = sorted(os.listdir(work)), open(path, "rb").read() if os.path.exists(path) else None
        check(before == after, f"{name}: the files changed")

    bad("truncated.ckpt", blob[:-100], needles=["truncated"])
    bad("header-only.ckpt", blob[:header_len], needles=["truncated"])
    bad("trailing.ckpt", blob + b"\0" * 8, needles=["bytes after"])
    flipped = bytearray(blob)
    flipped[header_len + 100] ^= 0x01
    bad("flipped-tensor.ckpt", bytes(flipped), needles=["corrupt", "CRC-32"])
    at = blob.index(b'"step":"7"') + len('"step":"')
    bad("flipped-step.ckpt", blob[:at] + b"8" + blob[at + 1:], needles=["corrupt"])
    rewrite(good, os.path.join(work, "v2.ckpt"), {"netc_checkpoint": "2"})
    bad("v2.ckpt", needles=["version 2", "version 1"])
    rewrite(good, os.path.join(work, "position.ckpt"), {"step": "9"})
    bad("position.ckpt", needles=["inconsistent position"])
    # (epoch - 1) * 12 + 3 wraps around 2^64 to the recorded step 7 (100 samples, batch 8)
    rewrite(good, os.path.join(work, "wrapped.ckpt"), {"epoch": str(pow(3, -1, 1 << 62) + 1), "batch_in_epoch": "3"})
    bad("wrapped.ckpt", needles=["inconsistent position"])
    bad("text.ckpt", b"this is not a safetensors file\n" * 4, needles=["not a safetensors file"])
    bad("empty.ckpt", b"", needles=["not a safetensors file"])
    weights = os.path.join(work, "weights.st")
    expect(run(exe, *common, "--steps", "2", "--save", weights), 0, "a weight file")
    bad("weights.st", needles=["not a netc checkpoint", "--init"])
    bad("missing.ckpt", needles=["cannot open"])
    foreign_models(netc, work, exe, common, bad)
    # a good checkpoint with a command line that would change the run
    fewer = args(make_data(work, "m96", (16,), 96)) + ["--quiet"]
    for name, status, needles, extra, data in [
            ("seed.ckpt", 2, ["--seed 5", "seed 0"], ["--seed", "5"], common),
            ("order.ckpt", 2, ["--no-shuffle"], ["--no-shuffle"], common),
            ("cosine.ckpt", 2, ["cosine"], ["--epochs", "4"], common),
            ("samples.ckpt", 1, ["100 training samples", "96"], [], fewer)]:
        shutil.copy(good, os.path.join(work, name))
        bad(name, status=status, needles=needles, extra=extra, data=data)
    random_damage(exe, common, work, blob)
    destinations(exe, common, work, good)
    nan_loss(netc, work)
    usage_errors(exe, common, good)


def random_damage(exe, common, work, blob, trials=100):
    """One flipped bit anywhere (half of them in the header): refused with status 1, never a
    crash; only a flip in the spaces that pad the JSON header may go unnoticed (they mean nothing)."""
    rng = random.Random(7)
    header_end = 8 + struct.unpack("<Q", blob[:8])[0]
    padding = range(8 + len(blob[8:header_end].rstrip(b" ")), header_end)
    path, refused = os.path.join(work, "damaged.ckpt"), 0
    for trial in range(trials):
        pos = rng.randrange(header_end) if trial % 2 else rng.randrange(len(blob))
        damaged = bytearray(blob)
        damaged[pos] ^= 1 << rng.randrange(8)
        with open(path, "wb") as f:
            f.write(damaged)
        r = subprocess.run([exe, *common, "--resume", path], capture_output=True, timeout=60)
        refused += r.returncode == 1
        check(r.returncode == 1 or (r.returncode == 0 and pos in padding),
              f"bit flip at byte {pos}: exit {r.returncode}\n{r.stderr.decode(errors='replace')}")
    print(f"random damage: {trials} single-bit flips, {refused} refused")


def foreign_models(netc, work, exe, common, bad):
    """Checkpoints of another model, another batch, another build of the same model."""
    other = compile_model(netc, HERE, work, "dropout")
    run(other, *common, "--checkpoint", os.path.join(work, "other-model.ckpt"), "--steps", "2")
    bad("other-model.ckpt", needles=["model 'ckpt_dropout', not 'ckpt_sgd_momentum'"])
    for define, needles in [("batch=4", ["batch 4", "-D batch=4"]), ("lr=0.1", ["different build"])]:
        variant = compile_model(netc, HERE, work, "sgd_momentum", define)
        name = f"build-{define.replace('=', '')}.ckpt"
        run(variant, *common, "--checkpoint", os.path.join(work, name), "--steps", "2")
        bad(name, needles=needles)


def destinations(exe, common, work, good):
    """--checkpoint where nothing can be written: refused before training, nothing changed."""
    regular = os.path.join(work, "regular-file")
    open(regular, "w").close()
    cases = [os.path.join(work, "no", "such", "dir", "c.ckpt"), os.path.join(regular, "c.ckpt"), work]
    ro = os.path.join(work, "readonly")
    os.makedirs(ro, exist_ok=True)
    if os.geteuid() != 0:  # root writes into read-only directories anyway
        os.chmod(ro, 0o555)
        cases.append(os.path.join(ro, "c.ckpt"))
    try:
        for dest in cases:
            before = sorted(os.listdir(work))
            r = run(exe, *common, "--checkpoint", dest, "--resume", good)
            expect(r, 1, f"--checkpoint {dest}", dest)
            check(sorted(os.listdir(work)) == before, f"--checkpoint {dest}: files changed")
            check("resuming" not in r.stdout, f"--checkpoint {dest}: training started")
    finally:
        os.chmod(ro, 0o755)


def nan_loss(netc, work):
    """A NaN loss stops with 3 and no checkpoint after it: the last good one stays."""
    exe = compile_model(netc, HERE, work, "sgd_momentum")
    # sample 45 is in batch 6 (steps count from 1) without shuffling
    common = args(make_data(work, "nan", (16,), 100, nan_at=45)) + ["--no-shuffle", "--quiet"]
    ck = os.path.join(work, "nan.ckpt")
    expect(run(exe, *common, "--checkpoint", ck, "--checkpoint-every", "1"), 3, "NaN loss", "NaN", "step 6")
    meta = verify(ck)
    check(meta["step"] == "5", f"NaN loss at step 6: the checkpoint is at step {meta['step']}, want 5")
    r = run(exe, *common, "--resume", ck, "--checkpoint", ck)
    expect(r, 3, "NaN loss after a resume", "step 6")
    check(verify(ck)["step"] == "5", "NaN loss after a resume: the checkpoint changed")


def usage_errors(exe, common, good):
    expect(run(exe, *common, "--checkpoint-every", "5"), 2, "--checkpoint-every alone", "--checkpoint")
    expect(run(exe, *common, "--stop-at", "5"), 2, "--stop-at alone", "--checkpoint")
    expect(run(exe, *common, "--resume", good, "--init", good), 2, "--resume with --init", "--init")
    expect(run(exe, *common, "--checkpoint-every", "0", "--checkpoint", good), 2, "--checkpoint-every 0")


CASES = {"resume": case_resume, "signals": case_signals, "kill9": case_kill9, "bad_files": case_bad_files}


def main():
    return run_cases(CASES, "checkpoint", check, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
