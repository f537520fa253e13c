"""Nothing a user has is ever destroyed (docs/trainer.md, "What the trainer promises"; docs/compiler.md):
every output of a trainer (--save, --checkpoint, --log) and of netc (-o, --emit-dir) is checked
against the inputs and the other outputs, replaces only a regular file, goes through a temporary
file that cannot be planted, is probed before the work starts, and reports write errors.

usage: outputs_test.py CASE NETC WORKDIR
  trainer   outputs that are inputs or each other, outputs that are not regular files, planted
            temporary files, a path near PATH_MAX, unwritable destinations found before the first
            step, non-finite parameters at --save, a log on a full device
  netc      -o or --emit-dir naming the source or netc, a trainer onto a pipe or a symbolic link,
            a planted temporary file, an unwritable -o found before the C compiler runs
  signals   SIGTERM and SIGINT while the C compiler runs: the compiler and its children stop, and
            netc's temporary directory and outputs are gone

Destinations that are not regular files are named pipes made here, never /dev/null: a netc or a
trainer without these checks, run as root, would replace a system device.
"""
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from netc_testlib import Checks, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "checkpoint", "sgd_momentum.net")
NONFINITE = 3

check = Checks()
expect = check.expect


def run(argv, cwd=None, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def snapshot(work):
    """Every entry of work: its kind, and a regular file's bytes."""
    out = {}
    for name in sorted(os.listdir(work)):
        path = os.path.join(work, name)
        st = os.lstat(path)
        if os.path.islink(path):
            out[name] = ("link", os.readlink(path))
        elif os.path.isfile(path):
            out[name] = ("file", open(path, "rb").read())
        else:
            out[name] = ("other", st.st_mode)
    return out


def unchanged(work, before, what):
    """Check that work is as snapshot() found it, and put back what changed, so that one failure
    does not hide the cases after it."""
    after = snapshot(work)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    for name in changed:
        path = os.path.join(work, name)
        if os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)
        kind, value = before.get(name, (None, None))
        if kind == "file":
            with open(path, "wb") as f:
                f.write(value)
            os.chmod(path, 0o755)
        elif kind == "link":
            os.symlink(value, path)
        elif kind == "other" and stat.S_ISFIFO(value):
            os.mkfifo(path)
    return check(not changed, f"{what}: changed {changed}")


def temp_files(work):
    return [f for f in os.listdir(work) if ".tmp." in f]


def is_weights(path):
    """A complete safetensors file of the test model."""
    try:
        data = open(path, "rb").read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        return max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__") == len(data) - 8 - n
    except (OSError, ValueError, KeyError):
        return False


# ---- the trainer

def make_trainer(netc, work, name="tr", *defines):
    exe = os.path.join(work, name)
    cmd = [netc, MODEL, "-o", exe]
    for d in defines:
        cmd += ["-D", d]
    subprocess.run(cmd, check=True)
    return exe


def make_data(work, scale=1.0):
    rng = np.random.default_rng(0)
    x, y = os.path.join(work, f"x{scale:g}.npy"), os.path.join(work, "y.npy")
    np.save(x, (rng.standard_normal((100, 16)) * scale).astype(np.float32))
    np.save(y, rng.integers(0, 4, 100).astype(np.int64))
    return x, y


def outputs_are_inputs(exe, work, common, x, y):
    """Class 1: an output naming an input or another output is refused (status 2) before any
    work; --checkpoint naming the --resume file is the run continuing, and works."""
    w, ck = os.path.join(work, "w.st"), os.path.join(work, "c.ckpt")
    expect(run([exe, *common, "--steps", "3", "--save", w]), 0, "weights")
    expect(run([exe, *common, "--steps", "6", "--checkpoint", ck, "--stop-at", "3"]), 4, "a checkpoint at step 3")
    hard = os.path.join(work, "hardlink.npy")
    os.link(x, hard)
    sym = os.path.join(work, "symlink.npy")
    os.symlink("y.npy", sym)
    fresh = os.path.join(work, "fresh.out")
    cases = [
        (["--save", x], "--data x="), (["--checkpoint", y], "--data label="), (["--log", x], "--data x="),
        (["--save", hard], "--data x="), (["--log", sym], "--data label="),
        (["--eval-data", f"x={x}", "--eval-data", f"label={y}", "--log", os.path.join(work, "x1.npy")], "--data x="),
        (["--init", w, "--log", w], "--init"), (["--init", w, "--save", w], "--init"),
        (["--init", ck, "--checkpoint", ck], "--init"), (["--resume", ck, "--save", ck], "--resume"),
        (["--resume", ck, "--log", ck], "--resume"), (["--save", fresh, "--checkpoint", fresh], "the same file"),
        (["--save", fresh, "--log", fresh], "the same file"), (["--save", exe], "trainer's own executable"),
    ]
    for extra, needle in cases:
        before = snapshot(work)
        r = run([exe, *common, "--steps", "3", *extra])
        expect(r, 2, f"trainer {' '.join(os.path.basename(a) for a in extra)}", needle)
        check("epoch" not in r.stdout, f"{extra}: training started")
        unchanged(work, before, f"trainer {extra}")
    r = run([exe, *common, "--resume", ck, "--checkpoint", ck])
    expect(r, 0, "--resume X --checkpoint X continues the run")
    check(b'"step":"6"' in open(ck, "rb").read(), "--resume X --checkpoint X: the checkpoint is not at step 6")
    return w, ck


def not_regular(exe, work, common, w):
    """Class 1: --save and --checkpoint replace only regular files; the log is written through a
    pipe or a character device."""
    fifo, link, victim = (os.path.join(work, f) for f in ("pipe", "link.st", "victim"))
    os.mkfifo(fifo)
    with open(victim, "w") as f:
        f.write("not to be touched\n")
    os.symlink("victim", link)
    for flag in ("--save", "--checkpoint"):
        for dest, needle in [(fifo, "named pipe"), (link, "symbolic link"), (work, "directory")]:
            before = snapshot(work)
            expect(run([exe, *common, "--steps", "2", flag, dest]), 1, f"{flag} onto a {needle}", needle, dest)
            unchanged(work, before, f"{flag} onto a {needle}")
    r = run([exe, *common, "--steps", "2", "--log", "/dev/null"])
    expect(r, 0, "--log /dev/null")
    check(os.path.exists("/dev/null") and not os.path.isfile("/dev/null"), "/dev/null is no longer a device")
    lines = []
    # a daemon: a trainer that never opened the pipe must not keep the test from ending
    reader = threading.Thread(target=lambda: lines.extend(open(fifo)), daemon=True)
    reader.start()
    r = run([exe, *common, "--steps", "24", "--log-every", "12", "--log", fifo])
    reader.join(timeout=60)
    expect(r, 0, "--log into a named pipe")
    check(len(lines) == 2 and all("step" in json.loads(s) for s in lines), f"the pipe's log lines: {lines}")
    check(os.path.exists(fifo) and not os.path.isfile(fifo), "the named pipe was replaced")


def planted_temporary(exe, work, common):
    """Class 2: a symbolic link planted at the old predictable temporary name FILE.tmp.PID (the
    shell's $$ is the trainer's process id after exec) is neither followed nor removed."""
    victim = os.path.join(work, "victim")
    for flag, out in [("--save", "planted.st"), ("--checkpoint", "planted.ckpt")]:
        with open(victim, "w") as f:
            f.write("not to be touched\n")
        script = f'ln -s victim {out}.tmp.$$ && exec "$0" "$@"'
        r = subprocess.run(["sh", "-c", script, exe, *common, "--steps", "2", flag, out], cwd=work,
                           capture_output=True, text=True, timeout=300)
        expect(r, 0, f"{flag} beside a planted {out}.tmp.PID")
        path = os.path.join(work, out)
        check(open(victim, "rb").read() == b"not to be touched\n", f"{flag}: the planted link's target was written")
        check(not os.path.islink(path) and is_weights(path), f"{flag}: {out} is not a regular weight file")
        planted = [f for f in os.listdir(work) if f.startswith(out + ".tmp.")]
        check(len(planted) == 1 and os.path.islink(os.path.join(work, planted[0])),
              f"{flag}: the planted link was removed or another temporary file left: {planted}")
        for f in planted:
            os.unlink(os.path.join(work, f))


def long_path(exe, work, common):
    """Class 2: a path of 4095 bytes (the longest Linux accepts), whose FILE.tmp.PID was cut
    back to FILE itself, is saved and checkpointed like any other."""
    deep = work
    while len(deep) < 4095 - 256:
        deep = os.path.join(deep, "d" * 200)
    os.makedirs(deep)
    for flag in ("--save", "--checkpoint"):
        target = os.path.join(deep, flag[2] * (4095 - len(deep) - 1))
        assert len(target) == 4095 and len(os.path.basename(target)) <= 255, len(target)
        with open(target, "w") as f:
            f.write("the old file\n")
        expect(run([exe, *common, "--steps", "2", flag, target]), 0, f"{flag} to a 4095-byte path")
        check(is_weights(target), f"{flag} to a 4095-byte path: the file is not the new one")
        check(not temp_files(deep), f"{flag} to a 4095-byte path: temporary files left: {temp_files(deep)}")
    shutil.rmtree(os.path.join(work, "d" * 200))


def found_before_work(exe, work, common):
    """Class 6: a --save or --log that cannot be written stops the run before its first step."""
    regular = os.path.join(work, "regular-file")
    open(regular, "w").close()
    for flag, dest, needle in [("--save", os.path.join(work, "no", "dir", "w.st"), "No such file or directory"),
                               ("--save", os.path.join(regular, "w.st"), "Not a directory"),
                               ("--log", os.path.join(work, "no", "dir", "log"), "No such file or directory"),
                               ("--log", work, "directory")]:
        before = snapshot(work)
        r = run([exe, *common, "--steps", "2", flag, dest])
        expect(r, 1, f"{flag} {dest}", needle)
        check("epoch" not in r.stdout, f"{flag} {dest}: training started before the refusal")
        unchanged(work, before, f"{flag} {dest}")


def nonfinite_save(netc, work, x, y):
    """Class 6: --save refuses NaN/Inf parameters as the checkpoint does (status 3), and keeps the
    old file. Inputs of 1e35 and lr 1e6: step 1's loss is finite (about 2e34), and its update
    overflows the first layer's weights to Inf; without --checkpoint nothing else checks them."""
    exe = make_trainer(netc, work, "big_lr", "lr=1e6")
    huge, _ = make_data(work, 1e35)
    w = os.path.join(work, "nonfinite.st")
    with open(w, "w") as f:
        f.write("the old weights\n")
    r = run([exe, "--data", f"x={huge}", "--data", f"label={y}", "--threads", "1", "--steps", "1", "--save", w])
    expect(r, NONFINITE, "--save of Inf parameters", "NaN or Inf", w)
    check(open(w, "rb").read() == b"the old weights\n", "--save of Inf parameters: the old file changed")


def log_errors(exe, work, common):
    """Class 7: a log that cannot be written (/dev/full) stops the run with status 1 and says why;
    the checkpoint holds the run, which resumes."""
    ck = os.path.join(work, "full.ckpt")
    r = run([exe, *common, "--steps", "36", "--log-every", "12", "--log", "/dev/full", "--checkpoint", ck])
    expect(r, 1, "--log /dev/full", "cannot write the log '/dev/full'", "No space left on device", "--resume")
    check(os.path.isfile(ck), "--log /dev/full: no checkpoint written")
    expect(run([exe, *common, "--steps", "36", "--resume", ck, "--checkpoint", ck]), 0, "resume after the failed log")
    expect(run([exe, *common, "--steps", "2", "--log", "/dev/full"]), 1, "--log /dev/full without --checkpoint",
           "cannot write the log")
    with open("/dev/full", "w") as full:
        r = subprocess.run([exe, *common, "--steps", "12", "--log-every", "12"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    r.stdout = ""
    expect(r, 1, "standard output on /dev/full", "standard output")


def case_trainer(netc, work):
    exe = make_trainer(netc, work)
    x, y = make_data(work)
    common = ["--data", f"x={x}", "--data", f"label={y}", "--threads", "1"]
    w, ck = outputs_are_inputs(exe, work, common, x, y)
    not_regular(exe, work, common, w)
    planted_temporary(exe, work, common)
    long_path(exe, work, common)
    found_before_work(exe, work, common)
    nonfinite_save(netc, work, x, y)
    log_errors(exe, work, common)
    check(not temp_files(work), f"temporary files left: {temp_files(work)}")


# ---- netc

def case_netc(netc, work):
    src = os.path.join(work, "model")  # a source without the .net ending
    shutil.copy(MODEL, src)
    shutil.copy(MODEL, os.path.join(work, "m.c"))
    fifo, link, victim = (os.path.join(work, f) for f in ("pipe", "link", "victim"))
    os.mkfifo(fifo)
    with open(victim, "w") as f:
        f.write("not to be touched\n")
    os.symlink("victim", link)
    own_netc = os.path.join(work, "netc")  # a copy, so that a netc that replaced itself breaks no other test
    shutil.copy(netc, own_netc)
    for argv, status, needle in [
            ([src], 2, "would replace the source"), ([src, "-o", src], 2, "would replace the source"),
            (["m.c", "-o", "m", "--emit-dir", "."], 2, "would replace the .net source"),
            ([src, "-o", own_netc], 2, "netc itself"), ([src, "-o", fifo], 1, "named pipe"),
            ([src, "-o", link], 1, "symbolic link"), ([src, "-o", work], 1, "directory"),
            ([src, "-o", "no/dir/tr", "--cc", "/bin/false"], 1, "No such file or directory")]:
        before = snapshot(work)
        expect(run([own_netc, *argv], cwd=work), status, f"netc {' '.join(argv)}", needle)
        unchanged(work, before, f"netc {' '.join(argv)}")
    # a symbolic link planted at the old OUT.tmp.PID
    script = 'ln -s victim tr.tmp.$$ && exec "$0" "$@"'
    r = subprocess.run(["sh", "-c", script, netc, src, "-o", "tr", "--emit-dir", "gen"], cwd=work,
                       capture_output=True, text=True, timeout=300)
    expect(r, 0, "netc beside a planted tr.tmp.PID")
    check(open(victim, "rb").read() == b"not to be touched\n", "netc: the planted link's target was written")
    tr = os.path.join(work, "tr")
    check(not os.path.islink(tr) and os.access(tr, os.X_OK), "netc: the trainer is not a regular executable")
    expect(run([tr, "--help"]), 0, "the trainer runs")
    check(os.path.isfile(os.path.join(work, "gen", "tr.c")), "--emit-dir: no tr.c")
    temps = [f for f in os.listdir(work) if ".tmp." in f] + [f for f in os.listdir(os.path.join(work, "gen"))
                                                             if ".tmp." in f]
    check(len(temps) == 1 and os.path.islink(os.path.join(work, temps[0])),
          f"netc: the planted link was removed, or temporary files were left: {temps}")


# ---- netc stopped by a signal during the C compile

SLOW_CC = """#!/bin/sh
# a C compiler that never finishes; it and its child record their process ids
sleep 600 &
echo "$$ $!" > "$(dirname "$0")/slow_cc.pids.tmp" && mv "$(dirname "$0")/slow_cc.pids.tmp" "$(dirname "$0")/slow_cc.pids"
wait
"""


def alive(pid):
    """True while the process runs (a zombie waiting for its reaper has stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def case_signals(netc, work):
    cc = os.path.join(work, "slow_cc")
    with open(cc, "w") as f:
        f.write(SLOW_CC)
    os.chmod(cc, 0o755)
    tmp = os.path.join(work, "tmp")
    os.makedirs(tmp)
    env = dict(os.environ, TMPDIR=tmp)
    for sig in (signal.SIGTERM, signal.SIGINT):
        pids = os.path.join(work, "slow_cc.pids")
        if os.path.exists(pids):
            os.unlink(pids)
        # output to a file, not a pipe: a compiler left running would hold a pipe open
        log = open(os.path.join(work, f"netc-{sig.name}.out"), "w+")
        p = subprocess.Popen([netc, MODEL, "-o", os.path.join(work, "tr"), "--cc", cc], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        end = time.time() + 120
        while not os.path.exists(pids) and p.poll() is None and time.time() < end:
            time.sleep(0.01)
        if not check(os.path.exists(pids), f"{sig.name}: the C compiler never started"):
            p.kill()
            p.wait()
            continue
        children = [int(s) for s in open(pids).read().split()]
        p.send_signal(sig)
        p.wait(timeout=60)
        log.seek(0)
        check(p.returncode == -sig, f"{sig.name}: netc exit {p.returncode}, want -{int(sig)}\n{log.read()}")
        end = time.time() + 30  # the kernel delivers the signal at once; a loaded machine may take a while
        while any(alive(c) for c in children) and time.time() < end:
            time.sleep(0.05)
        if not check(not any(alive(c) for c in children), f"{sig.name}: the C compiler and its children still run"):
            for c in children:  # ours to stop, so the next case and ctest are not held up
                if alive(c):
                    os.kill(c, signal.SIGKILL)
        check(os.listdir(tmp) == [], f"{sig.name}: netc left {os.listdir(tmp)} in TMPDIR")
        left = [f for f in os.listdir(work) if f.startswith("tr")]
        check(left == [], f"{sig.name}: netc left {left}")
        print(f"ok   {sig.name} during the C compile: exit {p.returncode}, compiler stopped, nothing left")


CASES = {"trainer": case_trainer, "netc": case_netc, "signals": case_signals}


def main():
    return run_cases(CASES, "outputs", check, sys.argv)


if __name__ == "__main__":
    sys.exit(main())
