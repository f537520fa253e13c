#!/usr/bin/python3
"""Every hand-written net through random_nets.py's BUILDS, up to its generated code.

    builds_check.py NETC ROOT

The gradient-check nets (tests/gradcheck), the models (models/, GPT-2 and BERT at 2 layers,
Llama with LoRA), the PyTorch cross-checks' nets (tests/torch) and the fuzz seeds, each with
every flag set of BUILDS (CUDA fp32, bf16 and fp16, distributed and sharded, row-major,
unfused, copied views) and --dump=c: netc must neither stop with an internal error nor refuse
one. The random nets (random_nets.py compile) cover random graphs; these cover the patterns
written by hand (a patch embedding's views under --layout=row-major with the CUDA backend
stopped with an internal error until a filter gradient beside channels-last activations was
made KRSC there too). About 10 s.
"""
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from random_nets import BUILDS  # noqa: E402

# the transformers at 2 of their layers (Llama with LoRA's adapters), as tests/cuda compiles them
DEFINES = {"gpt2": ["-D", "n_layer=2"], "bert": ["-D", "n_layer=2"], "llama": ["-D", "n_layer=2", "-D", "lora_r=8"]}


def main():
    netc, root = sys.argv[1], sys.argv[2]
    nets = sorted(sum((glob.glob(os.path.join(root, d, "*.net"))
                       for d in ("models", "tests/gradcheck", "tests/torch", "tests/fuzz/corpus")), []))
    failed = 0
    for path in nets:
        name = os.path.splitext(os.path.basename(path))[0]
        for flags in BUILDS:
            cmd = [netc, path, *flags, *DEFINES.get(name, []), "--dump=c"]
            r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                failed += 1
                print(f"FAIL (status {r.returncode}): {' '.join(cmd)}\n{r.stderr.strip()}")
    print(f"builds_check: {len(nets)} nets x {len(BUILDS)} builds, {failed} failed")
    return 1 if failed or not nets else 0


if __name__ == "__main__":
    sys.exit(main())
