#!/usr/bin/env python3
"""hybridnn against PyTorch and BVLC Caffe on the CPU, on Caffe's model zoo: CaffeNet,
GoogLeNet, ResNet-50 and MobileNet v1 (the deploy prototxt files in shared/models) and
SqueezeNet v1.1 (bench/models), each forward + full backward (weight and data gradients,
Caffe's force_backward) at batch 32, printed as JSON lines with the ratios hybridnn /
PyTorch, hybridnn / Caffe and the fraction of the FLOP-count limit that hybridnn reaches.

  bench/zoo.py [--nets caffenet,googlenet,resnet50,mobilenet,squeezenet] [--batch 32]
               [--iterations 10] [--chunks 5] [--threads 1,2] [--build build]
               [--tune cached] [--layout blocked] [--caffe PATH/caffe] [--markdown FILE]
               [--torch-python VENV/bin/python ...]

The three are timed alike, as bench/vs_pytorch.py does: a warm-up, then the timed
iterations in chunks, and the figure is the best chunk's mean ms per iteration (the
machine is shared; the best chunk is the one least disturbed). hybridnn (`hybridnn time
--json`) and Caffe (`caffe time`) warm up once per process and run one process per chunk,
taking turns chunk by chunk (so that both see the same moments of a machine whose speed
drifts); their per-layer times are each layer's best over the chunks. hybridnn and Caffe
run on the largest --threads count (Caffe through OPENBLAS_NUM_THREADS); PyTorch's figure is its best
over every --threads count and both memory formats (contiguous NCHW and channels_last).

The FLOP-count limit is 3 x the forward FLOPs of the convolutions and inner products
(hybridnn time's "forward_flops", 2 per multiply-add) over the sgemm peak, the best GFLOP/s
that `hybridnn-bench gemm` measures in the same run on the same threads: the backward
computes a data and a weight gradient, each as many FLOPs as the forward.

PyTorch's twins run in train mode (dropout active, as `caffe time` runs the TRAIN phase)
with their BatchNorm layers in eval mode (Caffe's use_global_stats: true) and end in a
softmax, as the prototxt files do. They are:
  CaffeNet   bench/vs_pytorch.py's, layer for layer the prototxt's.
  GoogLeNet  torchvision.models.googlenet(aux_logits=False, init_weights=False), which is
             not quite Caffe's: BatchNorm after every convolution, a 3x3 convolution in the
             "5x5" branch of each inception, no LRN, dropout 0.2 instead of 0.4.
  ResNet-50  torchvision.models.resnet50() with the stride of each stage's first block
             moved from its 3x3 to its first 1x1 convolution, as in Caffe's ResNet-50
             (v1; torchvision's is v1.5); conv1 has no bias (Caffe's has one).
  MobileNet  written here after the prototxt: conv 3x3/2 32, then 13 blocks of depthwise
             3x3 + BatchNorm + ReLU and pointwise 1x1 + BatchNorm + ReLU (convolutions
             without bias), global average pooling, and fc7 as a 1x1 convolution to 1000.
  SqueezeNet torchvision.models.squeezenet1_1(), the same layers as the Caffe v1.1 deploy
             net in bench/models (not in shared/models: a public net of GoogLeNet's family,
             1x1 and 3x3 branches joined by Concat).

PyTorch: Debian's python3-torch (1.13) in this process, and with --torch-python each other
interpreter's (e.g. today's PyPI build in a venv: `python3 -m venv ~/torch && ~/torch/bin/pip
install torch torchvision`, a few GB with its GPU libraries, of which the benchmark needs
the CPU part only), timed by the same code in a child process; the faster of them is
"PyTorch" (each one's figure is in the JSON line, `pytorch_each`).

Needs Debian's python3-torch and python3-torchvision; without them the script says so,
prints {"skipped": ...} and runs hybridnn and Caffe alone. Needs the `hybridnn` and
`hybridnn-bench` tools in --build. Caffe runs only with --caffe.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

from vs_pytorch import (MODELS, REPO, caffenet, emit, pytorch_forward_backward,
                        rerun_under_system_python)

NetSpec = collections.namedtuple("NetSpec", "key title prototxt twin")

LAYOUTS = ("contiguous", "channels_last")
TOP_LAYERS = 10
# A deploy net's input: `input_dim: 10` lines or `input_param { shape: { dim: 10 ... } }`.
INPUT_DIM = re.compile(r"\b((?:input_)?dim:\s*)(\d+)")
CAFFE_LAYER = re.compile(r"\]\s+(\S+)\t(forward|backward): ([0-9.eE+-]+) ms\.")
CAFFE_TOTAL = re.compile(r"Average Forward-Backward: ([0-9.eE+-]+) ms\.")

# MobileNet v1's depthwise-separable blocks (conv2_1 ... conv6): pointwise outputs, stride.
MOBILENET_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + \
    [(512, 1)] * 5 + [(1024, 2), (1024, 1)]


def note(message):
    print("zoo: " + message, file=sys.stderr, flush=True)


def import_torch():
    """PyTorch and torchvision, from /usr/bin/python3 if need be; None when they are not
    installed there either."""
    try:
        import torch
        import torchvision  # noqa: F401
        return torch
    except ImportError as error:
        rerun_under_system_python("HYBRIDNN_ZOO_REEXEC")
        note(f"PyTorch is not installed ({error}); install Debian's CPU build with "
             "`sudo apt-get install python3-torch python3-torchvision` for its figures")
        emit({"skipped": f"pytorch: python3-torch or python3-torchvision not installed ({error})"})
        return None


# ---------------------------------------------------------------------------------------------
# PyTorch's twins of the prototxt files

def googlenet(torch):
    import torchvision
    net = torchvision.models.googlenet(aux_logits=False, init_weights=False)
    return torch.nn.Sequential(net, torch.nn.Softmax(dim=1))


def resnet50(torch):
    import torchvision
    net = torchvision.models.resnet50()
    for stage in (net.layer2, net.layer3, net.layer4):
        stage[0].conv1.stride, stage[0].conv2.stride = (2, 2), (1, 1)
    return torch.nn.Sequential(net, torch.nn.Softmax(dim=1))


def mobilenet(torch):
    nn = torch.nn

    def conv_bn_relu(c_in, c_out, kernel, stride, groups=1):
        conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False)
        nn.init.kaiming_normal_(conv.weight)  # the prototxt's msra filler
        return [conv, nn.BatchNorm2d(c_out, eps=1e-5), nn.ReLU(inplace=True)]

    layers = conv_bn_relu(3, 32, 3, 2)                                          # conv1
    c_in = 32
    for c_out, stride in MOBILENET_BLOCKS:
        layers += conv_bn_relu(c_in, c_in, 3, stride, groups=c_in)             # convN/dw
        layers += conv_bn_relu(c_in, c_out, 1, 1)                              # convN/sep
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Conv2d(c_in, 1000, 1),              # pool6 fc7
               nn.Flatten(), nn.Softmax(dim=1)]                                # prob
    return nn.Sequential(*layers)


def squeezenet(torch):
    import torchvision
    net = torchvision.models.squeezenet1_1()
    return torch.nn.Sequential(net, torch.nn.Softmax(dim=1))


# Prototxt files named relative to ../shared/models, or absolute (bench/models: public Caffe
# nets of the same families that shared/models does not hold).
NETS = [NetSpec("caffenet", "CaffeNet", "bvlc_reference_caffenet_deploy.prototxt", caffenet),
        NetSpec("googlenet", "GoogLeNet", "bvlc_googlenet_deploy.prototxt", googlenet),
        NetSpec("resnet50", "ResNet-50", "resnet50_deploy.prototxt", resnet50),
        NetSpec("mobilenet", "MobileNet v1", "mobilenet_v1_deploy.prototxt", mobilenet),
        NetSpec("squeezenet", "SqueezeNet v1.1",
                os.path.join(REPO, "bench", "models", "squeezenet_v1.1_deploy.prototxt"),
                squeezenet)]


def caffe_phase(torch, net):
    """TRAIN as `caffe time`, with BatchNorm on its stored statistics (use_global_stats)."""
    net.train()
    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.eval()
    return net


def pytorch_time(torch, spec, shape, threads, layout, iterations, chunks):
    return pytorch_forward_backward(torch, lambda t: caffe_phase(t, spec.twin(t)), shape,
                                    threads, layout, iterations, chunks)


def pytorch_best(torch, spec, shape, threads, iterations, chunks):
    """Best (ms, threads, layout) over thread counts and memory formats."""
    best = None
    for t in threads:
        for layout in LAYOUTS:
            ms, mean = pytorch_time(torch, spec, shape, t, layout, iterations, chunks)
            note(f"{spec.key}: pytorch {torch.__version__}, {t} threads, {layout}: {ms:.2f} ms "
                 f"(mean {mean:.2f})")
            if best is None or ms < best[0]:
                best = (ms, t, layout)
    return best


def child_pytorch_best(python, spec, shape, threads, iterations, chunks):
    """pytorch_best in `python` (another interpreter's PyTorch), through --peer-child."""
    command = [python, os.path.abspath(__file__), "--peer-child", spec.key,
               "--shape", ",".join(map(str, shape)), "--threads", ",".join(map(str, threads)),
               "--iterations", str(iterations), "--chunks", str(chunks)]
    # The child must not fall back to /usr/bin/python3's PyTorch.
    env = dict(os.environ, HYBRIDNN_ZOO_REEXEC="1", HYBRIDNN_VS_PYTORCH_REEXEC="1")
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    sys.stderr.write(run.stderr)
    records = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not records or "ms" not in records[-1]:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    record = records[-1]
    return record["ms"], record["threads"], record["format"]


def torch_version(python):
    probe = subprocess.run([python, "-c", "import torch, torchvision; print(torch.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.strip():
        raise RuntimeError(f"{python} cannot import torch and torchvision:\n"
                           f"{probe.stderr[-1000:]}")
    return probe.stdout.strip().splitlines()[-1]


def peer_child(args):
    """--peer-child NET: this interpreter's PyTorch on NET's twin, one JSON line."""
    import torch
    spec = {s.key: s for s in NETS}[args.peer_child]
    shape = [int(d) for d in args.shape.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    ms, best_threads, layout = pytorch_best(torch, spec, shape, threads, args.iterations,
                                            args.chunks)
    emit({"ms": ms, "threads": best_threads, "format": layout, "torch": torch.__version__})
    return 0


# ---------------------------------------------------------------------------------------------
# hybridnn and Caffe: one process per chunk

def build_tool(build, name):
    path = os.path.join(build if os.path.isabs(build) else os.path.join(REPO, build), "bin", name)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"zoo: no {name} tool at {path}; build it (cmake --build {build})")
    return path


def run_checked(command, threads):
    """Runs a tool with its OpenMP and OpenBLAS pools (and oneDNN's, on OpenMP) capped at
    `threads`; glog to stderr rather than to files."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               GLOG_logtostderr="1")
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({run.returncode}):\n"
                           f"{(run.stdout + run.stderr)[-2000:]}")
    return run


def best_of_processes(runners, iterations, chunks):
    """Each of runners[i](n) times n iterations in a fresh process and returns (total ms,
    {layer: {"forward_ms", "backward_ms", ...}}). The runners take turns, one chunk each,
    so that all of them see the same moments of a machine whose speed drifts (a shared
    instance can slow by 15 % within the hour). Returns, per runner, as chunked() times
    PyTorch: the best chunk's total and, per layer and direction, the best of the chunks."""
    size = max(1, iterations // chunks)
    runs = [[] for _ in runners]
    for _ in range(max(1, iterations // size)):
        for i, run_once in enumerate(runners):
            runs[i].append(run_once(size))
    results = []
    for each in runs:
        layers = {name: dict(record) for name, record in each[0][1].items()}
        for _, run_layers in each[1:]:
            for name, record in run_layers.items():
                for key in ("forward_ms", "backward_ms"):
                    layers[name][key] = min(layers[name][key], record[key])
        results.append((min(total for total, _ in each), layers))
    return results


def hybridnn_time(tool, model, batch, threads, tune, layout, iterations):
    run = run_checked([tool, "time", "--model", model, "--batch", str(batch), "--iterations",
                       str(iterations), "--json", "--tune", tune, "--layout", layout,
                       "--threads", str(threads)],
                      threads)
    tuned = sum(line.startswith("Tuned") for line in run.stderr.splitlines())
    if tuned:
        note(f"hybridnn tuned {tuned} convolutions (kept in its cache for later runs)")
    total, layers = None, {}
    for line in run.stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if record.get("total") is True:
            total = float(record["forward_backward_ms"])
        elif "type" in record:
            layers[record["layer"]] = record
    if total is None:
        raise RuntimeError(f"no total line in the output of `hybridnn time` on {model}")
    return total, layers


def caffe_prototxt(text, batch):
    """The deploy net at `batch`, with gradients into every blob as `hybridnn time` does."""
    return "force_backward: true\n" + INPUT_DIM.sub(rf"\g<1>{batch}", text, count=1)


def caffe_time(caffe, model, threads, iterations):
    run = run_checked([caffe, "time", "-model", model, "-iterations", str(iterations)], threads)
    layers = collections.defaultdict(dict)
    for name, direction, ms in CAFFE_LAYER.findall(run.stderr):
        layers[name][direction + "_ms"] = float(ms)
    total = CAFFE_TOTAL.search(run.stderr)
    if total is None:
        raise RuntimeError(f"no 'Average Forward-Backward' in the log of `caffe time` on {model}")
    return float(total.group(1)), dict(layers)


def slowest_convolutions(key, ours, caffe):
    """The convolution passes with the largest ratio of hybridnn's time to Caffe's."""
    rows = []
    for name, record in ours.items():
        if record["type"] != "Convolution" or name not in caffe:
            continue
        for direction in ("forward", "backward"):
            theirs = caffe[name].get(direction + "_ms", 0.0)
            if theirs > 0:
                mine = record[direction + "_ms"]
                rows.append({"net": key, "layer": name, "direction": direction,
                             "hybridnn_ms": round(mine, 3), "caffe_ms": round(theirs, 3),
                             "ratio": round(mine / theirs, 3),
                             "algorithm": record.get("algorithm")})
    return sorted(rows, key=lambda row: row["ratio"], reverse=True)[:TOP_LAYERS]


# ---------------------------------------------------------------------------------------------

def sgemm_peak(bench_tool, threads):
    """The best GFLOP/s of `hybridnn-bench gemm`: its peak line (each BLAS called directly at
    large square sizes) or, when a disturbed peak run fell below it, the driver's best GEMM,
    so that the limit stays a bound. Returns {"gflops", "blas", "threads", "gemm"}."""
    run = run_checked([bench_tool, "gemm", "--threads", str(threads)], threads)
    best = None
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if best is None or record["gflops"] > best["gflops"]:
                gemm = ("square peak" if record["bench"] == "gemm_peak"
                        else f"{record['m']}x{record['n']}x{record['k']}")
                best = {"gflops": record["gflops"], "blas": record["blas"],
                        "threads": record["threads"], "gemm": gemm}
    if best is None:
        raise RuntimeError("no JSON lines in the output of `hybridnn-bench gemm`")
    return best


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def rounded(ms):
    return round(ms, 2) if ms is not None else None


def write_markdown(path, args, threads, peak, results):
    def cell(value, digits):
        return "—" if value is None else f"{value:.{digits}f}"

    lines = [f"Batch {args.batch}, forward + full backward, ms per iteration (the best "
             f"chunk's mean; {args.iterations} timed iterations in chunks of "
             f"{max(1, args.iterations // args.chunks)}); hybridnn and BVLC Caffe "
             f"on {max(threads)} threads, PyTorch the fastest of "
             f"{', '.join(sorted({v for _, row, _ in results for v in row['pytorch_each']}))} "
             f"over {','.join(map(str, threads))} "
             f"threads and NCHW / channels_last; FLOP limit = 3 x forward FLOPs / sgemm peak "
             f"({peak['gflops']:.1f} GFLOP/s, {peak['blas']} {peak['gemm']}, {peak['threads']} "
             "threads).",
             "",
             "| net | BVLC Caffe | PyTorch (version) | hybridnn | hybridnn/PyTorch | hybridnn/Caffe "
             "| FLOP limit | fraction of limit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for title, row, _ in results:
        version = f" ({row['pytorch_best']['torch']})" if row["pytorch_best"] else ""
        lines.append(f"| {title} | {cell(row['caffe_ms'], 1)} "
                     f"| {cell(row['pytorch_ms'], 1)}{version} "
                     f"| {cell(row['hybridnn_ms'], 1)} | {cell(row['ratio_pytorch'], 2)} "
                     f"| {cell(row['ratio_caffe'], 2)} | {cell(row['flop_limit_ms'], 1)} "
                     f"| {cell(row['fraction_of_flop_limit'], 3)} |")
    for title, _, layers in results:
        if not layers:
            continue
        lines += ["", f"{title}: the {len(layers)} convolution passes furthest behind Caffe's",
                  "", "| layer | direction | algorithm | hybridnn ms | Caffe ms | hybridnn/Caffe |",
                  "|---|---|---|---:|---:|---:|"]
        lines += [f"| {layer['layer']} | {layer['direction']} | {layer['algorithm'] or '—'} "
                  f"| {layer['hybridnn_ms']:.2f} | {layer['caffe_ms']:.2f} "
                  f"| {layer['ratio']:.2f} |" for layer in layers]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(spec.key for spec in NETS),
                        help="comma-separated nets (all: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (32)")
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations (10)")
    parser.add_argument("--chunks", type=int, default=5,
                        help="timed iterations are measured in this many chunks; the best "
                             "chunk is reported (5)")
    parser.add_argument("--threads", default="1,2",
                        help="PyTorch's thread counts; hybridnn, Caffe and the sgemm peak run "
                             "on the largest (1,2)")
    parser.add_argument("--build", default="build", help="hybridnn build directory (build)")
    parser.add_argument("--tune", default="cached",
                        help="hybridnn time's --tune: off, once or cached (cached)")
    parser.add_argument("--layout", default="blocked",
                        help="hybridnn time's --layout: blocked or nchw (blocked)")
    parser.add_argument("--caffe", help="BVLC Caffe's `caffe` binary; Caffe is left out without")
    parser.add_argument("--markdown", help="also write the results as markdown tables to FILE")
    parser.add_argument("--torch-python", action="append", default=[], metavar="PYTHON",
                        help="another interpreter whose PyTorch is timed too (repeatable; "
                             "e.g. a venv's bin/python with PyPI's torch); the fastest PyTorch "
                             "is the reference")
    parser.add_argument("--peer-child", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_child:
        return peer_child(args)
    known = {spec.key: spec for spec in NETS}
    names = [n for n in args.nets.split(",") if n]
    if not names or any(n not in known for n in names):
        parser.error(f"--nets takes a comma-separated list of {', '.join(known)}")
    try:
        threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        parser.error("--threads needs positive counts, e.g. 1,2")
    if min(args.batch, args.iterations, args.chunks) < 1:
        parser.error("--batch, --iterations and --chunks must be positive")
    if args.caffe and not os.access(args.caffe, os.X_OK):
        parser.error(f"--caffe: {args.caffe} is not an executable")
    tool = build_tool(args.build, "hybridnn")
    bench_tool = build_tool(args.build, "hybridnn-bench")

    torch = import_torch()
    peers = []  # (version, python) of each --torch-python that imports torch
    for python in args.torch_python:
        try:
            peers.append((torch_version(python), python))
        except (RuntimeError, OSError) as error:
            note(f"--torch-python {python} left out: {error}")
            emit({"skipped": f"pytorch in {python}: {error}"})
    emit({"setup": True, "torch": torch.__version__ if torch else None,
          "torch_peers": {python: version for version, python in peers}, "caffe": args.caffe,
          "load_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
          "threads": threads, "batch": args.batch, "iterations": args.iterations,
          "chunks": args.chunks, "tune": args.tune, "layout": args.layout})
    note(f"measuring the sgemm peak on {max(threads)} threads (hybridnn-bench gemm)")
    peak = sgemm_peak(bench_tool, max(threads))
    emit({"sgemm_peak_gflops": peak["gflops"], "blas": peak["blas"], "threads": peak["threads"],
          "gemm": peak["gemm"]})

    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="hybridnn-zoo-") as tmp:
        for spec in (known[n] for n in names):
            model = os.path.join(MODELS, spec.prototxt)
            if not os.path.exists(model):
                note(f"skipping {spec.key}: {model} not found")
                emit({"net": spec.key, "skipped": f"{model} not found"})
                continue
            try:
                with open(model) as f:
                    text = f.read()
                shape = [args.batch] + [int(d) for _, d in INPUT_DIM.findall(text)[1:4]]
                runners = [lambda n: hybridnn_time(tool, model, args.batch, max(threads),
                                                   args.tune, args.layout, n)]
                if args.caffe:
                    # A copy in tmp (an absolute spec.prototxt must not be overwritten).
                    caffe_model = os.path.join(tmp, os.path.basename(spec.prototxt))
                    with open(caffe_model, "w") as f:
                        f.write(caffe_prototxt(text, args.batch))
                    runners.append(lambda n: caffe_time(args.caffe, caffe_model, max(threads), n))
                note(f"{spec.key}: hybridnn" + (" and caffe, taking turns" if args.caffe else ""))
                timed = best_of_processes(runners, args.iterations, args.chunks)
                ours_ms, ours = timed[0]
                pytorch, each = None, {}
                chunks = min(args.chunks, args.iterations)
                if torch:
                    pytorch = pytorch_best(torch, spec, shape, threads, args.iterations,
                                           chunks) + (torch.__version__,)
                    each[torch.__version__] = rounded(pytorch[0])
                for version, python in peers:
                    note(f"{spec.key}: pytorch {version} ({python})")
                    theirs = child_pytorch_best(python, spec, shape, threads, args.iterations,
                                                chunks) + (version,)
                    each[version] = rounded(theirs[0])
                    if pytorch is None or theirs[0] < pytorch[0]:
                        pytorch = theirs
                caffe_ms, layers = None, []
                if args.caffe:
                    caffe_ms, theirs = timed[1]
                    layers = slowest_convolutions(spec.key, ours, theirs)
            except (RuntimeError, OSError, ValueError) as error:
                note(f"{spec.key} failed: {error}")
                failed = True
                continue
            flops = sum(record.get("forward_flops", 0.0) for record in ours.values())
            if not flops:
                note(f"{spec.key}: `hybridnn time` reports no forward_flops; no FLOP limit")
            limit_ms = 3 * flops / (peak["gflops"] * 1e6) if flops else None
            pytorch_ms = pytorch[0] if pytorch else None
            row = {"net": spec.key, "batch": args.batch, "hybridnn_ms": rounded(ours_ms),
                   "pytorch_ms": rounded(pytorch_ms),
                   "pytorch_best": ({"torch": pytorch[3], "threads": pytorch[1],
                                     "format": pytorch[2]} if pytorch else None),
                   "pytorch_each": each,
                   "caffe_ms": rounded(caffe_ms), "flop_limit_ms": rounded(limit_ms),
                   "ratio_pytorch": ratio(ours_ms, pytorch_ms),
                   "ratio_caffe": ratio(ours_ms, caffe_ms),
                   "fraction_of_flop_limit": ratio(limit_ms, ours_ms)}
            emit(row)
            for layer in layers:
                emit(layer)
            results.append((spec.title, row, layers))

    if args.markdown and results:
        write_markdown(args.markdown, args, threads, peak, results)
        note(f"markdown tables written to {args.markdown}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
