"""Where the CUDA backend permutes convolution filters (compiler/passes/layout.c, autocast.c).

    filter_layout.py NETC MODEL.net [-D ...]

cuDNN's channels-last convolutions take the filter channels-last (KRSC), and the runtime passes
it straight to cuDNN (runtime/cuda/rt_cuda_conv.c), so the generated step must permute it. In
`--backend cuda --dump=layout`:
  - every channels-last conv2d and conv2d_bwd_data reads its filter KRSC (`filter=krsc`): a
    `layout` conversion of the weight, one per weight shared by both convolutions, or the
    weight itself where both orders are the same bytes (one input channel per group, or 1x1);
  - every channels-last conv2d_bwd_filter (`nhwc`) of a parameter is converted back, and the
    conversion is the parameter's gradient;
  - under --precision bf16 each of those conversions is the bf16 cast itself: no `layout` node
    reads a weight or a filter gradient (one kernel permutes and rounds).
With the CPU backend nothing changes: no `filter=krsc`, no channels-last filter gradient.
"""
import re
import subprocess
import sys

NODE = re.compile(r"^\s+%(\d+) = (\w+)(?: \"[^\"]*\")?(?:\(([^)]*)\))? (\w+)\[([^\]]*)\](.*?)(?:\s+#.*)?$")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def dump(netc, args):
    out = subprocess.run([netc] + args + ["--dump=layout"], capture_output=True, text=True, check=True).stdout
    nodes, grads = {}, {}
    for line in out.splitlines():
        m = NODE.match(line)
        if m:
            nid, op, ins, dtype, shape, rest = m.groups()
            nodes[int(nid)] = dict(op=op, ins=[int(x[1:]) for x in ins.split(", ")] if ins else [], dtype=dtype,
                                   shape=[int(x) for x in shape.split(", ")] if shape else [], nhwc=" nhwc" in rest,
                                   krsc="filter=krsc" in rest)
        m = re.match(r"param (\S+) = %(\d+).*?(?:grad %(\d+))?$", line)
        if m and m.group(3):
            grads[int(m.group(3))] = m.group(1)
    return nodes, grads


def same_bytes(shape):
    return shape[1] == 1 or shape[2] * shape[3] == 1


def main():
    netc, model, defs = sys.argv[1], sys.argv[2], sys.argv[3:]
    nodes, _ = dump(netc, [model] + defs)
    check(not any(n["krsc"] for n in nodes.values()), "cpu: a convolution reads a KRSC filter")
    check(not any(n["op"] == "conv2d_bwd_filter" and n["nhwc"] for n in nodes.values()),
          "cpu: a channels-last filter gradient")

    nodes, grads = dump(netc, [model, "--backend", "cuda"] + defs)
    convs = [(i, n) for i, n in nodes.items() if n["op"] in ("conv2d", "conv2d_bwd_data") and n["nhwc"]]
    check(convs, "cuda: no channels-last convolution to check")
    copies = {}
    for i, n in convs:
        w = nodes[n["ins"][1]]
        check(n["krsc"], f"cuda: %{i} {n['op']} is channels-last with a KCRS filter")
        if w["op"] == "layout":
            check(w["nhwc"] and nodes[w["ins"][0]]["op"] == "param", f"cuda: %{i} reads a filter converted from "
                  f"{nodes[w['ins'][0]]['op']}")
            copies.setdefault(w["ins"][0], set()).add(n["ins"][1])
        else:
            check(w["op"] == "param" and same_bytes(w["shape"]), f"cuda: %{i} reads a {w['op']} {w['shape']} as KRSC")
    check(all(len(c) == 1 for c in copies.values()), "cuda: a weight permuted more than once per step")
    bwd = [i for i, n in nodes.items() if n["op"] == "conv2d_bwd_filter" and n["nhwc"]]
    check(bwd, "cuda: no channels-last filter gradient")
    for i in bwd:
        back = [j for j, n in nodes.items() if n["ins"] == [i]]
        check(len(back) == 1 and nodes[back[0]]["op"] == "layout" and not nodes[back[0]]["nhwc"] and back[0] in grads,
              f"cuda: the KRSC filter gradient %{i} is not converted into a parameter's gradient")

    nodes, grads = dump(netc, [model, "--backend", "cuda", "--precision", "bf16"] + defs)
    for i, n in nodes.items():
        if n["op"] == "layout":
            x = nodes[n["ins"][0]]
            check(x["op"] not in ("param", "conv2d_bwd_filter"), f"bf16: %{i} permutes a {x['op']} without casting")
    casts = [n for n in nodes.values() if n["op"] == "cast" and nodes[n["ins"][0]]["op"] == "param" and n["nhwc"]]
    check(len(casts) == len(copies), f"bf16: {len(casts)} weights cast to KRSC bf16, float32 permutes {len(copies)}")
    back = [n for n in nodes.values() if n["op"] == "cast" and nodes[n["ins"][0]]["op"] == "conv2d_bwd_filter"
            and nodes[n["ins"][0]]["nhwc"] and not n["nhwc"] and n["dtype"] == "f32"]
    check(len(back) == len(bwd), f"bf16: {len(back)} filter gradients cast back to KCRS float32, float32 has {len(bwd)}")
    if failures:
        sys.exit(f"{len(failures)} filter layout checks failed")
    print(f"PASS: {len(copies)} weights permuted once each for {len(convs)} convolutions, {len(bwd)} filter gradients "
          "converted back; the bf16 casts permute")


if __name__ == "__main__":
    main()
