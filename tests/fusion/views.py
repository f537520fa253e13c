"""Permutes, slices and concatenations read in place by the element-wise loops that read them
(compiler/passes/views.c), and permutes that are views of their operand's storage in another
order of its axes (permute_view, compiler/passes/layout.c): fewer kernels and buffers, never a
changed bit.

    views.py NETC WORKDIR

For each model below: compile it as it is and with --copy-views, and require
  - the nodes folded (`folded` in --dump=fused), counted by operator, and the permute_views to
    be the expected ones, and none with --copy-views; each folded node "folded" in the memory
    plan, with no storage, and each permute_view an alias;
  - with folded views only, fewer kernels per step (--report) than with --copy-views by the
    number of folded nodes; with permute_views (which also merge chains of permutes and take
    the place of layout conversions), fewer by at least the copies (permutes, slices,
    concatenations, layout conversions) that are gone;
  - no more bytes alive at once in the arena than with --copy-views (the arena itself may differ
    by the planner's gaps either way);
  - a few training steps from the same weights and data to save the same bytes both ways. That
    equality is guaranteed by construction: a loop reading through a folded view reads the very
    floats the copy would have held and computes with them what it computed with the copy, and
    the rest of the step is unchanged (the same fused groups, products and order of sums).
    Not so where a view hands a kernel its operand in another layout than the copy did
    (REORDERED): the same values are summed in another order, and the weights agree within
    rounding instead.
"""
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from netc_testlib import arena_bytes, netc_out, peak_live_bytes, st_load  # noqa: E402
from train_pair import saved_by_variant  # noqa: E402  (trains variants on 64 samples shaped like the inputs)

LLAMA = ["-D", "n_layer=2", "-D", "seq=32"]
# name, source, netc options, the nodes folded (operator: count)
MODELS = [
    # the rotary tables' concat (cat(freqs, freqs)); in each layer, for q and for k, the permute
    # that splits the heads off the projection and rotate_half's two slices and concatenation,
    # then in the backward pass the concatenation's gradient (two slices of dy) and the two
    # slices' gradients (slice_bwd): 1 + 2 * 2 * 4 + 2 * 2 * 4. (v's heads and the attention's
    # result the attention reads and writes in the projections' rows: no permute, attn_heads.c.)
    ("llama", "models/llama.net", LLAMA, {"concat": 5, "permute": 4, "slice": 16, "slice_bwd": 8}),
    # the same under LoRA: the adapters sit on the projections, before the heads are split
    ("llama_lora", "models/llama.net", LLAMA + ["-D", "lora_r=4", "-D", "lora_dropout=0"],
     {"concat": 5, "permute": 4, "slice": 16, "slice_bwd": 8}),
    # chains of views: a permute of a transpose of a permute added to its source (one permute
    # of the source in the identity order: the source itself), and each permute's gradient (the
    # inverse permute) read by the next: one permute_view each way, of the sum and of the
    # gradient, and the two gradients of the sum's operands read by the gradient's add
    ("permute", "tests/gradcheck/permute.net", [], {"permute_view": 3}),
    # an [N, H, W, C] input permuted into a channels-last convolution, its channels-last result
    # permuted to [N, H, W, C] for a dense layer and to [N, W, H, C] for an element-wise one,
    # and their gradients: no copy and no layout conversion left (--copy-views: 6 and 3)
    ("permute_conv", "tests/gradcheck/permute_conv.net", [], {"permute_view": 6}),
    # a patch embedding: a channels-last convolution's result reshaped to [N, D, h*w] and
    # transposed to tokens, both read in place (the reshape in the order N, h*w, D), and back
    # (--copy-views: 2 permutes and 2 conversions)
    ("patchify", "tests/gradcheck/patchify.net", [], {"permute_view": 2}),
    # slices at negative starts, equal and unequal splits, a slice of a slice; their gradients
    # (zeros around dy) summed by element-wise adds
    ("slice", "tests/gradcheck/slice.net", [], {"slice": 5, "slice_bwd": 5}),
]


# Models whose views change the layout some sum runs over (patchify: the bias and filter
# gradients of the convolution read a channels-last view where the copies gave them row-major
# values), with the largest relative difference allowed in the saved weights after 3 steps: each
# of those float32 sums (at most 96 terms here) may move by about its length times 2^-24 of its
# magnitude in another order, times the learning rate 0.1, three times; 1e-5 (about 170 float32
# ulps at 1.0) bounds that, where a wrongly read element moves a weight by 1e-3 and more.
REORDERED = {"patchify": 1e-5}


def folded(dump):
    """{op: count} of the nodes --dump=fused marks folded, and of its permute_views."""
    count = {}
    for m in re.finditer(r"^\s*%\d+ = (\w+)\(.*\bfolded\b|^\s*%\d+ = (permute_view)\(", dump, re.M):
        op = m.group(1) or m.group(2)
        count[op] = count.get(op, 0) + 1
    return count


def copies(dump):
    """The copies --dump=fused keeps: permutes, slices, concatenations and layout conversions
    that are not folded."""
    return len(re.findall(r"^\s*%\d+ = (?:permute|slice|slice_bwd|concat|layout)\((?!.*\bfolded\b)", dump, re.M))


def kernels(report):
    return int(re.search(r"^  fused: +(\d+)", report, re.M).group(1))


def main():
    netc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    for name, src, opts, want in MODELS:
        dump, dump_copy = (netc_out(netc, src, opts, *x, "--dump=fused") for x in ([], ["--copy-views"]))
        got = folded(dump)
        assert got == want, f"{name}: folded {got}, want {want}"
        kept = folded(dump_copy)
        assert not kept, f"{name}: --copy-views still folds {kept}"
        n_views = want.get("permute_view", 0)
        plan = netc_out(netc, src, opts, "--dump=memplan")
        in_plan = len(re.findall(r"^%\d+ +\w+ +f32 +\[[^]]*\] +folded +- ", plan, re.M))
        assert in_plan == sum(want.values()) - n_views, f"{name}: {in_plan} nodes folded in the memory plan"
        aliases = len(re.findall(r"^%\d+ +permute_view +f32 +\[[^]]*\] +alias ", plan, re.M))
        assert aliases == n_views, f"{name}: {aliases} permute_views are aliases in the memory plan"
        k_fold, k_copy = (kernels(netc_out(netc, src, opts, *x, "--report")) for x in ([], ["--copy-views"]))
        gone = copies(dump_copy) - copies(dump)
        if n_views:
            assert k_fold <= k_copy - gone, f"{name}: {k_fold} kernels a step, {k_copy} with --copy-views"
        else:
            assert k_fold == k_copy - sum(want.values()), f"{name}: {k_fold} kernels a step, {k_copy} with --copy-views"
        plans = [netc_out(netc, src, opts, *x, "--dump=memplan") for x in ([], ["--copy-views"])]
        a_fold, a_copy = (arena_bytes(p) for p in plans)
        live_fold, live_copy = (peak_live_bytes(p) for p in plans)
        assert live_fold <= live_copy, f"{name}: {live_fold} bytes alive at once, {live_copy} with --copy-views"
        saved = saved_by_variant(netc, os.path.join(ROOT, src), opts, ([], ["--copy-views"]), work, name)
        if name in REORDERED:
            a, b = (st_load(os.path.join(work, f"{name}-{k}.safetensors")) for k in (0, 1))
            for t in b:
                err = np.abs(a[t].astype(np.float64) - b[t]).max() / max(1.0, np.abs(b[t]).max())
                assert err <= REORDERED[name], f"{name}: {t} differs by {err:.3g} with --copy-views"
        else:
            assert saved[0] == saved[1], f"{name}: the weights differ with --copy-views"
        print(f"views: {name}: {sum(want.values())} nodes folded or views, {gone} copies gone, "
              f"{k_fold} kernels a step against {k_copy}, "
              f"arena {a_fold} bytes against {a_copy} (at most {live_fold} alive at once against {live_copy}); "
              f"3 steps {'within rounding of' if name in REORDERED else 'identical to'} --copy-views")


if __name__ == "__main__":
    main()
