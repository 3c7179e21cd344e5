#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/, one per parser of outside input) for a time budget each,
# starting from the committed seeds (fuzz/corpus/<target>/) and a working corpus that grows
# across runs (build/fuzz/corpus/<target>/). Builds them in build/asan (clang, ASan + UBSan +
# libFuzzer's coverage outside fuzz/coverage-ignore.txt), the tree of scripts/sanitize.sh
# address: after that script, nothing is left to build.
#
#   scripts/fuzz.sh [--seconds N] [--runs R] [--jobs J] [TARGET...]
#
# --seconds: each target's budget (default 60; CI gives 10; run for hours by hand); --runs: stop a
# target after R executions instead (its time is then unbounded unless --seconds is given
# too); --jobs: targets run side by side (default 1). One line per target: executions, coverage, corpus size. A
# finding (crash, sanitizer report, leak, timeout over 10 s, more than 2 GiB resident) stops
# that target, keeps its input in build/fuzz/findings/<target>/ and fails the script: make it
# a regression test, fix it, and add the input to the seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=
runs=
jobs=1
targets=()
while (($#)); do
  case $1 in
    --seconds) seconds=${2:?--seconds needs a number}; shift ;;
    --runs) runs=${2:?--runs needs a number}; shift ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
if [[ -z $seconds && -z $runs ]]; then seconds=60; fi
budget=()
[[ -n $seconds ]] && budget+=(-max_total_time="$seconds")
[[ -n $runs ]] && budget+=(-runs="$runs")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(find fuzz/corpus -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
fi
scripts/setup.sh --sanitizers >/dev/null
# shellcheck source=scripts/sanitizers/configure.sh
source scripts/sanitizers/configure.sh
asan_configure
cmake --build build/asan -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

run_target() {
  local target=$1 work=build/fuzz
  local corpus=$work/corpus/$target findings=$work/findings/$target log=$work/logs/$target.log
  mkdir -p "$corpus" "$findings" "$work/logs"
  local status=0
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: the parsers must bound what
  # they allocate. The seeds are read, never written (new inputs go to the working corpus).
  TMPDIR=$PWD/$work build/asan/bin/fuzz_"$target" "${budget[@]}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/" \
    "$corpus" "fuzz/corpus/$target" >"$log" 2>&1 || status=$?
  local executed coverage elapsed
  executed=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  coverage=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo 0)
  if ((status == 72)) && grep -q 'libFuzzer: run interrupted' "$log"; then
    # SIGINT to the target (libFuzzer's interrupt exit code): stopped by hand, not a finding.
    echo "fuzz_$target: interrupted after $executed executions; no finding"
    return 0
  fi
  if ((status != 0)); then
    echo "fuzz_$target: FINDING after $executed executions (exit $status); input in $findings/, log $log:"
    grep -m1 -A12 -E '==ERROR|runtime error|ALARM|out-of-memory|deadly signal' "$log" | sed 's/^/  /'
    return 1
  fi
  elapsed=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' || echo "${seconds:-?}")
  echo "fuzz_$target: $executed executions in $elapsed s, coverage $coverage, corpus $(find "$corpus" -type f | wc -l) inputs; no finding"
}

failed=0
running=0
for target in "${targets[@]}"; do
  [[ -d fuzz/corpus/$target ]] || { echo "fuzz: no target '$target' (no fuzz/corpus/$target)" >&2; exit 2; }
  run_target "$target" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
if ((failed)); then
  echo "fuzz: findings above" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no finding"
