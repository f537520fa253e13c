"""The CPU trainer updates a large parameter in the backward pass, as soon as the pass is done
with it (codegen/cpu.c, "the update in the backward pass"): that moves the update, never its
result.

    in_backward.py NETC WORKDIR

For each model below: compile it, keeping the generated C, and require the parameters that
forward_backward updates, and those --report lists, to be the expected ones (so that the check
fails if the update stops moving); then train a few steps from the same weights and data twice, as compiled and with
--update-after-backward (every update after the whole backward pass, in optimizer_step), and
require the saved parameters to be equal bit for bit. That equality is guaranteed by
construction: both runs compute the same gradients with the same code, and the update is the
same element-wise arithmetic (rt_recipe.h) wherever it runs. An update placed too early, before
a later node reads the parameter (each of deep_mlp's fc2 and fc3 is read for its input's
gradient after its own gradient is final; GPT-2's tied embedding is read by the output layer's
backward pass), changes the gradients computed after it, and the parameters with them.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(HERE, "..", "fusion"))
from train_pair import train_and_save, write_data  # noqa: E402  (64 samples shaped like the model's inputs)

GPT2_TINY = ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=2", "-D", "n_head=2", "-D", "n_embd=128",
             "-D", "grad_clip=0", "-D", "weight_decay=0.1"]
# name, source, netc options, steps, the parameters updated in the backward pass (None: every
# parameter of at least 32768 floats, codegen/cpu.c's PAR_MIN, which ResNet-18's convolutions
# pass from layer2 on at width 16)
MODELS = [
    ("mlp", "models/mlp.net", [], 3, {"fc1.weight"}),
    ("deep_mlp", "tests/optimizer/deep_mlp.net", [], 3, {"fc1.weight", "fc2.weight", "fc3.weight"}),
    ("lenet", "models/lenet.net", [], 3, {"fc1.weight"}),
    ("resnet18", "models/resnet18_cifar.net", ["-D", "batch=8", "-D", "width=16"], 3, None),
    ("gpt2", "models/gpt2.net", GPT2_TINY, 3,
     {"transformer.wte.weight"} | {f"transformer.h.{i}.{m}.weight" for i in range(2)
                                   for m in ("attn.c_attn", "mlp.c_fc", "mlp.c_proj")}),
]


def updated_in_backward(c_file):
    """The names in forward_backward's comment "updated in this pass, ...: a, b,\n//   c"."""
    text = open(c_file).read()
    m = re.search(r"// updated in this pass[^:]*\): (.*?)\n(?!\s*//   )", text, re.S)
    if not m:
        return set()
    return {n.strip() for n in re.sub(r"\n\s*//\s*", " ", m.group(1)).split(",") if n.strip()}


def big_params(exe):
    out = subprocess.run([exe, "--list-params"], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[-1].isdigit() and int(f[-1]) >= 32768:
            names.add(f[0])
    return names


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name, src, opts, steps, want in MODELS:
        exe = os.path.join(work, name)
        src_dir = os.path.join(work, name + "-src")
        subprocess.run([netc, os.path.join(ROOT, src), *opts, "-o", exe, "--emit-dir", src_dir], check=True)
        got = updated_in_backward(os.path.join(src_dir, name + ".c"))
        if want is None:
            want = big_params(exe)
        assert want and got == want, f"{name}: updated in the backward pass: {sorted(got)}, want {sorted(want)}"
        report = subprocess.run([netc, os.path.join(ROOT, src), *opts, "--report"], capture_output=True, text=True,
                                check=True).stdout
        listed = set(re.findall(r"^  (\S+) +after node \d+ of \d+", report.split("\noptimizer: ")[1], re.M))
        assert listed == want, f"{name}: --report lists {sorted(listed)} as updated in the backward pass"
        data = write_data(exe, work)
        saved = []
        for extra in ([], ["--update-after-backward"]):
            out = os.path.join(work, f"{name}{'-after' if extra else ''}.safetensors")
            train_and_save(exe, data, steps, out, *extra)
            saved.append(open(out, "rb").read())
        assert saved[0] == saved[1], f"{name}: the weights differ with --update-after-backward"
        print(f"in_backward: {name}: {len(got)} parameters updated in the backward pass; "
              f"{steps} steps identical to updating after it")


if __name__ == "__main__":
    main()
