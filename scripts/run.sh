#!/usr/bin/env bash
# The README's main job: builds hybridnn, then trains Caffe's LeNet on Fashion-MNIST with
# Caffe's lenet_solver hyper-parameters (examples/fashion_mnist), from the repository root.
# Progress and test accuracy are printed as training goes; JSON-lines metrics and the
# snapshots go to examples/fashion_mnist/output/. Extra arguments go to CMake, as for
# scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
build/bin/hybridnn train --solver examples/fashion_mnist/lenet_solver.prototxt \
  --metrics examples/fashion_mnist/output/metrics.jsonl
