"""SiLU, GELU, dropout and norm values computed again in the backward pass
(compiler/passes/remat.c): that frees memory and never changes a bit.

    remat.py NETC WORKDIR

For each model below: compile it as it is and with --no-remat, and require
  - the activations computed again: in the backward pass (--dump=fused, after the forward part),
    one copy per activation the pass should take, each SiLU or GELU fused into a loop
    (`internal`; a dropout a product reads has a loop of its own, a norm is a call of its own),
    and none with --no-remat;
  - the memory plan's arena smaller than with --no-remat;
  - a few training steps from the same weights and data to save the same bytes both ways. That
    equality is guaranteed by construction: the copy applies the same function to the same
    stored floats (a dropout's mask is a hash of the step's seed, the mask and the element; a norm's
    rows are summed by the same kernel in the same order), and the rest of the step is unchanged.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import arena_bytes, netc_out  # noqa: E402
from train_pair import saved_by_variant  # noqa: E402  (trains variants on 64 samples shaped like the inputs)

GPT2 = ["-D", "vocab=256", "-D", "seq=32", "-D", "n_layer=2", "-D", "n_head=2", "-D", "n_embd=64"]
# name, source, netc options, the activations computed again (operator: count)
MODELS = [
    ("geglu", "tests/fusion/geglu.net", [], {"gelu": 1, "gelu_tanh": 1, "silu": 1}),
    # every norm's input is read by its gradient, its output by products' weight gradients: the
    # two norms of each layer and the final one computed again
    ("llama", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32"], {"silu": 2, "rmsnorm": 5}),
    # the adapters on q, k and v drop the same normed input, each with its own mask (dropout 0.1, the
    # model's default): the three dropped copies computed again; o_proj's adapter drops the
    # attention's output, which the attention's gradient reads: computed again (with the permute
    # between them); the normed input is computed again in layer 1, whose input the norm's gradient
    # reads, and kept in layer 0, whose input (the frozen embedding's rows) nothing reads there
    ("llama_lora", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32", "-D", "lora_r=4"],
     {"silu": 2, "dropout": 8, "rmsnorm": 1}),
    ("llama_lora_p0", "models/llama.net", ["-D", "n_layer=2", "-D", "seq=32", "-D", "lora_r=4", "-D",
                                           "lora_dropout=0"], {"silu": 2, "rmsnorm": 1}),
    # GELU's output is read by c_proj's weight gradient, a product: kept; the five layer norms as in llama
    ("gpt2", "models/gpt2.net", GPT2, {"layernorm": 5}),
    # c_attn's lone adapter drops ln_1's output: computed again in layer 1 with ln_1 (its input is read
    # by ln_1's gradient), kept in layer 0 (ln_1's input, the frozen embeddings' sum, is not)
    ("gpt2_lora", "models/gpt2.net", GPT2 + ["-D", "lora_r=4"], {"dropout": 1, "layernorm": 1}),
]
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "dropout", "rmsnorm", "layernorm")
LOOPS_OF_THEIR_OWN = ("dropout", "rmsnorm", "layernorm")


def backward_copies(fused):
    """{op: count} of the activations and norms in the backward part of --dump=fused (after its
    "backward:" line), each SiLU or GELU required fused into a loop."""
    count = {}
    for line in fused.split("\nbackward:\n", 1)[1].splitlines():
        m = re.match(r"\s*%\d+ = (\w+)\(", line)
        if m and m.group(1) in ACTIVATIONS:
            assert "internal" in line or m.group(1) in LOOPS_OF_THEIR_OWN, f"a copy not fused into a loop: {line.strip()}"
            count[m.group(1)] = count.get(m.group(1), 0) + 1
    return count


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name, src, opts, want in MODELS:
        got = backward_copies(netc_out(netc, src, opts, "--dump=fused"))
        assert got == want, f"{name}: computed again in the backward pass: {got}, want {want}"
        kept = backward_copies(netc_out(netc, src, opts, "--no-remat", "--dump=fused"))
        assert not kept, f"{name}: --no-remat still computes {kept} again"
        remat, plain = (arena_bytes(netc_out(netc, src, opts, *x, "--dump=memplan")) for x in ([], ["--no-remat"]))
        assert remat < plain, f"{name}: arena {remat} bytes, {plain} with --no-remat"
        saved = saved_by_variant(netc, os.path.join(ROOT, src), opts, ([], ["--no-remat"]), work, name)
        assert saved[0] == saved[1], f"{name}: the weights differ with --no-remat"
        print(f"remat: {name}: {sum(want.values())} activations computed again, arena {remat} bytes against "
              f"{plain}; 3 steps identical to --no-remat")


if __name__ == "__main__":
    main()
