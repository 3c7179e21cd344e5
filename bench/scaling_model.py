#!/usr/bin/env python3
"""A model of data-parallel scaling, calibrated on this machine (issue 39, item 4).

  bench/scaling_model.py calibrate [--ranks 2,4] [--out FILE]   the collective's terms
  bench/scaling_model.py validate  --model NET [--ranks 2,4] [--batch 32] [--threads 1]
                                   [--repeats 3] [--link RATE]
  bench/scaling_model.py project   [--calibration FILE] [--nets caffenet,googlenet,resnet50]
                                   [--links 10,25,100] [--speedups 1,170] [--plot PNG]
  bench/scaling_model.py self-test  the model's arithmetic against hand-worked values

The model: an iteration is the forward, then the backward layer by layer in reverse order;
the gradients go in buckets of --bucket-mb (25 MB, the Solver's default) in the order
backward finishes them, each handed to one communication thread when its last layer's
backward ends (GradientSync); the thread reduces the buckets one after another, each taking
the ring's time

    T(bytes, n) = 2 (n - 1) alpha + 2 (n - 1) / n * bytes * beta

(reduce-scatter then allgather: 2 (n - 1) steps, each moving 1/n of the buffer). The
iteration ends when both the backward and the last bucket (then the loss's two floats) are
done. Per-layer forward and backward times and each layer's gradient bytes come from
`hybridnn time --json`.

calibrate: alpha and beta fitted (least squares on relative error) to the ring's times in
`hybridnn-bench allreduce` over shared memory (64 KiB to 64 MiB), for each --ranks count
apart (ranks beyond the cores share them: every hop slows, which one pair of terms cannot
follow), and from the same runs the node's share of the hierarchical allreduce (hier on
this one node: node_alpha + bytes x node_beta); one JSON line per rank count and size with
the fit's prediction and its ratio to the time measured, then the fitted terms. --out
keeps them for project.

validate: the model's iteration time against `mpirun -np N hybridnn time --json` (N ranks
over shared memory, each with --threads threads; alpha and beta fitted to the benchmark's
ring_shared times, the allreduce in the communicator's shared buffer where the Solver packs
its buckets on one node, over the sizes from a quarter of the net's smallest bucket up: a
link's shaper passes smaller sizes at memory speed, in its burst) for every N of --ranks, in
the same run:
the compute is measured as N copies of a one-process `hybridnn time` run side by side (the
same cores and memory shared as under mpirun, without the collective; their per-layer
times, which the copies run at the same moments), alpha and beta fitted on N ranks just
before; each side the fastest of --repeats runs, taken in turn. Where the ranks' threads
fill the cores, the collective is slower while the backward runs, and the backward loses
the CPU time the collective takes while they overlap: a bucket started under the backward
takes the time of alpha and beta fitted to the benchmark run again beside a busy thread for
each of a rank's threads (--busy-threads), and the backward loses the collective's busy
share (the unloaded benchmark's CPU seconds over ranks x wall seconds) of the overlapped
seconds. One JSON line per N with the predicted and measured milliseconds and their ratio
(the acceptance: within 15 %). --link RATE (root, iproute2; e.g. 1gbit) runs the 2 ranks
on two simulated nodes instead: network namespaces joined by a veth pair shaped with tc
netem to RATE and 100 us of delay (bench/model_parallel.py's), alpha and beta fitted over
that link.

project: the scaling efficiency (one rank's compute time over the modelled iteration, batch
per rank fixed) of each net from 4 to 256 ranks, one rank per node on links of --links
Gbit/s: beta = 8 / rate, alpha = the shared-memory fit's alpha on the fewest ranks plus
--link-latency-us (10 us a hop), the compute this machine's, one process on every core.
Where InnerProduct layers hold most of a net's parameters (CaffeNet), also with them
model-parallel (NetOptions::model_parallel): their gradients leave the buckets, and each
adds an allgather of its input over every rank's rows before its forward and a
reduce-scatter of that gradient after its backward, unhidden. For each --per-node count m
above 1 (default 8, a GPU server's), the nodes' ranks numbered node by node: the flat ring
over all N ranks (each of its 2 (N - 1) steps waits for the link between nodes), and hier
(comm/hier.cpp): the node's latency, node_alpha measured on the fewest --ranks here, then
2 k - 1 steps between the k nodes, each moving 1/k of the buffer over the node's link.
Both leave out the copies inside a node (as the one-rank-a-node projections leave out the
NIC's): what differs is the hops and the bytes on the link. One JSON line per net, mode,
link and rank count; --plot draws the curves (matplotlib; several ranks a node for the
fastest link only). --speedups divides the compute
by each factor (default 1 and 170: ResNet-50's training step takes 6.7 s here on 2 cores,
PyTorch's FP32 one 39 ms on an H200, docs/benchmarks.md), a GPU-class rank.

Open MPI runs as root with OMPI_ALLOW_RUN_AS_ROOT; in containers without CMA,
--mca btl_vader_single_copy_mechanism none (done here). More ranks than cores are
oversubscribed (--oversubscribe --bind-to none), one thread each unless --threads.
"""
import argparse
import functools
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT.parent / "shared" / "models"
NETS = {
    "lenet": ("mnist_lenet_train_test.prototxt", "synthetic:1x28x28"),
    "caffenet": ("bvlc_reference_caffenet_deploy.prototxt", None),
    "googlenet": ("bvlc_googlenet_deploy.prototxt", None),
    "resnet50": ("resnet50_deploy.prototxt", None),
}
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def fail(message):
    sys.exit(f"scaling_model.py: {message}")


def mpirun(ranks, nodes=None):
    """The launcher of `ranks` ranks over shared memory, or of 2 on two simulated nodes."""
    launcher = shutil.which("mpirun")
    if launcher is None:
        fail("mpirun is not on PATH (apt-get install openmpi-bin)")
    if nodes is not None:
        return nodes.prefix(launcher)
    return [launcher, "--oversubscribe", "--bind-to", "none", "--mca",
            "btl_vader_single_copy_mechanism", "none", "-np", str(ranks)]


def launch_env(threads, nodes=None):
    env = dict(ENV, OMP_NUM_THREADS=str(threads))
    if nodes is not None:
        env["HN_NETNS_MAP"] = f"{nodes.A}={nodes.ns[0]} {nodes.B}={nodes.ns[1]}"
    return env


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run(command, env=None):
    print(f"# {' '.join(command)}", file=sys.stderr, flush=True)
    done = subprocess.run(command, capture_output=True, text=True, env=env or ENV)
    if done.returncode != 0:
        fail(f"`{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json_lines(done.stdout)


# ---- the collective ------------------------------------------------------------------------

def ring_seconds(bytes_, ranks, alpha, beta):
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * bytes_ * beta


def hier_seconds(bytes_, nodes, alpha, beta, node_alpha, node_beta):
    """The hierarchical allreduce (comm/hier.cpp) over `nodes` nodes: the node's work (the
    buffers into the shared window, the adds, the sums out: node_alpha + bytes x node_beta,
    fitted to one node's hier) and the rings between the nodes, 2 k - 1 steps each moving
    1/k of the buffer over the node's link (its local ranks' rails share it)."""
    local = node_alpha + bytes_ * node_beta
    if nodes <= 1:
        return local
    return local + (2 * nodes - 1) * alpha + (2 * nodes - 1) / nodes * bytes_ * beta


def fit_line(points):
    """a, b of t = a + b x bytes over (bytes, seconds), least squares on relative error."""
    return least_squares([(1 / t, b / t) for b, t in points], "the node's terms")


def hier_points(lines, ranks):
    return [(ranks, line["bytes"], line["time_us"] * 1e-6) for line in lines
            if line.get("way") == "hier"]


def measure_allreduce(args, ranks, nodes=None, busy=None, lines=None, shared=False,
                      busy_threads=0):
    """The ring's (ranks, bytes, seconds); with `shared`, the ring's in its shared buffer
    where the benchmark has it (ring_shared: every rank on one node, where the Solver's
    gradient buckets lie there), else by messages; with `busy` (a list), appends the share
    of the ranks' time the benchmark kept a CPU busy (its processes' CPU seconds over ranks x
    wall seconds: MPI polls while it waits, and TCP's copies are the kernel's); with `lines`
    (a list), extends it with the benchmark's lines (hier's among them); with busy_threads,
    that many threads of arithmetic beside every rank (the backward it overlaps)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    output = run(mpirun(ranks, nodes) + [str(args.build / "bin" / "hybridnn-bench"),
                                         "allreduce", "--min", "64K", "--max", "64M",
                                         "--busy-threads", str(busy_threads)],
                 env=launch_env(1, nodes))
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if busy is not None:
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        busy.append(min(1.0, cpu / (ranks * wall)))
    if lines is not None:
        lines.extend(output)
    ways = {line.get("way") for line in output}
    way = "ring_shared" if shared and "ring_shared" in ways else "ring"
    return [(ranks, line["bytes"], line["time_us"] * 1e-6) for line in output
            if line.get("way") == way]


def bucket_sized(points, buckets):
    """The points (ranks, bytes, seconds) from a quarter of the smallest bucket up (at least
    the two largest sizes): the sizes the model applies the fit to. One line cannot follow
    both a link's small sizes, which its shaper's burst (tbf's 1 MB) passes at memory speed,
    and the buckets of tens of MB that pay its rate."""
    smallest = min((size for size, _ in buckets), default=0)
    sizes = sorted({b for _, b, _ in points})
    floor = min(smallest / 4, sizes[-2] if len(sizes) > 1 else 0)
    return [point for point in points if point[1] >= floor]


def least_squares(rows, what):
    """The non-negative (a, b) minimising the squares of a x + b y - 1 over rows (x, y),
    by the normal equations."""
    aa = sum(x * x for x, _ in rows)
    ab = sum(x * y for x, y in rows)
    bb = sum(y * y for _, y in rows)
    a1 = sum(x for x, _ in rows)
    b1 = sum(y for _, y in rows)
    determinant = aa * bb - ab * ab
    if determinant <= 0:
        fail(f"cannot fit {what}: the sizes measured do not tell them apart")
    return max((a1 * bb - b1 * ab) / determinant, 0.0), max((b1 * aa - a1 * ab) / determinant, 0.0)


def fit(points):
    """alpha, beta minimising the relative error of ring_seconds over (ranks, bytes, s):
    the least squares of rows (2 (n - 1) / t, 2 (n - 1) / n b / t) against 1."""
    return least_squares([(2 * (n - 1) / t, 2 * (n - 1) / n * b / t) for n, b, t in points],
                         "alpha and beta")


def calibrate(args):
    """alpha and beta per rank count (ranks sharing a node share its cores and memory: more
    ranks than cores make each hop slower, which one pair of terms cannot follow)."""
    terms = {}
    for ranks in args.ranks:
        lines = []
        points = measure_allreduce(args, ranks, lines=lines)
        alpha, beta = fit(points)
        # The same run's hier on this one node: the node's share of the hierarchical sums.
        node = [(b, t) for n, b, t in hier_points(lines, ranks)]
        node_alpha, node_beta = fit_line(node)
        terms[ranks] = (alpha, beta, node_alpha, node_beta)
        fitted = [("ring", n, b, t, ring_seconds(b, n, alpha, beta)) for n, b, t in points]
        fitted += [("hier_node", ranks, b, t, node_alpha + b * node_beta) for b, t in node]
        for way, n, b, t, predicted in fitted:
            print(json.dumps({"bench": "scaling_model", "fit": way, "ranks": n, "bytes": b,
                              "measured_us": round(t * 1e6, 1),
                              "predicted_us": round(predicted * 1e6, 1),
                              "ratio_predicted_to_measured": round(predicted / t, 3)}))
        print(json.dumps({"bench": "scaling_model", "ranks": ranks, "alpha_us": alpha * 1e6,
                          "beta_gbs": 1e-9 / beta if beta > 0 else None,
                          "node_alpha_us": node_alpha * 1e6,
                          "node_beta_gbs": 1e-9 / node_beta if node_beta > 0 else None,
                          "cpu": cpu_name()}), flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            {str(n): {"alpha": a, "beta": b, "node_alpha": na, "node_beta": nb}
             for n, (a, b, na, nb) in terms.items()}) + "\n")
    return terms


# ---- the compute ---------------------------------------------------------------------------

def time_command(args, net, threads):
    prototxt, data = NETS.get(net, (net, None))
    model = pathlib.Path(prototxt)
    if not model.is_absolute():
        model = MODELS / prototxt
    if not model.exists():
        fail(f"{model} is missing")
    command = [str(args.build / "bin" / "hybridnn"), "time", "--model", str(model), "--batch",
               str(args.batch), "--iterations", str(args.iterations), "--threads", str(threads),
               "--json"]
    if data:
        command += ["--data", data]
    return command


def layers_of(lines):
    layers = [line for line in lines if "layer" in line]
    total = next(line for line in lines if line.get("total"))
    return layers, total


def compute_side_by_side(args, net, copies):
    """Per-layer times of the slowest of `copies` one-process runs started together."""
    command = time_command(args, net, args.threads)
    env = launch_env(args.threads)
    print(f"# {copies} x {' '.join(command)}", file=sys.stderr, flush=True)
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for _ in range(copies)]
    results = []
    for process in processes:
        out, err = process.communicate()
        if process.returncode != 0:
            fail(f"`{' '.join(command)}` exited {process.returncode}:\n{err[-3000:]}")
        results.append(layers_of(json_lines(out)))
    return max(results, key=lambda result: layer_sum(result[0]))


def layer_sum(layers):
    return sum(layer["forward_ms"] + layer["backward_ms"] for layer in layers)


# ---- the iteration -------------------------------------------------------------------------

def cut_bytes(layer, batch, ranks):
    """The bytes of an InnerProduct's input over every rank's rows: what model parallelism
    gathers before its forward and reduce-scatters after its backward (param_bytes =
    4 (in x out + out) and forward_flops = 2 batch in x out give in and out)."""
    weights = layer["forward_flops"] / (2 * batch)  # in x out
    outputs = layer["param_bytes"] / 4 - weights
    return 4 * ranks * batch * weights / outputs


def buckets_of(layers, bucket_bytes, cut=()):
    """The Solver's gradient buckets (GradientSync) in the order backward fills them: (bytes,
    the position in backward order of the layer whose backward completes the bucket). A
    layer's gradient joins the open bucket unless that would pass bucket_bytes; a layer
    larger than a bucket has one of its own. Layers named in `cut` have no gradient there."""
    buckets = []  # [bytes, last]
    for position, layer in enumerate(reversed(layers)):
        size = layer.get("param_bytes", 0)
        if size == 0 or layer["layer"] in cut:
            continue
        if not buckets or (buckets[-1][0] > 0 and buckets[-1][0] + size > bucket_bytes):
            buckets.append([0, 0])
        buckets[-1][0] += size
        buckets[-1][1] = position
    return [tuple(bucket) for bucket in buckets]


def iteration_seconds(layers, ranks, alpha, beta, bucket_bytes, cut=(), batch=0, busy=0.0,
                      allreduce=None, loaded=None):
    """The modelled iteration: forward, backward with the buckets' allreduce overlapping it
    (the flat ring's time, or `allreduce(bytes)`'s; a bucket that starts while the backward
    runs takes `loaded(bytes)` where given: the collective beside busy compute threads).
    Layers named in `cut` run model-parallel (NetOptions::model_parallel): no gradient in
    the buckets; an allgather of their input before the forward and a reduce-scatter of its
    gradient after the backward, each (n - 1) steps moving (n - 1) / n of it, in the way."""
    def gathered(layer):
        if layer["layer"] not in cut or ranks <= 1:
            return 0.0
        size = cut_bytes(layer, batch, ranks)
        return (ranks - 1) * alpha + (ranks - 1) / ranks * size * beta
    forward = sum(layer["forward_ms"] * 1e-3 + gathered(layer) for layer in layers)
    clock = forward
    ends = []  # when each layer's backward ends, in backward order
    for layer in reversed(layers):
        clock += layer["backward_ms"] * 1e-3 + gathered(layer)
        ends.append(clock)
    buckets = [(size, ends[last]) for size, last in buckets_of(layers, bucket_bytes, cut)]
    backward_end = clock
    comm = 0.0
    overlapped = 0.0  # the allreduce's seconds while backward still runs
    if allreduce is None:
        def allreduce(size):
            return ring_seconds(size, ranks, alpha, beta)
    for size, ready in buckets:
        start = max(comm, ready)
        under_backward = loaded is not None and start < backward_end
        comm = start + (loaded if under_backward else allreduce)(size)
        overlapped += max(0.0, min(comm, backward_end) - start)
    # Where the ranks' threads fill the cores, the collective's busy share of those seconds
    # is CPU time the backward loses.
    backward_end += busy * overlapped
    end = max(backward_end, comm) + allreduce(8)
    compute = layer_sum(layers) * 1e-3
    return end, compute, len(buckets)


def validate(args):
    if not args.link:
        for ranks in args.ranks:
            validate_on(args, ranks, None)
        return
    if args.ranks != [2]:
        fail("--link simulates two nodes: give --ranks 2")
    sys.path.insert(0, str(ROOT / "bench"))
    from model_parallel import SimulatedNodes  # the two namespaces and their veth pair
    with tempfile.TemporaryDirectory() as work, SimulatedNodes(args.link, work) as nodes:
        validate_on(args, 2, nodes)


def validate_on(args, ranks, nodes):
    busy = []
    # On one node the gradient buckets lie in the communicator's shared buffer: its times.
    points = measure_allreduce(args, ranks, nodes, busy, shared=nodes is None)
    # The collective competes with the compute for CPUs only where the ranks fill them; there
    # it is timed again beside a busy thread for each of a rank's compute threads.
    full = ranks * args.threads >= (os.cpu_count() or 1)
    contention = busy[0] if full else 0.0
    loaded_points = measure_allreduce(args, ranks, nodes, shared=nodes is None,
                                      busy_threads=args.threads) if full else None
    # The compute: the copies' per-layer times (each layer timed over the iterations, as
    # `hybridnn time` under mpirun times its total too), which the copies run at the same
    # moments, where their whole-iteration totals, timed afterwards, drift apart. Each side
    # the fastest of --repeats runs, taken in turn (the least disturbed: on a shared 2-core
    # machine one run of 4 ranks moves by 15 %).
    layers, measured = None, None
    for _ in range(args.repeats):
        candidate, _ = compute_side_by_side(args, args.model, ranks)
        if layers is None or layer_sum(candidate) < layer_sum(layers):
            layers = candidate
        _, total = layers_of(run(mpirun(ranks, nodes) +
                                 time_command(args, args.model, args.threads) +
                                 ["--comm", "ring"], env=launch_env(args.threads, nodes)))
        if measured is None or total["forward_backward_ms"] < measured["forward_backward_ms"]:
            measured = total
    sizes = buckets_of(layers, args.bucket_mb * 1e6)
    alpha, beta = fit(bucket_sized(points, sizes))
    loaded, loaded_terms = None, (None, None)
    if loaded_points:
        loaded_terms = fit(bucket_sized(loaded_points, sizes))

        def loaded(size):
            return ring_seconds(size, ranks, *loaded_terms)
    predicted, compute, buckets = iteration_seconds(layers, ranks, alpha, beta,
                                                    args.bucket_mb * 1e6, busy=contention,
                                                    loaded=loaded)
    measured_ms = measured["forward_backward_ms"]
    print(json.dumps({
        "bench": "scaling_model", "validate": args.model, "ranks": ranks,
        "link": nodes.shaping if nodes else "shared memory", "batch_per_rank": args.batch,
        "threads": args.threads, "alpha_us": round(alpha * 1e6, 2),
        "beta_gbs": round(1e-9 / beta, 3) if beta else None,
        "loaded_alpha_us": round(loaded_terms[0] * 1e6, 2) if loaded else None,
        "loaded_beta_gbs": round(1e-9 / loaded_terms[1], 3) if loaded and loaded_terms[1]
        else None,
        "compute_ms": round(compute * 1e3, 2), "buckets": buckets,
        "comm_busy": round(contention, 3), "predicted_ms": round(predicted * 1e3, 2),
        "measured_ms": round(measured_ms, 2),
        "measured_allreduce_ms": measured.get("allreduce_ms"),
        "measured_exposed_ms": measured.get("exposed_comm_ms"),
        "ratio_predicted_to_measured": round(predicted * 1e3 / measured_ms, 3),
        "cpu": cpu_name()}), flush=True)


def project(args):
    # The per-hop latency of the software (ours and MPI's) from the fewest ranks measured,
    # where every rank has a core.
    if args.calibration:
        terms = json.loads(pathlib.Path(args.calibration).read_text())
        fewest = terms[str(min(int(n) for n in terms))]
        alpha, node_alpha = fewest["alpha"], fewest["node_alpha"]
    else:
        terms = calibrate(args)
        alpha, _, node_alpha, _ = terms[min(terms)]
    curves = {}
    cores = os.cpu_count() or 1
    for net in args.nets:
        layers, total = layers_of(run(time_command(args, net, cores), env=launch_env(cores)))
        scale = total["forward_backward_ms"] / layer_sum(layers)
        for layer in layers:
            layer["forward_ms"] *= scale
            layer["backward_ms"] *= scale
        # Model-parallel FC: the nets whose InnerProduct layers hold most of the parameters
        # (CaffeNet's fc6-fc8), cut across the ranks.
        fc = [layer["layer"] for layer in layers if layer["type"] == "InnerProduct"]
        fc_bytes = sum(layer.get("param_bytes", 0) for layer in layers
                       if layer["layer"] in fc)
        total_bytes = sum(layer.get("param_bytes", 0) for layer in layers)
        modes = [("data_parallel", ())]
        if fc and fc_bytes > total_bytes / 2:
            modes.append(("model_parallel_fc", tuple(fc)))
        for speedup in args.speedups:
            faster = [dict(layer, forward_ms=layer["forward_ms"] / speedup,
                           backward_ms=layer["backward_ms"] / speedup) for layer in layers]
            for gbit in args.links:
                link_alpha = alpha + args.link_latency_us * 1e-6
                link_beta = 8 / (gbit * 1e9)
                # One rank per node (data-parallel, model-parallel FC), then for each
                # --per-node count above 1 the flat ring and hier over those nodes.
                runs = [(mode, cut, 1) for mode, cut in modes]
                runs += [(f"{comm}_{per_node}_per_node", (), per_node)
                         for per_node in args.per_node if per_node > 1
                         for comm in ("ring", "hier")]
                for mode, cut, per_node in runs:
                    # The node's share of hier: its latency as measured here (two barriers,
                    # the copies of a small buffer), its bytes left out as the ring's copies
                    # are (a GPU server's NVLink or a node's memory moves them faster than
                    # the link): the comparison is the hops' and the link's.
                    def hier(size, ranks=0):
                        return hier_seconds(size, ranks // per_node, link_alpha, link_beta,
                                            node_alpha, 0.0)
                    points = []
                    for ranks in (4, 8, 16, 32, 64, 128, 256):
                        if ranks < 2 * per_node:
                            continue
                        collective = None
                        if mode.startswith("hier"):
                            collective = functools.partial(hier, ranks=ranks)
                        seconds, compute, buckets = iteration_seconds(
                            faster, ranks, link_alpha, link_beta, args.bucket_mb * 1e6, cut,
                            args.batch, allreduce=collective)
                        efficiency = compute / seconds
                        points.append((ranks, efficiency))
                        print(json.dumps({
                            "bench": "scaling_model", "project": net, "mode": mode,
                            "ranks_per_node": per_node, "compute_speedup": speedup,
                            "link_gbit": gbit, "ranks": ranks, "batch_per_rank": args.batch,
                            "compute_ms": round(compute * 1e3, 1),
                            "iteration_ms": round(seconds * 1e3, 1), "buckets": buckets,
                            "param_mb": round(total_bytes / 1e6, 1),
                            "efficiency": round(efficiency, 3), "cpu": cpu_name()}), flush=True)
                    curves[(net, gbit, mode, speedup)] = points
    if args.plot:
        plot(curves, args)


def plot(curves, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nets = list(dict.fromkeys(key[0] for key in curves))
    speedups = list(dict.fromkeys(key[3] for key in curves))
    figure, axes = plt.subplots(len(speedups), len(nets), figsize=(4.2 * len(nets),
                                                                  3.4 * len(speedups)),
                                sharey=True, squeeze=False)
    for row, speedup in enumerate(speedups):
        for column, net in enumerate(nets):
            axis = axes[row][column]
            colours = {}
            fastest = max(key[1] for key in curves)
            for (name, gbit, mode, fast), points in curves.items():
                if name != net or fast != speedup:
                    continue
                # Several ranks per node: the fastest link's alone, for legibility.
                nodes = mode.endswith("_per_node")
                if nodes and gbit != fastest:
                    continue
                colour = colours.setdefault(gbit, f"C{len(colours)}")
                style, marker, label = "-", "o", f"{gbit:g} Gbit/s, 1 rank a node"
                if mode == "model_parallel_fc":
                    style, marker, label = "--", "s", f"{gbit:g} Gbit/s, FC model-parallel"
                elif nodes:
                    comm, per_node = mode.split("_")[:2]
                    style, marker = (":", "^") if comm == "hier" else ("-.", "v")
                    label = f"{gbit:g} Gbit/s, {per_node} ranks a node, {comm}"
                axis.plot([p[0] for p in points], [p[1] for p in points], color=colour,
                          marker=marker, linestyle=style, label=label)
            axis.set_xscale("log", base=2)
            axis.set_ylim(0, 1.05)
            compute = "this CPU" if speedup == 1 else f"compute / {speedup:g}"
            axis.set_title(f"{net}, batch {args.batch} per rank, {compute}", fontsize=9)
            axis.set_xlabel("ranks")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
        axes[row][0].set_ylabel("scaling efficiency")
    figure.suptitle(f"Data-parallel training with the bucketed allreduce overlapping backward "
                    f"(ring; hier with 8 ranks a node), modelled (compute measured on "
                    f"{cpu_name()}, 2 cores)", fontsize=9)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=100)
    print(f"# wrote {args.plot}", file=sys.stderr)


def self_test():
    """The model's arithmetic against values worked out by hand (ctest runs this)."""
    def close(a, b):
        return abs(a - b) <= 1e-9 * max(1.0, abs(b))
    checks = []
    # 2 (4 - 1) 10 us + 2 (4 - 1) / 4 x 1 MB x 1 ns/B = 60 us + 1.5 ms.
    checks.append(("ring_seconds", close(ring_seconds(1e6, 4, 1e-5, 1e-9), 1.56e-3)))
    checks.append(("ring_seconds one rank", ring_seconds(1e6, 1, 1e-5, 1e-9) == 0.0))
    # The fit recovers the terms of exact times.
    points = [(n, b, ring_seconds(b, n, 5e-6, 4e-10)) for n in (2, 4)
              for b in (65536, 1 << 20, 1 << 24)]
    alpha, beta = fit(points)
    checks.append(("fit", abs(alpha - 5e-6) < 1e-12 and abs(beta - 4e-10) < 1e-16))
    # Forward 3 ms; backward c (no parameters) ends at 4 ms, b at 5 ms (bucket 0: 20 MB),
    # a at 7 ms (10 MB more would pass 25 MB: bucket 1). At 1 GB/s on 2 ranks (bytes x 1 ns),
    # bucket 0 runs 5-25 ms and bucket 1 25-35 ms, then the loss's 8 bytes.
    layers = [{"layer": "a", "forward_ms": 1, "backward_ms": 2, "param_bytes": 10e6},
              {"layer": "b", "forward_ms": 1, "backward_ms": 1, "param_bytes": 20e6},
              {"layer": "c", "forward_ms": 1, "backward_ms": 1}]
    seconds, compute, buckets = iteration_seconds(layers, 2, 0.0, 1e-9, 25e6)
    checks.append(("iteration", close(seconds, 35e-3 + 8e-9) and close(compute, 7e-3)
                   and buckets == 2))
    # At 1 TB/s bucket 0 is hidden (5-5.02 ms); bucket 1, ready when backward ends, is not.
    seconds, _, _ = iteration_seconds(layers, 2, 0.0, 1e-12, 25e6)
    checks.append(("hidden", close(seconds, 7e-3 + 10e-6 + 8e-12)))
    # At 10 GB/s bucket 0 runs 5-7 ms, under the backward; with the CPU busy all that time
    # the backward ends at 9 ms instead of 7, after bucket 1 (7-8 ms).
    seconds, _, _ = iteration_seconds(layers, 2, 0.0, 1e-10, 25e6, busy=1.0)
    checks.append(("busy", close(seconds, 9e-3 + 8e-10)))
    seconds, _, _ = iteration_seconds(layers, 2, 0.0, 1e-10, 25e6)
    checks.append(("not busy", close(seconds, 8e-3 + 8e-10)))
    # An InnerProduct of 100 inputs and 10 outputs at batch 4: 2 ranks gather 2 x 4 rows of
    # 100 floats; cut, its 4040 bytes leave the buckets and each pass moves half of 3200
    # bytes once (2 - 1 steps).
    fc = {"layer": "fc", "forward_ms": 1, "backward_ms": 1, "forward_flops": 2 * 4 * 100 * 10,
          "param_bytes": 4 * (100 * 10 + 10)}
    checks.append(("cut_bytes", close(cut_bytes(fc, 4, 2), 3200)))
    seconds, _, buckets = iteration_seconds([fc], 2, 0.0, 1e-9, 25e6, ("fc",), 4)
    checks.append(("cut", buckets == 0 and close(seconds, 2e-3 + 2 * 1600e-9 + 8e-9)))
    # hier: on one node the node's term alone; on 4 nodes 10 us + 1 ns/B x 1 MB inside, then
    # 7 steps of 5 us and 7/4 x 1 MB at 0.1 ns/B: 10 + 35 + 1000 + 175 us.
    checks.append(("hier_seconds one node", close(hier_seconds(1e6, 1, 5e-6, 1e-10, 1e-5, 1e-9),
                                                  1.01e-3)))
    checks.append(("hier_seconds", close(hier_seconds(1e6, 4, 5e-6, 1e-10, 1e-5, 1e-9),
                                         1.22e-3)))
    checks.append(("fit_line", all(abs(x - y) < 1e-15 for x, y in zip(
        fit_line([(b, 2e-5 + b * 3e-10) for b in (65536, 1 << 20, 1 << 24)]), (2e-5, 3e-10)))))
    # iteration_seconds with another collective: the hand-worked iteration above, each
    # bucket twice as long (5-45 ms, 45-65 ms), the loss's 16 ns.
    seconds, _, _ = iteration_seconds(layers, 2, 0.0, 0.0, 25e6,
                                      allreduce=lambda size: 2e-9 * size)
    checks.append(("iteration, another collective", close(seconds, 65e-3 + 16e-9)))
    # Beside busy threads bucket 0 takes twice as long (5-9 ms, started under the backward);
    # bucket 1, started at 9 ms after the backward (7 ms), the unloaded 1 ms.
    seconds, _, _ = iteration_seconds(layers, 2, 0.0, 1e-10, 25e6,
                                      loaded=lambda size: 2e-10 * size)
    checks.append(("loaded", close(seconds, 10e-3 + 8e-10)))
    # bucket_sized: buckets of 20 MB and 10 MB keep the sizes from 2.5 MB; one of 1 KB keeps
    # all; none above the largest sizes keeps the two largest.
    sized = [(2, b, 1.0) for b in (65536, 1 << 20, 1 << 22, 1 << 24)]
    checks.append(("bucket_sized", [b for _, b, _ in bucket_sized(sized, buckets_of(layers, 25e6))]
                   == [1 << 22, 1 << 24]))
    checks.append(("bucket_sized, small", len(bucket_sized(sized, [(1000, 0)])) == 4))
    checks.append(("bucket_sized, large", [b for _, b, _ in bucket_sized(sized, [(1e9, 0)])]
                   == [1 << 22, 1 << 24]))
    checks.append(("buckets_of", buckets_of(layers, 25e6) == [(20e6, 1), (10e6, 2)]))
    failed = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(f"{'ok' if ok else 'FAILED'}: {name}")
    sys.exit(1 if failed else 0)


@functools.lru_cache(maxsize=None)
def cpu_name():
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    for line in info.splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            return name + (", AVX-512" if "avx512f" in info else ", AVX2")
    return "unknown CPU"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("calibrate", "validate", "project", "self-test"))
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--model", default="lenet", help="a NETS name or a prototxt")
    parser.add_argument("--nets", default="caffenet,googlenet,resnet50")
    parser.add_argument("--links", default="10,25,100")
    parser.add_argument("--speedups", default="1,170",
                        help="compute divided by each (170: ResNet-50's step here against "
                             "PyTorch's FP32 one on an H200)")
    parser.add_argument("--link-latency-us", type=float, default=10.0)
    parser.add_argument("--per-node", default="1,8",
                        help="project: ranks a node; above 1, the flat ring and hier")
    parser.add_argument("--link", default="", help="validate: 2 ranks on two simulated nodes "
                        "joined by a link of this rate (tc: 1gbit, 10gbit)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--calibration", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--plot", default="")
    parser.add_argument("--build", default=str(ROOT / "build"))
    args = parser.parse_args()
    args.ranks = [int(r) for r in args.ranks.split(",")]
    args.nets = args.nets.split(",")
    args.links = [float(g) for g in args.links.split(",")]
    args.speedups = [float(x) for x in args.speedups.split(",")]
    args.per_node = [int(x) for x in args.per_node.split(",")]
    args.build = pathlib.Path(args.build)
    if args.what == "self-test":
        self_test()
    {"calibrate": calibrate, "validate": validate, "project": project}[args.what](args)


if __name__ == "__main__":
    main()
