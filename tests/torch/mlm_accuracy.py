"""accuracy(logits, labels, ignore_index = -100), masked-LM accuracy as MLPerf's BERT measures it:
the correct predictions among the positions whose label is not ignored, over all of them (not a
mean of per-batch or per-sample fractions). A small model over sequences (an embedding and a dense
head, labels an i32 input: the trainer counts them in the batch it stages) trains one step from
known weights (--init) on ten samples in file order, batch 4: batches of 4, 4 and a partial 2, a
sample with no labelled position, others with one to six.

Checked against a float64 forward in numpy: the logged training accuracy of step 1 (the first
batch, the initial weights) and the evaluation accuracy (all ten samples, the saved weights after
the step), each exactly the reference's ratio of two integers. The reference's argmax is the
trainer's wherever the two largest logits are more than 1e-4 apart (float32 logits of this
size are off by ~1e-7): the test requires that of every counted position, so no near-tie can
make the two disagree.

usage: mlm_accuracy.py NETC WORK
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import Checks, st_load, st_save  # noqa: E402

check = Checks()
N, BATCH, SEQ, VOCAB, DIM = 10, 4, 6, 11, 8
MODEL = f"""model mlm_accuracy
const batch = {BATCH}, seq = {SEQ}, vocab = {VOCAB}
input x : i64[batch, seq]
input labels : i32[batch, seq]
h = emb: embedding(x, vocab, {DIM})
logits = head: dense(relu(h), vocab)
train {{
  loss = cross_entropy(logits, labels, ignore_index = -100)
  metrics = accuracy(logits, labels, ignore_index = -100)
  optimizer = sgd(0.5)
}}
"""


def logits(w, x):
    h = np.maximum(w["emb.weight"].astype(np.float64)[x], 0)
    return h @ w["head.weight"].astype(np.float64).T + w["head.bias"].astype(np.float64)


def accuracy(w, x, labels):
    """correct, counted and the smallest gap between the two largest logits at a counted position."""
    z = logits(w, x)
    at = labels != -100
    top2 = np.sort(z, axis=-1)[..., -2:]
    gap = float((top2[..., 1] - top2[..., 0])[at].min())
    return int((z.argmax(-1) == labels)[at].sum()), int(at.sum()), gap


def main():
    netc, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(2)
    x = rng.integers(0, VOCAB, (N, SEQ))
    init = {"emb.weight": rng.normal(size=(VOCAB, DIM)), "head.weight": rng.normal(size=(VOCAB, DIM)),
            "head.bias": rng.normal(size=VOCAB) * 0.1}
    init = {k: v.astype(np.float32) for k, v in init.items()}
    # about half the positions labelled, half of those with the initial model's prediction (so
    # that both accuracies are neither 0 nor 1)
    guess = np.where(rng.random((N, SEQ)) < 0.5, logits(init, x).argmax(-1), rng.integers(0, VOCAB, (N, SEQ)))
    labels = np.where(rng.random((N, SEQ)) < 0.5, guess, -100).astype(np.int32)
    labels[2] = -100  # a sample with nothing to predict
    labels[9, :] = guess[9]  # and one with every position (the partial batch's second)
    np.save(f"{work}/x.npy", x)
    np.save(f"{work}/labels.npy", labels)
    st_save(f"{work}/init.safetensors", init)
    with open(f"{work}/m.net", "w") as f:
        f.write(MODEL)
    exe = f"{work}/m"
    subprocess.run([netc, f"{work}/m.net", "-o", exe], check=True)
    data = ["--data", f"x={work}/x.npy", "--data", f"labels={work}/labels.npy", "--eval-data", f"x={work}/x.npy",
            "--eval-data", f"labels={work}/labels.npy"]
    subprocess.run([exe, *data, "--init", f"{work}/init.safetensors", "--no-shuffle", "--steps", "1",
                    "--log-every", "1", "--log", f"{work}/log.jsonl", "--save", f"{work}/after.safetensors",
                    "--quiet"], check=True)
    log = [json.loads(line) for line in open(f"{work}/log.jsonl")]
    train = next(r for r in log if not r.get("eval"))
    evals = [r for r in log if r.get("eval")]

    correct, counted, gap = accuracy(init, x[:BATCH], labels[:BATCH])
    print(f"step 1: {correct} of {counted} positions (smallest top-two gap {gap:.2e}); logged {train['accuracy']}")
    check(gap > 1e-4, f"a near-tie at a counted position ({gap:.2e}): the test's data cannot decide it")
    check(0 < correct < counted, f"step 1: {correct} of {counted} decides nothing")
    check(abs(train["accuracy"] - correct / counted) < 1e-7, f"step 1's accuracy {train['accuracy']}, want "
          f"{correct}/{counted}")
    after = st_load(f"{work}/after.safetensors")
    correct, counted, gap = accuracy(after, x, labels)
    print(f"evaluation: {correct} of {counted} positions (smallest top-two gap {gap:.2e}); logged "
          f"{evals[-1]['accuracy'] if evals else None}")
    check(gap > 1e-4, f"a near-tie at a counted position ({gap:.2e}): the test's data cannot decide it")
    check(0 < correct < counted, f"evaluation: {correct} of {counted} decides nothing")
    check(len(evals) == 1 and abs(evals[0]["accuracy"] - correct / counted) < 1e-7,
          f"evaluation accuracy {evals}, want {correct}/{counted}")
    # the per-sample mean of fractions differs here: the test tells the two apart
    per_sample = [(logits(after, x[i]).argmax(-1) == labels[i])[labels[i] != -100].mean() for i in range(N)
                  if (labels[i] != -100).any()]
    check(abs(np.mean(per_sample) - correct / counted) > 1e-3, "the data does not tell the global ratio from a mean")
    print(f"mlm_accuracy: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
