#!/usr/bin/env bash
# Fine-tunes torchvision's ResNet-18, exported to ONNX, with hybridnn on CIFAR-10-sized
# generated data: exports the model, then `hybridnn train` on train.prototxt, whose ONNX
# layer expands into the model's layers (docs/onnx.md). Extra arguments go to `hybridnn
# train` (e.g. --split cpu:0.5,cpu:1:0.5, --max-iter 200, --data cifar10/data_batch_1.bin).
# Run from the repository root after scripts/build.sh: examples/onnx_finetune/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tool=${HYBRIDNN_TOOL:-$PWD/build/bin/hybridnn}
work=${HYBRIDNN_WORK:-$PWD/build/onnx_finetune}
mkdir -p "$work"
cp "$here/train.prototxt" "$here/solver.prototxt" "$work/"
if ! /usr/bin/python3 -c "import torch, torchvision" 2>/dev/null; then
  echo "SKIPPED: exporting ResNet-18 needs python3-torch and python3-torchvision" >&2
  exit 77
fi
/usr/bin/python3 "$here/export_resnet18.py" "$work/resnet18.onnx"
cd "$work"
"$tool" train --solver solver.prototxt "$@"
