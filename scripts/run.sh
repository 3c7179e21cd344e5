#!/usr/bin/env bash
# The README's main job. Until the trainer lands (Fashion-MNIST training), it builds
# hybridnn and runs the GEMM benchmark of the CPU driver against the machine's best sgemm.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
build/bin/hybridnn-bench gemm
