"""The classifier's backward products over the labelled rows only (compiler/passes/ignored_rows.c):
a cross-entropy with an ignore index has a zero gradient on every ignored row, so the products
that read that gradient run over the other rows, and the step keeps its value.

    ignored_rows.py NETC WORKDIR

- Where the pass applies (--dump=fused): row_order and row_compact once, and a matmul_rows for
  each product that reads the gradient (two with a trained tied decoder; one under LoRA, whose
  frozen embedding takes no gradient); none with --all-rows, and none without an ignore index
  (GPT-2).
- tests/fusion/mlm_head.net, three labels in four ignored: the default trainer and the
  --all-rows one take the first SGD step within float32 rounding of the float64 one
  (step_vs_float64.py, which says how the bound follows from PyTorch's float32). Not bit for
  bit: the weight gradient's sum runs over fewer rows, blocked differently.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

BERT = ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=1", "-D", "n_head=2", "-D", "hidden=64",
        "-D", "intermediate=128", "-D", "batch=4"]
# name, source, netc options, the products over the labelled rows
MODELS = [
    ("mlm_head", "tests/fusion/mlm_head.net", [], 2),
    ("bert", "models/bert.net", BERT, 2),
    ("bert_packed", "models/bert.net", BERT + ["-D", "packed=true"], 2),
    ("bert_lora", "models/bert.net", BERT + ["-D", "lora_r=4"], 1),
    ("gpt2", "models/gpt2.net", ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=1", "-D", "n_head=2",
                                 "-D", "n_embd=64"], 0),
]


def row_ops(netc, src, opts):
    """{op: count} of the pass's operators in the backward part of --dump=fused."""
    fused = subprocess.run([netc, os.path.join(ROOT, src), *opts, "--dump=fused"], capture_output=True, text=True,
                           check=True).stdout
    count = {}
    for line in fused.split("\nbackward:\n", 1)[1].splitlines():
        m = re.match(r"\s*%\d+ = (row_order|row_compact|matmul_rows)\(", line)
        if m:
            count[m.group(1)] = count.get(m.group(1), 0) + 1
    return count


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name, src, opts, products in MODELS:
        got = row_ops(netc, src, opts)
        want = {"row_order": 1, "row_compact": 1, "matmul_rows": products} if products else {}
        assert got == want, f"{name}: {got}, want {want}"
        assert not row_ops(netc, src, opts + ["--all-rows"]), f"{name}: --all-rows still compacts rows"
        print(f"ignored_rows: {name}: matmul_rows for {products} of the products", flush=True)
    src = os.path.join(ROOT, "tests/fusion/mlm_head.net")
    opts = ["-D", "lr=1000"]  # p - 1000 g: the step's own rounding costs ~1 ulp of g (step_vs_float64.py)
    exes = [os.path.join(work, "mlm_head"), os.path.join(work, "mlm_head-all-rows")]
    subprocess.run([netc, src, *opts, "-o", exes[0]], check=True)
    subprocess.run([netc, src, *opts, "--all-rows", "-o", exes[1]], check=True)
    subprocess.run([sys.executable, os.path.join(HERE, "step_vs_float64.py"), "--ignore", "labels=-100",
                    os.path.join(work, "step"), "1000", *exes, "--", netc, src, *opts], check=True)


if __name__ == "__main__":
    main()
