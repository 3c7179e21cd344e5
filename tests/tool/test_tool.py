#!/usr/bin/env python3
"""Tests of the `hybridnn` tool, one ctest test per case (tools/CMakeLists.txt registers them).

  test_tool.py --list
  test_tool.py --tool BUILD/bin/hybridnn --models ../shared/models --work DIR CASE

Each case runs in DIR/CASE on small generated data: IDX files whose label is the bright
quadrant of a noisy 12x12 image, a tiny LeNet-like net and a solver of a few dozen
iterations. Exit status: 0 passed, 1 failed, 77 skipped (something the machine lacks).
"""

import argparse
import gzip
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


class Context:
    def __init__(self, tool, models, work, mpiexec=None):
        self.tool, self.models, self.work, self.mpiexec = tool, models, work, mpiexec
        self.repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def run(self, *args, code=0, timeout=90):
        command = [self.tool] + [str(a) for a in args]
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             cwd=self.work)
        if run.returncode != code:
            raise Failure(f"`{' '.join(command)}` exited {run.returncode}, expected {code}\n"
                          f"--- stdout (end)\n{run.stdout[-3000:]}\n"
                          f"--- stderr\n{run.stderr[-3000:]}")
        return run

    def error(self, *args, needles=(), patterns=(), code=1):
        """Runs a command that must fail with `code` and a message on stderr holding every
        needle and matching every pattern."""
        run = self.run(*args, code=code)
        command = args[0]
        prefix = f"hybridnn {command}: error: " if code == 1 else f"hybridnn {command}: "
        check(run.stderr.startswith(prefix),
              f"stderr should start with '{prefix}':\n{run.stderr}")
        for needle in needles:
            check(needle in run.stderr, f"stderr lacks '{needle}':\n{run.stderr}")
        for pattern in patterns:
            check(re.search(pattern, run.stderr), f"stderr does not match /{pattern}/:\n"
                  f"{run.stderr}")
        return run


# ---- generated data and nets ---------------------------------------------------------------

SIDE = 12
CLASSES = 4


def write_idx(images_path, images, labels, compress=True):
    """IDX images (magic 0x803) and the labels file beside them (0x801)."""
    labels_path = images_path.replace("images-idx3", "labels-idx1")
    opener = gzip.open if compress else open
    with opener(images_path, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(images), SIDE, SIDE))
        f.write(b"".join(images))
    with opener(labels_path, "wb") as f:
        f.write(struct.pack(">II", 0x801, len(labels)))
        f.write(bytes(labels))
    return images_path


def make_images(count, seed):
    rng = random.Random(seed)
    images, labels = [], []
    half = SIDE // 2
    for _ in range(count):
        label = rng.randrange(CLASSES)
        qy, qx = divmod(label, 2)
        pixels = bytearray(rng.randrange(0, 90) for _ in range(SIDE * SIDE))
        for y in range(qy * half, qy * half + half):
            for x in range(qx * half, qx * half + half):
                pixels[y * SIDE + x] = min(255, pixels[y * SIDE + x] + 150)
        images.append(bytes(pixels))
        labels.append(label)
    return images, labels


def make_dataset(ctx, compress=True):
    """Train (256 images) and test (100) IDX files in ctx.work/data; returns their paths."""
    os.makedirs(ctx.path("data"), exist_ok=True)
    ext = ".gz" if compress else ""
    train = write_idx(ctx.path("data", "train-images-idx3-ubyte" + ext), *make_images(256, 1),
                      compress=compress)
    test = write_idx(ctx.path("data", "t10k-images-idx3-ubyte" + ext), *make_images(100, 2),
                     compress=compress)
    return train, test


def data_layer(phase, source, batch):
    return f"""layer {{
  name: "data" type: "Data" top: "data" top: "label"
  include {{ phase: {phase} }}
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }}
}}
"""


def tiny_net(train_source, test_source, conv_type="Convolution", classes=CLASSES, extra=""):
    return (f'name: "Tiny"\n' + data_layer("TRAIN", train_source, 16) +
            data_layer("TEST", test_source, 20) + f"""layer {{
  name: "conv1" type: "{conv_type}" bottom: "data" top: "conv1"
  convolution_param {{ num_output: 4 kernel_size: 3 weight_filler {{ type: "xavier" }} }}
}}
layer {{
  name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }}
}}
layer {{
  name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param {{ num_output: 16 weight_filler {{ type: "xavier" }} }}
}}
layer {{ name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{
  name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param {{ num_output: {classes} weight_filler {{ type: "xavier" }} }}
}}
layer {{
  name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy"
  include {{ phase: TEST }}
}}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }}
""" + extra)


def solver_text(net, prefix, max_iter=40, display=1, snapshot=20, test_interval=20,
                extra=""):
    return f"""net: "{net}"
test_iter: 5
test_interval: {test_interval}
base_lr: 0.05
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: {display}
max_iter: {max_iter}
snapshot: {snapshot}
snapshot_prefix: "{prefix}"
random_seed: 7
{extra}"""


def write(ctx, name, text):
    path = ctx.path(name)
    with open(path, "w") as f:
        f.write(text)
    return path


def setup_training(ctx, **solver_args):
    """Data, tiny net and solver in ctx.work; returns (solver, net, snapshot prefix)."""
    train, test = make_dataset(ctx)
    net = write(ctx, "net.prototxt", tiny_net(train, test))
    prefix = ctx.path("snapshots", "tiny")
    solver = write(ctx, "solver.prototxt", solver_text(net, prefix, **solver_args))
    return solver, net, prefix


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def output_value(stdout, name):
    """The last 'NAME = V' line of `hybridnn test` (the mean over the batches)."""
    values = re.findall(rf"^{re.escape(name)} = (\S+)", stdout, re.MULTILINE)
    check(values, f"no '{name} = ...' line in:\n{stdout[-2000:]}")
    return float(values[-1])


def json_lines(stdout):
    records = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    check(records, "no JSON lines printed")
    return records


# ---- command line ----------------------------------------------------------------------------

@case
def help_and_usage_errors(ctx):
    run = ctx.run("help")
    for command in ["train", "test", "time", "device_query", "convert"]:
        check(command in run.stdout, f"`hybridnn help` does not list {command}")
    check("--threads" in ctx.run("--help").stdout, "`hybridnn --help` does not mention --threads")
    for args in (["help", "train"], ["train", "--help"], ["train", "-help"]):
        run = ctx.run(*args)
        check("usage: hybridnn train" in run.stdout and "--solver" in run.stdout,
              f"`hybridnn {' '.join(args)}` does not show train's flags:\n{run.stdout}")
    for command in ["test", "time", "device_query", "convert"]:
        check(f"usage: hybridnn {command}" in ctx.run(command, "--help").stdout,
              f"no usage for {command}")
    ctx.run(code=2)
    ctx.run("frobnicate", code=2)
    # An extra word after the command is named as such, not as an unknown command.
    run = ctx.run("help", "train", "extra", code=2)
    check("'extra'" in run.stderr and "unknown command" not in run.stderr,
          f"`hybridnn help train extra` blames the wrong word:\n{run.stderr}")
    usage_errors = [
        (["train"], "needs --solver"),
        (["train", "--solver", "s.prototxt", "--bogus", "1"], "unknown flag '--bogus'"),
        (["train", "--solver"], "--solver needs a value"),
        (["train", "--solver", "a", "--solver", "b"], "given twice"),
        (["train", "--solver", "s", "--weights", "w", "--snapshot", "s"], "not both"),
        (["train", "--solver", "s", "stray"], "unexpected argument 'stray'"),
        (["test", "--model", "m", "--weights", "w", "--iterations", "ten"], "expects an integer"),
        (["test", "--model", "m", "--weights", "w", "--iterations", "0"], "between 1"),
        (["test", "--model", "m"], "needs --weights"),
        (["time", "--model", "m", "--phase", "deploy"], "expects train or test"),
        (["time", "--model", "m", "--json=maybe"], "expects true or false"),
        (["time", "--model", "m", "--device", "tpu"], "--device"),
        (["time", "--model", "m", "--device", "cpu", "--gpu", "0"], "not both"),
        (["convert", "--source", "x"], "needs --output"),
    ]
    for args, needle in usage_errors:
        run = ctx.error(*args, needles=[needle, f"usage: hybridnn {args[0]}"], code=2)


@case
def split_written_in_the_prototxt_finds_its_drivers(ctx):
    # ip1 cut by outputs between cpu and reference in the prototxt alone: train, test and
    # time give the reference device a driver without --split.
    solver, net, prefix = setup_training(ctx, max_iter=5, snapshot=5)
    text = open(net).read()
    cut = text.replace('name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"',
                       'name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1" '
                       'split { device: "cpu" fraction: 0.5 } '
                       'split { device: "reference" fraction: 0.5 } split_axis: OUTPUT')
    check(cut != text, "the tiny net's ip1 line changed: update this test")
    write(ctx, "net.prototxt", cut)
    ctx.run("train", "--solver", solver)
    ctx.run("test", "--model", net, "--weights", prefix + "_iter_5.caffemodel", "--iterations", 2)
    run = ctx.run("time", "--model", net, "--iterations", 2)
    check("ip1" in run.stdout, run.stdout)


@case
def split_spec(ctx):
    solver, net, prefix = setup_training(ctx)
    # An integer after a bare device kind is a device index ("cpu:1" is the device cpu:1);
    # a fraction has a point or follows a full device name.
    for spec, device in [("cpu", "cpu"), ("cpu=1", "cpu"), ("reference:1.0", "reference"),
                         ("cpu:1.0", "cpu"), ("cpu:0:1", "cpu"), ("cpu:1", "cpu:1")]:
        run = ctx.run("time", "--model", net, "--iterations", 1, "--split", spec, "--json")
        check(json_lines(run.stdout)[-1]["device"] == device,
              f"--split {spec} did not run on {device}:\n{run.stdout}")
    # Several devices: the batch is cut among them; the Net's own driver is the first.
    for spec, device in [("cpu:0.5,reference:0.5", "cpu"), ("reference:0.25,cpu", "reference")]:
        run = ctx.run("time", "--model", net, "--iterations", 1, "--split", spec, "--json")
        check(json_lines(run.stdout)[-1]["device"] == device,
              f"--split {spec} did not run on {device}:\n{run.stdout}")
    # Measured fractions: bare auto measures cpu and the GPUs (not the reference driver).
    run = ctx.run("time", "--model", net, "--iterations", 1, "--split", "auto", "--json")
    chosen = [r for r in json_lines(run.stdout) if r.get("split")]
    check(chosen and all(r["split_spec"] == "cpu:1.0" or "cuda" in r["split_spec"]
                         for r in chosen), f"--split auto chose {chosen}")
    check(json_lines(run.stdout)[-1]["device"] == "cpu", f"--split auto:\n{run.stdout}")
    check(json_lines(run.stdout)[-1].get("split_spec") == "auto", f"--split auto:\n{run.stdout}")
    for spec, needle in [("cpu:0.5", "sum to 0.5"), ("tpu:1", "unknown device 'tpu:1'"),
                         ("cpu:0.5,cpu:0.5", "appears twice"), ("cpu:-1", "'cpu:-1'"),
                         ("", "an empty entry"), ("auto:cpu,cpu", "appears twice"),
                         ("auto:cpu,tpu", "unknown device 'tpu'"), ("auto:", "an empty entry")]:
        ctx.error("time", "--model", net, "--split", spec, code=2, needles=[needle])

    # A device this build or machine lacks is the library's error, not a usage error.
    ctx.error("time", "--model", net, "--iterations", 1, "--device", "cuda:7",
              needles=["cuda:7"])


@case
def flag_spellings(ctx):
    solver, net, prefix = setup_training(ctx)
    for args in (["-model", net, "-iterations", "1"], ["--model=" + net, "--iterations=1"],
                 ["-model=" + net, "--iterations", "1", "--force_backward=false", "-json"],
                 ["--model", net, "-iterations=1", "--no-force-backward", "--json=true"]):
        run = ctx.run("time", *args)
        if any("json" in a for a in args):
            json_lines(run.stdout)
        else:
            check("Average Forward-Backward" in run.stdout, f"no Caffe-style summary:\n{run.stdout}")
    run = ctx.run("train", "-solver=" + solver, "-max_iter", "2", "--snapshot_prefix",
                  ctx.path("other", "x"))
    check("Iteration 2" in run.stdout or "Iteration 1" in run.stdout, run.stdout)
    check(os.path.exists(ctx.path("other", "x_iter_2.caffemodel")),
          "--max-iter 2 with --snapshot-prefix did not write other/x_iter_2.caffemodel; "
          f"files: {os.listdir(ctx.path('other')) if os.path.isdir(ctx.path('other')) else []}")


@case
def device_query(ctx):
    run = ctx.run("device_query")
    # Every registered driver kind, its options and the CPU's BLAS choices.
    for needle in ["available devices:", "driver reference:", "driver cpu:", "driver cuda:",
                   "option threads:", "option blas:", "onednn", "option separate_memory:"]:
        check(needle in run.stdout, f"device_query lacks '{needle}':\n{run.stdout}")
    run = ctx.run("device_query", "--device", "reference")
    check(re.search(r"^reference", run.stdout, re.MULTILINE), run.stdout)


# ---- bad input: a clear message and a non-zero exit ---------------------------------------

@case
def malformed_prototxt(ctx):
    train, test = make_dataset(ctx)
    text = tiny_net(train, test).replace('name: "pool1" type: "Pooling"',
                                         'name: "pool1" type: "Pooling" }')
    net = write(ctx, "bad_net.prototxt", text)
    line = text[:text.index('type: "Pooling" }')].count("\n") + 1
    ctx.error("time", "--model", net, needles=[f"bad_net.prototxt:{line}:"],
              patterns=[rf"bad_net\.prototxt:{line}:\d+"])
    solver = write(ctx, "solver.prototxt", solver_text(net, ctx.path("s", "x")))
    ctx.error("train", "--solver", solver, patterns=[rf"bad_net\.prototxt:{line}:\d+"])
    bad_solver = write(ctx, "bad_solver.prototxt", 'net: "x.prototxt"\nbase_lr: fast\n')
    ctx.error("train", "--solver", bad_solver, patterns=[r"bad_solver\.prototxt:2:\d+"])
    ctx.error("train", "--solver", ctx.path("missing_solver.prototxt"),
              needles=["missing_solver.prototxt"])


@case
def unknown_layer_type(ctx):
    train, test = make_dataset(ctx)
    net = write(ctx, "net.prototxt", tiny_net(train, test, conv_type="Convolutio"))
    ctx.error("time", "--model", net,
              needles=["conv1", "'Convolutio'", "Convolution", "InnerProduct", "Pooling",
                       "SoftmaxWithLoss"])


@case
def mismatched_shapes(ctx):
    train, test = make_dataset(ctx)
    extra = """layer {
  name: "bad_sum" type: "Eltwise" bottom: "pool1" bottom: "ip2" top: "bad_sum"
}
"""
    net = write(ctx, "net.prototxt", tiny_net(train, test, extra=extra))
    ctx.error("time", "--model", net, needles=["bad_sum", "16x4x5x5", f"16x{CLASSES}"])


@case
def weights_of_another_net(ctx):
    solver, net, prefix = setup_training(ctx, max_iter=2, snapshot=0)
    ctx.run("train", "--solver", solver)
    model = prefix + "_iter_2.caffemodel"
    check(os.path.exists(model), f"no final snapshot {model}")
    train, test = make_dataset(ctx)
    other = write(ctx, "other.prototxt", tiny_net(train, test, classes=CLASSES + 1))
    ctx.error("test", "--model", other, "--weights", model, "--iterations", 1,
              needles=["ip2", model, f"{CLASSES}x16", f"{CLASSES + 1}x16"])
    other_solver = write(ctx, "other_solver.prototxt", solver_text(other, ctx.path("o", "x")))
    ctx.error("train", "--solver", other_solver, "--weights", model, needles=["ip2"])


@case
def truncated_and_foreign_caffemodel(ctx):
    solver, net, prefix = setup_training(ctx, max_iter=2, snapshot=0)
    ctx.run("train", "--solver", solver)
    model, state = prefix + "_iter_2.caffemodel", prefix + "_iter_2.solverstate"
    with open(model, "rb") as f:
        data = f.read()
    truncated = ctx.path("truncated.caffemodel")
    with open(truncated, "wb") as f:
        f.write(data[:len(data) // 2])
    ctx.error("test", "--model", net, "--weights", truncated, needles=[truncated])
    ctx.error("train", "--solver", solver, "--weights", truncated, needles=[truncated])
    foreign = ctx.path("foreign.caffemodel")
    with open(foreign, "wb") as f:
        f.write(bytes(random.Random(3).randrange(256) for _ in range(4096)))
    ctx.error("test", "--model", net, "--weights", foreign, needles=[foreign])
    ctx.error("test", "--model", net, "--weights", net, needles=[net])
    ctx.error("test", "--model", net, "--weights", ctx.path("absent.caffemodel"),
              needles=["absent.caffemodel"])
    with open(state, "rb") as f:
        state_data = f.read()
    truncated_state = ctx.path("truncated.solverstate")
    with open(truncated_state, "wb") as f:
        f.write(state_data[:len(state_data) // 2])
    ctx.error("train", "--solver", solver, "--snapshot", truncated_state,
              needles=[truncated_state])


@case
def missing_dataset(ctx):
    solver, net, prefix = setup_training(ctx)
    missing = ctx.path("nowhere", "train-images-idx3-ubyte.gz")
    ctx.error("train", "--solver", solver, "--train-data", missing, needles=[missing])
    ctx.error("time", "--model", net, "--data", missing, needles=[missing])
    os.remove(ctx.path("data", "train-labels-idx1-ubyte.gz"))
    ctx.error("train", "--solver", solver, needles=["train-labels-idx1-ubyte"])


@case
def truncated_dataset(ctx):
    for compress in (True, False):
        shutil.rmtree(ctx.path("data"), ignore_errors=True)
        train, test = make_dataset(ctx, compress=compress)
        net = write(ctx, "net.prototxt", tiny_net(train, test))
        with open(train, "rb") as f:
            data = f.read()
        with open(train, "wb") as f:
            f.write(data[:len(data) * 2 // 3])
        ctx.error("time", "--model", net, "--iterations", 1, needles=[train])
        solver = write(ctx, "solver.prototxt", solver_text(net, ctx.path("s", "x")))
        ctx.error("train", "--solver", solver, needles=[train])


@case
def nan_loss_keeps_earlier_snapshot(ctx):
    train, test = make_dataset(ctx)
    net = write(ctx, "net.prototxt", tiny_net(train, test))
    prefix = ctx.path("snap", "tiny")
    # From iteration 6 the learning rate is 1e30 times larger: the loss becomes NaN or inf.
    text = solver_text(net, prefix, max_iter=6, snapshot=5, test_interval=1000,
                       extra="stepvalue: 6\n")
    text = text.replace('lr_policy: "inv"', 'lr_policy: "multistep"').replace(
        "gamma: 0.0001", "gamma: 1e30")
    # The same run stopped before the NaN gives the bytes the snapshot at 5 must keep.
    ctx.run("train", "--solver", write(ctx, "good.prototxt", text))
    snapshot = prefix + "_iter_5.caffemodel"
    state = prefix + "_iter_5.solverstate"
    expected = {path: open(path, "rb").read() for path in (snapshot, state)}
    shutil.rmtree(ctx.path("snap"))
    bad = write(ctx, "bad.prototxt", text.replace("max_iter: 6", "max_iter: 60"))
    run = ctx.error("train", "--solver", bad, patterns=[r"(?i)iteration \d+"], needles=[snapshot])
    check(re.search(r"(?i)nan|inf", run.stderr), f"the message says neither NaN nor inf:\n"
          f"{run.stderr}")
    for path, data in expected.items():
        with open(path, "rb") as f:
            check(f.read() == data, f"{path} differs from the same run's snapshot without NaN")
    leftovers = sorted(set(os.listdir(ctx.path("snap"))) -
                       {os.path.basename(p) for p in expected})
    check(not leftovers, f"files besides the iteration-5 snapshot: {leftovers}")


class Tmpfs:
    """A tmpfs of `size` bytes mounted at `path` (read-only with ro=True) for the disk-fault
    cases; skips the case where mounting is not allowed (not root, no CAP_SYS_ADMIN)."""

    def __init__(self, path, size, ro=False):
        self.path = path
        os.makedirs(path, exist_ok=True)
        options = f"size={size}" + (",ro" if ro else "")
        if os.geteuid() != 0 or shutil.which("mount") is None:
            raise Skip("the disk-fault cases mount a small tmpfs: they need root")
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "hybridnn-test", path],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise Skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        subprocess.run(["umount", "-l", self.path], capture_output=True)


@case
def snapshot_on_full_disk_keeps_earlier_snapshots(ctx):
    """A snapshot that does not fit (a tmpfs with room for one) stops training with an error
    naming the file and the system's reason; the earlier snapshot stays byte for byte, and
    no temporary file is left."""
    train, test = make_dataset(ctx)
    net = write(ctx, "net.prototxt", tiny_net(train, test))
    text = solver_text(net, ctx.path("ref", "tiny"), max_iter=5, snapshot=5,
                       test_interval=1000)
    ctx.run("train", "--solver", write(ctx, "ref.prototxt", text))
    names = ("tiny_iter_5.caffemodel", "tiny_iter_5.solverstate")
    expected = {name: open(ctx.path("ref", name), "rb").read() for name in names}
    # Room for the first snapshot and a little more, not for a second one.
    room = sum(len(data) for data in expected.values())
    size = (room + 4096 + 4095) // 4096 * 4096
    with Tmpfs(ctx.path("disk"), size):
        # The reference bytes again, at the same prefix (the solverstate names its caffemodel).
        prefix = ctx.path("disk", "tiny")
        ctx.run("train", "--solver", write(ctx, "ref.prototxt", text.replace(
            ctx.path("ref", "tiny"), prefix)))
        expected = {name: open(ctx.path("disk", name), "rb").read() for name in names}
        for name in names:
            os.remove(ctx.path("disk", name))
        full = solver_text(net, prefix, max_iter=20, snapshot=5, test_interval=1000)
        run = ctx.error("train", "--solver", write(ctx, "full.prototxt", full),
                        needles=[prefix + "_iter_10."], patterns=[r"(?i)no space left on device"])
        for name, data in expected.items():
            with open(ctx.path("disk", name), "rb") as f:
                check(f.read() == data, f"{name} on the full disk differs from the reference run")
        left = sorted(set(os.listdir(ctx.path("disk"))) - set(names))
        check(not left, f"files besides the iteration-5 snapshot on the full disk: {left}")
        check("Iteration 6" in run.stdout or "iteration 6" in run.stdout.lower(),
              "training did not go on past the first snapshot before the disk filled")
        # Resuming from the intact snapshot works where there is room.
        ctx.run("train", "--solver", write(ctx, "resume.prototxt",
                                           text.replace("max_iter: 5", "max_iter: 6")),
                "--snapshot", ctx.path("disk", names[1]))


@case
def snapshot_prefix_on_read_only_disk_fails_at_start(ctx):
    """A read-only file system under the snapshot prefix is found before the first iteration
    (root ignores permission bits, so a read-only mount is the way to show it)."""
    train, test = make_dataset(ctx)
    net = write(ctx, "net.prototxt", tiny_net(train, test))
    with Tmpfs(ctx.path("ro"), 65536, ro=True):
        prefix = ctx.path("ro", "tiny")
        run = ctx.error("train", "--solver",
                        write(ctx, "ro.prototxt", solver_text(net, prefix, max_iter=5)),
                        needles=[ctx.path("ro")], patterns=[r"(?i)read-only file system"])
        check("Iteration 1 " not in run.stdout, "training started before the check")


# ---- training, testing, resuming ---------------------------------------------------------

@case
def metrics_into_a_fifo_says_it_waits_for_a_reader(ctx):
    solver, net, prefix = setup_training(ctx, display=5)
    fifo = ctx.path("metrics.fifo")
    os.mkfifo(fifo)
    lines = []
    # The reader opens the FIFO after the tool does; the tool says why it waits.
    reader = threading.Thread(target=lambda: lines.extend(open(fifo).read().splitlines()))
    reader.start()
    run = ctx.run("train", "--solver", solver, "--metrics", fifo)
    reader.join(timeout=60)
    check("--metrics" in run.stderr and "is a FIFO" in run.stderr and "reader" in run.stderr,
          f"no word of the FIFO on stderr:\n{run.stderr}")
    check(any(json.loads(line).get("phase") == "train" for line in lines if line.strip()),
          f"the reader got no metrics: {lines[:3]}")


@case
def metrics_lines(ctx):
    solver, net, prefix = setup_training(ctx, display=5)
    metrics = ctx.path("out", "metrics.jsonl")
    run = ctx.run("train", "--solver", solver, "--metrics", metrics)
    check(re.search(r"^Iteration 5, loss = \S+, lr = \S+, \d+ images/s, \S+ remaining$",
                    run.stdout, re.MULTILINE), f"no display line for iteration 5:\n{run.stdout}")
    check(re.search(r"Test net output #\d+: accuracy = ", run.stdout), run.stdout)
    check(re.search(r"Snapshotting to binary proto file \S+_iter_20\.caffemodel", run.stdout),
          run.stdout)
    records = read_metrics(metrics)
    keys = {"iter", "phase", "loss", "accuracy", "lr", "images_per_s", "peak_rss_bytes"}
    for record in records:
        check(set(record) == keys, f"metrics keys {sorted(record)}")
    # The process's resident high-water mark: it never falls, and holds at least the
    # tool itself (several MB).
    peaks = [r["peak_rss_bytes"] for r in records]
    check(peaks == sorted(peaks) and peaks[0] > 4e6, f"peak_rss_bytes {peaks}")
    check(re.search(r"Optimization Done: .* peak resident memory \d", run.stdout), run.stdout)
    train_records = [r for r in records if r["phase"] == "train"]
    test_records = [r for r in records if r["phase"] == "test"]
    check([r["iter"] for r in train_records][:3] == [0, 5, 10] or
          [r["iter"] for r in train_records][:3] == [5, 10, 15],
          f"train iterations {[r['iter'] for r in train_records]}")
    check(all(r["accuracy"] is None for r in train_records), "train lines have an accuracy")
    # The first display of a run (its first iteration pays one-off setup) and the closing
    # display after the last iteration time no training: their speed is null.
    check(train_records[0]["images_per_s"] is None and train_records[-1]["images_per_s"] is None,
          f"first or last train line has a speed: {train_records}")
    check(all(isinstance(r["images_per_s"], (int, float)) for r in train_records[1:-1]),
          f"train lines lack images_per_s: {train_records}")
    check(test_records and all(0 <= r["accuracy"] <= 1 for r in test_records), "test lines")
    check(test_records[-1]["iter"] == 40, f"no final test at 40: {test_records}")
    check(test_records[-1]["accuracy"] > 0.6,
          f"the tiny net did not learn the quadrants: {test_records[-1]}")


def built_with_address_sanitizer(binary):
    """Whether `binary` carries AddressSanitizer's runtime (clang links it in statically)."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


@case
def out_of_memory_at_build_names_the_blob(ctx):
    """Activations are allocated when the net is built: under an address-space limit
    (ulimit -v) too small for a net of 1 GB blobs, the error names the blob (or the
    parameter) whose allocation failed, and the tool exits 1 instead of crashing later."""
    import resource
    net = ctx.path("huge.prototxt")
    with open(net, "w") as f:
        f.write('name: "huge"\n'
                'layer { name: "data" type: "Input" top: "data"\n'
                '  input_param { shape { dim: 1 dim: 250 dim: 1000 dim: 1000 } } }\n'
                'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
                '  inner_product_param { num_output: 1 } }\n')
    limit = 5 << 29  # 2.5 GiB: the tool, the 1 GB weight and not the 2 GB of activations

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    command = [ctx.tool, "time", "--model", net, "--iterations", "1"]
    env, preexec = dict(os.environ), limit_address_space
    if built_with_address_sanitizer(ctx.tool):
        # AddressSanitizer maps terabytes of shadow memory at start, so no address-space
        # limit can hold it. Its own limit on one allocation fails the same 1 GB allocation
        # (aligned_alloc returns null, as under ulimit -v) without killing the process.
        options = "allocator_may_return_null=1:max_allocation_size_mb=512"
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), options]))
        preexec = None
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ctx.work,
                         env=env, preexec_fn=preexec)
    check(run.returncode == 1, f"exit {run.returncode}, expected 1:\n{run.stderr[-3000:]}")
    check(re.search(r"huge\.prototxt: (net 'huge': allocating .* for .*blob 'data' "
                    r"\(1x250x1000x1000\)|layer 'ip' \(InnerProduct\): parameter 0)", run.stderr),
          f"the error names no blob or parameter:\n{run.stderr}")


@case
def reloaded_caffemodel_gives_identical_accuracy(ctx):
    solver, net, prefix = setup_training(ctx)
    metrics = ctx.path("metrics.jsonl")
    ctx.run("train", "--solver", solver, "--metrics", metrics)
    final = [r for r in read_metrics(metrics) if r["phase"] == "test"][-1]
    check(final["iter"] == 40, f"last test at {final['iter']}")
    run = ctx.run("test", "--model", net, "--weights", prefix + "_iter_40.caffemodel",
                  "--iterations", 5)
    check(re.search(r"^Batch 0, accuracy = \S+$", run.stdout, re.MULTILINE), run.stdout)
    check(re.search(r"^Loss: \S+$", run.stdout, re.MULTILINE), run.stdout)
    check(output_value(run.stdout, "accuracy") == final["accuracy"],
          f"test gives accuracy {output_value(run.stdout, 'accuracy')}, training ended with "
          f"{final['accuracy']}")
    check(output_value(run.stdout, "loss") == final["loss"],
          f"test gives loss {output_value(run.stdout, 'loss')}, training ended with "
          f"{final['loss']}")


@case
def resume_reproduces_losses(ctx):
    solver, net, prefix = setup_training(ctx)
    full = ctx.path("full.jsonl")
    ctx.run("train", "--solver", solver, "--metrics", full)
    # The interrupted run: stops at 20 with a snapshot, then resumes from it.
    first, second = ctx.path("first.jsonl"), ctx.path("second.jsonl")
    resumed_prefix = ctx.path("resumed", "tiny")
    ctx.run("train", "--solver", solver, "--max-iter", 20, "--snapshot-prefix", resumed_prefix,
            "--metrics", first)
    run = ctx.run("train", "--solver", solver, "--snapshot", resumed_prefix + "_iter_20.solverstate",
                  "--snapshot-prefix", resumed_prefix, "--metrics", second)
    check("Resumed at iteration 20" in run.stdout, run.stdout)

    def losses(records, phase):
        return [(r["iter"], r["loss"], r["lr"]) for r in records if r["phase"] == phase]

    expected = losses(read_metrics(full), "train")
    got = losses(read_metrics(first), "train") + losses(read_metrics(second), "train")
    got = sorted(set(got))
    check(len(expected) >= 40, f"only {len(expected)} train lines with display 1")
    check(got == sorted(set(expected)),
          "resumed losses differ:\n" + "\n".join(
              f"{a} | {b}" for a, b in zip(sorted(set(expected)), got) if a != b))
    check(losses(read_metrics(full), "test")[-1] == losses(read_metrics(second), "test")[-1],
          "the final tests differ")
    with open(prefix + "_iter_40.caffemodel", "rb") as a, \
            open(resumed_prefix + "_iter_40.caffemodel", "rb") as b:
        check(a.read() == b.read(), "the resumed run's final weights differ")


def start_until(ctx, command, iteration, env=None):
    """Starts `command` and returns it with its stdout lines read up to "Iteration N,"."""
    process = subprocess.Popen(command, cwd=ctx.work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(f"Iteration {iteration},"):
            return process, lines
    process.wait()
    raise Failure(f"training ended before iteration {iteration}:\n{''.join(lines)}\n"
                  f"{process.stderr.read()[-3000:]}")


def start_training(ctx, solver, *args):
    """Starts `hybridnn train` and returns it with the lines read up to "Iteration 3,"."""
    return start_until(ctx, [ctx.tool, "train", "--solver", solver, *args], 3)


def stop_writes_snapshot(ctx, signum, name):
    solver, net, prefix = setup_training(ctx, max_iter=1000000, snapshot=0, test_interval=100000)
    process, lines = start_training(ctx, solver)
    try:
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout = "".join(lines) + out
    check(process.returncode == 0, f"exit {process.returncode} after {name}:\n"
          f"{stdout[-2000:]}\n{err}")
    match = re.search(r"Snapshotting to binary proto file (\S+)", stdout)
    check(match, f"no snapshot after {name}:\n{stdout[-2000:]}")
    check(f"stopped by {name}" in stdout, stdout[-2000:])
    model = match.group(1)
    model = model if os.path.isabs(model) else ctx.path(model)
    state = model.replace(".caffemodel", ".solverstate")
    check(os.path.exists(model) and os.path.exists(state), f"{model} or {state} is missing")
    ctx.run("test", "--model", net, "--weights", model, "--iterations", 1)
    stopped_at = int(re.search(r"_iter_(\d+)\.caffemodel", model).group(1))
    run = ctx.run("train", "--solver", solver, "--snapshot", state, "--max-iter", stopped_at + 2)
    check(f"Resumed at iteration {stopped_at}" in run.stdout, run.stdout)


@case
def sigint_writes_snapshot(ctx):
    stop_writes_snapshot(ctx, signal.SIGINT, "SIGINT")


@case
def sigterm_writes_snapshot(ctx):
    stop_writes_snapshot(ctx, signal.SIGTERM, "SIGTERM")


@case
def second_sigint_exits_at_once(ctx):
    # Iterations of a few hundred milliseconds, so the second signal lands within one.
    heavy = """name: "Heavy"
layer { name: "data" type: "Data" top: "data" top: "label"
  transform_param { scale: 0.00390625 } data_param { source: "synthetic:3x64x64" batch_size: 64 } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 64 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
    net = write(ctx, "heavy.prototxt", heavy)
    solver = write(ctx, "solver.prototxt", solver_text(net, ctx.path("snap", "heavy"),
                                                        max_iter=1000, snapshot=0,
                                                        test_interval=0).replace(
        "test_iter: 5\n", "").replace("base_lr: 0.05", "base_lr: 0.0001"))
    for attempt in range(3):
        process, lines = start_training(ctx, solver)
        try:
            process.send_signal(signal.SIGINT)
            # The handler says it took the first one; only then can a second one count
            # (two pending SIGINTs are one).
            said = process.stderr.readline()
            while said.startswith("Tuned "):  # the first forward measures the convolution
                said = process.stderr.readline()
            check("stopping after this iteration" in said, f"no stop message: {said!r}")
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode == 0:
            continue  # the iteration ended before the second signal: try again
        check(process.returncode == 128 + signal.SIGINT,
              f"exit {process.returncode} after two SIGINTs, expected {128 + signal.SIGINT}\n{err}")
        check("stopped by" not in out, f"the second SIGINT waited for the stop:\n{out}")
        return
    raise Failure("three times the first SIGINT's stop finished before the second arrived")


# ---- time ---------------------------------------------------------------------------------

def check_time_json(ctx, records, layer_names):
    layers = [r for r in records if "layer" in r]
    totals = [r for r in records if r.get("total")]
    check(len(totals) == 1 and records[-1] is totals[0], f"one total line, last: {records[-1]}")
    names = [r["layer"] for r in layers]
    for name in layer_names:
        check(name in names, f"no line for layer {name}: {names}")
    for r in layers:
        keys = {"layer", "type", "forward_ms", "backward_ms", "forward_best_ms",
                "backward_best_ms"}
        if r["type"] == "Convolution":
            keys.add("algorithm")  # what it runs with: measured (--tune) or the cost model's
        elif "algorithm" in r:
            # A layer another one runs (fuse_layers: a ReLU after a convolution).
            check(r["algorithm"].startswith("fused into '"), f"algorithm of {r}")
            keys.add("algorithm")
        if r["type"] in ("Convolution", "InnerProduct"):
            keys.add("forward_flops")
            check(r["forward_flops"] > 0, f"no FLOPs: {r}")
            check("param_bytes" in r, f"no param_bytes: {r}")
        if "param_bytes" in r:
            keys.add("param_bytes")
            check(r["param_bytes"] > 0 and r["param_bytes"] % 4 == 0, f"param_bytes of {r}")
        check(set(r) == keys, f"layer keys {r}")
        check(r["forward_ms"] >= 0 and r["backward_ms"] >= 0, f"negative time {r}")
        # The fastest iteration is one of those the mean averages (rounding aside).
        for pass_ in ("forward", "backward"):
            best, mean = r[f"{pass_}_best_ms"], r[f"{pass_}_ms"]
            check(0 <= best <= mean * (1 + 1e-9) + 1e-9, f"{pass_} best {best} against mean {mean}: {r}")
    total = totals[0]
    # The total counts each parameter's values and gradient.
    check(2 * sum(r.get("param_bytes", 0) for r in layers) == total["param_bytes"],
          f"layers' param_bytes against the total's {total['param_bytes']}")
    if "conv1" in names and "lenet" in str(total.get("model", "")):
        # Caffe's LeNet: 20 filters of 1 x 5 x 5 and 20 biases.
        conv1 = layers[names.index("conv1")]
        check(conv1["param_bytes"] == 4 * (20 * 25 + 20), f"LeNet conv1: {conv1}")
    for key in ["forward_ms", "backward_ms", "forward_backward_ms"]:
        check(total[key] > 0, f"total {key} is {total[key]}")
    # The total comes from whole iterations timed apart from the per-layer ones (which wait
    # after each layer), so no bound ties it to their sum: two iterations of each under
    # AddressSanitizer on a loaded machine differed by 4x either way.
    return layers, total


def shared_model(ctx, name):
    """The path of `name` in ../shared/models; skips the case when it is missing."""
    model = os.path.join(ctx.models, name)
    if not os.path.exists(model):
        raise Skip(f"{model} is missing")
    return model


def time_deploy(ctx, name):
    model = shared_model(ctx, name)
    run = ctx.run("time", "--model", model, "--iterations", 1, "--batch", 1, "--json")
    layers, total = check_time_json(ctx, json_lines(run.stdout),
                                    ["conv1", "conv5", "fc6", "fc8", "prob"])
    conv1 = next(r for r in layers if r["layer"] == "conv1")
    check(conv1["backward_ms"] > 0, f"conv1 has no backward (force_backward): {conv1}")
    check(total["batch"] == 1, f"--batch 1 not applied: {total}")


@case
def time_json_caffenet_deploy(ctx):
    time_deploy(ctx, "bvlc_reference_caffenet_deploy.prototxt")


@case
def time_json_alexnet_deploy(ctx):
    time_deploy(ctx, "bvlc_alexnet_deploy.prototxt")


def time_train_test(ctx, name, data, layer_names, extra=()):
    model = shared_model(ctx, name)
    for phase in ("train", "test"):
        run = ctx.run("time", "--model", model, "--iterations", 2, "--data", data, "--batch", 10,
                      "--phase", phase, "--json", *extra)
        layers, total = check_time_json(ctx, json_lines(run.stdout), layer_names)
        check(total["phase"] == phase and total["batch"] == 10, f"total {total}")
        names = [r["layer"] for r in layers]
        check(("accuracy" in names) == (phase == "test"), f"{phase} layers: {names}")


@case
def time_json_lenet_train_test_synthetic(ctx):
    time_train_test(ctx, "mnist_lenet_train_test.prototxt", "synthetic:1x28x28",
                    ["mnist", "conv1", "ip2", "loss"])


@case
def time_json_cifar10_quick_synthetic(ctx):
    time_train_test(ctx, "cifar10_cifar10_quick_train_test.prototxt", "synthetic:3x32x32",
                    ["cifar", "conv1", "ip2", "loss"], extra=["--mean-file", "none"])


@case
def time_json_cifar10_full_synthetic(ctx):
    time_train_test(ctx, "cifar10_cifar10_full_train_test.prototxt", "synthetic:3x32x32",
                    ["cifar", "norm1", "ip1", "loss"], extra=["--mean-file", "none"])


@case
def time_text_like_caffe(ctx):
    solver, net, prefix = setup_training(ctx)
    run = ctx.run("time", "--model", net, "--iterations", 2)
    for pattern in [r"Initial loss: \S+", r"Iteration: 2 forward-backward time: \S+ ms\.",
                    r"conv1\tforward: \S+ ms\.", r"conv1\tbackward: \S+ ms\.",
                    r"Average Forward pass: \S+ ms\.", r"Average Backward pass: \S+ ms\.",
                    r"Average Forward-Backward: \S+ ms\.", r"Total Time: \S+ ms\."]:
        check(re.search(pattern, run.stdout), f"no /{pattern}/ in:\n{run.stdout}")


@case
def time_fills_image_inputs_with_random_values(ctx):
    # `time` fills 4-D image inputs with uniform values in [-1, 1) (kernels timed on zeros
    # hide value-dependent costs such as denormals) and leaves other inputs zero. Here the
    # loss is sum((image - target)^2) / (2 * batch): with the target left zero, its
    # expectation over 2 * 3 * 8 * 8 = 384 uniform values is 384 / 3 / 4 = 32 (standard
    # deviation 1.5); zeros give 0, and a target filled too would give about twice 32.
    net = write(ctx, "random_inputs.prototxt", """name: "random_inputs"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "target" type: "Input" top: "target" input_param { shape { dim: 2 dim: 192 } } }
layer { name: "flat" type: "Flatten" bottom: "data" top: "flat" }
layer { name: "loss" type: "EuclideanLoss" bottom: "flat" bottom: "target" top: "loss" }
""")
    run = ctx.run("time", "--model", net, "--iterations", 1)
    check("Input data holds uniform random values in [-1, 1)" in run.stdout, run.stdout)
    loss = float(re.search(r"Initial loss: (\S+)", run.stdout).group(1))
    check(26 < loss < 38, f"loss {loss}: the image input is not uniform in [-1, 1)\n{run.stdout}")


LENET = "mnist_lenet_train_test.prototxt"
LENET_SPLIT_LAYERS = ["conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"]
# A split cuts these by rows; ip1 (500 outputs of 800 inputs) by its outputs instead, where
# each device computes its outputs for every row.
LENET_ROW_LAYERS = ["conv1", "pool1", "conv2", "pool2", "relu1", "ip2"]


def lenet(ctx):
    return shared_model(ctx, LENET)


def cores_text(cores):
    """A list of cores as taskset and the tool write it: "0-3,6"."""
    runs = []
    for core in sorted(cores):
        if runs and runs[-1][1] == core - 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def time_lenet(ctx, batch, *args):
    return ctx.run("time", "--model", lenet(ctx), "--data", "synthetic:1x28x28", "--batch",
                   batch, "--iterations", 2, *args)


@case
def time_tune_once_then_cached(ctx):
    cache = ctx.path("tune.txt")
    measured = time_lenet(ctx, 16, "--json", "--tune", "once", "--tune-cache", cache)
    check(re.search(r"Tuned conv1 on cpu in \S+ s: ", measured.stderr),
          f"no 'Tuned conv1' line on stderr:\n{measured.stderr}")
    algorithms = {r["layer"]: r.get("algorithm") for r in json_lines(measured.stdout)
                  if "layer" in r}
    allowed = {"direct", "direct_plain", "type1", "type3", "direct_1x1", "winograd"}
    for layer in ("conv1", "conv2"):
        words = set(re.findall(r"[a-z_0-9]+", algorithms.get(layer) or ""))
        check(words and words & allowed and not words - allowed - {"forward", "backward", "data",
                                                                    "weights"},
              f"{layer}: algorithm {algorithms.get(layer)!r}")
    check(algorithms.get("pool1") is None, f"pool1 has an algorithm: {algorithms}")
    with open(cache) as f:
        entries = [line for line in f if line.strip() and not line.startswith("#")]
    check(len(entries) == 6, f"expected 2 layers x 3 directions in the cache:\n{entries}")
    cached = time_lenet(ctx, 16, "--json", "--tune-cache", cache)  # default: cached
    check("Tuned" not in cached.stderr, f"the cached run measured again:\n{cached.stderr}")
    again = {r["layer"]: r.get("algorithm") for r in json_lines(cached.stdout) if "layer" in r}
    check(again == algorithms, f"cached choices differ: {again} vs {algorithms}")
    off = time_lenet(ctx, 16, "--json", "--tune", "off", "--tune-cache", cache)
    check("Tuned" not in off.stderr, off.stderr)
    ctx.error("time", "--model", lenet(ctx), "--tune", "sometimes", code=2,
              needles=["--tune", "'sometimes'", "off, once, cached"])
    # The cache cannot be written: the run goes on, with a warning.
    blocked = ctx.path("file")
    write(ctx, "file", "not a directory")
    run = time_lenet(ctx, 16, "--tune", "once", "--tune-cache", os.path.join(blocked, "tune.txt"))
    check("Warning: tuning cache not written" in run.stderr, run.stderr)


def time_algorithms(ctx, model, *args):
    """`time --json` of `model` at batch 1, one iteration, untuned: each layer's algorithm."""
    run = ctx.run("time", "--model", model, "--batch", 1, "--iterations", 1, "--json",
                  "--tune", "off", *args)
    return {r["layer"]: r.get("algorithm") for r in json_lines(run.stdout) if "layer" in r}


@case
def time_layout_blocked_or_nchw(ctx):
    model = shared_model(ctx, "bvlc_reference_caffenet_deploy.prototxt")

    blocked = time_algorithms(ctx, model)  # default: blocked
    # oneDNN's block: 16 channels with AVX-512 (its avx512_core: F, BW, VL, DQ), else 8.
    with open("/proc/cpuinfo") as f:
        flags = set(next((line for line in f if line.startswith("flags")), "").split())
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    layout = "nChw16c" if avx512 else "nChw8c"
    # conv1 reads the NCHW input and writes the blocked layout; conv2..conv5 read and write it.
    for layer in ("conv1", "conv2", "conv3", "conv4", "conv5"):
        check(blocked.get(layer) == f"direct ({layout})", f"{layer}: {blocked.get(layer)!r}")
    plain = time_algorithms(ctx, model, "--layout", "nchw")
    check(not any("nChw" in (a or "") for a in plain.values()), f"--layout nchw: {plain}")
    ctx.error("time", "--model", model, "--layout", "nhwc", code=2,
              needles=["--layout", "'nhwc'", "nchw or blocked"])


@case
def time_fuse_on_or_off(ctx):
    model = shared_model(ctx, "mobilenet_v1_deploy.prototxt")

    fused = time_algorithms(ctx, model)  # default: on
    # Each BatchNorm + Scale folded into the convolution before it, the ReLU its activation.
    for layer in ("conv1/bn", "conv1/scale", "relu1"):
        check(fused.get(layer) == "fused into 'conv1'", f"{layer}: {fused.get(layer)!r}")
    folded = ", folded: BatchNorm 'conv1/bn' + Scale 'conv1/scale'"
    check((fused.get("conv1") or "").endswith(folded), f"conv1: {fused.get('conv1')!r}")
    check(sum(1 for a in fused.values() if (a or "").startswith("fused into")) == 81,
          f"27 BatchNorm, 27 Scale and 27 ReLU layers fused: {fused}")
    apart = time_algorithms(ctx, model, "--fuse", "off")
    check(not any("fused" in (a or "") for a in apart.values()), f"--fuse off: {apart}")
    ctx.error("time", "--model", model, "--fuse", "maybe", code=2,
              needles=["--fuse", "'maybe'", "on or off"])


@case
def time_math_modes(ctx):
    model = lenet(ctx)

    def total(*args, net=model):
        run = ctx.run("time", "--model", net, "--data", "synthetic:1x28x28", "--batch", 1,
                      "--iterations", 1, "--json", "--tune", "off", *args)
        return run, next(r for r in json_lines(run.stdout) if r.get("total"))

    run, record = total()
    check(record["math"] == "FP32", f"default math: {record}")
    check("Note:" not in run.stderr, f"FP32 needs no note: {run.stderr}")
    # Recorded iterations (CUDA graphs) are a GPU's: the CPU runs its calls one by one, and
    # says nothing about it; --graphs takes on or off.
    check(record["graphs"] is False, f"graphs on the CPU: {record}")
    check(total("--graphs", "off")[1]["graphs"] is False, "--graphs off")
    ctx.error("time", "--model", model, "--graphs", "maybe", code=2,
              needles=["--graphs", "'maybe'", "on or off"])
    for flag, name in (("tf32", "TF32"), ("BF16", "BF16")):
        run, record = total("--math", flag)
        check(record["math"] == name, f"--math {flag}: {record}")
        # The CPU says once what it computes: FP32 for TF32 (no CPU has TF32); for BF16,
        # BF16 products where it has AVX512_BF16, else FP32.
        said = "Note: cpu computes FP32 for TF32 math" if name == "TF32" else "Note: cpu computes "
        check(run.stderr.count(said) == 1, f"--math {flag}: stderr {run.stderr!r}")
    # The prototxt's own `math` field, overridden by the flag.
    with open(model) as f:
        text = f.read()
    tf32_model = write(ctx, "lenet_tf32.prototxt", "math: TF32\n" + text)
    check(total(net=tf32_model)[1]["math"] == "TF32", "the prototxt's math: TF32")
    check(total("--math", "fp32", net=tf32_model)[1]["math"] == "FP32", "--math wins")
    ctx.error("time", "--model", model, "--math", "fp16", code=2,
              needles=["--math", "'fp16'", "FP32, TF32 or BF16"])


def device_lines(records):
    """The per-(layer, device) lines of `time --split --json`, by layer, in device order."""
    keys = {"layer", "device", "rows", "forward_busy_ms", "backward_busy_ms", "waiting_ms",
            "copy_bytes", "copy_ms"}
    by_layer = {}
    for r in records:
        if "device" in r and "layer" in r:
            check(set(r) == keys, f"per-device keys {r}")
            check(all(r[k] >= 0 for k in keys - {"layer", "device"}), f"negative value {r}")
            by_layer.setdefault(r["layer"], []).append(r)
    return by_layer


def partition(spec, rows):
    """Split::partition's rule: boundary i is the cumulative fraction times rows, rounded half
    up; the last is `rows`."""
    fractions = [float(entry.rsplit(":", 1)[1]) for entry in spec.split(",")]
    counts, begin, cumulative = [], 0, 0.0
    for i, fraction in enumerate(fractions):
        cumulative += fraction
        end = rows if i + 1 == len(fractions) else int(cumulative * rows + 0.5)
        end = min(max(end, begin), rows)
        counts.append(end - begin)
        begin = end
    return counts


@case
def time_split_reports_each_device(ctx):
    batch = 10
    run = time_lenet(ctx, batch, "--split", "cpu:0.5,reference:0.5", "--json")
    records = json_lines(run.stdout)
    check(records[-1].get("total") and records[-1]["device"] == "cpu", f"last: {records[-1]}")
    check(records[-1].get("split_spec") == "cpu:0.5,reference:0.5", f"last: {records[-1]}")
    by_layer = device_lines(records)
    for name in LENET_SPLIT_LAYERS:
        lines = by_layer.get(name, [])
        check([r["device"] for r in lines] == ["cpu", "reference"],
              f"{name}: devices {[r['device'] for r in lines]}")
        rows = [5, 5] if name in LENET_ROW_LAYERS else [batch, batch]
        check([r["rows"] for r in lines] == rows, f"{name}: rows {lines}")
        check(lines[0]["forward_busy_ms"] > 0, f"{name}: cpu was never busy: {lines[0]}")
    # Layers that need the whole batch run on the Net's driver.
    check([(r["device"], r["rows"]) for r in by_layer.get("loss", [])] == [("cpu", batch)],
          f"loss: {by_layer.get('loss')}")
    text = time_lenet(ctx, 7, "--split", "cpu:0.75,reference:0.25").stdout
    table = text[text.find("Split per layer and device:"):]
    check(table, f"no split table:\n{text}")
    # 7 rows at 3:1: 5 and 2.
    check(re.search(r"^\s*conv1\s+cpu\s+5\s", table, re.MULTILINE) and
          re.search(r"^\s*conv1\s+reference\s+2\s", table, re.MULTILINE), table)
    # The total runs the layers cut alike together: LeNet's convolutions and pooling.
    check(re.search(r"^Runs of layers cut alike in the total, forward: conv1\.\.pool2 \(4 layers\)",
                    text, re.MULTILINE), text)
    check(re.search(r"^Runs of layers cut alike in the total, backward: ", text, re.MULTILINE),
          text)
    check("Split per layer and device" not in time_lenet(ctx, 7).stdout,
          "the split table is printed without --split")
    # With memory of its own, the reference device is sent its rows: conv1's input (and its
    # weight-gradient partial back), while conv2 reads what conv1 left there.
    batch = 8
    run = time_lenet(ctx, batch, "--split", "cpu:0.5,reference:0.5", "--json",
                     "--reference-memory", "separate")
    by_layer = device_lines(json_lines(run.stdout))
    conv1 = {r["device"]: r for r in by_layer["conv1"]}
    conv2 = {r["device"]: r for r in by_layer["conv2"]}
    grads1, grads2 = (20 * 25 + 20) * 4, (50 * 20 * 25 + 50) * 4
    check(conv1["cpu"]["copy_bytes"] == 0, f"conv1 cpu copied: {conv1['cpu']}")
    check(conv1["reference"]["copy_bytes"] == 4 * 28 * 28 * 4 + grads1,
          f"conv1 reference: {conv1['reference']}")
    check(conv2["reference"]["copy_bytes"] == grads2, f"conv2 reference: {conv2['reference']}")
    ctx.error("time", "--model", lenet(ctx), "--reference-memory", "far", code=2,
              needles=["--reference-memory", "'far'"])
    # Two CPU drivers side by side share the cores unless --threads says otherwise, each
    # bound to its own half of them (the first half for cpu) unless --cores says otherwise.
    allowed = sorted(os.sched_getaffinity(0))
    want = max(1, len(allowed) // 2)
    header = time_lenet(ctx, 7, "--split", "cpu:0.5,cpu:1:0.5").stdout.splitlines()[0]
    check(f"cpu: {want} thread{'' if want == 1 else 's'} on cores {cores_text(allowed[:want])},"
          in header, header)
    header = time_lenet(ctx, 7, "--split", "cpu:0.5,cpu:1:0.5", "--threads", 2).stdout
    check(re.search(r"cpu: 2 threads on cores \S+,", header.splitlines()[0]),
          header.splitlines()[0])
    header = time_lenet(ctx, 7, "--split", "cpu:0.5,cpu:1:0.5", "--cores", "any").stdout
    check(f"cpu: {want} thread{'' if want == 1 else 's'}, BLAS" in header.splitlines()[0],
          header.splitlines()[0])
    ctx.error("time", "--model", lenet(ctx), "--cores", "1-0", code=1,
              needles=["cores", "'1-0'", "runs backwards"])


@case
def time_split_auto_saves_and_reuses(ctx):
    saved = ctx.path("splits", "lenet.txt")
    run = time_lenet(ctx, 10, "--split", "auto:cpu,reference", "--split-save", saved)
    measured, ip1_cut = {}, False
    for name in LENET_SPLIT_LAYERS:
        found = re.search(rf"^Measuring the split of {name}\.\.\. (.+)$", run.stdout,
                          re.MULTILINE)
        check(found, f"no measurement of {name}:\n{run.stdout}")
        spec = found.group(1)
        if name == "ip1":
            # Timed whole on each device as the net was built: cut by its outputs in
            # proportion, or on one device where the cut would save little (the reference
            # driver is several times slower than cpu).
            check(re.fullmatch(r"whole on cpu|cpu:\S+,reference:\S+( of its outputs)?", spec),
                  f"ip1: {spec}")
            ip1_cut = spec.endswith(" of its outputs")
            spec = spec.replace(" of its outputs", "")
        elif name == "relu1":
            # In place on ip1's output: where ip1's output is (gathered on cpu when cut).
            check(spec == ("whole on cpu" if ip1_cut else measured["ip1"]),
                  f"relu1: {spec}, ip1: {measured['ip1']}")  # "whole on cpu" with ip1
        else:
            check(re.fullmatch(r"cpu:\S+,reference:\S+", spec), f"{name}: {spec}")
        measured[name] = spec
    measured = {name: spec for name, spec in measured.items() if spec != "whole on cpu"}
    # Then the whole net, with the measured splits, one split for every layer and one device
    # alone.
    whole = re.search(r"^Whole net: [0-9.]+ ms per forward \+ backward with the measured splits, "
                      r"[0-9.]+ ms with (cpu:\S+,reference:\S+) for every layer, "
                      r"[0-9.]+ ms with (cpu|reference) alone; keeping (.*)$", run.stdout,
                      re.MULTILINE)
    chosen = run.stdout[run.stdout.find("Chosen split:"):]
    check(chosen, f"no 'Chosen split:' block:\n{run.stdout}")
    check(os.path.exists(saved), f"--split-save did not write {saved}")
    with open(saved) as f:
        text = f.read()
    check(text.startswith("#") and "--split-file" in text, f"no header comment:\n{text}")
    splits = dict(line.split() for line in text.splitlines() if line and not line[0] == "#")
    # The whole-net check weighs the layers cut by rows; a cut by outputs stays.
    cut_outputs = {"ip1": measured["ip1"]} if ip1_cut else {}
    if whole and whole.group(3) == "cpu alone":
        # cpu is the Net's own device: every layer runs unsplit, and nothing is saved.
        if not ip1_cut:
            check(chosen.startswith("Chosen split: none, every layer on cpu"), chosen)
        check(splits == cut_outputs, f"saved {splits} for an unsplit choice")
    else:
        if whole:
            check(whole.group(3) in ("the measured splits", f"{whole.group(1)} for every layer",
                                     f"{whole.group(2)} alone"), whole.group(0))
        check(sorted(splits) == sorted(measured), f"saved layers {sorted(splits)}")
        for name, spec in splits.items():
            outputs = " (its outputs)" if name in cut_outputs else ""
            check(re.search(rf"^\s*{name} {re.escape(spec + outputs)}$", chosen, re.MULTILINE),
                  f"{name} {spec} is not in the printed choice:\n{chosen}")
            check(abs(sum(float(e.rsplit(":", 1)[1]) for e in spec.split(",")) - 1) <= 1e-6,
                  spec)
        if not whole or whole.group(3) == "the measured splits":
            check(splits == measured, f"saved {splits}, measured {measured}")
        elif whole.group(3).endswith(" for every layer"):
            check({s for n, s in splits.items() if n not in cut_outputs} == {whole.group(1)},
                  f"saved {splits}, {whole.group(0)}")

    # A file of the measured splits runs them, measuring nothing.
    reused = write(ctx, "measured.txt",
                   "".join(f"{name} {spec}\n" for name, spec in measured.items()))
    run = time_lenet(ctx, 10, "--split-file", reused, "--json")
    check("Measuring" not in run.stderr, f"--split-file measured again:\n{run.stderr}")
    by_layer = device_lines(json_lines(run.stdout))
    for name, spec in measured.items():
        rows = [r["rows"] for r in by_layer.get(name, [])]
        want = [10, 10] if name in cut_outputs else partition(spec, 10)
        check(rows == want, f"{name} ran {rows} rows, {spec} gives {want}")

    # --json: the choice as JSON lines on stdout, the progress on stderr.
    run = time_lenet(ctx, 10, "--split", "auto:cpu,reference", "--json")
    records = [r for r in json_lines(run.stdout) if r.get("split")]
    by_rows = sorted(r["layer"] for r in records if r["axis"] == "batch")
    check(all(r["layer"] == "ip1" for r in records if r["axis"] == "outputs"), f"{records}")
    if "keeping cpu alone" in run.stderr:
        check(by_rows == [], f"JSON choice {records} for cpu alone")
    else:
        check(set(by_rows) >= {"conv1", "pool1", "conv2", "pool2", "ip2"}, f"JSON {records}")
    check("Measuring the split of conv1..." in run.stderr, f"no progress on stderr:\n{run.stderr}")

    # train measures its net's splits before the first iteration, and saves them.
    solver, net, prefix = setup_training(ctx, max_iter=2, test_interval=2)
    trained = ctx.path("train_splits.txt")
    run = ctx.run("train", "--solver", solver, "--split", "auto:cpu,reference", "--split-save",
                  trained)
    check(0 <= run.stdout.find("Chosen split:") < run.stdout.find("Iteration 0"),
          f"no choice before the first iteration:\n{run.stdout}")
    check(os.path.exists(trained), "train --split-save wrote nothing")
    ctx.run("train", "--solver", solver, "--split-file", trained, "--snapshot-prefix",
            ctx.path("again", "x"))


@case
def malformed_split_file(ctx):
    model = lenet(ctx)
    args = ["time", "--model", model, "--data", "synthetic:1x28x28", "--iterations", 1,
            "--split-file"]
    for name, text, needles in [
            ("sum.txt", "# splits\nconv1 cpu:0.5\n", [":2", "conv1", "sum to 0.5"]),
            ("missing.txt", "conv1 cpu:1.0\n\npool1\n", [":3", "pool1 has no split"]),
            ("twice.txt", "conv1 cpu:1.0\nconv1 reference:1.0\n", [":2", "named twice"]),
            ("auto.txt", "conv1 auto\n", [":1", "automatic"])]:
        path = write(ctx, name, text)
        line = needles[0]
        ctx.error(*args, path, needles=[path + line] + needles[1:])
    ctx.error(*args, ctx.path("absent.txt"), needles=[ctx.path("absent.txt"), "cannot read"])
    path = write(ctx, "unknown.txt", "conv9 cpu:1.0\n")
    ctx.error(*args, path, needles=["conv9"])


@case
def test_split_gives_unsplit_accuracy(ctx):
    solver, net, prefix = setup_training(ctx)
    ctx.run("train", "--solver", solver)
    weights = prefix + "_iter_40.caffemodel"
    plain = ctx.run("test", "--model", net, "--weights", weights, "--iterations", 5).stdout
    split = ctx.run("test", "--model", net, "--weights", weights, "--iterations", 5, "--split",
                    "cpu:0.5,reference:0.5").stdout
    check(output_value(split, "accuracy") == output_value(plain, "accuracy"),
          f"split accuracy {output_value(split, 'accuracy')}, unsplit "
          f"{output_value(plain, 'accuracy')}")
    check(abs(output_value(split, "loss") - output_value(plain, "loss")) <=
          1e-5 * abs(output_value(plain, "loss")), "split loss differs")


# ---- convert and the example ---------------------------------------------------------------

@case
def convert_model_to_onnx_and_back(ctx):
    """A trained net's prototxt and weights -> ONNX -> a prototxt and caffemodel again; each
    runs, and the errors name what is wrong. (The outputs' equality: tests/test_onnx_export.cpp.)"""
    solver, net, prefix = setup_training(ctx, max_iter=4, snapshot=4)
    ctx.run("train", "--solver", solver)
    onnx_path = ctx.path("tiny.onnx")
    run = ctx.run("convert", "--model", net, "--weights", prefix + "_iter_4.caffemodel",
                  "--output", onnx_path)
    if "writes no ONNX files" in run.stderr:
        raise Skip("this build writes no ONNX files (no libonnx-dev)")
    check(f"Wrote {onnx_path}" in run.stdout and os.path.getsize(onnx_path) > 0, run.stdout)
    ctx.run("time", "--model", onnx_path, "--iterations", 1, "--batch", 2)
    back = ctx.path("back.prototxt")
    run = ctx.run("convert", "--model", onnx_path, "--output", back)
    check(os.path.exists(ctx.path("back.caffemodel")), f"no back.caffemodel: {run.stdout}")
    ctx.run("time", "--model", back, "--iterations", 1, "--batch", 2)
    ctx.error("convert", "--model", onnx_path, "--output", ctx.path("x.onnx"), code=2,
              needles=["--output", ".prototxt"])
    refused = write(ctx, "refused.prototxt", """name: "refused"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 2 dim: 3 dim: 3 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 2 axis: 2 } }
""")
    ctx.error("convert", "--model", refused, "--output", ctx.path("refused.onnx"),
              needles=["layer 'fc' (InnerProduct)", "axis 2"])
    check(not os.path.exists(ctx.path("refused.onnx")), "a refused model left a file")


@case
def convert_to_lmdb(ctx):
    train, test = make_dataset(ctx)
    lmdb = ctx.path("train_lmdb")
    mean = ctx.path("mean.binaryproto")
    run = ctx.run("convert", "--source", train, "--output", lmdb, "--shuffle", "--seed", 5,
                  "--mean", mean)
    check("Wrote 256 records" in run.stdout, run.stdout)
    check(os.path.exists(os.path.join(lmdb, "data.mdb")) and os.path.exists(mean),
          f"no data.mdb or mean file: {os.listdir(ctx.work)}")
    net = write(ctx, "net.prototxt", tiny_net(lmdb, test))
    ctx.run("time", "--model", net, "--iterations", 1)
    solver = write(ctx, "solver.prototxt", solver_text(net, ctx.path("s", "x"), max_iter=4))
    ctx.run("train", "--solver", solver)
    ctx.error("convert", "--source", train, "--output", lmdb, needles=[lmdb])
    ctx.error("convert", "--source", ctx.path("absent-images-idx3-ubyte"), "--output",
              ctx.path("other_lmdb"), needles=["absent-images-idx3-ubyte"])


FASHION = "/usr/share/datasets/fashion-mnist"


# ---- data parallelism under mpirun (tool.mpi_* run one at a time, RUN_SERIAL) ---------------

def mpirun(ctx, ranks):
    """The mpirun command line for `ranks` ranks on this machine, or Skip."""
    if not ctx.mpiexec:
        raise Skip("hybridnn was built without MPI (HYBRIDNN_MPI)")
    return [ctx.mpiexec, "--oversubscribe", "--bind-to", "none", "--mca",
            "btl_vader_single_copy_mechanism", "none", "-np", str(ranks)]


def mpi_env():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    return env


def run_mpi(ctx, ranks, *args, code=0, timeout=120):
    command = mpirun(ctx, ranks) + [ctx.tool] + [str(a) for a in args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ctx.work,
                         env=mpi_env())
    if (run.returncode == 0) != (code == 0):
        raise Failure(f"`{' '.join(command)}` exited {run.returncode}, expected "
                      f"{'0' if code == 0 else 'non-zero'}\n--- stdout (end)\n"
                      f"{run.stdout[-3000:]}\n--- stderr\n{run.stderr[-3000:]}")
    return run


def train_losses(metrics):
    return [(m["iter"], m["loss"]) for m in read_metrics(metrics) if m["phase"] == "train"]


def test_accuracies(metrics):
    return [(m["iter"], m["accuracy"]) for m in read_metrics(metrics) if m["phase"] == "test"]


def batch16_and_32(ctx):
    """Data, the tiny net at train batch 16 and 32, and a solver for each."""
    train, test = make_dataset(ctx)
    solvers = {}
    for batch in (16, 32):
        net = write(ctx, f"net{batch}.prototxt",
                    tiny_net(train, test).replace("batch_size: 16", f"batch_size: {batch}"))
        solvers[batch] = write(ctx, f"solver{batch}.prototxt",
                               solver_text(net, ctx.path(f"snapshots{batch}", "tiny"),
                                           max_iter=40, snapshot=20))
    return solvers


@case
def mpi_two_ranks_train_as_one_process_at_twice_the_batch(ctx):
    solvers = batch16_and_32(ctx)
    ctx.run("train", "--solver", solvers[32], "--metrics", ctx.path("one.jsonl"))
    run = run_mpi(ctx, 2, "train", "--solver", solvers[16], "--metrics", ctx.path("two.jsonl"))
    check(run.stdout.count("Solving Tiny") == 1, f"only rank 0 prints:\n{run.stdout}")
    # The default communicator, auto: the flat ring for two ranks of one node.
    check("x 2 ranks (ring) = global batch 32" in run.stdout, run.stdout)
    check(re.search(r"comm exposed \d+%", run.stdout), f"no exposed share:\n{run.stdout}")
    one, two = train_losses(ctx.path("one.jsonl")), train_losses(ctx.path("two.jsonl"))
    check(len(one) == len(two) == 41, f"{len(one)} and {len(two)} train lines")
    for (i, a), (j, b) in zip(one, two):
        # Relative, but not below the rounding of a loss that has converged to ~1e-6.
        check(i == j and abs(a - b) <= 1e-4 * max(abs(a), 1e-2),
              f"iteration {i}: loss {a} alone, {b} on 2 ranks")
    accuracies = zip(test_accuracies(ctx.path("one.jsonl")), test_accuracies(ctx.path("two.jsonl")))
    for (i, a), (j, b) in accuracies:
        check(i == j and abs(a - b) <= 1e-4, f"iteration {i}: test accuracy {a} alone, {b} on 2")
    # Rank 0 alone wrote the snapshots, and they load in one process.
    check(os.path.exists(ctx.path("snapshots16", "tiny_iter_40.caffemodel")), "no snapshot")
    ctx.run("test", "--model", ctx.path("net16.prototxt"), "--weights",
            ctx.path("snapshots16", "tiny_iter_40.caffemodel"), "--iterations", 5)


@case
def mpi_model_parallel_train_and_time(ctx):
    # ip1 and ip2 cut across 2 ranks: the losses of one process at twice the batch, the
    # bytes sent in the metrics and in `time`, a whole snapshot, a clear error for a layer
    # the net lacks.
    solvers = batch16_and_32(ctx)
    ctx.run("train", "--solver", solvers[32], "--metrics", ctx.path("one.jsonl"))
    run_mpi(ctx, 2, "train", "--solver", solvers[16], "--model-parallel", "ip1,ip2",
            "--metrics", ctx.path("cut.jsonl"))
    one, cut = train_losses(ctx.path("one.jsonl")), train_losses(ctx.path("cut.jsonl"))
    check(len(one) == len(cut) == 41, f"{len(one)} and {len(cut)} train lines")
    for (i, a), (j, b) in zip(one, cut):
        check(i == j and abs(a - b) <= 1e-4 * max(abs(a), 1e-2),
              f"iteration {i}: loss {a} alone, {b} with ip1,ip2 cut across 2 ranks")
    sent = [m["comm_bytes_per_iter"] for m in read_metrics(ctx.path("cut.jsonl"))
            if m["phase"] == "train" and "comm_bytes_per_iter" in m]
    check(sent and all(b > 0 for b in sent), f"no bytes sent in the metrics: {sent}")
    # The snapshot is the whole model: one process loads it.
    ctx.run("test", "--model", ctx.path("net16.prototxt"), "--weights",
            ctx.path("snapshots16", "tiny_iter_40.caffemodel"), "--iterations", 5)
    times = {}
    for name, extra in (("data", []), ("cut", ["--model-parallel", "ip1,ip2"])):
        run = run_mpi(ctx, 2, "time", "--model", ctx.path("net16.prototxt"), "--json",
                      "--iterations", 3, *extra)
        times[name] = [json.loads(line) for line in run.stdout.splitlines()
                       if line.startswith("{") and '"total"' in line][0]
    check(times["data"]["model_parallel_sent_bytes"] == 0 and
          times["cut"]["model_parallel_sent_bytes"] > 0, f"bytes: {times}")
    check(times["cut"]["allreduce_bytes"] < times["data"]["allreduce_bytes"],
          f"ip1 and ip2 are still allreduced: {times}")
    run = run_mpi(ctx, 2, "train", "--solver", solvers[16], "--model-parallel", "ip9", code=1)
    check("model parallelism is asked for layer 'ip9', which the net does not have"
          in run.stderr + run.stdout, run.stderr)


@case
def mpi_snapshot_of_four_ranks_resumes_on_two(ctx):
    solvers = batch16_and_32(ctx)
    run_mpi(ctx, 4, "train", "--solver", solvers[16], "--max-iter", 20, "--threads", 1)
    state = ctx.path("snapshots16", "tiny_iter_20.solverstate")
    check(os.path.exists(state), "the 4-rank run wrote no snapshot at 20")
    run = run_mpi(ctx, 2, "train", "--solver", solvers[16], "--snapshot", state,
                  "--metrics", ctx.path("resumed.jsonl"), "--threads", 1)
    check("Resumed at iteration 20" in run.stdout, run.stdout)
    losses = train_losses(ctx.path("resumed.jsonl"))
    check(losses[0][0] == 20 and losses[-1][0] == 40, f"resumed iterations: {losses}")
    check(losses[-1][1] < 1.0, f"the resumed run does not train on: {losses}")
    check(os.path.exists(ctx.path("snapshots16", "tiny_iter_40.caffemodel")), "no final snapshot")


@case
def mpi_ranks_with_different_nets_fail_at_start(ctx):
    solvers = batch16_and_32(ctx)
    other = write(ctx, "other.prototxt", open(ctx.path("net16.prototxt")).read().replace(
        "num_output: 16", "num_output: 12"))
    odd = write(ctx, "odd_solver.prototxt", open(solvers[16]).read().replace(
        ctx.path("net16.prototxt"), other))
    command = (mpirun(ctx, 1) + [ctx.tool, "train", "--solver", solvers[16], ":", "-np", "1",
                                 ctx.tool, "train", "--solver", odd])
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ctx.work,
                         env=mpi_env())
    check(run.returncode != 0, f"mismatched ranks exited 0:\n{run.stdout}")
    for needle in ("do not all train the same net", "rank 1: training net prototxt differs",
                   "rank 1: parameter shapes differs"):
        check(needle in run.stderr, f"stderr lacks '{needle}':\n{run.stderr[-3000:]}")


@case
def mpi_ranks_with_different_communicators_fail_at_start(ctx):
    """Ranks that pass different --comm fail at once, each naming the others' backends (they
    had waited in each other's collectives: hier's blocking MPI_Comm_split_type against the
    ring's first allgather, until the deadline or mpirun ended them)."""
    solvers = batch16_and_32(ctx)
    start = time.monotonic()
    command = (mpirun(ctx, 1) + [ctx.tool, "train", "--solver", solvers[16], "--comm", "ring",
                                 "--comm-timeout", "30", "--threads", "1", ":", "-np", "1",
                                 ctx.tool, "train", "--solver", solvers[16], "--comm", "hier",
                                 "--comm-timeout", "30", "--threads", "1"])
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ctx.work,
                         env=mpi_env())
    elapsed = time.monotonic() - start
    check(run.returncode != 0, f"ranks with different communicators exited 0:\n{run.stdout}")
    check(elapsed < 20, f"they took {elapsed:.1f} s to fail (the deadline is 30 s)")
    needle = "the ranks asked for different communicators (this rank {}; rank {}: {})"
    for mine, other, theirs in (("ring", 1, "hier"), ("hier", 0, "ring")):
        text = needle.format(mine, other, theirs)
        check(text in run.stderr, f"stderr lacks '{text}':\n{run.stderr[-3000:]}")


@case
def mpi_ranks_take_rank_0s_tuning(ctx):
    """Ranks whose tuning caches disagree compute with rank 0's choices (broadcast at set-up),
    so the run is that of one model: rank 1 records rank 0's choices in its own cache."""
    solver, _, _ = setup_training(ctx, max_iter=4, snapshot=0, display=1, test_interval=4)
    first = ctx.path("rank0.txt")
    ctx.run("train", "--solver", solver, "--tune", "once", "--tune-cache", first,
            "--threads", 1)

    def choices(path):
        with open(path) as f:
            rows = [line.rstrip("\n").rsplit("\t", 1) for line in f if not line.startswith("#")]
        return {key: choice for key, choice in rows}

    mine = choices(first)
    check(mine, f"nothing tuned into {first}")
    # Rank 1's cache: the same shapes, every choice another candidate of every convolution.
    other = {key: "type1" if choice != "type1" else "type3" for key, choice in mine.items()}
    second = write(ctx, "rank1.txt", "".join(f"{k}\t{v}\n" for k, v in other.items()))
    command = (mpirun(ctx, 1) + [ctx.tool, "train", "--solver", solver, "--threads", "1",
                                 "--tune-cache", first, ":", "-np", "1", ctx.tool, "train",
                                 "--solver", solver, "--threads", "1", "--tune-cache", second])
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ctx.work,
                         env=mpi_env())
    check(run.returncode == 0, f"2 ranks exited {run.returncode}:\n{run.stderr[-3000:]}")
    check(choices(first) == mine, f"rank 0's cache changed:\n{choices(first)}\n{mine}")
    check(choices(second) == mine, f"rank 1 kept its own choices:\n{choices(second)}\n{mine}")


@case
def mpi_time_reports_overlap_and_writes_a_timeline(ctx):
    net = os.path.join(ctx.repo, "examples", "fashion_mnist", "lenet_train_test.prototxt")
    trace = ctx.path("trace.json")
    # Buckets of 0.5 MB: LeNet's 1.7 MB of gradients go in several, some overlapping backward.
    run = run_mpi(ctx, 2, "time", "--model", net, "--data", "synthetic:1x28x28:10",
                  "--iterations", 3, "--json", "--bucket-mb", "0.5", "--timeline", trace)
    total = json.loads(run.stdout.strip().splitlines()[-1])
    # auto: two ranks of one node sum on the flat ring.
    check(total["ranks"] == 2 and total["comm"] == "ring", total)
    check(total["buckets"] >= 3, f"0.5 MB buckets: {total}")
    check(total["allreduce_bytes"] == 4 * 431080 + 8, f"LeNet's gradients and the loss: {total}")
    check(total["allreduce_ms"] > 0 and 0 <= total["exposed_comm_ms"], total)
    check(abs(total["overlap_efficiency"] -
              (1 - total["exposed_comm_ms"] / total["allreduce_ms"])) < 1e-6, total)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    for rank in (0, 1):
        spans = [e for e in events if e.get("ph") == "X" and e["pid"] == rank]
        names = {(e["cat"], e["name"]) for e in spans}
        check(("forward", "conv1") in names and ("backward", "conv1") in names,
              f"rank {rank}: no conv1 spans")
        reduces = [e for e in spans if e["cat"] == "allreduce"]
        check(len(reduces) == 3 * (total["buckets"] + 1), f"rank {rank}: {len(reduces)} allreduces")
        check(all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans), f"rank {rank}: negative spans")


class SimulatedNodes:
    """Two network namespaces joined by a veth pair, shaped to 10 Gbit/s with 100 us of delay
    (tc netem; a tbf rate limit alone where the kernel lacks netem); mpirun runs in the first
    and reaches the second through tests/mpi/netns_rsh_agent.sh. Skip where namespaces
    cannot be made."""

    A, B = "10.77.0.1", "10.77.0.2"

    def __init__(self, ctx):
        self.ctx = ctx
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"hn{tag}a", f"hn{tag}b")
        self.veth = (f"hv{tag}a", f"hv{tag}b")
        self.shaping = None

    def sh(self, *command, check_rc=True):
        run = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
        if check_rc and run.returncode != 0:
            raise Failure(f"`{' '.join(command)}` exited {run.returncode}: {run.stderr}")
        return run

    def __enter__(self):
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            raise Skip("simulated nodes need root, ip and tc (iproute2)")
        if self.sh("ip", "netns", "add", self.ns[0], check_rc=False).returncode != 0:
            raise Skip("cannot create network namespaces here")
        try:
            self.sh("ip", "netns", "add", self.ns[1])
            self.sh("ip", "link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer",
                    "name", self.veth[1], "netns", self.ns[1])
            for ns, veth, address in zip(self.ns, self.veth, (self.A, self.B)):
                self.sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", veth)
                self.sh("ip", "-n", ns, "link", "set", veth, "up")
                self.sh("ip", "-n", ns, "link", "set", "lo", "up")
                netem = self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root",
                                "netem", "delay", "100us", "rate", "10gbit", check_rc=False)
                if netem.returncode == 0:
                    self.shaping = "netem 10 Gbit/s, 100 us"
                else:
                    self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root",
                            "tbf", "rate", "10gbit", "burst", "1mb", "latency", "1ms")
                    self.shaping = "tbf 10 Gbit/s (no netem in this kernel: no added delay)"
        except BaseException:
            self.__exit__()
            raise
        print(f"simulated nodes {self.ns[0]} ({self.A}) and {self.ns[1]} ({self.B}): {self.shaping}")
        return self

    def __exit__(self, *exc):
        for ns in self.ns:
            # What runs there (an orted cut off from mpirun) goes with the namespace.
            pids = self.sh("ip", "netns", "pids", ns, check_rc=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            self.sh("ip", "netns", "del", ns, check_rc=False)

    def mpirun(self, *args, per_node=1, program=None, launcher_args=()):
        """mpirun of `program` (the tool) with `per_node` ranks on each node, numbered node by
        node unless `launcher_args` say otherwise; the ranks of a node talk through shared
        memory, the nodes over the shaped link."""
        hosts = self.ctx.path("hosts")
        with open(hosts, "w") as f:
            f.write(f"{self.A} slots={per_node}\n{self.B} slots={per_node}\n")
        agent = os.path.join(self.ctx.repo, "tests", "mpi", "netns_rsh_agent.sh")
        return (["ip", "netns", "exec", self.ns[0], self.ctx.mpiexec, "--hostfile", hosts,
                 "-np", str(2 * per_node), "--mca", "plm_rsh_agent", agent, "--mca", "btl",
                 "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none",
                 "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include",
                 "10.77.0.0/24", "--bind-to", "none", "-x", "OMP_NUM_THREADS",
                 *launcher_args] + [program or self.ctx.tool] + [str(a) for a in args])

    def env(self):
        return dict(mpi_env(), HN_NETNS_MAP=f"{self.A}={self.ns[0]} {self.B}={self.ns[1]}")


@case
def mpi_two_simulated_nodes(ctx):
    mpirun(ctx, 2)  # Skip without MPI
    solver, _, prefix = setup_training(ctx, max_iter=30, snapshot=0, display=1,
                                       test_interval=30)
    run_mpi(ctx, 2, "train", "--solver", solver, "--metrics", ctx.path("shm.jsonl"),
            "--threads", 1)
    with SimulatedNodes(ctx) as nodes:
        command = nodes.mpirun("train", "--solver", solver, "--metrics", ctx.path("tcp.jsonl"),
                               "--threads", 1)
        run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ctx.work,
                             env=nodes.env())
        check(run.returncode == 0, f"2 nodes over TCP exited {run.returncode}:\n"
              f"{run.stdout[-2000:]}\n{run.stderr[-3000:]}")
        # The ring sums in an order fixed by (length, ranks): the transport changes no bit.
        check_same_training(ctx.path("shm.jsonl"), ctx.path("tcp.jsonl"),
                            "2 nodes over TCP differ from 2 ranks over shared memory")

        cut_link_mid_run(ctx, nodes, per_node=1, after=10, needles=("timed out after 5 s",))


def check_same_training(first, second, what):
    """Two runs' metrics files hold the same iterations, losses and accuracies, bit for bit."""
    a, b = read_metrics(first), read_metrics(second)
    check([(m["iter"], m["loss"], m["accuracy"]) for m in a] ==
          [(m["iter"], m["loss"], m["accuracy"]) for m in b], f"{what}:\n{a}\n{b}")


def cut_link_mid_run(ctx, nodes, per_node, after, needles):
    """Training on the simulated nodes with a 5 s deadline; cutting the link after iteration
    `after`, every rank fails within 2 x the deadline with the needles on stderr. (mpirun
    itself then waits on a daemon it cannot reach: the ranks' exits are what counts.)"""
    slow, _, _ = setup_training(ctx, max_iter=100000, snapshot=0, display=1,
                                test_interval=100000)
    command = nodes.mpirun("train", "--solver", slow, "--comm-timeout", 5, "--threads", 1,
                           per_node=per_node)
    pattern = f"{ctx.tool} train --solver {slow}"
    process, _ = start_until(ctx, command, after, env=nodes.env())
    errors = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    try:
        reader.start()
        running = len(ranks_running(pattern))
        check(running == 2 * per_node, f"{running} ranks running, not {2 * per_node}")
        nodes.sh("ip", "-n", nodes.ns[0], "link", "set", nodes.veth[0], "down")
        cut = time.monotonic()
        while ranks_running(pattern) and time.monotonic() - cut < 20:
            time.sleep(0.1)
        elapsed = time.monotonic() - cut
    finally:
        process.kill()
        process.wait()
        subprocess.run(["pkill", "-9", "-f", pattern])
    reader.join(5)
    stderr = "".join(errors)
    check(elapsed <= 10.0, f"the ranks took {elapsed:.1f} s to fail (deadline 5 s)")
    for needle in needles:
        check(needle in stderr, f"no '{needle}' on stderr:\n{stderr[-3000:]}")


@case
def mpi_hier_on_two_simulated_nodes(ctx):
    """Two simulated nodes of two ranks each: the hierarchical allreduce's own tests (its sums
    bit for bit the flat ring's, on the nodes MPI finds), training with the default
    communicator (auto: hier there) giving the flat ring's losses on 4 ranks of one node, hier
    refusing ranks numbered round the nodes, and every rank failing by the deadline when the
    link between the nodes is cut."""
    mpirun(ctx, 4)  # Skip without MPI
    tests_mpi = os.path.join(os.path.dirname(ctx.tool), "hybridnn-tests-mpi")
    if not os.path.exists(tests_mpi):
        raise Skip(f"{tests_mpi} was not built")
    solver, _, _ = setup_training(ctx, max_iter=20, snapshot=0, display=1, test_interval=20)
    run_mpi(ctx, 4, "train", "--solver", solver, "--metrics", ctx.path("shm.jsonl"),
            "--threads", 1, "--comm", "ring")
    with SimulatedNodes(ctx) as nodes:
        def run(command, timeout=180, env=None):
            return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                  cwd=ctx.work, env=env or nodes.env())

        units = run(nodes.mpirun("[hier_nodes]", per_node=2, program=tests_mpi), timeout=300)
        check(units.returncode == 0, f"the [hier_nodes] tests on 2 x 2 ranks exited "
              f"{units.returncode}:\n{units.stdout[-4000:]}\n{units.stderr[-2000:]}")
        check("All tests passed" in units.stdout, units.stdout[-2000:])
        # A node whose /dev/shm has no room for the window: hier fails naming it, auto runs
        # the flat ring.
        cramped = run(nodes.mpirun("[.hier_shm]", per_node=2, program=tests_mpi),
                      env=dict(nodes.env(), HN_NETNS_SHM_SIZE="24m"))
        check(cramped.returncode == 0 and "All tests passed" in cramped.stdout,
              f"[.hier_shm] exited {cramped.returncode}:\n{cramped.stdout[-4000:]}\n"
              f"{cramped.stderr[-2000:]}")

        lenet = ("time", "--model", os.path.join(ctx.repo, "examples", "fashion_mnist",
                                                 "lenet_train_test.prototxt"),
                 "--data", "synthetic:1x28x28:10", "--iterations", 2, "--threads", 1, "--json")
        timed = run(nodes.mpirun(*lenet, per_node=2))
        check(timed.returncode == 0, f"time exited {timed.returncode}:\n{timed.stderr[-3000:]}")
        total = json.loads(timed.stdout.strip().splitlines()[-1])
        check(total["ranks"] == 4 and total["comm"] == "hier",
              f"auto on 2 x 2 ranks should run hier: {total}")

        train = run(nodes.mpirun("train", "--solver", solver, "--metrics",
                                 ctx.path("hier.jsonl"), "--threads", 1, per_node=2))
        check(train.returncode == 0, f"training on 2 x 2 ranks exited {train.returncode}:\n"
              f"{train.stdout[-2000:]}\n{train.stderr[-3000:]}")
        check_same_training(ctx.path("shm.jsonl"), ctx.path("hier.jsonl"),
                            "hier on 2 x 2 ranks differs from the flat ring on 4 ranks")

        # Ranks numbered round the nodes: hier refuses, auto runs the flat ring.
        round_robin = ("--map-by", "node")
        refused = run(nodes.mpirun("train", "--solver", solver, "--threads", 1, "--comm", "hier",
                                   per_node=2, launcher_args=round_robin))
        check(refused.returncode != 0 and "not numbered node by node" in refused.stderr,
              f"hier with --map-by node exited {refused.returncode}:\n{refused.stderr[-3000:]}")
        flat = run(nodes.mpirun(*lenet, per_node=2, launcher_args=round_robin))
        check(flat.returncode == 0 and json.loads(flat.stdout.strip().splitlines()[-1])["comm"] ==
              "ring", f"auto with --map-by node:\n{flat.stdout[-2000:]}\n{flat.stderr[-2000:]}")

        # Cutting the link mid-run: every rank, the ones at the link and the others waiting
        # in their node, fails by the deadline.
        cut_link_mid_run(ctx, nodes, per_node=2, after=5,
                         needles=("communicator hier: allreduce", "timed out after 5 s"))


def ranks_running(pattern):
    """Pids of the processes whose command line starts with `pattern` (not mpirun's)."""
    found = subprocess.run(["pgrep", "-f", "^" + re.escape(pattern)], capture_output=True,
                           text=True)
    return found.stdout.split()


def rank_pid(mpirun_pid, rank):
    """The pid of rank `rank` among mpirun's children (from their environment)."""
    for _ in range(100):
        children = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True,
                                  text=True).stdout.split()
        for pid in children:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.1)
    raise Failure(f"rank {rank} of mpirun {mpirun_pid} not found")


def lose_a_rank(ctx, how):
    """Two ranks training with a 5 s deadline; rank 1 gets `how` (SIGSTOP or SIGKILL) after a
    few iterations. Rank 0 must end the job, non-zero, within 2 x the deadline."""
    solver, _, prefix = setup_training(ctx, max_iter=100000, snapshot=5, display=1,
                                       test_interval=100000)
    command = mpirun(ctx, 2) + [ctx.tool, "train", "--solver", solver, "--comm-timeout", "5",
                                "--threads", "1"]
    process, _ = start_until(ctx, command, 12, env=mpi_env())
    victim = None
    try:
        victim = rank_pid(process.pid, 1)
        os.kill(victim, how)
        lost = time.monotonic()
        stdout, stderr = process.communicate(timeout=30)
        elapsed = time.monotonic() - lost
    finally:
        if process.poll() is None:
            process.kill()
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    check(process.returncode != 0, "the run exited 0 after losing a rank")
    check(elapsed <= 10.0, f"the survivor took {elapsed:.1f} s to fail (deadline 5 s)")
    return stderr, prefix


@case
def mpi_stopped_rank_ends_the_run_within_the_deadline(ctx):
    stderr, prefix = lose_a_rank(ctx, signal.SIGSTOP)
    # Rank 0 waits in the gradients' allreduce, or in the allgather of the weights' checksums
    # when the stop comes just before a snapshot.
    for pattern in (r"error on rank 0 of 2",
                    r"(allreduce|allgather) #\d+ on rank 0 of 2 timed out after 5 s",
                    r"rank 1 did not arrive", r"iteration \d+"):
        check(re.search(pattern, stderr), f"stderr does not match /{pattern}/:\n{stderr[-3000:]}")
    # Snapshots written before the fault are whole: one process resumes from the last.
    states = sorted((int(re.search(r"_iter_(\d+)\.solverstate$", f).group(1)), f)
                    for f in os.listdir(os.path.dirname(prefix)) if f.endswith(".solverstate"))
    check(states, "no snapshot was written before the fault")
    last = os.path.join(os.path.dirname(prefix), states[-1][1])
    ctx.run("train", "--solver", ctx.path("solver.prototxt"), "--snapshot", last, "--max-iter",
            states[-1][0] + 2)


@case
def mpi_killed_rank_ends_the_run_within_the_deadline(ctx):
    # mpirun sees the rank die and ends the others itself, naming it.
    stderr, _ = lose_a_rank(ctx, signal.SIGKILL)
    check(re.search(r"process rank 1 .* signal 9", stderr),
          f"nothing names the lost rank:\n{stderr[-3000:]}")




@case
def example_nets_parse_and_run(ctx):
    example = os.path.join(ctx.repo, "examples", "fashion_mnist")
    net = os.path.join(example, "lenet_train_test.prototxt")
    with open(net) as f, open(os.path.join(ctx.models, "mnist_lenet_train_test.prototxt")) as g:
        ours, caffe = f.read(), g.read()
    check(ours == caffe.replace("examples/mnist/mnist_train_lmdb",
                                f"{FASHION}/train-images-idx3-ubyte.gz").replace(
        "examples/mnist/mnist_test_lmdb", f"{FASHION}/t10k-images-idx3-ubyte.gz"),
        "the example net differs from Caffe's LeNet beyond its data sources")
    ctx.run("time", "--model", net, "--iterations", 1, "--data", "synthetic:1x28x28", "--json")
    if not os.path.exists(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")):
        raise Skip(f"Fashion-MNIST is not installed in {FASHION} (dataset-fashion-mnist)")
    ctx.run("time", "--model", net, "--iterations", 1, "--phase", "test", "--json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--tool", help="the hybridnn executable")
    parser.add_argument("--models", help="Caffe's example nets (../shared/models)")
    parser.add_argument("--work", help="scratch directory; each case uses WORK/CASE")
    parser.add_argument("--mpiexec", help="mpirun, when hybridnn was built with MPI")
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    args = parser.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0
    if not (args.tool and args.models and args.work and args.case):
        parser.error("--tool, --models, --work and a case are needed")
    work = os.path.join(os.path.abspath(args.work), args.case)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Each case measures its convolutions into a cache of its own, not the user's.
    os.environ["HYBRIDNN_TUNE_CACHE"] = os.path.join(work, "tune-cache.txt")
    ctx = Context(os.path.abspath(args.tool), os.path.abspath(args.models), work, args.mpiexec)
    try:
        CASES[args.case](ctx)
    except Skip as skip:
        print(f"SKIPPED: {skip}")
        return 77
    except (Failure, subprocess.TimeoutExpired) as failure:
        print(f"FAILED: {args.case}\n{failure}")
        return 1
    print(f"passed: {args.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
