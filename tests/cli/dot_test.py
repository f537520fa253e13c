"""netc --dump=dot and --dump=dot-step (docs/compiler.md, "Drawing the network"): for every model in
models/, the DOT text must be accepted by Graphviz (dot -Tsvg, which scripts/setup.sh installs),
and it must draw exactly the graph that --dump=fused prints: a node for every forward node (every
node with dot-step) but the scalar constants and the inputs and parameters nothing drawn reads,
labelled with its operator, dtype and shape and an
input's or parameter's name; an edge for every operand that is not a constant; and each fused
group as a cluster holding the group's nodes, the matrix product whose epilogue it is, and
batch-norm sums accumulated in its loop.

usage: dot_test.py CASE NETC WORKDIR   (CASE: models)
"""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from netc_testlib import Checks, run_cases  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = sorted(glob.glob(os.path.join(HERE, "..", "..", "models", "*.net")))
# GPT-2 at its real size is 12 layers of ~100 nodes each way: Graphviz takes minutes to lay it
# out (Llama's whole step at 4 layers, more than the test's time). One small layer has every
# operator of each.
DEFINES = {"gpt2.net": ["-D", "n_layer=1", "-D", "vocab=64", "-D", "seq=16", "-D", "n_embd=32", "-D", "n_head=2"],
           "llama.net": ["-D", "n_layer=1"]}
check = Checks()
NODE = re.compile(r'  %(\d+) = (\w+)(?: "([^"]*)")?(?:\(([^)]*)\))? (\w+\[[^\]]*\])(.*?)(?:   #.*)?$')


def fused_graph(netc, model, whole_step):
    """Nodes {id: (op, name, operands, dtype+shape, cluster)} of --dump=fused."""
    out = subprocess.run([netc, model, "--dump=fused", *DEFINES.get(os.path.basename(model), [])], capture_output=True, text=True, check=True).stdout
    nodes, phase = {}, None
    for line in out.splitlines():
        if line in ("forward:", "backward:"):
            phase = line
            continue
        m = NODE.match(line)
        if not m or (phase == "backward:" and not whole_step):
            continue
        i, op, name, ins, shape, rest = m.groups()
        ins = [int(x.strip()[1:]) for x in ins.split(",")] if ins else []
        k = re.search(r" (?:group|epilogue|in_group)=(\d+)", rest)
        nodes[int(i)] = (op, name, ins, shape, int(k.group(1)) if k else 0)
    return nodes


def drawn(netc, model, stage):
    """Boxes {id: label}, edges {(a, b)} and clusters {k: {ids}} of the DOT text, and the text."""
    text = subprocess.run([netc, model, f"--dump={stage}", *DEFINES.get(os.path.basename(model), [])], capture_output=True, text=True, check=True).stdout
    boxes = {int(i): lab for i, lab in re.findall(r'^  n(\d+) \[label="((?:[^"\\]|\\.)*)"', text, re.M)}
    edges = {(int(a), int(b)) for a, b in re.findall(r"^  n(\d+) -> n(\d+);$", text, re.M)}
    clusters = {}
    for k, body in re.findall(r"subgraph cluster_group(\d+) \{\n(.*?)\n  \}", text, re.S):
        clusters[int(k)] = {int(i) for i in re.findall(r"n(\d+);", body)}
    return boxes, edges, clusters, text


def models(netc, work):
    check(len(MODELS) >= 4, f"models: {MODELS}")
    for model in MODELS:
        base = os.path.basename(model)
        for stage in ("dot", "dot-step"):
            want = fused_graph(netc, model, stage == "dot-step")
            boxes, edges, clusters, text = drawn(netc, model, stage)
            ids = {i for i, n in want.items() if n[0] != "const"}
            read = {a for i in ids for a in want[i][2]}
            ids -= {i for i in ids if want[i][0] in ("input", "param") and i not in read}
            check(set(boxes) == ids, f"{base} {stage}: boxes {sorted(set(boxes) ^ ids)} differ from --dump=fused")
            for i in ids & set(boxes):
                op, name, _, shape, _ = want[i]
                lab = boxes[i].split("\\n")
                stored = re.sub(r" (nhwc|order=[0-9,]+)$", "", lab[1])  # the layout, when not row-major
                ok = lab[0].split(" ")[0] == op and stored == shape and (not name or lab[2] == name)
                check(ok, f"{base} {stage}: node {i} is {boxes[i]!r}, want {op} {shape} {name or ''}")
            want_edges = {(a, i) for i in ids for a in want[i][2] if want[a][0] != "const"}
            check(edges == want_edges, f"{base} {stage}: edges differ by {sorted(edges ^ want_edges)[:8]}")
            groups = {}
            for i in ids:
                if want[i][4]:
                    groups.setdefault(want[i][4], set()).add(i)
            check(clusters == groups, f"{base} {stage}: clusters {clusters} want {groups}")
            svg = os.path.join(work, f"{base}.{stage}.svg")
            r = subprocess.run(["dot", "-Tsvg", "-o", svg], input=text, capture_output=True, text=True, timeout=300)
            check(r.returncode == 0 and r.stderr == "" and os.path.getsize(svg) > 1000,
                  f"{base} {stage}: dot -Tsvg: exit {r.returncode} {r.stderr}")
            print(f"ok   {base} --dump={stage}: {len(boxes)} nodes, {len(edges)} edges, {len(clusters)} clusters")
    r = subprocess.run([netc, MODELS[0], "--dump=dots"], capture_output=True, text=True)
    check(r.returncode == 2 and "dot-step" in r.stderr, f"--dump=dots: exit {r.returncode} {r.stderr}")


if __name__ == "__main__":
    sys.exit(run_cases({"models": models}, "dot", check, sys.argv))
