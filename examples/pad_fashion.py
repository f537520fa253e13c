#!/usr/bin/python3
"""Fashion-MNIST as 32x32 three-channel images for models/resnet18_cifar.net.

    examples/pad_fashion.py OUTDIR [TRAIN_SAMPLES]

Pads each 28x28 image by 2 pixels on every side, repeats it over 3 channels, and normalises it
with the training set's mean and standard deviation (0.2860, 0.3530): normalising is the data's
job, the model uses its input as given. Writes OUTDIR/{train,test}-{image,label}.npy, images as
float16 (the trainer converts by value) to keep the files small; TRAIN_SAMPLES (default all
60000) takes the first N training images.
"""
import gzip
import os
import sys

import numpy as np

DATA = os.environ.get("NETC_FASHION_DIR", "/usr/share/datasets/fashion-mnist")


def idx(name):
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def convert(images):
    x = (images.astype(np.float32) / 255 - 0.2860) / 0.3530
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)), constant_values=(0 - 0.2860) / 0.3530)
    return np.repeat(x[:, None], 3, axis=1).astype(np.float16)


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 60000
    os.makedirs(out, exist_ok=True)
    for split, prefix, limit in (("train", "train", n), ("test", "t10k", 10000)):
        np.save(os.path.join(out, f"{split}-image.npy"), convert(idx(f"{prefix}-images-idx3-ubyte.gz")[:limit]))
        np.save(os.path.join(out, f"{split}-label.npy"), idx(f"{prefix}-labels-idx1-ubyte.gz")[:limit].astype(np.int64))


if __name__ == "__main__":
    main()
