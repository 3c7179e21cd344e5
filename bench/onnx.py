#!/usr/bin/env python3
"""hybridnn on ONNX models against ONNX Runtime and PyTorch on the CPU (issue 37, item 6):
torchvision's resnet50, mobilenet_v2, efficientnet_b0 and shufflenet_v2_x1_0 exported by
torch.onnx.export (opset 13, a symbolic batch, 224x224), then

* forward at batch 1 and 32: hybridnn (the model read from the .onnx file, the cpu driver,
  the tool's defaults: blocked activations, convolutions tuned once and cached) against ONNX
  Runtime's CPU provider, same threads, same run;
* forward + full backward at batch 32 (parameter and input gradients, the parameter
  gradients zeroed each step; BatchNorm on its stored statistics on both sides, as an
  imported model trains): the .onnx file's net in its training phase (as `hybridnn time`
  runs it) against PyTorch (eval mode, NCHW and channels_last, the faster), Debian's
  python3-torch here and, with --torch PYTHON, another PyTorch (PyPI's in a venv) too: the
  faster of all is the reference. Each model's PyTorch steps are timed right before its
  hybridnn steps, so that a shared machine's drift over the run falls on both alike.

One JSON line per model, pass and batch, each with its ratio (hybridnn / the peer: below 1
hybridnn is faster). Timing, the same on every side: a warm-up, then chunks of iterations;
the figure is the best chunk's mean (the least disturbed on a shared machine), the mean of
all chunks beside it.

  bench/onnx.py [--build build] [--models resnet50,...] [--threads N] [--chunks 3]
                [--torch /path/to/venv/bin/python]

Needs torch, torchvision and onnx (Debian's python3-torch, python3-torchvision,
python3-onnx: the script re-runs itself under /usr/bin/python3 where they are) and the
library's Python module in BUILD/python; onnxruntime (pip install onnxruntime) for the
forward comparison, else those lines say it is missing. A model the importer refuses
prints its error in its line ({"model": ..., "error": ...}).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0", "shufflenet_v2_x1_0"]
SIZE = 224


def emit(record):
    print(json.dumps(record), flush=True)


def note(message):
    print("onnx bench: " + message, file=sys.stderr, flush=True)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next(l.split(":", 1)[1].strip() for l in info.splitlines()
                    if l.startswith("model name"))
        flags = next(l for l in info.splitlines() if l.startswith("flags"))
        return name + (", AVX-512" if " avx512f" in flags else ", AVX2 only")
    except (OSError, StopIteration):
        return "unknown"


def best_of_chunks(step, chunks, per_chunk):
    """(best chunk's mean, mean of all chunks) in ms per call of step()."""
    step()
    step()  # warm-up: tuning, plans, first touches
    means = []
    for _ in range(chunks):
        start = time.perf_counter()
        for _ in range(per_chunk):
            step()
        means.append((time.perf_counter() - start) * 1000 / per_chunk)
    return min(means), sum(means) / len(means)


def per_chunk(batch):
    return 8 if batch == 1 else 2


# ---- PyTorch's side (also run alone under another interpreter: --pytorch-only) ------------

def pytorch_times(models, threads, chunks):
    """{model: (best ms, mean ms, label)} of forward + full backward at batch 32."""
    import torch
    import torchvision
    torch.set_num_threads(threads)
    found = {}
    for name in models:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        best = None
        for fmt in ("nchw", "channels_last"):
            m = model.to(memory_format=torch.channels_last) if fmt == "channels_last" else model
            x = torch.randn(32, 3, SIZE, SIZE)
            if fmt == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last)
            x.requires_grad_(True)

            def step():
                m.zero_grad(set_to_none=False)
                x.grad = None
                m(x).sum().backward()

            ms, mean = best_of_chunks(step, chunks, 2)
            if best is None or ms < best[0]:
                best = (ms, mean, f"torch {torch.__version__} {fmt}")
        found[name] = best
    return found


# ---- hybridnn and ONNX Runtime ------------------------------------------------------------

def export(name, folder):
    import torch
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    path = os.path.join(folder, name + ".onnx")
    torch.onnx.export(model, torch.randn(1, 3, SIZE, SIZE), path, opset_version=13,
                      input_names=["data"], output_names=["logits"],
                      dynamic_axes={"data": {0: "batch"}, "logits": {0: "batch"}})
    return path


def hybridnn_forward(hn, path, batch, chunks):
    import numpy as np
    rt = hn.Runtime()
    net = hn.Net(rt, rt.add("cpu"), path, batch=batch, phase="test", layout="blocked",
                 tune="cached")
    net.blob("data").data[...] = np.random.default_rng(0).standard_normal(
        (batch, 3, SIZE, SIZE)).astype(np.float32)
    return best_of_chunks(net.forward, chunks, per_chunk(batch))


def ort_forward(ort, path, batch, threads, chunks):
    import numpy as np
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((batch, 3, SIZE, SIZE)).astype(np.float32)
    return best_of_chunks(lambda: session.run(None, {"data": x}), chunks, per_chunk(batch))


def hybridnn_train_step(hn, path, chunks):
    """(best chunk's mean, mean) ms of forward + full backward at batch 32, as PyTorch's."""
    import numpy as np
    rt = hn.Runtime()
    net = hn.Net(rt, rt.add("cpu"), path, batch=32, phase="train", layout="blocked",
                 tune="cached", force_backward=True)
    net.blob("data").data[...] = np.random.default_rng(0).standard_normal(
        (32, 3, SIZE, SIZE)).astype(np.float32)

    def step():
        net.clear_param_diffs()
        net.forward()
        net.backward()

    return best_of_chunks(step, chunks, 2)


def peer_times(models, args):
    """{model: (best ms, mean ms, label)}: the faster of Debian's PyTorch and --torch's."""
    peers = pytorch_times(models, args.threads, args.chunks)
    if args.torch:
        run = subprocess.run([args.torch, os.path.abspath(__file__), "--pytorch-only",
                              "--models", ",".join(models), "--threads", str(args.threads),
                              "--chunks", str(args.chunks)], capture_output=True, text=True)
        for line in run.stdout.splitlines():
            r = json.loads(line)
            if r["ms"] < peers[r["model"]][0]:
                peers[r["model"]] = (r["ms"], r["mean_ms"], r["label"])
        if run.returncode != 0:
            note(f"{args.torch}: {run.stderr.strip()[-500:]}")
    return peers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--torch", help="another Python whose PyTorch is timed too")
    parser.add_argument("--pytorch-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    models = args.models.split(",")
    if args.pytorch_only:
        for name, (ms, mean, label) in pytorch_times(models, args.threads, args.chunks).items():
            print(json.dumps({"model": name, "ms": ms, "mean_ms": mean, "label": label}))
        return 0

    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get("HYBRIDNN_ONNX_BENCH_RERUN")):
        try:
            import torch  # noqa: F401
            import onnx  # noqa: F401
        except ImportError:
            os.environ["HYBRIDNN_ONNX_BENCH_RERUN"] = "1"
            os.execv(system, [system] + sys.argv)
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    try:
        import hybridnn as hn
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as missing:
        emit({"bench": "onnx", "skipped": f"{missing}"})
        return 0
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        note("onnxruntime is not installed (pip install onnxruntime): no forward comparison")
    cpu = cpu_name()
    common = {"bench": "onnx", "cpu": cpu, "threads": args.threads}

    with tempfile.TemporaryDirectory() as folder:
        for name in models:
            try:
                path = export(name, folder)
                probe = hn.Runtime()
                hn.Net(probe, probe.add("cpu"), path, batch=1, phase="test")
            except Exception as failure:  # noqa: BLE001 (the importer's refusal, reported)
                emit({**common, "model": name, "error": str(failure).splitlines()[0][:400]})
                continue
            for batch in (1, 32):
                ms, mean = hybridnn_forward(hn, path, batch, args.chunks)
                record = {**common, "model": name, "pass": "forward", "batch": batch,
                          "hybridnn_ms": round(ms, 2), "hybridnn_mean_ms": round(mean, 2)}
                if ort is not None:
                    ort_ms, ort_mean = ort_forward(ort, path, batch, args.threads, args.chunks)
                    record.update({"onnxruntime": ort.__version__,
                                   "onnxruntime_ms": round(ort_ms, 2),
                                   "onnxruntime_mean_ms": round(ort_mean, 2),
                                   "ratio": round(ms / ort_ms, 3)})
                emit(record)
            peer_ms, peer_mean, label = peer_times([name], args)[name]
            ms, mean = hybridnn_train_step(hn, path, args.chunks)
            emit({**common, "model": name, "pass": "forward_backward", "batch": 32,
                  "hybridnn_ms": round(ms, 2), "hybridnn_mean_ms": round(mean, 2),
                  "pytorch": label, "pytorch_ms": round(peer_ms, 2),
                  "pytorch_mean_ms": round(peer_mean, 2), "ratio": round(ms / peer_ms, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
