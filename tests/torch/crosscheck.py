"""Cross-check a netc trainer against PyTorch: same initial weights (--init), same data in the
same order (--no-shuffle), same optimizer, N steps; then compare every parameter, and load
netc's saved file into the PyTorch module with strict=True.

usage: crosscheck.py NETC WORKDIR MODEL MOMENTUM [STEPS]
"""
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
from netc_testlib import fashion, fashion_files, st_load, st_save, torch_model  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Relative error ||netc - torch|| / ||torch|| per tensor. Both compute in float32 with
# different summation orders (BLAS blocking, reductions), so after 50 steps the parameters
# differ by accumulated rounding (~1e-6 relative); a wrong gradient or update rule is off by
# orders of magnitude more. The bound is 1e-4.
TOLERANCE = 1e-4


def main():
    netc, work, model, momentum = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 50
    batch, lr, wd = 64, 0.01, 0.0
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(1234)
    torch.set_num_threads(2)
    net = torch_model(model)
    init = os.path.join(work, f"{model}-m{momentum}-init.safetensors")
    st_save(init, {k: v.detach().numpy() for k, v in net.state_dict().items()})

    exe = os.path.join(work, f"{model}-m{momentum}")
    subprocess.run([netc, os.path.join(ROOT, "models", f"{model}.net"), "-o", exe,
                    "-D", f"lr={lr}", "-D", f"momentum={momentum}", "-D", f"batch={batch}"],
                   check=True)
    out = os.path.join(work, f"{model}-m{momentum}.safetensors")
    images_file, labels_file = fashion_files("train")
    subprocess.run([exe, "--data", f"image={images_file}", "--data", f"label={labels_file}",
                    "--init", init, "--no-shuffle", "--steps", str(steps), "--save", out,
                    "--quiet"], check=True)

    images, labels = fashion("train")
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    for step in range(steps):
        x = torch.from_numpy(images[step * batch:(step + 1) * batch].astype(np.float32))
        x = x.reshape(batch, 1, 28, 28)
        y = torch.from_numpy(labels[step * batch:(step + 1) * batch].astype(np.int64))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    ours = st_load(out)
    worst = 0.0
    for name, ref in net.state_dict().items():
        ref = ref.numpy()
        got = ours[name]
        assert got.shape == ref.shape, f"{name}: shape {got.shape} vs torch {ref.shape}"
        rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)
        moved = np.linalg.norm(ref - st_load(init)[name]) / max(np.linalg.norm(ref), 1e-12)
        print(f"{name:12s} relative error {rel:.2e} (moved {moved:.2e} from init)")
        worst = max(worst, rel)
    # netc's file must load into the PyTorch module strictly (names, shapes, nothing extra).
    fresh = torch_model(model)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=True)
    print(f"{model} momentum={momentum}: worst relative error {worst:.2e} (bound {TOLERANCE})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
