"""Indices that do not fit, ignored labels and tied weights, through the trainer:

  - token ids outside an embedding's table in a data file are refused when the file is loaded,
    naming the input and the value;
  - a computed index outside the table (an embedding of iota) stops the step with a message
    naming the table, the position and the value;
  - with ignore_index, labels equal to it load and train; another label outside the classes
    stops the step with a message naming it and the ignore index; a batch whose every label is
    ignored has the loss 0/0 = NaN (as PyTorch's mean over no positions) and the trainer stops
    on it with the non-finite status 3;
  - a tied parameter (weight("...")) is one tensor in the saved weight file.

usage: index_test.py NETC WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import Checks, st_load  # noqa: E402

checks = Checks()

MODEL = """model tok
const batch = 4, seq = 3, vocab = 10
input tokens : i64[batch, seq]
input targets : i64[batch, seq]
x = wte: embedding(tokens, vocab, 8, std = 0.02)
x = x + wpe: embedding(iota([batch, seq], 1), POSITIONS, 8)
h = tanh(fc: dense(x, vocab))
logits = matmul(reshape(h, [batch * seq, vocab]), weight("wte.weight"))
logits = reshape(head: dense(logits, vocab), [batch, seq, vocab])
train {
  loss = cross_entropy(logits, targets, ignore_index = -100)
  optimizer = sgd(0.1)
}
"""


def check(what, cmd, status, *needles):
    """The command exits with `status` and its output holds every needle (Checks.expect)."""
    checks.expect(subprocess.run(cmd, capture_output=True, text=True), status, what, *needles)


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    exes = {}
    for positions in (3, 2):  # 2: iota reaches 2, one row past the table
        src = os.path.join(work, f"tok{positions}.net")
        with open(src, "w") as f:
            f.write(MODEL.replace("POSITIONS", str(positions)))
        exes[positions] = os.path.join(work, f"tok{positions}")
        subprocess.run([netc, src, "-o", exes[positions]], check=True)
    rng = np.random.default_rng(0)

    def data(name, arr):
        path = os.path.join(work, f"{name}.npy")
        np.save(path, arr)
        return path

    tokens = data("tokens", rng.integers(0, 10, (8, 3)))
    targets = rng.integers(0, 10, (8, 3))
    targets[0, 1] = targets[5, 2] = -100
    good = data("targets", targets)

    def run(exe, tok=tokens, tgt=good, *extra):
        return [exes[exe], "--data", f"tokens={tok}", "--data", f"targets={tgt}", "--steps", "2", "--quiet",
                "--no-shuffle", *extra]

    out = os.path.join(work, "tied.safetensors")
    check("ignored labels train", run(3, tokens, good, "--save", out), 0)
    if os.path.exists(out):
        names = sorted(st_load(out))
        tied_once = names == ["fc.bias", "fc.weight", "head.bias", "head.weight", "wpe.weight", "wte.weight"]
        checks(tied_once, f"tied weights: the weight file holds {names}")
    bad_tokens = rng.integers(0, 10, (8, 3))
    bad_tokens[6, 1] = 10
    check("token id outside the table", run(3, data("bad_tokens", bad_tokens)), 1, "tokens", "10",
          "embedding")
    check("computed index outside the table", run(2), 1, "index 2 at position 2 (sample 0)",
          "'wpe.weight'", "outside [0, 2)")
    bad = targets.copy()
    bad[2, 0] = -5
    check("label outside the classes", run(3, tokens, data("bad_targets", bad)), 1, "label -5",
          "ignore_index -100")
    ignored = np.full((8, 3), -100)
    check("every label ignored", run(3, tokens, data("ignored", ignored)), 3, "loss is")
    print(f"index_test: {checks.count} cases, {len(checks.failures)} failed")
    sys.exit(1 if checks.failures or not checks.count else 0)


if __name__ == "__main__":
    main()
