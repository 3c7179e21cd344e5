#!/usr/bin/env python3
"""The GPU bundle's table: hybridnn against PyTorch on one GPU, from one call's logs.

  bench/gpu_table.py OUT_DIR

Reads the `hybridnn time --json` logs that .gpu/run.sh (scripts/gpu-bundle.sh) leaves in
OUT_DIR (their "total" lines: model, device, math, batch, forward_backward_ms) and the
PyTorch twins' OUT_DIR/pytorch-bN/pytorch-times.jsonl (bench/gpu_profile.py), and prints
markdown: per net and batch, hybridnn on cuda:0 in each math mode beside PyTorch's matching
mode (FP32 with TF32 off; TF32 against PyTorch's defaults, TF32 convolutions; BF16 against
BF16 autocast with channels_last) and the ratio hybridnn / PyTorch (below 1: hybridnn is
faster); then, where the call ran them, FP32 with cuDNN's algorithms measured
(HYBRIDNN_CUDNN_ALGO=find), with non-deterministic ones allowed
(HYBRIDNN_CUDNN_DETERMINISTIC=0), both, with FFT and Winograd too
(HYBRIDNN_CUDNN_TRANSFORMS=1, deterministic or not), and with the baseline build; and whole
iterations as one CUDA graph against call by call (--graphs on, off). Times are ms per iteration,
forward and full backward.
"""

import glob
import json
import os
import sys

# Prototxt file names (less _deploy.prototxt) -> bench/zoo.py's keys.
KEYS = {"bvlc_reference_caffenet": "caffenet", "resnet50": "resnet50",
        "mobilenet_v1": "mobilenet", "bvlc_googlenet": "googlenet",
        "squeezenet_v1.1": "squeezenet"}
ORDER = ["caffenet", "googlenet", "resnet50", "mobilenet", "squeezenet"]
# hybridnn's math mode -> the PyTorch mode it is compared with.
PEERS = {"FP32": "fp32", "TF32": "default", "BF16": "bf16"}
# "findnondet" before "find", whose name it starts with.
LABELS = ("baseline", "beside", "findnondet", "find", "nondet", "transforms", "fastest",
          "graphson", "graphsoff", "cudnnlog")


def totals(out):
    """{(label, key, batch, math): ms} of the unsplit cuda runs' total lines."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
        name = os.path.basename(path)
        label = next((lab for lab in LABELS if name.startswith(lab)), "")
        with open(path, errors="replace") as f:
            for line in f:
                if not line.startswith('{"total"'):
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "split_spec" in r or not str(r.get("device", "")).startswith("cuda"):
                    continue
                model = os.path.basename(r.get("model", "")).replace("_deploy.prototxt", "")
                if model in KEYS:
                    found[(label, KEYS[model], r.get("batch"), r.get("math", "FP32"))] = \
                        r["forward_backward_ms"]
    return found


def pytorch_times(out):
    """{(key, batch, mode): median ms}."""
    found = {}
    for path in glob.glob(os.path.join(out, "pytorch-b*", "pytorch-times.jsonl")):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if "median_ms" in r:
                    found[(r["net"], r["batch"], r["mode"])] = r["median_ms"]
    return found


def cell(ms):
    return f"{ms:.2f}" if ms is not None else "—"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "—"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    ours, theirs = totals(out), pytorch_times(out)
    gpu = ""
    summary = os.path.join(out, "summary.txt")
    if os.path.exists(summary):
        with open(summary) as f:
            gpu = next((line.strip() for line in f if line.startswith("gpu:")), "")
    print(f"hybridnn against PyTorch, ms per iteration (forward + full backward); {gpu}\n")
    print("| net | batch | FP32 | PyTorch FP32 | ratio | TF32 | PyTorch default | ratio "
          "| BF16 | PyTorch BF16 autocast | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = sorted({(k, b) for (label, k, b, _) in ours if not label} |
                  {(k, b) for (k, b, _) in theirs},
                  key=lambda kb: (kb[1], ORDER.index(kb[0]) if kb[0] in ORDER else 99))
    for key, batch in rows:
        cells = [key, str(batch)]
        for math, mode in PEERS.items():
            a, b = ours.get(("", key, batch, math)), theirs.get((key, batch, mode))
            cells += [cell(a), cell(b), ratio(a, b)]
        print("| " + " | ".join(cells) + " |")
    graphed = sorted({(k, b) for (label, k, b, _) in ours if label.startswith("graphs")},
                     key=lambda kb: (ORDER.index(kb[0]) if kb[0] in ORDER else 99, kb[1]))
    if graphed:
        print("\nFP32 on cuda:0, whole iterations as one CUDA graph (--graphs on, the default) "
              "and call by call (--graphs off), back to back\n")
        print("| net | batch | graphs on | graphs off | on / off |")
        print("|---|---|---|---|---|")
        for key, batch in graphed:
            on, off = ours.get(("graphson", key, batch, "FP32")), ours.get(
                ("graphsoff", key, batch, "FP32"))
            print(f"| {key} | {batch} | {cell(on)} | {cell(off)} | {ratio(on, off)} |")
    extra = sorted({(k, b) for (label, k, b, _) in ours
                    if label and not label.startswith("graphs") and label != "cudnnlog"})
    if extra:
        print("\nFP32 on cuda:0: this build; cuDNN's algorithms measured "
              "(HYBRIDNN_CUDNN_ALGO=find); non-deterministic ones allowed "
              "(HYBRIDNN_CUDNN_DETERMINISTIC=0); both; measured with FFT and Winograd "
              "(HYBRIDNN_CUDNN_TRANSFORMS=1); that and non-deterministic; the baseline build; "
              "PyTorch FP32\n")
        print("| net | batch | this build | measured | non-deterministic | both | transforms "
              "| transforms, non-deterministic | baseline | PyTorch FP32 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for key, batch in extra:
            print(f"| {key} | {batch} | {cell(ours.get(('', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('find', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('nondet', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('findnondet', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('transforms', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('fastest', key, batch, 'FP32')))} | "
                  f"{cell(ours.get(('baseline', key, batch, 'FP32')))} | "
                  f"{cell(theirs.get((key, batch, 'fp32')))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
