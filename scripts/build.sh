#!/usr/bin/env bash
# Configures and builds hybridnn in ./build (Release, warnings as errors). Extra arguments
# go to CMake, e.g. scripts/build.sh -DHYBRIDNN_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRIDNN_WERROR=ON "$@"
cmake --build build -j "$(nproc)"
