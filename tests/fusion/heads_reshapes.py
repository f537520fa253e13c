"""Two rewrites that remove copies and loops from transformer steps, checked where they must and
must not apply (their values are checked elsewhere: gradcheck's attention_heads.net against
float64, tests/torch against PyTorch):

  - attention reading its heads where the projections wrote them (compiler/passes/attn_heads.c):
    GPT-2 (packed q, k, v of one product), BERT (three products, a padding mask), GPT-2 under
    LoRA: every attention and its gradient carry heads=, and no permute, slice or slice_bwd is
    left in the step, with either backend (the CPU's RtAttnView, the device kernels'
    RtKAttnView); Llama (rotary embeddings between the projections and the attention): q and k
    read as they are, v and the result in the projections' rows (heads=0,0,H), so only q's and
    k's permutes and their gradients' are left; with --no-fuse none does;
  - element-wise operators computed on a dense layer's rows (compiler/passes/reshapes.c): GPT-2's
    GELU and its gradient on [B*T, 4C], each in the epilogue group of the product before it, and
    Llama's SiLU-gated product on [B*T, intermediate]; with --no-fuse on [B, T, 4C].

    heads_reshapes.py NETC
"""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
NODE = re.compile(r"\s*%(\d+) = (\w+)(?: \"[^\"]*\")?(?:\(([^)]*)\))? \w+\[([^\]]*)\](.*)$")
GPT2 = ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=2", "-D", "n_head=2", "-D", "n_embd=64", "-D", "batch=4"]
BERT = ["-D", "n_layer=2", "-D", "seq=32", "-D", "hidden=64", "-D", "n_head=2", "-D", "intermediate=128",
        "-D", "vocab=512", "-D", "batch=2"]
LLAMA = ["-D", "n_layer=2", "-D", "seq=32", "-D", "batch=2"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def nodes(model, opts, stage):
    """[(id, op, operand ids, shape, rest of the line)] of `netc MODEL --dump=STAGE`."""
    out = subprocess.run([sys.argv[1], os.path.join(ROOT, "models", model), *opts, f"--dump={stage}"],
                         capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = NODE.match(line)
        if m:
            ins = [int(t.strip()[1:]) for t in m.group(3).split(",")] if m.group(3) else []
            shape = tuple(int(d) for d in m.group(4).split(",")) if m.group(4).strip() else ()
            found.append((int(m.group(1)), m.group(2), ins, shape, m.group(5)))
    return found


def heads(name, model, opts, layers, folds):
    for extra, want in (([], folds), (["--no-fuse"], False)):
        g = nodes(model, opts + extra, "grad")
        attn = [n for n in g if n[1].startswith("attention")]
        copies = [n for n in g if n[1] in ("permute", "slice", "slice_bwd")]
        tag = f"{name}{' --no-fuse' if extra else ''}"
        check(len(attn) == 2 * layers, f"{tag}: {len(attn)} attention nodes, forward and gradient of {layers} layers")
        if want == "v":
            check(all(re.search(r" heads=0,0,[1-9]", n[4]) for n in attn),
                  f"{tag}: every attention reads v, and only v, in place")
            permutes = [n for n in copies if n[1] == "permute"]
            check(len(permutes) == 4 * layers, f"{tag}: {len(permutes)} permutes, q's and k's and their gradients'")
        elif want:
            check(all(" heads=" in n[4] for n in attn), f"{tag}: every attention reads its heads in place")
            check(not copies, f"{tag}: no head copies left ({[n[1] for n in copies][:6]})")
        else:
            check(not any(" heads=" in n[4] for n in attn), f"{tag}: no attention reads its heads in place")
            check(len(copies) > 0, f"{tag}: the head copies are computed ({len(copies)})")


def reshapes():
    g = nodes("gpt2.net", GPT2, "fused")
    by_id = {n[0]: n for n in g}
    epilogues = {re.search(r"epilogue=(\d+)", n[4]).group(1) for n in g if n[1] == "matmul" and "epilogue=" in n[4]}
    for op in ("gelu_tanh", "gelu_tanh_grad"):
        found = [n for n in g if n[1] == op]
        check(len(found) == 2, f"gpt2: {len(found)} {op} nodes, one a layer")
        for n in found:
            group = re.search(r"group=(\d+)", n[4])
            check(n[3] == (4 * 32, 4 * 64), f"gpt2: {op} %{n[0]} on the rows {n[3]}")
            check(bool(group) and group.group(1) in epilogues, f"gpt2: {op} %{n[0]} in a product's epilogue")
            check(by_id[n[2][-1]][1] in ("add", "matmul"), f"gpt2: {op} %{n[0]} reads the product's group directly")
    g = nodes("gpt2.net", GPT2 + ["--no-fuse"], "fused")
    shapes = [n[3] for n in g if n[1] == "gelu_tanh"]
    check(shapes == [(4, 32, 4 * 64)] * 2, f"gpt2 --no-fuse: GELU on [B, T, 4C] ({shapes})")
    g = nodes("llama.net", LLAMA, "fused")
    gated = [n for n in g if n[1] == "mul" and n[3] == (2 * 32, 352)]
    check(len(gated) >= 2, f"llama: the SiLU-gated products on the rows ({len(gated)})")


def main():
    for backend in ("cpu", "cuda"):
        be = ["--backend", backend]
        tag = "" if backend == "cpu" else " cuda"
        heads("gpt2" + tag, "gpt2.net", GPT2 + be, 2, True)
        heads("gpt2 lora" + tag, "gpt2.net", GPT2 + be + ["-D", "lora_r=4"], 2, True)
        heads("bert" + tag, "bert.net", BERT + be, 2, True)
        heads("llama" + tag, "llama.net", LLAMA + be, 2, "v")
    reshapes()
    if failures:
        sys.exit(f"heads_reshapes: {len(failures)} failed")
    print("heads_reshapes: all passed")


if __name__ == "__main__":
    main()
