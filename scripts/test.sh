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
# The three downstream examples against the installed tree only: through the CMake package
# (embed: C++17 on hybridnn.hpp; embed_c: C99 on the C ABI; embed_hpp: C++20 on
# hybridnn.hpp) and through pkg-config.
prefix="$PWD/build/install-test"
rm -rf "$prefix" build/embed-test
cmake --install build --prefix "$prefix" >/dev/null
for example in embed embed_c embed_hpp; do
  cmake -S "examples/$example" -B "build/embed-test/$example" -G Ninja \
    -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "build/embed-test/$example" >/dev/null
  "build/embed-test/$example/$example"
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pkg-config --exists hybridnn
# shellcheck disable=SC2046 # pkg-config's flags are meant to split into words
c++ -std=c++17 examples/embed/main.cpp -o build/embed-test/embed-pkgconfig \
  $(pkg-config --cflags --libs hybridnn) -Wl,-rpath,"$prefix/lib"
build/embed-test/embed-pkgconfig
# shellcheck disable=SC2046
cc -std=c99 examples/embed_c/main.c -o build/embed-test/embed_c-pkgconfig \
  $(pkg-config --cflags --libs hybridnn) -lm -Wl,-rpath,"$prefix/lib"
build/embed-test/embed_c-pkgconfig

echo "== pip install ./bindings/python (in a virtual environment)"
# The bindings as a user installs them: pip builds the extension with scikit-build-core
# against the hybridnn installed above (CMAKE_PREFIX_PATH; without one pip would build the
# library too), then the pytest suite runs on the installed package. pip fetches its build
# tools from the package index: without one this step is skipped, visibly.
venv=build/venv-test
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
if "$venv/bin/python" -m pip download --quiet --no-deps --dest build/pip-probe \
    scikit-build-core >/dev/null 2>&1; then
  CMAKE_PREFIX_PATH="$prefix" "$venv/bin/python" -m pip install --quiet ./bindings/python
  (cd build && OMP_NUM_THREADS=1 "../$venv/bin/python" -m pytest -q -p no:cacheprovider \
    ../bindings/python/tests)
else
  echo "SKIPPED: pip install ./bindings/python: no Python package index reachable"
fi

echo "test.sh: all checks passed"
