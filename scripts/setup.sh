#!/usr/bin/env bash
# Installs, with apt-get, whatever hybridnn needs to build, test and run on Debian 12 and is
# missing. Idempotent: does nothing when everything is present. The CUDA toolkit is not a
# Debian package here: when /usr/local/cuda exists the CUDA driver is built too.
set -euo pipefail

# ocl-icd-opencl-dev: Debian's oneDNN is built with its OpenCL GPU runtime, so its CMake
# package (dnnl-config.cmake) calls find_package(OpenCL REQUIRED) and stops the configure
# without OpenCL's headers and loader, even though hybridnn uses only oneDNN's CPU engine.
# Installing the package keeps oneDNN's own CMake targets (its include paths, link flags
# and version checks) instead of a hand-made find of libdnnl; CMakeLists.txt names this
# package when it is missing.
# openmpi-bin, libopenmpi-dev: the multi-process collectives (ring and MPI_Allreduce) and
# mpirun, which launches the ranks; without them only the single-process communicator is
# built.
# python3-dev, pybind11-dev, python3-numpy: the Python bindings (bindings/python), built
# with the library; python3-pytest runs their tests; python3-venv lets `pip install
# ./bindings/python` go into a virtual environment; python3-matplotlib draws the training
# curves (python3 -m hybridnn.plot).
# python3-torch: the standing differential test of every layer against PyTorch
# (bindings/python/tests/test_differential_pytorch.py) and the PyTorch layer example; it is
# Debian's PyTorch 1.13 (about 180 MB installed), CPU only.
# libonnx-dev: reading ONNX models (lib/onnx; its protobuf classes, checker and shape
# inference, built against the same protobuf as ours); python3-onnx and python3-torchvision:
# the ONNX tests export torchvision's models and build one-node models
# (bindings/python/tests/test_onnx.py).
packages=(
  build-essential cmake ninja-build pkg-config git python3
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libeigen3-dev libtbb-dev libfmt-dev catch2
  libprotobuf-dev protobuf-compiler liblmdb-dev zlib1g-dev
  clang-format
  dataset-fashion-mnist
  openmpi-bin libopenmpi-dev
  python3-dev pybind11-dev python3-numpy python3-pytest python3-venv python3-matplotlib
  python3-torch
  libonnx-dev python3-onnx python3-torchvision
)

# clang and its runtimes build the sanitizer and fuzzing trees (libclang-rt-14-dev: the
# sanitizers and libFuzzer; libomp-14-dev: clang's OpenMP, and libarcher, which tells
# ThreadSanitizer about OpenMP's synchronisation): scripts/sanitize.sh and scripts/fuzz.sh
# ask for them with --sanitizers; the README's commands do not need them.
if [[ ${1:-} == --sanitizers ]]; then
  packages+=(clang libclang-rt-14-dev libomp-14-dev)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
