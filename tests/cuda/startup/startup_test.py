"""A GPU trainer linked against cuda_stub.c, started on stub devices (startup.sh builds it).

    startup_test.py WORKDIR TRAINER [NETC_ARGS...]

TRAINER was built by netc --arch sm_80,sm_90 (cubins for sm_80 and sm_90, PTX for sm_80) with
NETC_ARGS. On each stub device it must:
  - sm_80, sm_86, sm_89: load the sm_80 cubin; sm_90: the sm_90 cubin; sm_100, sm_120: the PTX
    (no cubin of their major version), and nothing else;
  - find every kernel of the generated host C's kernel_names in that image;
  - build every plan: a product for each cuBLASLt plan, and for each convolution plan a
    deterministic algorithm with the math the precision allows that needs at most 1 GiB of
    workspace and runs: the stub ranks a non-deterministic algorithm, a tensor-op one, one
    wanting 4 GiB and one that fails when run before PyTorch's default (algorithm 1), so bf16
    and fp16 plans take the tensor-op one and float32 plans try the failing one once, then take the
    default;
  - ask for blocking waits (device flags and every event);
  - capture two graphs (training and evaluation), replay them for every step, and exit 0; with
    --no-graph capture nothing and launch the kernels directly; with --accumulate 2 capture two
    training graphs (a summed batch's, with no collective, and a step's last batch's) and launch
    both each step;
  - --predict: replay the evaluation graph once per batch of the samples (or, with --no-graph,
    launch its kernels), copy the output out of the arena behind it, and write the array
    [samples, output shape] --help gives;
  - copy each batch to the device on a stream of its own, which the stub's order of the work
    (cuda_stub.c) checks against the steps reading it and the host refilling its staging slot;
  - distributed (--distributed): join a communicator of one rank (MPI's singleton) and run each
    training step's collectives - one per gradient bucket and one for the loss - on a stream
    forked from the step's and joined back, so that each captured training graph holds them (the
    stub fails a capture whose forked work is not joined, as CUDA does);
  - on sm_75, for which it carries no image, exit 5 naming what it carries and the --arch to
    rebuild with; with no device memory, or memory for the arena but not for the libraries'
    workspace, exit 5 saying what it needs.
The stub itself aborts on any call that breaks the libraries' rules (cuda_stub.c).
"""
import os
import re
import subprocess
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "emu"))
sys.path.insert(0, os.path.join(_here, "..", "..", "tools"))
import numpy as np  # noqa: E402
from emu_compare import EVAL_SAMPLES, predict_args, write_data, write_eval_data, write_init  # noqa: E402
from netc_testlib import Checks  # noqa: E402

STEPS = 4

check = Checks()


def run(exe, args, sm, log, extra_env=None):
    env = dict(os.environ, NETC_STUB_LOG=log)
    env.pop("NETC_STUB_MEM_MIB", None)
    if sm:
        env["NETC_STUB_SM"] = str(sm)
    env.update(extra_env or {})
    if os.path.exists(log):
        os.unlink(log)
    p = subprocess.run([exe] + args, capture_output=True, text=True, env=env)
    lines = open(log).read().splitlines() if os.path.exists(log) else []
    return p, lines


def summary(lines):
    s = [ln for ln in lines if ln.startswith("summary: ")]
    return {k: int(v) for v, k in re.findall(r"(\d+) ([a-z -]+?)(?:,| \(|$)", s[-1])} if s else {}


def main():
    work, exe = sys.argv[1], sys.argv[2]
    half = "bf16" in sys.argv[3:] or "fp16" in sys.argv[3:]  # --precision: tensor-op convolutions
    distributed = "--distributed" in sys.argv[3:]
    host = open(os.path.join(work, "src", os.path.basename(exe)[: -len("-stub")] + ".c")).read()
    names = re.search(r"kernel_names\[N_KERNELS\] = \{(.*?)\};", host, re.S).group(1)
    n_kernels = len(re.findall(r'"\w+"', names))
    n_at = host.count("rt_cuda_launch_at(cu, ")  # shared kernels' launches (cuda_stub.c checks each)
    n_gemm = len(re.findall(r"^static RtGemmPlan \*", host, re.M))
    n_conv = len(re.findall(r"^static RtCudaConvPlan \*", host, re.M))
    batch = int(re.search(r"^    \.batch = (\d+),", host, re.M).group(1))
    buckets = re.search(r"gradient_buckets\[(\d+)\]", host)
    # the buckets' and the loss's collectives, and --sync-bn's batch-norm sums; with
    # --shard-optimizer each bucket's slices reduced (one rank: one reduce) and the parameters'
    # slices broadcast, and the sums of clip_grad_norm and LAMB's norms
    sharded = "--shard-optimizer" in sys.argv[3:]
    per_step = (int(buckets.group(1)) * (2 if sharded else 1) + 1 + host.count("rt_cuda_sum_doubles(cu,")
                if distributed else 0)
    # --accumulate: a summed batch's, --sync-bn's sums in its forward and backward passes alone
    train = host[host.index("static void train("):]
    per_sum = train[:train.index("if (part == RT_STEP_SUM)")].count("rt_cuda_sum_doubles(cu,")
    data = write_data(exe, work)
    evals = write_eval_data(data, work)
    base = data + evals + ["--steps", str(STEPS), "--quiet"]
    args = base + ["--log-every", "2"]
    log = os.path.join(work, "stub.log")

    for sm, image in [(80, "cubin sm_80"), (86, "cubin sm_80"), (89, "cubin sm_80"), (90, "cubin sm_90"),
                      (100, "PTX sm_80"), (120, "PTX sm_80")]:
        for graph in (True, False) if sm == 90 else (True,):
            tag = f"sm_{sm}" + ("" if graph else " --no-graph")
            p, lines = run(exe, args + ([] if graph else ["--no-graph"]), sm, log)
            check(p.returncode == 0, f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
            loaded = [ln for ln in lines if ln.startswith("image ")]
            check(loaded == [f"image {image} with {n_kernels} kernels, on a device sm_{sm}: loaded"],
                  f"{tag}: expected the {image} image with {n_kernels} kernels, the stub saw {loaded}")
            got = summary(lines)
            check(got.get("kernels found") == n_kernels,
                  f"{tag}: {got.get('kernels found')} of {n_kernels} kernels looked up")
            check(got.get("kernel attributes") == n_kernels,
                  f"{tag}: {got.get('kernel attributes')} of {n_kernels} kernels loaded by their attributes "
                  "(lazy loading would defer a bad image's error to the first launch)")
            captures = sum(ln.startswith("captured a graph") for ln in lines)
            check(captures == (2 if graph else 0), f"{tag}: {captures} graphs captured")
            check((got.get("graph launches", 0) >= STEPS) == graph, f"{tag}: {got.get('graph launches')} graph launches")
            check(got.get("kernel launches", 0) > 0, f"{tag}: no kernel launched")
            check((got.get("launches with operand offsets", 0) > 0) == (n_at > 0),
                  f"{tag}: {got.get('launches with operand offsets')} launches with operand offsets, "
                  f"{n_at} in the host C")
            check((got.get("products", 0) > 0) == (n_gemm > 0), f"{tag}: {got.get('products')} products, {n_gemm} plans")
            check(got.get("filter transforms") == 0, f"{tag}: {got.get('filter transforms')} cudnnTransformTensor calls, "
                  "expected none (the generated kernels permute the filters)")
            ran = {re.sub(r"^convolution: cudnnConvolution\w+ ", "", ln) for ln in lines
                   if ln.startswith("convolution: ") and ln.endswith(": ran")}
            want = "algorithm 2, math tensor-op: ran" if half else "algorithm 1, math FMA: ran"
            check(ran == ({want} if n_conv else set()), f"{tag}: convolutions ran with {ran}, expected {want}")
            failed = sum(ln.startswith("convolution: ") and ln.endswith(": failed") for ln in lines)
            check(failed == (0 if half else n_conv), f"{tag}: {failed} trial runs failed, expected one per plan "
                  f"({n_conv}) in float32, where the failing algorithm 4 is reached")
            check("device schedule: blocking sync" in lines and
                  not any(ln.startswith("an event whose waits spin") for ln in lines),
                  f"{tag}: the host's waits spin")
            check(not any(ln.startswith("prohibited") for ln in lines), f"{tag}: a prohibited call in a capture")
            # collectives: the warm-up step's, then the training graph's or each step's
            want = (per_step * 2, per_step) if graph else (per_step * (1 + STEPS), 0)
            have = (got.get("collectives", 0), got.get("captured collectives", 0))
            check(have == want, f"{tag}: {have[0]} collectives ({have[1]} captured), expected {want[0]} ({want[1]})")
            if distributed:
                check("nccl: communicator of 1 rank" in lines and "nccl: communicator destroyed" in lines,
                      f"{tag}: the NCCL communicator was not made and destroyed")
            print(f"{tag}: {image}, {got}")

    # --eval-async: a second lane (arena, streams, workspace, staging slots) whose evaluation
    # graph is captured on its own stream; an evaluation copies the parameters across, runs
    # there beside the steps, and its sums are read from there
    for graph in (True, False):
        tag = "sm_90 --eval-async" + ("" if graph else " --no-graph")
        p, lines = run(exe, args + ["--eval-async"] + ([] if graph else ["--no-graph"]), 90, log)
        check(p.returncode == 0, f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
        captures = sum(ln.startswith("captured a graph") for ln in lines)
        check(captures == (3 if graph else 0), f"{tag}: {captures} graphs captured, expected {3 if graph else 0}")
        # the evaluation's batches (EVAL_SAMPLES in batches) replay the second lane's graphs
        got, batches = summary(lines), -(-EVAL_SAMPLES // batch)
        side = got.get("graph launches on a second stream", 0)
        check(side == (batches if graph else 0), f"{tag}: {side} graphs launched on the second stream, expected "
              f"{batches if graph else 0} (the evaluation batches)")
        check(not any(ln.startswith("prohibited") for ln in lines), f"{tag}: a prohibited call in a capture")
        print(f"{tag}: {summary(lines)}")

    # --predict: the evaluation graph replayed for each batch of the samples, the model's output
    # copied behind it out of the arena into pinned memory (rt_cuda.c's read_output; the stub
    # checks the copy's range and order), and written as float32 [samples, output shape]
    pargs, dims = predict_args(exe, evals)
    init = os.path.join(work, "init.safetensors")
    write_init(exe, init)
    out = os.path.join(work, "predict.npy")
    for graph in (True, False) if dims is not None else ():
        tag = "sm_90 --predict" + ("" if graph else " --no-graph")
        if os.path.exists(out):
            os.unlink(out)
        flags = ["--init", init, "--predict-out", out, "--quiet"] + ([] if graph else ["--no-graph"])
        p, lines = run(exe, pargs + flags, 90, log)
        check(p.returncode == 0, f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
        got, batches = summary(lines), -(-EVAL_SAMPLES // batch)
        shape = np.load(out).shape if os.path.exists(out) else None
        check(shape == (EVAL_SAMPLES, *dims), f"{tag}: wrote an array {shape}, expected {(EVAL_SAMPLES, *dims)}")
        check(got.get("graph launches", 0) == (batches if graph else 0),
              f"{tag}: {got.get('graph launches')} graph launches, expected {batches if graph else 0}")
        check(not any(ln.startswith("prohibited") for ln in lines), f"{tag}: a prohibited call in a capture")
        print(f"{tag}: {shape}, {got}")

    # --accumulate 2: two training graphs, a summed batch's (no bucket's collective, and
    # no fork left unjoined, which fails its capture; --sync-bn's sums) and a step's last
    # batch's, each step launching both, as the warm-up does
    for graph in (True, False):
        tag = "sm_90 --accumulate 2" + ("" if graph else " --no-graph")
        p, lines = run(exe, args + ["--accumulate", "2"] + ([] if graph else ["--no-graph"]), 90, log)
        check(p.returncode == 0, f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
        captures = sum(ln.startswith("captured a graph") for ln in lines)
        check(captures == (3 if graph else 0), f"{tag}: {captures} graphs captured, expected {3 if graph else 0}")
        got = summary(lines)
        check((got.get("graph launches", 0) >= 2 * STEPS) == graph, f"{tag}: {got.get('graph launches')} graph "
              f"launches, expected {2 * STEPS} training ones at least")
        both = per_sum + per_step
        want = (both * 2, both) if graph else (both * (1 + STEPS), 0)
        have = (got.get("collectives", 0), got.get("captured collectives", 0))
        check(have == want, f"{tag}: {have[0]} collectives ({have[1]} captured), expected {want[0]} ({want[1]})")
        check(not any(ln.startswith("prohibited") for ln in lines), f"{tag}: a prohibited call in a capture")
        print(f"{tag}: {got}")

    # The log's sums are read behind the steps (an asynchronous copy and an event), never by
    # waiting for the stream: a run that logs every step waits for its stream as often as one
    # that logs only at the end of each epoch, and writes every line, in order, although the
    # stub's events answer "not ready" once after each recording
    waits, lines_seen = {}, {}
    for every in (1, 10**6):
        tag = f"sm_90 --log-every {every}"
        jsonl = os.path.join(work, f"log-every-{every}.jsonl")
        if os.path.exists(jsonl):
            os.unlink(jsonl)
        p, lines = run(exe, base + ["--log-every", str(every), "--log", jsonl], 90, log)
        check(p.returncode == 0, f"{tag}: exit status {p.returncode}: {p.stderr.strip()}")
        got = summary(lines)
        waits[every] = got.get("stream waits")
        steps = [int(m) for m in re.findall(r'^\{"step": (\d+)', open(jsonl).read(), re.M)] if os.path.exists(jsonl) else []
        lines_seen[every] = steps
        if every == 1:
            check(got.get("events not ready", 0) > 0, f"{tag}: the trainer never found an event not ready")
        print(f"{tag}: {got.get('stream waits')} stream waits, {got.get('events not ready')} events not ready, "
              f"lines for steps {steps}")
    check(waits[1] is not None and waits[1] == waits[10**6],
          f"{waits[1]} stream waits logging every step, {waits[10**6]} logging once an epoch: a log line waited "
          "for the stream")
    check(lines_seen[1] == list(range(1, STEPS + 1)), f"logging every step: lines for steps {lines_seen[1]}")

    p, lines = run(exe, args, 75, log)
    check(p.returncode == 5, f"sm_75: exit status {p.returncode}, expected 5")
    check("is sm_75, but this trainer carries kernels for sm_80, sm_90 (cubin) and sm_80 (PTX); rebuild it with "
          "netc --arch sm_75" in p.stderr, f"sm_75: message {p.stderr.strip()!r}")
    print("sm_75:", p.stderr.strip())

    # An image the driver refuses only when a kernel is first needed (lazy loading, a PTX it cannot
    # compile): a start-up message (status 5), not the first launch's stop; likewise a kernel that
    # cannot run the generated block size.
    p, lines = run(exe, args, 90, log, {"NETC_STUB_LAZY_LOAD_FAIL": "1"})
    check(p.returncode == 5 and "cubin kernel image does not load on this GPU (kernel " in p.stderr,
          f"lazy load failure: exit status {p.returncode}, message {p.stderr.strip()!r}")
    print("lazy load failure:", p.stderr.strip())
    p, lines = run(exe, args, 90, log, {"NETC_STUB_MAX_THREADS": "128"})
    check(p.returncode == 5 and "runs at most 128 threads a block on this GPU, fewer than the 256" in p.stderr,
          f"too few threads a block: exit status {p.returncode}, message {p.stderr.strip()!r}")
    print("too few threads a block:", p.stderr.strip())

    p, lines = run(exe, args, 90, log, {"NETC_STUB_MEM_MIB": "0"})
    check(p.returncode == 5 and "MiB of GPU memory (the arena, and one batch on its way in), but the GPU (stub sm_90) "
          "has 0.0 MiB free" in p.stderr,
          f"no memory: exit status {p.returncode}, message {p.stderr.strip()!r}")
    print("no memory:", p.stderr.strip())

    # Memory for the arena and the landing buffer of one batch (rounded up to whole MiB), none to
    # spare for a library's workspace: a convolution plan finds no algorithm whose workspace fits,
    # or the shared workspace does not.
    arena_mib = -(-(int(re.search(r"\.device_bytes = (\d+),", host).group(1)) +
                    int(re.search(r"\.batch_bytes = (\d+),", host).group(1))) // (1 << 20))
    p, lines = run(exe, args, 90, log, {"NETC_STUB_MEM_MIB": str(arena_mib)})
    check(p.returncode == 5 and "lower the batch size" in p.stderr and "workspace" in p.stderr,
          f"no memory for the workspace: exit status {p.returncode}, message {p.stderr.strip()!r}")
    print("no memory for the workspace:", p.stderr.strip())

    if check.failures:
        sys.exit(f"{len(check.failures)} of {check.count} start-up checks failed")
    print("PASS:", os.path.basename(exe))


if __name__ == "__main__":
    main()
