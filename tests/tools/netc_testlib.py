"""Helpers shared by the Python tests: safetensors files, Fashion-MNIST, and the PyTorch
reference modules equivalent to models/*.net (same parameter names and layouts).

safetensors is read and written with numpy directly (the format is an 8-byte little-endian
header length, a JSON header, then raw little-endian tensors), because Debian ships no
safetensors package; tests/torch/ checks our reader against files netc writes.
"""
import gzip
import json
import os
import re
import shutil
import struct
import subprocess

import numpy as np

FASHION = os.environ.get("NETC_FASHION_DIR", "/usr/share/datasets/fashion-mnist")


def log_records(log):
    """A trainer's --log: its step and evaluation records, without timings (samples/s, the
    ranks' waits) and checkpoint notes, so that two runs of the same trainer compare equal."""
    out = []
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if "checkpoint" in r:
                continue
            r.pop("samples_per_s", None), r.pop("comm_wait", None)
            out.append(r)
    return out


def model_output(exe):
    """What a trainer's --help says --predict writes: the output's per-sample shape and the names
    of the inputs it reads, or None for a model without an output."""
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^model output \(per sample; what --predict writes\): f32\[([^\]]*)\], from inputs? (.*)$", text,
                  re.M)
    return (tuple(int(d) for d in m.group(1).split(",") if d.strip()), m.group(2).split(", ")) if m else None


def mpi_env():
    """The environment distributed trainers run in under Open MPI's mpirun on any machine."""
    env = dict(os.environ)
    if os.geteuid() == 0:  # CI runs as root; Open MPI refuses root without both of these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Containers often forbid the cross-memory attach Open MPI's shared-memory transport tries
    # first, and mpirun then prints a warning per message; copying through shared memory works.
    env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def mpirun_args(ranks):
    """The command line prefix that runs a trainer as `ranks` ranks on this machine (whatever its
    number of cores)."""
    return ["mpirun", "--oversubscribe", "-np", str(ranks)]


class Checks:
    """A test script's checks: check(ok, what) counts one, prints "FAIL what" when it fails and
    keeps it in .failures; returns ok."""

    def __init__(self):
        self.count = 0
        self.failures = []

    def __call__(self, ok, what):
        self.count += 1
        if not ok:
            self.failures.append(what)
            print("FAIL", what)
        return ok

    def expect(self, r, status, what, *needles):
        """A finished command (subprocess.CompletedProcess) exited with `status` and its output
        holds every needle; a refusal that does prints its first line. Returns ok."""
        msg = r.stdout + r.stderr
        if not self(r.returncode == status, f"{what}: exit {r.returncode}, want {status}\n{msg}"):
            return False
        missing = [s for s in needles if s not in msg]
        if status and not missing:
            print(f"ok   {what}: {msg.strip().splitlines()[0] if msg.strip() else ''}")
        return self(not missing, f"{what}: output lacks {missing}:\n{msg}")


def netc_out(netc, src, opts, *extra):
    """What `netc SRC OPTS... EXTRA...` prints (a --dump stage, --report), SRC relative to the
    repository's root; netc must succeed."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    return subprocess.run([netc, os.path.join(root, src), *opts, *extra], capture_output=True, text=True,
                          check=True).stdout


def arena_bytes(plan):
    """The arena's size in bytes, from netc --dump=memplan's text."""
    return int(re.search(r"^arena: (\d+) bytes", plan, re.M).group(1))


def peak_live_bytes(plan):
    """The most bytes of arena values alive at once (netc --dump=memplan's lifetimes, both ends
    included): what any placement of them needs at least, whatever gaps the planner leaves."""
    rows = re.findall(r"^%\d+ +\w+ +\w+ +\[[^]]*\] +arena +\d+ +(\d+) +\[(\d+), (\d+)\]", plan, re.M)
    ends = [(int(a), int(b), int(size)) for size, a, b in rows]
    return max((sum(size for a, b, size in ends if a <= t <= b) for t in {a for a, _, _ in ends}), default=0)


def compile_model(netc, here, work, name, *defines):
    """A trainer of here/NAME.net with each -D of `defines`, as work/NAME_<defines>."""
    exe = os.path.join(work, name + "".join("_" + d.replace("=", "") for d in defines))
    cmd = [netc, os.path.join(here, name + ".net"), "-o", exe]
    for d in defines:
        cmd += ["-D", d]
    subprocess.run(cmd, check=True)
    return exe


def run_cases(cases, label, check, argv):
    """A test script's main: argv = [script, CASE, NETC, WORK]; WORK is emptied, cases[CASE] runs
    with the absolute paths of NETC and WORK, and the checks are counted. Returns the exit
    status: 1 if a check failed."""
    case, netc, work = argv[1], os.path.abspath(argv[2]), os.path.abspath(argv[3])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cases[case](netc, work)
    print(f"{label} {case}: {check.count} checks, {len(check.failures)} failed")
    return 1 if check.failures else 0


_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def st_save(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        # integer tensors (num_batches_tracked) stay I64, as PyTorch writes them
        is_int = np.asarray(arr).dtype.kind in "iu"
        arr = np.array(arr, dtype=np.int64 if is_int else np.float32, order="C")  # keeps 0-d shapes
        header[name] = {"dtype": "I64" if is_int else "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr.tobytes())
        offset += arr.nbytes
    header["__metadata__"] = metadata or {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def st_load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim:], dtype=np.uint8).reshape(dims)


def fashion(split="train"):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(f"{FASHION}/{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(f"{FASHION}/{prefix}-labels-idx1-ubyte.gz")
    return images, labels


def fashion_files(split="train"):
    prefix = "train" if split == "train" else "t10k"
    return (f"{FASHION}/{prefix}-images-idx3-ubyte.gz", f"{FASHION}/{prefix}-labels-idx1-ubyte.gz")


def torch_model(name):
    """The PyTorch module equivalent to models/NAME.net, with the same parameter names."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, image):
            x = torch.flatten(image / 255, 1)
            return self.fc2(torch.relu(self.fc1(x)))

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(400, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, image):
            x = image / 255
            x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
            x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
            x = torch.relu(self.fc1(torch.flatten(x, 1)))
            x = torch.relu(self.fc2(x))
            return self.fc3(x)

    return {"mlp": MLP, "lenet": LeNet}[name]()
