"""Watching a run (docs/trainer.md, "What it prints", "The JSON Lines log", "MLPerf's log"):

  terminal  under a pseudo-terminal, every log line is printed whole (the progress line never
            overwrites one), the output ends with a newline, and log lines and progress lines count
            steps alike (of the whole run)
  accuracy  a model with a metric logs its training accuracy per interval, on the terminal and in
            the JSON log, equal to the fraction the loss's own predictions get right; a model
            without one logs none
  mllog     --mllog FILE: every line is ':::MLLOG ' and a JSON object with mlperf_logging's keys,
            the events come in order, and their values agree with the JSON log; a stopped run's
            run_stop is aborted; an --mllog that names an input or a directory is refused, and a
            failed write ends the run with status 1

usage: watch_test.py CASE NETC WORKDIR
"""
import json
import os
import pty
import re
import select
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from netc_testlib import Checks, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "checkpoint", "sgd_momentum.net")
check = Checks()

NO_METRIC = """model watch_mse
const batch = 8
input x : f32[batch, 16]
input target : f32[batch, 4]
y = fc: dense(x, 4)
train {
  loss = mse(y, target)
  optimizer = sgd(0.01)
  epochs = 1
}
"""


def make(netc, work, source=MODEL, name="tr"):
    exe = os.path.join(work, name)
    r = subprocess.run([netc, source, "-o", exe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return exe


def data(work, n=400):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
    paths = [os.path.join(work, "x.npy"), os.path.join(work, "y.npy")]
    np.save(paths[0], x), np.save(paths[1], y)
    return ["--data", f"x={paths[0]}", "--data", f"label={paths[1]}",
            "--eval-data", f"x={paths[0]}", "--eval-data", f"label={paths[1]}"]


def in_pty(argv):
    """Run argv with its standard output on a pseudo-terminal; return (status, bytes written)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out


def screen_lines(out):
    """The lines a terminal shows at the end: each carriage return goes back to the start of the
    line, and what follows overwrites it character by character."""
    lines, cur, col = [], [], 0
    for ch in out.decode().replace("\r\n", "\n"):
        if ch == "\n":
            lines.append("".join(cur).rstrip())
            cur, col = [], 0
        elif ch == "\r":
            col = 0
        else:
            if col < len(cur):
                cur[col] = ch
            else:
                cur.append(ch)
            col += 1
    return lines, "".join(cur).rstrip()


def terminal(netc, work):
    exe = make(netc, work)
    log = os.path.join(work, "run.jsonl")
    # 50 steps per epoch, 3 epochs, a log line every 7: the progress line is drawn between them
    status, out = in_pty([exe, *data(work), "--log-every", "7", "--log", log])
    check(status == 0, f"terminal: exit {status}\n{out!r}")
    check(out.endswith(b"\n"), f"terminal: the output does not end with a newline: {out[-80:]!r}")
    lines, last = screen_lines(out)
    check(last == "", f"terminal: the screen ends on an unfinished line {last!r}")
    records = [json.loads(s) for s in open(log)]
    want = [f"epoch {r['epoch']} step {r['step']}/150 loss {r['loss']:.4f} accuracy {r['accuracy']:.4f}"
            for r in records if "step" in r]
    got = [s for s in lines if s.startswith("epoch ")]
    check(len(got) == len(want), f"terminal: {len(got)} step lines on the screen, {len(want)} logged\n" + "\n".join(lines))
    for g, w in zip(got, want):
        check(g.startswith(w + " lr "), f"terminal: screen line {g!r}, want {w!r} ...")
    evals = [s for s in lines if s.startswith("eval epoch")]
    check(len(evals) == 3, f"terminal: {len(evals)} evaluation lines, want 3\n" + "\n".join(lines))
    # a progress line was drawn, counted of the whole run like the log lines
    progress = re.findall(rb"\repoch (\d+) step (\d+)/(\d+)  \d+ samples/s  ETA", out)
    check(progress, f"terminal: no progress line was drawn\n{out!r}")
    check(all(total == b"150" for _, _, total in progress), f"terminal: progress counts {progress}")
    print(f"ok   terminal: {len(got)} step lines intact, {len(progress)} progress redraws, ends with a newline")
    # not a terminal: no progress line and no carriage returns
    r = subprocess.run([exe, *data(work), "--log-every", "7"], capture_output=True, timeout=300)
    check(r.returncode == 0 and b"\r" not in r.stdout and r.stdout.endswith(b"\n"), f"pipe: {r.stdout[-200:]!r}")


def accuracy(netc, work):
    exe = make(netc, work)
    log = os.path.join(work, "run.jsonl")
    # --no-shuffle and one epoch: the intervals' samples are known, so the logged accuracy can
    # be compared with the count of correct predictions that the intervals' step lines imply
    r = subprocess.run([exe, *data(work), "--no-shuffle", "--steps", "50", "--log-every", "10", "--log", log],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"accuracy: exit {r.returncode}\n{r.stderr}")
    steps = [json.loads(s) for s in open(log) if '"step"' in s]
    check(len(steps) == 5 and all("accuracy" in s for s in steps), f"accuracy: log lines {steps}")
    for s in steps:
        # 10 steps of 8 samples: a whole number of correct predictions out of 80
        n = s["accuracy"] * 80
        check(0 <= s["accuracy"] <= 1 and abs(n - round(n)) < 1e-6, f"accuracy: {s['accuracy']} is not k/80")
    check(steps[-1]["accuracy"] > steps[0]["accuracy"], f"accuracy: did not rise while training: {steps}")
    printed = re.findall(r"step \d+/50 loss [\d.]+ accuracy ([\d.]+)", r.stdout)
    check([float(a) for a in printed] == [round(s["accuracy"], 4) for s in steps],
          f"accuracy: printed {printed}, logged {[s['accuracy'] for s in steps]}")
    print(f"ok   accuracy: {[s['accuracy'] for s in steps]}")
    # a model without a metric logs no accuracy
    src = os.path.join(work, "mse.net")
    open(src, "w").write(NO_METRIC)
    exe2 = make(netc, work, src, "tr_mse")
    rng = np.random.default_rng(1)
    x, t = os.path.join(work, "mx.npy"), os.path.join(work, "mt.npy")
    np.save(x, rng.normal(size=(64, 16)).astype(np.float32)), np.save(t, rng.normal(size=(64, 4)).astype(np.float32))
    r = subprocess.run([exe2, "--data", f"x={x}", "--data", f"target={t}", "--log", log], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0 and "accuracy" not in r.stdout and "accuracy" not in open(log).read(),
          f"no metric: {r.stdout}{open(log).read()}")


KEYS = ["namespace", "time_ms", "event_type", "key", "value", "metadata"]


def mllog(netc, work):
    exe = make(netc, work)
    log, ml = os.path.join(work, "run.jsonl"), os.path.join(work, "mlperf.log")
    r = subprocess.run([exe, *data(work), "--epochs", "2", "--log", log, "--mllog", ml], capture_output=True,
                       text=True, timeout=300)
    check(r.returncode == 0, f"mllog: exit {r.returncode}\n{r.stderr}")
    events = []
    for line in open(ml):
        check(line.startswith(":::MLLOG {"), f"mllog: line {line!r}")
        e = json.loads(line[len(":::MLLOG "):])
        check(list(e) == KEYS, f"mllog: keys {list(e)}")
        check(e["event_type"] in ("INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"), f"mllog: {e}")
        check(isinstance(e["time_ms"], int) and isinstance(e["metadata"]["lineno"], int)
              and e["metadata"]["file"].endswith(".c"), f"mllog: {e}")
        events.append(e)
    times = [e["time_ms"] for e in events]
    check(times == sorted(times), "mllog: time_ms goes backwards")
    evals = [json.loads(s) for s in open(log) if '"eval"' in s]
    keys = [e["key"] for e in events]
    want = ["init_start", "global_batch_size", "opt_base_learning_rate", "train_samples", "init_stop", "run_start"]
    for epoch in (1, 2):
        want += ["epoch_start", "epoch_stop", "eval_start", "eval_accuracy", "eval_stop"]
    want += ["run_stop"]
    check(keys == want, f"mllog: events {keys}\nwant {want}")
    value = {e["key"]: e["value"] for e in events}
    check(value["global_batch_size"] == 8 and value["train_samples"] == 400 and value["opt_base_learning_rate"] == 0.05,
          f"mllog: constants {value}")
    acc = [(e["value"], e["metadata"]["epoch_num"]) for e in events if e["key"] == "eval_accuracy"]
    check(acc == [(v["accuracy"], v["epoch"]) for v in evals], f"mllog: eval_accuracy {acc}, logged {evals}")
    epochs = [e["metadata"].get("epoch_num") for e in events if e["key"].startswith("epoch_")]
    check(epochs == [1, 1, 2, 2], f"mllog: epoch_num {epochs}")
    check(events[-1]["metadata"].get("status") == "success", f"mllog: {events[-1]}")
    print(f"ok   mllog: {len(events)} events in order, eval_accuracy {acc}")
    # a stopped run ends with run_stop aborted
    r = subprocess.run([exe, *data(work), "--epochs", "2", "--mllog", ml, "--checkpoint",
                        os.path.join(work, "c.ckpt"), "--stop-at", "60"], capture_output=True, text=True, timeout=300)
    last = json.loads(open(ml).read().splitlines()[-1][len(":::MLLOG "):])
    check(r.returncode == 4 and last["key"] == "run_stop" and last["metadata"]["status"] == "aborted",
          f"mllog stopped: exit {r.returncode}, last {last}")
    # an --mllog that names an input is refused before anything is written
    x = os.path.join(work, "x.npy")
    before = open(x, "rb").read()
    r = subprocess.run([exe, *data(work), "--mllog", x], capture_output=True, text=True, timeout=300)
    check(r.returncode == 2 and "--mllog" in r.stderr and open(x, "rb").read() == before, f"mllog input: {r.stderr}")
    # a failed write (a full device) stops the run with status 1
    r = subprocess.run([exe, *data(work), "--mllog", "/dev/full"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 1 and "cannot write the MLPerf log '/dev/full'" in r.stderr, f"mllog full: {r.stderr}")
    d = os.path.join(work, "adir")
    os.makedirs(d, exist_ok=True)
    r = subprocess.run([exe, *data(work), "--mllog", d], capture_output=True, text=True, timeout=300)
    check(r.returncode == 1 and "directory" in r.stderr, f"mllog directory: {r.returncode} {r.stderr}")


if __name__ == "__main__":
    sys.exit(run_cases({"terminal": terminal, "accuracy": accuracy, "mllog": mllog}, "watch", check, sys.argv))
