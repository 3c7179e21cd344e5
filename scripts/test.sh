#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything (the CUDA driver
# too when nvcc is present), runs the whole test suite, then checks that an installed
# hybridnn is usable from a downstream CMake project and through pkg-config.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"

echo "== unit tests"
ctest --test-dir build --output-on-failure -j "$(nproc)"

echo "== install and embed"
prefix="$PWD/build/install-test"
rm -rf "$prefix" build/embed-test
cmake --install build --prefix "$prefix" >/dev/null
cmake -S examples/embed -B build/embed-test -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/embed-test >/dev/null
build/embed-test/embed
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists hybridnn
# shellcheck disable=SC2046 # pkg-config's flags are meant to split into words
c++ examples/embed/main.cpp -o build/embed-test/embed-pkgconfig \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs hybridnn) \
  -Wl,-rpath,"$prefix/lib"
build/embed-test/embed-pkgconfig
# The layer-as-kernel example, against the installed headers and library only.
# shellcheck disable=SC2046
c++ -std=c++17 examples/layer_as_kernel.cpp -o build/embed-test/layer_as_kernel \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs hybridnn) \
  -Wl,-rpath,"$prefix/lib"
build/embed-test/layer_as_kernel
echo "test.sh: all checks passed"
