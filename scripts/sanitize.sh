#!/usr/bin/env bash
# The test suite under sanitizers, built with clang in its own tree:
#
#   scripts/sanitize.sh address   AddressSanitizer + UndefinedBehaviorSanitizer: every CPU
#                                 test (ctest; no CUDA, no Python), in build/asan (where
#                                 scripts/fuzz.sh's targets are built too)
#   scripts/sanitize.sh thread    ThreadSanitizer: the tests of the concurrent parts (the split
#                                 scheduler and its device threads, the communicators, the
#                                 data feed's prefetch thread), in build/tsan
#
# Extra arguments go to ctest (address) or to the test binary (thread). Any report fails the
# run (-fno-sanitize-recover=all, halt_on_error). Suppressions, for third-party code only and
# each with its reason, are in scripts/sanitizers/.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case $mode in
  address | thread) shift ;;
  -h | --help | "") sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; [[ -n $mode ]]; exit ;;
  *) echo "sanitize: unknown mode '$mode': use address or thread" >&2; exit 2 ;;
esac
scripts/setup.sh --sanitizers
repo=$PWD
suppressions=$repo/scripts/sanitizers

# shellcheck source=scripts/sanitizers/configure.sh
source scripts/sanitizers/configure.sh

if [[ $mode == address ]]; then
  asan_configure
  cmake --build build/asan -j "$(nproc)"
  export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
  export LSAN_OPTIONS=suppressions=$suppressions/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # ResNet-50's, GoogLeNet's and CaffeNet's whole-net comparisons with the reference driver
  # (167, 59 and 72 s under ASan, most of it the reference's loops) run in the plain suite
  # only; MobileNet v1 keeps the zoo's depthwise and BatchNorm + Scale + ReLU layers under
  # ASan, CaffeNet's fc6-fc8 run in the output-cut tests, and the layer and fusion tests
  # (LRN, pooling) the rest.
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer: the CPU test suite"
  ctest --test-dir build/asan --output-on-failure -j "$(nproc)" \
    -E 'mpi|^(ResNet-50|GoogLeNet|CaffeNet) from Caffe' "$@"
  # The tests under mpirun: Open MPI's libraries have no frame pointers, so a leak's stack
  # reaches their names (for lsan.supp) only with the slow unwinder, and only when their
  # plugins stay loaded.
  # The training under mpirun with 2 ranks only: 4 run the same code (74 s under ASan, each
  # MPI test alone on the machine); the collectives keep 2, 3 and 4.
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer: the MPI tests"
  ASAN_OPTIONS=$ASAN_OPTIONS:fast_unwind_on_malloc=0 OMPI_MCA_mca_base_component_disable_dlclose=1 \
    ctest --test-dir build/asan --output-on-failure -j "$(nproc)" -R 'mpi' \
    -E 'train\.mpi\.ranks_4' "$@"
else
  # (No MPI and no ONNX reader: no concurrency of ours in either, and 30 s less to compile.)
  sanitizer_configure build/tsan thread -DHYBRIDNN_MPI=OFF -DHYBRIDNN_ONNX=OFF -DHYBRIDNN_FUZZ=OFF
  # The test files holding these cases only (tests/CMakeLists.txt): the whole suite took
  # 5 minutes of CI to compile under TSan.
  cmake --build build/tsan -j "$(nproc)" --target hybridnn-tests-concurrency
  # The third-party libraries are not instrumented: TSan ignores their own memory accesses
  # (ignore_noninstrumented_modules), and libarcher (LLVM's OpenMP tool) reports the OpenMP
  # runtime's barriers and tasks to TSan, without which every parallel loop of the CPU
  # driver would read as a race. Our code's accesses are all checked.
  archer=$(dirname "$(clang -print-resource-dir)")/../libarcher.so
  [[ -f $archer ]] || archer=/usr/lib/llvm-14/lib/libarcher.so
  export OMP_TOOL_LIBRARIES=$archer
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$suppressions/tsan.supp"
  echo "== ThreadSanitizer: the split scheduler, the communicators, the data feed"
  bin=build/tsan/bin/hybridnn-tests-concurrency
  if (($#)); then
    "$bin" "$@"
  else
    # One process per case, as many at a time as there are cores, as ctest would run them:
    # a single process left a core idle for minutes, and cases dealt out in turn in advance
    # left one process 28 s and the other 160. Each name is escaped for Catch's test spec
    # (commas, brackets). (Catch's exit status after a listing is the number listed.)
    # (Idle OpenMP threads asleep, as ctest's tests have them: HYBRIDNN_TEST_ENVIRONMENT.)
    export OMP_WAIT_POLICY=passive
    dir=build/tsan/cases
    rm -rf "$dir" && mkdir -p "$dir"
    names=$("$bin" --list-test-names-only '[split],[comm],[feed],[runtime]' | sed '/^$/d') || true
    [[ -n $names ]] || { echo "sanitize: no test cases listed by $bin" >&2; exit 1; }
    mapfile -t specs < <(sed -e 's/[][\\,"*~]/\\&/g' <<<"$names")
    failed=()
    running=0
    for i in "${!specs[@]}"; do
      if ((running >= $(nproc))); then
        wait -n || true
        running=$((running - 1))
      fi
      "$bin" "${specs[i]}" >"$dir/$i.log" 2>&1 &
      running=$((running + 1))
    done
    wait || true
    ran=0
    for i in "${!specs[@]}"; do
      if grep -q '^All tests passed (.* in 1 test case)' "$dir/$i.log"; then
        ran=$((ran + 1))
      else
        failed+=("$i")
      fi
    done
    for i in "${failed[@]}"; do
      echo "== ${specs[i]}"
      cat "$dir/$i.log"
    done
    ((${#failed[@]} == 0)) || exit 1
    echo "ThreadSanitizer: $ran of ${#specs[@]} cases passed, each in its own process"
  fi
fi
echo "sanitize $mode: no reports"
