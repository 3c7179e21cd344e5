#!/usr/bin/env python3
"""PyTorch on a GPU, per op: bench/zoo.py's twins of CaffeNet, ResNet-50, MobileNet v1,
GoogLeNet and SqueezeNet v1.1, forward + full backward (weight and input gradients, Caffe's
force_backward) at batch 32, in FP32 with TF32 off (cuDNN's and cuBLAS's, as hybridnn's cuda
driver computes in FP32 math), with PyTorch's own defaults (TF32 convolutions) and in BF16
autocast with channels_last, for comparing hybridnn's `time --device cuda:0` lines in each
--math mode.

  bench/gpu_profile.py [--nets caffenet,resnet50,mobilenet] [--modes fp32,default]
                       [--batch 32] [--warmup 5] [--iterations 20] [--profile-iterations 3]
                       [--top 5] [--out DIR] [--models DIR] [--device cuda|cpu]

scripts/gpu-bundle.sh packs it with zoo.py and vs_pytorch.py (whose builders it imports)
and its run.sh runs it on the lent GPU machine. Per net and mode (fp32, default, bf16): warm-up,
then the timed iterations, each between two CUDA events (the median, min and mean ms go to
stdout as a `pytorch NET MODE` line), then a few iterations under torch.profiler
(ProfilerActivity.CPU and CUDA): the top kernels by CUDA time go to stdout, and to
DIR (--out, default .) pytorch-times.jsonl (a line per net and mode), pytorch-kernels.jsonl
(per net and mode, the kernels' total, then every kernel) and pytorch-ops.jsonl (every op
per input shapes: calls, CUDA time of its own kernels and with its children's, CPU time),
times in ms per iteration (--profile-iterations 0: no profile). A profiler failure leaves
the timings and the other modes.

Without PyTorch, or without CUDA (--device cuda), it prints `SKIPPED: PyTorch profile:
REASON` and exits 0. A net whose twin cannot be built (ResNet-50 needs torchvision) prints
`SKIPPED: PyTorch profile NET: REASON` and the others run. --device cpu runs the same path
on the CPU (wall clock instead of CUDA events, the CPU profiler alone): a quick check
of the script where there is no GPU (e.g. --batch 1 --iterations 1).
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402  (bench/zoo.py, and bench/vs_pytorch.py which it imports)

NETS = ("caffenet", "resnet50", "mobilenet", "googlenet", "squeezenet")
MODES = ("fp32", "default", "bf16")
# The prototxt inputs, where the models directory is not at hand.
SHAPES = {"caffenet": (3, 227, 227), "resnet50": (3, 224, 224), "mobilenet": (3, 224, 224),
          "googlenet": (3, 224, 224), "squeezenet": (3, 227, 227)}
NAME_WIDTH = 90


def emit(handle, record):
    handle.write(json.dumps(record) + "\n")
    handle.flush()


def skipped(reason):
    print(f"SKIPPED: PyTorch profile: {reason}", flush=True)
    return 0


def microseconds(event, *names):
    """The first of `names` that the profiler's event has (PyTorch renamed cuda_* to
    device_* in 2.x and warns on the old names), in us; 0 when none."""
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = getattr(event, name)
        except (AttributeError, AssertionError, RuntimeError):
            continue
        return float(value or 0)
    return 0.0


def device_self_us(event):
    return microseconds(event, "self_device_time_total", "self_cuda_time_total")


def device_total_us(event):
    return microseconds(event, "device_time_total", "cuda_time_total")


def tf32_flags(torch):
    """The TF32 switches as they stand: the legacy allow_tf32 flags and, from PyTorch 2.9,
    the fp32_precision settings that replace them (what is not there is left out)."""
    getters = {"cudnn_allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
               "matmul_allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
               "cudnn_benchmark": lambda: torch.backends.cudnn.benchmark,
               "cudnn_conv_fp32_precision": lambda: torch.backends.cudnn.conv.fp32_precision,
               "matmul_fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision}
    flags = {}
    for name, get in getters.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = get()
        except Exception:  # noqa: BLE001 (an older or newer PyTorch without it)
            continue
        flags[name] = value if isinstance(value, str) else bool(value)
    return flags


def set_mode(torch, mode, defaults):
    """fp32: TF32 off for cuDNN and cuBLAS; default and bf16: the flags as PyTorch started.
    Through the allow_tf32 flags, or fp32_precision where a PyTorch refuses those."""
    tf32 = mode != "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2.9's notice that allow_tf32 is to be deprecated
        try:
            torch.backends.cudnn.allow_tf32 = tf32 and defaults.get("cudnn_allow_tf32", True)
            torch.backends.cuda.matmul.allow_tf32 = tf32 and defaults.get("matmul_allow_tf32",
                                                                          False)
        except Exception:  # noqa: BLE001
            torch.backends.cudnn.conv.fp32_precision = (
                defaults.get("cudnn_conv_fp32_precision", "tf32") if tf32 else "ieee")
            torch.backends.cuda.matmul.fp32_precision = (
                defaults.get("matmul_fp32_precision", "ieee") if tf32 else "ieee")


def input_shape(spec, models, batch):
    path = os.path.join(models, spec.prototxt) if models else ""
    if path and os.path.exists(path):
        with open(path) as f:
            dims = [int(d) for _, d in zoo.INPUT_DIM.findall(f.read())[1:4]]
        if len(dims) == 3:
            return [batch] + dims
    return [batch] + list(SHAPES[spec.key])


class Clock:
    """CUDA events on a GPU, the wall clock on the CPU; ms per step."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda = torch, cuda

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, step, iterations):
        """(per-step ms list, mean ms over the whole run)."""
        torch = self.torch
        self.sync()
        if not self.cuda:
            each, begin = [], time.perf_counter()
            for _ in range(iterations):
                start = time.perf_counter()
                step()
                each.append((time.perf_counter() - start) * 1e3)
            return each, (time.perf_counter() - begin) * 1e3 / iterations
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iterations)]
        whole = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        whole[0].record()
        for start, end in events:
            start.record()
            step()
            end.record()
        whole[1].record()
        torch.cuda.synchronize()
        return ([start.elapsed_time(end) for start, end in events],
                whole[0].elapsed_time(whole[1]) / iterations)


def profile(torch, clock, step, iterations, cuda):
    """torch.profiler over `iterations` steps: (kernel averages, op averages by shape)."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    clock.sync()
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(iterations):
            step()
        clock.sync()
    kernels = [e for e in prof.key_averages()
               if str(getattr(e, "device_type", "")).endswith("CUDA")]
    ops = [e for e in prof.key_averages(group_by_input_shape=True)
           if not str(getattr(e, "device_type", "CPU")).endswith("CUDA")]
    return kernels, ops


def profile_tables(torch, clock, step, spec, mode, args, files):
    """Profiles a few steps; prints the top kernels, writes the kernel and op tables."""
    cuda = args.device == "cuda"
    kernels, ops = profile(torch, clock, step, args.profile_iterations, cuda)
    per = 1e3 * args.profile_iterations  # us over the profile -> ms per iteration
    kernels.sort(key=device_self_us, reverse=True)
    kernel_ms = sum(device_self_us(k) for k in kernels) / per
    emit(files["kernels"], {"net": spec.key, "mode": mode, "profile_iterations":
                            args.profile_iterations, "kernels": len(kernels),
                            "kernel_ms": round(kernel_ms, 4)})
    if cuda:
        print(f"  top kernels by CUDA time ({kernel_ms:.2f} ms of kernels per iteration, "
              f"{len(kernels)} kinds):", flush=True)
    for rank, k in enumerate(kernels):
        ms = device_self_us(k) / per
        emit(files["kernels"], {"net": spec.key, "mode": mode, "rank": rank + 1,
                                "kernel": k.key, "calls": k.count / args.profile_iterations,
                                "cuda_ms": round(ms, 4)})
        if rank < args.top:
            share = ms / kernel_ms if kernel_ms else 0.0
            print(f"  {ms:8.3f} ms {share:6.1%} x{k.count // args.profile_iterations:<4} "
                  f"{k.key[:NAME_WIDTH]}", flush=True)
    ops.sort(key=lambda e: (device_self_us(e), microseconds(e, "self_cpu_time_total")),
             reverse=True)
    for e in ops:
        emit(files["ops"], {
            "net": spec.key, "mode": mode, "op": e.key,
            "input_shapes": str(getattr(e, "input_shapes", "") or ""),
            "calls": e.count / args.profile_iterations,
            "self_cuda_ms": round(device_self_us(e) / per, 4),
            "cuda_ms": round(device_total_us(e) / per, 4),
            "self_cpu_ms": round(microseconds(e, "self_cpu_time_total") / per, 4),
            "cpu_ms": round(microseconds(e, "cpu_time_total") / per, 4)})


def run_net(torch, spec, shape, args, defaults, files):
    cuda = args.device == "cuda"
    device = torch.device(args.device)
    clock = Clock(torch, cuda)
    torch.manual_seed(1)
    net = zoo.caffe_phase(torch, spec.twin(torch)).to(device)
    data = torch.randn(*shape, device=device, requires_grad=True)

    autocast = [False]

    def step():
        if autocast[0]:
            with torch.autocast(device_type=args.device, dtype=torch.bfloat16):
                loss = net(data).float().sum()
        else:
            loss = net(data).sum()
        net.zero_grad(set_to_none=True)
        data.grad = None
        loss.backward()  # weights and the input's gradient (Caffe's force_backward)

    for mode in args.modes:
        set_mode(torch, mode, defaults)
        if mode == "bf16":  # mixed precision as PyTorch recommends it: autocast, NHWC
            autocast[0] = True
            net = net.to(memory_format=torch.channels_last)
            data = data.detach().to(memory_format=torch.channels_last).requires_grad_()
        for _ in range(args.warmup):
            step()
        each, mean = clock.time(step, args.iterations)
        record = {"net": spec.key, "mode": mode, "batch": shape[0], "device": args.device,
                  "iterations": args.iterations, "median_ms": round(statistics.median(each), 3),
                  "min_ms": round(min(each), 3), "mean_ms": round(mean, 3), **tf32_flags(torch)}
        emit(files["times"], record)
        print(f"pytorch {spec.key:9} {mode:7} fb_ms={record['median_ms']:.2f} (median of "
              f"{args.iterations}; min {record['min_ms']:.2f}, mean {record['mean_ms']:.2f}; "
              f"cudnn tf32 {record.get('cudnn_allow_tf32')}, matmul tf32 "
              f"{record.get('matmul_allow_tf32')})", flush=True)
        if args.profile_iterations == 0:
            continue
        try:
            profile_tables(torch, clock, step, spec, mode, args, files)
        except Exception as error:  # noqa: BLE001 (the timings stand; the other mode runs)
            print(f"FAILED: PyTorch profile {spec.key} {mode}: torch.profiler: "
                  f"{type(error).__name__}: {error}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default=",".join(NETS), help="comma-separated (%(default)s)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="fp32 (TF32 off) and/or default (PyTorch's flags) (%(default)s)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per mode (5)")
    parser.add_argument("--iterations", type=int, default=20, help="timed steps per mode (20)")
    parser.add_argument("--profile-iterations", type=int, default=3,
                        help="steps under torch.profiler per mode (3)")
    parser.add_argument("--top", type=int, default=5, help="kernels printed per net and mode")
    parser.add_argument("--out", default=".", help="directory of the JSON lines files (.)")
    parser.add_argument("--models", default=zoo.MODELS,
                        help="the prototxt files, for the input shapes (%(default)s)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    known = {spec.key: spec for spec in zoo.NETS}
    names = [n for n in args.nets.split(",") if n]
    args.modes = [m for m in args.modes.split(",") if m]
    if not names or any(n not in NETS for n in names):
        parser.error(f"--nets takes a comma-separated list of {', '.join(NETS)}")
    if not args.modes or any(m not in MODES for m in args.modes):
        parser.error(f"--modes takes a comma-separated list of {', '.join(MODES)}")
    args.modes.sort(key=MODES.index)  # bf16 last: it turns the net to channels_last
    if min(args.batch, args.iterations) < 1 or min(args.warmup, args.profile_iterations) < 0:
        parser.error("--batch and --iterations must be positive, --warmup and "
                     "--profile-iterations not negative")

    try:
        import torch
        import torch.profiler  # noqa: F401
    except Exception as error:  # noqa: BLE001 (ImportError, or a library torch cannot load)
        return skipped(f"no PyTorch for {sys.executable} ({error})")
    if args.device == "cuda" and not torch.cuda.is_available():
        return skipped(f"torch {torch.__version__} sees no CUDA device "
                       f"(built for CUDA {torch.version.cuda})")
    defaults = tf32_flags(torch)
    os.makedirs(args.out, exist_ok=True)
    files = {name: open(os.path.join(args.out, f"pytorch-{name}.jsonl"), "w")
             for name in ("times", "kernels", "ops")}
    setup = {"setup": True, "torch": torch.__version__, "cuda": torch.version.cuda,
             "device": args.device, "defaults": defaults,
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if args.device == "cuda":
        setup["gpu"] = torch.cuda.get_device_name(0)
        setup["cudnn"] = torch.backends.cudnn.version()
    emit(files["times"], setup)
    print(f"pytorch setup: {json.dumps(setup)}", flush=True)
    failed = False
    for key in names:
        spec = known[key]
        try:
            run_net(torch, spec, input_shape(spec, args.models, args.batch), args, defaults,
                    files)
        except ImportError as error:  # torchvision, for ResNet-50
            print(f"SKIPPED: PyTorch profile {key}: {error}", flush=True)
            emit(files["times"], {"net": key, "skipped": str(error)})
        except Exception as error:  # noqa: BLE001 (one net's failure must not stop the rest)
            failed = True
            print(f"FAILED: PyTorch profile {key}: {type(error).__name__}: {error}", flush=True)
            emit(files["times"], {"net": key, "failed": f"{type(error).__name__}: {error}"})
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the net's memory, before the next one
    for handle in files.values():
        handle.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
