# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: configures an instrumented tree with
# clang (no CUDA, no Python, no benchmarks; -O1 with line tables for readable reports).
#   sanitizer_configure DIR SANITIZERS [CMAKE ARGS...]
sanitizer_configure() {
  local dir=$1 sanitizers=$2
  shift 2
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DHYBRIDNN_SANITIZE="$sanitizers" -DHYBRIDNN_CUDA=OFF -DHYBRIDNN_PYTHON=OFF \
    -DHYBRIDNN_BENCH=OFF -DHYBRIDNN_INSTALL=OFF -DHYBRIDNN_WERROR=ON "$@" >/dev/null
}

# build/asan: ASan + UBSan, the test suite and the libFuzzer targets in one tree (one
# instrumented build of the library instead of two, about 6 minutes of CI). The coverage
# callbacks libFuzzer needs are left out of the code that is no parser's
# (fuzz/coverage-ignore.txt): the tests run at the speed of a tree without them.
asan_configure() {
  sanitizer_configure build/asan address,undefined -DHYBRIDNN_FUZZ=ON
}
