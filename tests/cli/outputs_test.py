"""Nothing a user has is ever destroyed (docs/trainer.md, "What the trainer promises"; docs/compiler.md):
every output of a trainer (--save, --checkpoint, --log) and of netc (-o, --emit-dir) is checked
against the inputs and the other outputs, replaces only a regular file, goes through a temporary
file that cannot be planted, is probed before the work starts, and reports write errors.

usage: outputs_test.py CASE NETC WORKDIR
  netc      -o or --emit-dir naming the source or netc, a trainer onto a pipe or a symbolic link,
            a planted temporary file, an unwritable -o found before the C compiler runs
  signals   SIGTERM and SIGINT while the C compiler runs: the compiler and its children stop, and
            netc's temporary directory and outputs are gone

Destinations that are not regular files are named pipes made here, never /dev/null: a netc or a
trainer without these checks, run as root, would replace a system device.
"""
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "checkpoint", "sgd_momentum.net")

failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAIL", what)
    return ok


def run(argv, cwd=None, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def expect(r, status, what, *needles):
    msg = r.stdout + r.stderr
    if not check(r.returncode == status, f"{what}: exit {r.returncode}, want {status}\n{msg}"):
        return False
    missing = [s for s in needles if s not in msg]
    if status and not missing:
        print(f"ok   {what}: {msg.strip().splitlines()[0] if msg.strip() else ''}")
    return check(not missing, f"{what}: output lacks {missing}:\n{msg}")


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


CASES = {"netc": case_netc, "signals": case_signals}


def main():
    case, netc, work = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    CASES[case](netc, work)
    print(f"outputs {case}: {checks} checks, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
