"""gpu_check.py's time limits, without a GPU: a run that hangs is killed with everything it
started and reported as a FAIL naming the command; a run asked for after the deadline does not
start and is FAILED-TO-RUN. (run.sh's --deadline rows: tests/relocate/gpu_pack_selftest.sh.)"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): it has ended
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def main():
    failures = []

    def check(cond, what):
        print(("ok: " if cond else "FAIL: ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        pidfile = os.path.join(tmp, "child")
        # a "trainer" that hangs, and a child of it that would outlive a kill of its parent alone
        hang = ["sh", "-c", f"sleep 300 & echo $! >{pidfile}; echo started; wait"]
        gpu_check.limits.update(timeout=2.0, deadline=None)
        t0 = time.time()
        try:
            gpu_check.run(hang, "training hung")
            check(False, "a hanging run raises CheckFailed")
        except gpu_check.CheckFailed as e:
            took = time.time() - t0
            msg = str(e)
            check("timed out" in msg and "killed after 2 s" in msg, f"the message says it timed out: {msg!r}")
            check("sleep 300" in msg, "the message names the command")
            check("started" in msg, "the message keeps the run's last output")
            check(gpu_check.failed(e) == "FAIL", "a hang is a FAIL")
            # 2 s limit; the rest is process start and the kill (generous: CI machines are busy)
            check(took < 30, f"killed near its limit ({took:.1f} s)")
        child = int(open(pidfile).read())
        for _ in range(50):
            if not alive(child):
                break
            time.sleep(0.1)
        check(not alive(child), "the hung run's child process was killed too")

        # a run that ends in time is untouched by the limit
        out, _ = gpu_check.run(["sh", "-c", "echo fine"], "quick")
        check(out.stdout.strip() == "fine", "a quick run's output is returned")

        # past the deadline nothing starts
        gpu_check.limits.update(timeout=60.0, deadline=time.time() - 1)
        marker = os.path.join(tmp, "ran")
        try:
            gpu_check.run(["touch", marker], "training late")
            check(False, "a run after the deadline raises")
        except gpu_check.CheckFailed as e:
            check(isinstance(e, gpu_check.DeadlinePassed), "it raises DeadlinePassed")
            check(gpu_check.failed(e) == "FAILED-TO-RUN", "its row is FAILED-TO-RUN")
            check(not os.path.exists(marker), "the command did not run")

        # a deadline nearer than the timeout shortens it
        gpu_check.limits.update(timeout=60.0, deadline=time.time() + 3)
        t0 = time.time()
        try:
            gpu_check.run(["sleep", "300"], "training near the deadline")
            check(False, "a run past the deadline raises")
        except gpu_check.CheckFailed as e:
            check("timed out" in str(e) and time.time() - t0 < 30, "the deadline cut the run short")
    print("PASS" if not failures else f"{len(failures)} checks failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
