#!/usr/bin/env python3
"""hybridnn against PyTorch on the CPU: Caffe's LeNet trained on Fashion-MNIST and CaffeNet
forward + full backward at batch 32, each in PyTorch (1 and 2 threads) and in the `hybridnn`
tool, printed as JSON lines with the ratio hybridnn / PyTorch's best.

  bench/vs_pytorch.py [--build build] [--iterations N] [--threads 1,2]
                      [--only lenet|caffenet|memory|load] [--torch-python VENV/bin/python]
  bench/vs_pytorch.py --accuracy     # PyTorch LeNet, 10,000 iterations, test accuracy
  bench/vs_pytorch.py --only load     # LeNet idle and beside a process that keeps a core busy

Under load (--only load): LeNet's training throughput with the default threads (2, as the
tool and PyTorch take on this machine), first on the idle machine, then while a competing
process spins on one core, so that both threads of each library share the cores with it.
Each side's `kept` is its idle time over its loaded time (the share of its own idle
throughput it keeps; 0.5 would be a fair share of one core in two); the ratio of hybridnn's
kept share to PyTorch's is the figure (>= 1: hybridnn degrades no worse). The means over all
chunks count here, not the best chunk, since the competitor takes its time throughout.

Memory: CaffeNet at batch 32, forward + full backward and training with SGD and momentum
(the solver's history included), each in a process of its own so that its peak resident
memory (the kernel's high-water mark) is that case's alone: PyTorch in both memory formats
(its lower peak is the reference), hybridnn through `hybridnn-bench memory`.

Both sides are timed the same way: a warm-up, then the timed iterations in chunks; the
figure is the best chunk's mean (the machine is shared, so the best chunk is the one least
disturbed) and the mean over all chunks is printed beside it. PyTorch runs in both memory
formats (NCHW and channels_last, which is faster with Debian's oneDNN build); its best over
threads and formats is the reference of the ratio. LeNet's data come from
tensors preloaded in memory, sliced per batch in Caffe's order (batch b holds records
[64b, 64b+64) modulo 60,000), as hybridnn's data feed hands them over.

PyTorch: Debian's python3-torch (1.13) in this process, and with --torch-python each other
interpreter's (today's PyTorch from PyPI in a venv: `python3 -m venv /tmp/torchvenv &&
/tmp/torchvenv/bin/pip install torch torchvision`; it pulls GPU libraries too, the benchmark
needs only the CPU), timed in a child process of that interpreter. The faster PyTorch is the
reference of every ratio, as a user would pick it.

Needs Debian's python3-torch (CPU); without it the script says so, prints
{"skipped": ...} and exits 0. Without the `hybridnn` tool only the PyTorch figures print.
"""

import argparse
import contextlib
import functools
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(os.path.dirname(REPO), "shared", "models")
FASHION = "/usr/share/datasets/fashion-mnist"
LENET_EXAMPLE = os.path.join(REPO, "examples", "fashion_mnist", "lenet_train_test.prototxt")
LENET_CAFFE = os.path.join(MODELS, "mnist_lenet_train_test.prototxt")
CAFFENET = os.path.join(MODELS, "bvlc_reference_caffenet_deploy.prototxt")

# Caffe's lenet_solver.prototxt.
BASE_LR, MOMENTUM, WEIGHT_DECAY, GAMMA, POWER = 0.01, 0.9, 5e-4, 1e-4, 0.75
LENET_BATCH, LENET_TEST_BATCH, CAFFENET_BATCH = 64, 100, 32


def emit(record):
    print(json.dumps(record), flush=True)


def note(message):
    print("vs_pytorch: " + message, file=sys.stderr, flush=True)


def rerun_under_system_python(flag):
    """Debian's python3-torch lives in /usr/bin/python3's dist-packages; a python3 earlier
    on PATH (pyenv, a venv) does not see it, so the script re-runs itself under
    /usr/bin/python3 (once: `flag` names the environment variable that says it did)."""
    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get(flag)):
        os.environ[flag] = "1"
        os.execv(system, [system] + sys.argv)


def import_torch():
    """PyTorch, from /usr/bin/python3 if need be (rerun_under_system_python)."""
    try:
        import numpy  # noqa: F401
        import torch
        return torch
    except ImportError as error:
        rerun_under_system_python("HYBRIDNN_VS_PYTORCH_REEXEC")
        note(f"PyTorch is not installed ({error}); install Debian's CPU build with "
             "`sudo apt-get install python3-torch` to run this comparison")
        emit({"skipped": f"python3-torch not installed ({error})"})
        sys.exit(0)


def set_threads(torch, threads):
    """torch.set_num_threads covers OpenMP and oneDNN; Debian's torch does its GEMMs in
    OpenBLAS (pthreads build), whose pool must be sized separately."""
    torch.set_num_threads(threads)
    import ctypes
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if hasattr(lib, "openblas_set_num_threads"):
            lib.openblas_set_num_threads(threads)
        break


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (IDX, gzip)

def read_idx(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise SystemExit(f"vs_pytorch: {path} is not an IDX file of unsigned bytes")
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != math.prod(shape):
        raise SystemExit(f"vs_pytorch: {path} is truncated "
                         f"({body.size} of {math.prod(shape)} bytes)")
    return body.reshape(shape)


def load_fashion(torch, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(FASHION, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(FASHION, f"{prefix}-labels-idx1-ubyte.gz"))
    # transform_param scale: 0.00390625, applied to the bytes as Caffe does.
    x = torch.from_numpy(images.astype("float32")).mul_(0.00390625).unsqueeze(1).contiguous()
    y = torch.from_numpy(labels.astype("int64"))
    return x, y


class Batches:
    """Batch b = records [b*batch, (b+1)*batch) modulo the set's size (Caffe's Data layer
    order, and hybridnn's feed)."""

    def __init__(self, torch, x, y, batch):
        self.torch, self.x, self.y, self.batch, self.pos = torch, x, y, batch, 0

    def next(self):
        n, start, end = self.x.shape[0], self.pos, self.pos + self.batch
        self.pos = end % n
        if end <= n:
            return self.x[start:end], self.y[start:end]
        rest = end - n
        return (self.torch.cat((self.x[start:], self.x[:rest])),
                self.torch.cat((self.y[start:], self.y[:rest])))


# ---------------------------------------------------------------------------------------------
# The nets, as in the prototxt files

def caffe_xavier_(torch, weight):
    # Caffe's XavierFiller (variance_norm FAN_IN): U(-a, a), a = sqrt(3 / fan_in).
    fan_in = weight[0].numel()
    bound = math.sqrt(3.0 / fan_in)
    with torch.no_grad():
        weight.uniform_(-bound, bound)


def lenet(torch):
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 20, 5),                                   # conv1
        nn.MaxPool2d(2, 2, ceil_mode=True),                    # pool1
        nn.Conv2d(20, 50, 5),                                  # conv2
        nn.MaxPool2d(2, 2, ceil_mode=True),                    # pool2
        nn.Flatten(),
        nn.Linear(800, 500),                                   # ip1
        nn.ReLU(inplace=True),                                 # relu1
        nn.Linear(500, 10))                                    # ip2
    for module in net:
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            caffe_xavier_(torch, module.weight)
            nn.init.zeros_(module.bias)
    return net


def lenet_solver(torch, net):
    """SGD, momentum 0.9, weight_decay 5e-4 on weights and biases (decay_mult 1), biases at
    lr_mult 2; the inv policy is applied per iteration by inv_lr()."""
    weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in net.named_parameters() if name.endswith("bias")]
    groups = [{"params": weights, "lr_mult": 1.0}, {"params": biases, "lr_mult": 2.0}]
    return torch.optim.SGD(groups, lr=BASE_LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)


def inv_lr(iteration):
    return BASE_LR * (1.0 + GAMMA * iteration) ** (-POWER)


def sgd_step(net, solver, loss_fn, feed, iteration):
    """One LeNet training iteration as Caffe's solver does it: the inv rate times each
    group's lr_mult, forward, backward, update. Returns the loss tensor."""
    lr = inv_lr(iteration)
    for group in solver.param_groups:
        group["lr"] = lr * group["lr_mult"]
    data, label = feed.next()
    loss = loss_fn(net(data), label)
    solver.zero_grad(set_to_none=True)
    loss.backward()
    solver.step()
    return loss


def caffenet(torch):
    nn = torch.nn
    lrn = dict(size=5, alpha=1e-4, beta=0.75, k=1.0)
    net = nn.Sequential(
        nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(inplace=True),                   # conv1
        nn.MaxPool2d(3, 2, ceil_mode=True), nn.LocalResponseNorm(**lrn),         # pool1 norm1
        nn.Conv2d(96, 256, 5, padding=2, groups=2), nn.ReLU(inplace=True),       # conv2
        nn.MaxPool2d(3, 2, ceil_mode=True), nn.LocalResponseNorm(**lrn),         # pool2 norm2
        nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(inplace=True),                # conv3
        nn.Conv2d(384, 384, 3, padding=1, groups=2), nn.ReLU(inplace=True),      # conv4
        nn.Conv2d(384, 256, 3, padding=1, groups=2), nn.ReLU(inplace=True),      # conv5
        nn.MaxPool2d(3, 2, ceil_mode=True),                                      # pool5
        nn.Flatten(),
        nn.Linear(9216, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),           # fc6
        nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),           # fc7
        nn.Linear(4096, 1000),                                                   # fc8
        nn.Softmax(dim=1))                                                       # prob
    # The deploy net has no fillers; values do not change the timing, so keep activations
    # in the normal float range.
    for module in net:
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(module.weight, std=0.01)
            nn.init.constant_(module.bias, 0.1)
    return net.train()  # `caffe time` runs the TRAIN phase: dropout is active


# ---------------------------------------------------------------------------------------------
# Timing

def chunked(step, iterations, chunks, warmup):
    """Runs `warmup` steps, then `iterations` steps in `chunks` chunks; returns
    (best chunk ms/iteration, mean ms/iteration)."""
    for _ in range(warmup):
        step()
    size = max(1, iterations // chunks)
    times = []
    for _ in range(max(1, iterations // size)):
        start = time.perf_counter()
        for _ in range(size):
            step()
        times.append((time.perf_counter() - start) * 1e3 / size)
    return min(times), sum(times) / len(times)


def memory_format(torch, name):
    return torch.channels_last if name == "channels_last" else torch.contiguous_format


def pytorch_lenet(torch, threads, layout, iterations, chunks):
    set_threads(torch, threads)
    torch.manual_seed(1)
    x, y = load_fashion(torch, "train")
    x = x.contiguous(memory_format=memory_format(torch, layout))
    feed = Batches(torch, x, y, LENET_BATCH)
    net = lenet(torch).to(memory_format=memory_format(torch, layout))
    solver = lenet_solver(torch, net)
    loss_fn = torch.nn.CrossEntropyLoss()
    state = {"iter": 0}

    def step():
        sgd_step(net, solver, loss_fn, feed, state["iter"])
        state["iter"] += 1

    warmup = max(1, iterations // chunks)
    return chunked(step, iterations, chunks, warmup)


def pytorch_forward_backward(torch, make_net, shape, threads, layout, iterations, chunks):
    """ms per forward + full backward of make_net(torch) on random inputs of `shape`."""
    set_threads(torch, threads)
    torch.manual_seed(1)
    fmt = memory_format(torch, layout)
    net = make_net(torch).to(memory_format=fmt)
    data = torch.randn(*shape).contiguous(memory_format=fmt)
    data.requires_grad_()

    def step():
        loss = net(data).sum()
        net.zero_grad(set_to_none=True)
        data.grad = None
        loss.backward()  # weights and the input's gradient (Caffe's force_backward)

    return chunked(step, iterations, chunks, warmup=2)


def pytorch_caffenet(torch, threads, layout, iterations, chunks):
    return pytorch_forward_backward(torch, caffenet, (CAFFENET_BATCH, 3, 227, 227), threads,
                                    layout, iterations, chunks)


PYTORCH_CASES = {"lenet": pytorch_lenet, "caffenet": pytorch_caffenet}


class InProcessPyTorch:
    """The PyTorch this interpreter imports (Debian's, through /usr/bin/python3)."""

    def __init__(self, torch):
        self.torch = torch
        self.version = torch.__version__
        self.python = os.path.realpath(sys.executable)

    def time(self, case, threads, layout, iterations, chunks):
        return PYTORCH_CASES[case](self.torch, threads, layout, iterations, chunks)


class ChildPyTorch:
    """Another interpreter's PyTorch (--torch-python, e.g. a venv with PyPI's build), timed
    in a child process running this script's --peer-child mode, so that each PyTorch
    measures its own net the same way."""

    def __init__(self, python):
        self.python = python
        probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0 or not probe.stdout.strip():
            raise RuntimeError(f"{python} cannot import torch:\n{probe.stderr[-1000:]}")
        self.version = probe.stdout.strip().splitlines()[-1]

    def time(self, case, threads, layout, iterations, chunks):
        command = [self.python, os.path.abspath(__file__), "--peer-child", case,
                   "--threads", str(threads), "--layouts", layout,
                   "--iterations", str(iterations), "--chunks", str(chunks)]
        # The child must not fall back to /usr/bin/python3's PyTorch.
        env = dict(os.environ, HYBRIDNN_VS_PYTORCH_REEXEC="1")
        run = subprocess.run(command, capture_output=True, text=True, env=env)
        records = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        if run.returncode != 0 or not records or "ms_per_iter" not in records[-1]:
            raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                               f"{(run.stdout + run.stderr)[-2000:]}")
        return records[-1]["ms_per_iter"], records[-1]["ms_per_iter_mean"]


def pytorch_peers(torch, pythons):
    """This interpreter's PyTorch and each --torch-python's; the faster of them is the
    reference (the one a user would pick)."""
    peers = [InProcessPyTorch(torch)]
    for python in pythons:
        try:
            peers.append(ChildPyTorch(python))
        except (RuntimeError, OSError) as error:
            note(f"--torch-python {python} left out: {error}")
    return peers


def pytorch_accuracy(torch, threads, iterations=10000):
    set_threads(torch, threads)
    torch.manual_seed(1)
    x, y = load_fashion(torch, "train")
    tx, ty = load_fashion(torch, "test")
    feed = Batches(torch, x, y, LENET_BATCH)
    net = lenet(torch).to(memory_format=torch.channels_last)  # the faster layout here
    solver = lenet_solver(torch, net)
    loss_fn = torch.nn.CrossEntropyLoss()

    def test():
        correct = 0
        with torch.no_grad():
            for start in range(0, tx.shape[0], LENET_TEST_BATCH):
                out = net(tx[start:start + LENET_TEST_BATCH])
                correct += (out.argmax(1) == ty[start:start + LENET_TEST_BATCH]).sum().item()
        return correct / tx.shape[0]

    start = time.perf_counter()
    for iteration in range(iterations):
        loss = sgd_step(net, solver, loss_fn, feed, iteration)
        if (iteration + 1) % 1000 == 0 and iteration + 1 < iterations:
            note(f"pytorch lenet iteration {iteration + 1}: loss {loss.item():.4f}, "
                 f"test accuracy {test():.4f}")
    wall = time.perf_counter() - start
    return test(), wall, loss.item()


# ---------------------------------------------------------------------------------------------
# hybridnn

def find_tool(build, name="hybridnn"):
    path = os.path.join(build if os.path.isabs(build) else os.path.join(REPO, build),
                        "bin", name)
    return path if os.access(path, os.X_OK) else None


@functools.lru_cache(maxsize=None)
def tool_help(tool):
    try:
        run = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60)
        return run.stdout + run.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def thread_args(tool, threads):
    """`hybridnn` takes --threads where it has it; the environment caps OpenMP and OpenBLAS
    pools either way."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    args = ["--threads", str(threads)] if "--threads" in tool_help(tool) else []
    return args, env


def lenet_net_file(tmp):
    if os.path.exists(LENET_EXAMPLE):
        return LENET_EXAMPLE
    # Caffe's LeNet with its LMDB sources pointed at the Fashion-MNIST IDX files.
    with open(LENET_CAFFE) as f:
        text = f.read()
    text = text.replace("examples/mnist/mnist_train_lmdb",
                        os.path.join(FASHION, "train-images-idx3-ubyte.gz"))
    text = text.replace("examples/mnist/mnist_test_lmdb",
                        os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"))
    path = os.path.join(tmp, "lenet_train_test.prototxt")
    with open(path, "w") as f:
        f.write(text)
    return path


def hybridnn_lenet(tool, threads, iterations, chunks, tmp):
    display = max(1, iterations // chunks)
    # Displays fall at iterations 0, d, 2d, ... below max_iter, each line's rate covering
    # the d iterations before it: the lines at 2d ... (chunks+1)d are the timed chunks.
    max_iter = display * (iterations // display + 2)
    solver = os.path.join(tmp, f"lenet_solver_{threads}.prototxt")
    metrics = os.path.join(tmp, f"lenet_metrics_{threads}.jsonl")
    with open(solver, "w") as f:
        f.write(f'net: "{lenet_net_file(tmp)}"\n'
                f"test_iter: 1\ntest_interval: {max_iter + 1000}\n"
                f"test_initialization: false\n"
                f"base_lr: {BASE_LR}\nmomentum: {MOMENTUM}\nweight_decay: {WEIGHT_DECAY}\n"
                f'lr_policy: "inv"\ngamma: {GAMMA}\npower: {POWER}\n'
                f"display: {display}\nmax_iter: {max_iter}\n"
                f"snapshot: 0\nsnapshot_after_train: false\n"
                f'snapshot_prefix: "{os.path.join(tmp, "lenet")}"\nsolver_mode: CPU\n')
    args, env = thread_args(tool, threads)
    command = [tool, "train", "--solver", solver, "--metrics", metrics] + args
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    rates = []
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record.get("phase") == "train" and record.get("images_per_s"):
                rates.append((record["iter"], record["images_per_s"]))
    # The interval ending at d (net warm-up) is left out.
    timed = [LENET_BATCH * 1e3 / rate for it, rate in sorted(rates) if it > display]
    if not timed:
        raise RuntimeError(f"no images_per_s after iteration {display} in {metrics}")
    return min(timed), sum(timed) / len(timed), wall


def hybridnn_caffenet(tool, threads, iterations, chunks):
    """`hybridnn time` once per chunk (it warms up, then reports its mean): the best run's
    and the overall mean ms/iteration, as chunked() gives PyTorch's."""
    size = max(1, iterations // chunks)
    runs = [hybridnn_time(tool, threads, size) for _ in range(max(1, iterations // size))]
    times = [ms for ms, _ in runs]
    return min(times), sum(times) / len(times)


def hybridnn_time(tool, threads, iterations):
    args, env = thread_args(tool, threads)
    command = [tool, "time", "--model", CAFFENET, "--iterations", str(iterations),
               "--batch", str(CAFFENET_BATCH), "--json"] + args
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    total = peak = None
    for line in run.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            record = json.loads(line)
            # The last line, {"total":true,...}, holds the mean per iteration and the
            # process's peak resident memory.
            if record.get("total") is True and "forward_backward_ms" in record:
                total = float(record["forward_backward_ms"])
                peak = record.get("peak_rss_bytes")
    if total is None:
        raise RuntimeError("no total forward+backward milliseconds in the output of "
                           f"`{' '.join(command)}`:\n{run.stdout[-2000:]}")
    return total, peak


# ---------------------------------------------------------------------------------------------
# Under load: a competing process that keeps one core busy

class BusyCore:
    """A process spinning on one core while the block runs (not pinned: the scheduler
    shares the cores among it and the measured threads)."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)  # running before the measurement starts
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()
        return False


def load_comparison(peers, tool, threads, layouts, iterations, chunks):
    """LeNet idle and under a busy core: each PyTorch (in its faster layout idle) and
    hybridnn. The PyTorch that is faster idle is the reference (`kept_pytorch`)."""
    failed = False
    chosen = {}
    for peer in peers:
        chosen[peer.version] = min(
            layouts, key=lambda l: peer.time("lenet", threads, l, iterations, chunks)[1])
    figures = {}
    for loaded in (False, True):
        with BusyCore() if loaded else contextlib.nullcontext():
            for peer in peers:
                layout = chosen[peer.version]
                _, mean = peer.time("lenet", threads, layout, iterations, chunks)
                figures[(peer.version, loaded)] = mean
                emit({"bench": "lenet_under_load", "impl": "pytorch", "torch": peer.version,
                      "threads": threads, "layout": layout, "busy_core": loaded,
                      "iterations": iterations, "ms_per_iter_mean": round(mean, 3)})
            if tool:
                try:
                    with tempfile.TemporaryDirectory(prefix="hybridnn-bench-") as tmp:
                        _, mean, _ = hybridnn_lenet(tool, threads, iterations, chunks, tmp)
                    figures[("hybridnn", loaded)] = mean
                    emit({"bench": "lenet_under_load", "impl": "hybridnn", "threads": threads,
                          "busy_core": loaded, "iterations": iterations,
                          "ms_per_iter_mean": round(mean, 3)})
                except (RuntimeError, OSError, ValueError) as error:
                    note(f"hybridnn LeNet under load failed: {error}")
                    failed = True
    fastest = min(peers, key=lambda peer: figures[(peer.version, False)]).version
    kept = {name: figures[(name, False)] / figures[(name, True)]
            for name in [peer.version for peer in peers] + ["hybridnn"]
            if (name, True) in figures}
    record = {"bench": "lenet_under_load", "threads": threads, "pytorch": fastest,
              "kept_pytorch": round(kept[fastest], 3)}
    if len(peers) > 1:
        record.update({f"kept_torch_{peer.version}": round(kept[peer.version], 3)
                       for peer in peers})
    if "hybridnn" in kept:
        record["kept_hybridnn"] = round(kept["hybridnn"], 3)
        record["ratio_kept_hybridnn_to_pytorch"] = round(kept["hybridnn"] / kept[fastest], 3)
        record["ratio_loaded_ms_hybridnn_to_pytorch"] = round(
            figures[("hybridnn", True)] / figures[(fastest, True)], 3)
    emit(record)
    return failed


# ---------------------------------------------------------------------------------------------
# Peak resident memory, one process per case

MEMORY_ITERATIONS = 3


def peak_rss_bytes():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB


def pytorch_memory_child(case, threads, layout):
    """Runs in a process of its own (--memory-child): CaffeNet forward + full backward
    (`fwd_bwd`) or SGD training with momentum and weight decay (`train`, fc8's output into a
    softmax loss as Caffe's train_val has it), MEMORY_ITERATIONS times; prints the peak."""
    torch = import_torch()
    set_threads(torch, threads)
    torch.manual_seed(1)
    fmt = memory_format(torch, layout)
    net = caffenet(torch)
    if case == "train":
        net = net[:-1]  # logits: CrossEntropyLoss applies the softmax
    net = net.to(memory_format=fmt)
    data = torch.randn(CAFFENET_BATCH, 3, 227, 227).contiguous(memory_format=fmt)
    if case == "fwd_bwd":
        data.requires_grad_()
        for _ in range(MEMORY_ITERATIONS):
            loss = net(data).sum()
            net.zero_grad(set_to_none=True)
            data.grad = None
            loss.backward()
    else:
        labels = torch.randint(0, 1000, (CAFFENET_BATCH,))
        solver = torch.optim.SGD(net.parameters(), lr=BASE_LR, momentum=MOMENTUM,
                                 weight_decay=WEIGHT_DECAY)
        loss_fn = torch.nn.CrossEntropyLoss()
        for _ in range(MEMORY_ITERATIONS):
            solver.zero_grad(set_to_none=True)
            loss_fn(net(data), labels).backward()
            solver.step()
    emit({"peak_rss_bytes": peak_rss_bytes()})
    return 0


def pytorch_memory(case, threads, layout):
    command = [sys.executable, os.path.abspath(__file__), "--memory-child", case,
               "--threads", str(threads), "--layouts", layout]
    run = subprocess.run(command, capture_output=True, text=True)
    records = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    if run.returncode != 0 or not records or "peak_rss_bytes" not in records[-1]:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    return records[-1]["peak_rss_bytes"]


def caffenet_train_files(tmp):
    """CaffeNet's deploy net made a training net as PyTorch's: DummyData (Gaussian images,
    labels 0) in place of the Input layer, a softmax loss in place of `prob`; and an SGD
    solver with momentum and weight decay (Caffe's, from lenet_solver)."""
    import re
    with open(CAFFENET) as f:
        text = f.read()
    head, *layers = re.split(r"(?m)^layer \{", text)
    kept = [l for l in layers
            if not re.search(r'type: "Input"', l) and not re.search(r'name: "prob"', l)]
    net = (head + f"""layer {{ name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param {{ shape {{ dim: {CAFFENET_BATCH} dim: 3 dim: 227 dim: 227 }}
    shape {{ dim: {CAFFENET_BATCH} }}
    data_filler {{ type: "gaussian" std: 1 }} data_filler {{ type: "constant" }} }} }}
""" + "".join("layer {" + l for l in kept) +
           'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" '
           'top: "loss" }\n')
    net_path = os.path.join(tmp, "caffenet_train.prototxt")
    with open(net_path, "w") as f:
        f.write(net)
    solver_path = os.path.join(tmp, "caffenet_solver.prototxt")
    with open(solver_path, "w") as f:
        f.write(f'net: "{net_path}"\nbase_lr: {BASE_LR}\nmomentum: {MOMENTUM}\n'
                f'weight_decay: {WEIGHT_DECAY}\nlr_policy: "fixed"\n'
                f"max_iter: {MEMORY_ITERATIONS + 1}\ndisplay: 0\nsnapshot_after_train: false\n"
                f'snapshot_prefix: "{os.path.join(tmp, "caffenet")}"\n')
    return solver_path


def hybridnn_memory(bench, case, threads, tmp):
    """`hybridnn-bench memory` in a process of its own: its JSON line."""
    command = [bench, "memory", "--threads", str(threads), "--iterations",
               str(MEMORY_ITERATIONS)]
    command += ["--solver", caffenet_train_files(tmp)] if case == "train" else [
        "--model", CAFFENET, "--batch", str(CAFFENET_BATCH)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp, env=env)
    records = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    if run.returncode != 0 or not records or "peak_rss_bytes" not in records[-1]:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    return records[-1]


def memory_comparison(bench, threads, layouts):
    """One JSON line per implementation and case, then the ratio to PyTorch's lower peak."""
    failed = False
    for case in ("fwd_bwd", "train"):
        best = None
        for layout in layouts:
            peak = pytorch_memory(case, threads, layout)
            emit({"bench": "caffenet_memory", "case": case, "impl": "pytorch", "threads": threads,
                  "layout": layout, "batch": CAFFENET_BATCH, "iterations": MEMORY_ITERATIONS,
                  "peak_rss_bytes": peak})
            best = peak if best is None else min(best, peak)
        if not bench:
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="hybridnn-bench-") as tmp:
                record = hybridnn_memory(bench, case, threads, tmp)
            ours = record["peak_rss_bytes"]
            emit({"bench": "caffenet_memory", "case": case, "impl": "hybridnn",
                  "threads": threads, "batch": CAFFENET_BATCH, "iterations": MEMORY_ITERATIONS,
                  "ms_per_iter": record["ms_per_iteration"], "peak_rss_bytes": ours,
                  "param_bytes": record["param_bytes"],
                  "activation_bytes": record["activation_bytes"]})
            emit({"bench": "caffenet_memory", "case": case,
                  "ratio_hybridnn_to_pytorch_best": round(ours / best, 3)})
        except (RuntimeError, OSError, ValueError) as error:
            note(f"hybridnn CaffeNet memory ({case}) failed: {error}")
            failed = True
    return failed


# ---------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="hybridnn build directory (build)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed LeNet iterations (500); CaffeNet uses this too unless "
                             "--caffenet-iterations is given")
    parser.add_argument("--caffenet-iterations", type=int, default=None,
                        help="timed CaffeNet iterations (10)")
    parser.add_argument("--chunks", type=int, default=5,
                        help="timed iterations are measured in this many chunks; the best "
                             "chunk is reported (5)")
    parser.add_argument("--threads", default="1,2",
                        help="thread counts, PyTorch's and hybridnn's (1,2)")
    parser.add_argument("--layouts", default="nchw,channels_last",
                        help="PyTorch memory formats tried; the best counts (nchw,channels_last)")
    parser.add_argument("--only", choices=["lenet", "caffenet", "memory", "load"], default=None,
                        help="one comparison; load (LeNet beside a busy core) runs only so")
    parser.add_argument("--torch-python", action="append", default=[], metavar="PYTHON",
                        help="another interpreter whose PyTorch is timed too, e.g. a venv's "
                             "with PyPI's build (repeatable); the faster PyTorch is the "
                             "reference")
    parser.add_argument("--memory-child", choices=["fwd_bwd", "train"], default=None,
                        help=argparse.SUPPRESS)  # one PyTorch memory case (memory_comparison)
    parser.add_argument("--peer-child", choices=sorted(PYTORCH_CASES), default=None,
                        help=argparse.SUPPRESS)  # one PyTorch timing (ChildPyTorch)
    parser.add_argument("--accuracy", action="store_true",
                        help="instead: train PyTorch's LeNet for 10,000 iterations and print "
                             "its Fashion-MNIST test accuracy")
    args = parser.parse_args()
    try:
        threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        parser.error("--threads needs positive counts, e.g. 1,2")
    layouts = [l for l in args.layouts.split(",") if l]
    if not layouts or any(l not in ("nchw", "channels_last") for l in layouts):
        parser.error("--layouts takes nchw and/or channels_last")
    lenet_iterations = args.iterations or 500
    caffenet_iterations = args.caffenet_iterations or args.iterations or 10
    if lenet_iterations < 1 or caffenet_iterations < 1 or args.chunks < 1:
        parser.error("--iterations, --caffenet-iterations and --chunks must be positive")

    if args.memory_child:
        return pytorch_memory_child(args.memory_child, max(threads), layouts[0])
    torch = import_torch()
    if args.peer_child:
        ms, mean = PYTORCH_CASES[args.peer_child](torch, threads[0], layouts[0],
                                                  args.iterations or 1, args.chunks)
        emit({"torch": torch.__version__, "ms_per_iter": ms, "ms_per_iter_mean": mean})
        return 0
    peers = pytorch_peers(torch, args.torch_python)
    load = os.getloadavg()[0]
    emit({"bench": "setup", "torch": [peer.version for peer in peers],
          "load_1min": round(load, 2), "cpus": os.cpu_count()})

    if args.accuracy:
        accuracy, wall, loss = pytorch_accuracy(torch, max(threads))
        emit({"bench": "lenet_accuracy", "impl": "pytorch", "threads": max(threads),
              "iterations": 10000, "test_accuracy": round(accuracy, 4),
              "final_loss": round(loss, 4), "wall_s": round(wall, 1)})
        return 0

    tool = find_tool(args.build)
    if tool is None:
        note(f"no hybridnn tool at {os.path.join(args.build, 'bin', 'hybridnn')}; build it "
             "(cmake --build build) for the comparison; printing PyTorch's figures only")
    failed = False

    if args.only == "load":
        return 1 if load_comparison(peers, tool, max(threads), layouts, lenet_iterations,
                                    args.chunks) else 0

    if args.only in (None, "lenet"):
        best = None
        for peer in peers:
            for t in threads:
                for layout in layouts:
                    ms, mean = peer.time("lenet", t, layout, lenet_iterations, args.chunks)
                    emit({"bench": "lenet_train", "impl": "pytorch", "torch": peer.version,
                          "threads": t, "layout": layout, "batch": LENET_BATCH,
                          "iterations": lenet_iterations, "ms_per_iter": round(ms, 3),
                          "ms_per_iter_mean": round(mean, 3)})
                    best = ms if best is None else min(best, ms)
        if tool:
            with tempfile.TemporaryDirectory(prefix="hybridnn-bench-") as tmp:
                try:
                    ours = None
                    for t in threads:
                        ms, mean, wall = hybridnn_lenet(tool, t, lenet_iterations, args.chunks,
                                                        tmp)
                        emit({"bench": "lenet_train", "impl": "hybridnn", "threads": t,
                              "batch": LENET_BATCH, "iterations": lenet_iterations,
                              "ms_per_iter": round(ms, 3), "ms_per_iter_mean": round(mean, 3),
                              "process_wall_s": round(wall, 2)})
                        ours = ms if ours is None else min(ours, ms)
                    emit({"bench": "lenet_train", "ratio_hybridnn_to_pytorch_best":
                          round(ours / best, 3)})
                except (RuntimeError, OSError, ValueError) as error:
                    note(f"hybridnn LeNet failed: {error}")
                    failed = True

    if args.only in (None, "caffenet"):
        best = None
        for peer in peers:
            for t in threads:
                for layout in layouts:
                    ms, mean = peer.time("caffenet", t, layout, caffenet_iterations,
                                         min(args.chunks, caffenet_iterations))
                    emit({"bench": "caffenet_fwd_bwd", "impl": "pytorch", "torch": peer.version,
                          "threads": t, "layout": layout, "batch": CAFFENET_BATCH,
                          "iterations": caffenet_iterations, "ms_per_iter": round(ms, 1),
                          "ms_per_iter_mean": round(mean, 1)})
                    best = ms if best is None else min(best, ms)
        if tool:
            try:
                ours = None
                for t in threads:
                    ms, mean = hybridnn_caffenet(tool, t, caffenet_iterations,
                                                 min(args.chunks, caffenet_iterations))
                    emit({"bench": "caffenet_fwd_bwd", "impl": "hybridnn", "threads": t,
                          "batch": CAFFENET_BATCH, "iterations": caffenet_iterations,
                          "ms_per_iter": round(ms, 1), "ms_per_iter_mean": round(mean, 1)})
                    ours = ms if ours is None else min(ours, ms)
                emit({"bench": "caffenet_fwd_bwd", "ratio_hybridnn_to_pytorch_best":
                      round(ours / best, 3)})
            except (RuntimeError, OSError, ValueError) as error:
                note(f"hybridnn CaffeNet failed: {error}")
                failed = True

    if args.only in (None, "memory"):
        bench = find_tool(args.build, "hybridnn-bench")
        if bench is None:
            note("no hybridnn-bench beside the tool; printing PyTorch's memory only")
        failed = memory_comparison(bench, max(threads), layouts) or failed

    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
