#!/usr/bin/env bash
# Follows the README's quick start on a bare Debian 12, as a new user would: builds a
# minimal bookworm root with mmdebstrap (apt variant, this machine's apt sources), clones
# the committed HEAD into it with ../shared beside it, and runs the README's two commands
# there with chroot: scripts/test.sh (the whole suite) and scripts/run.sh (the main job).
# The root has no CUDA toolkit, so this is the CPU-only path a user without one gets.
#
#   scripts/check-fresh.sh [--keep] [--only test|run] [--min-accuracy A] [--cuda DIR]
#
# --keep leaves the root (its path is printed) for a look after a failure; --only runs one
# of the two commands; --min-accuracy (default 0.85) is the least final test accuracy the
# main job must reach; --cuda DIR, after the two commands, mounts the CUDA toolkit DIR
# (read-only, at its own path and as /usr/local/cuda) into the root and builds the CUDA
# driver and its tests in the tree they built (only the CUDA files compile:
# lib/drivers/cuda/CMakeLists.txt), then runs the tests (each reported skipped without a
# GPU) -- CI's compile check of the CUDA code, without a second build of the rest. Each
# command's whole output goes to a log in build/check-fresh/; a failing command's last
# lines are printed and the script exits non-zero. Needs root
# (mmdebstrap, mounts, chroot); installs mmdebstrap when it is missing. Only committed work
# is checked: uncommitted changes are not part of the clone.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

keep=0
only=""
min_accuracy=0.85
cuda=""
while (($#)); do
  case $1 in
    --keep) keep=1 ;;
    --only) only=${2:?--only needs test or run}; shift ;;
    --min-accuracy) min_accuracy=${2:?--min-accuracy needs a value}; shift ;;
    --cuda) cuda=${2:?--cuda needs the CUDA toolkit directory}; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-fresh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $only in "" | test | run) ;; *) echo "check-fresh: --only takes test or run, not '$only'" >&2; exit 2 ;; esac
if [[ -n $cuda && ! -x $cuda/bin/nvcc ]]; then
  echo "check-fresh: --cuda $cuda: no bin/nvcc there" >&2
  exit 2
fi

fail() { echo "check-fresh: error: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "needs root (mmdebstrap --mode=root, bind mounts and chroot); run it with sudo"
shared=$(cd "$repo/.." && pwd)/shared
[[ -d $shared ]] || fail "no $shared: the models and tools the tests read lie beside the repository"
head=$(git -C "$repo" rev-parse HEAD)
if [[ -n $(git -C "$repo" status --porcelain --untracked-files=no) ]]; then
  echo "check-fresh: note: uncommitted changes are not checked; the clone is HEAD ${head:0:12}"
fi

if ! command -v mmdebstrap >/dev/null; then
  echo "check-fresh: installing mmdebstrap"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

logs=$repo/build/check-fresh
mkdir -p "$logs"
rm -f "$logs"/*.log
work=$(mktemp -d "${TMPDIR:-/tmp}/hybridnn-fresh.XXXXXX")
root=$work/root
mounted=()

cleanup() {
  local status=$?
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" 2>/dev/null ||
      echo "check-fresh: warning: could not unmount ${mounted[i]}" >&2
  done
  if ((keep)); then
    echo "check-fresh: the root is kept at $root"
  elif ! findmnt -rn -o TARGET | grep -q "^$work/"; then
    rm -rf --one-file-system "$work"
  else
    echo "check-fresh: warning: $work still has mounts; not removed" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The host's apt sources, as one-line or deb822 files (a .list or .sources name; files that
# apt itself would ignore, such as *.disabled, are left out).
sources=()
[[ -s /etc/apt/sources.list ]] && sources+=(/etc/apt/sources.list)
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -s $f ]] && sources+=("$f")
done
((${#sources[@]})) || fail "no apt sources in /etc/apt/sources.list or /etc/apt/sources.list.d"
# How this machine reaches them (a proxy, a mirror whose Release files are past their
# Valid-Until), which a new machine on the same network would be given too.
acquire=$work/acquire.conf
apt-config dump | grep -E '^Acquire::(https?::Proxy|Check-Valid-Until|Check-Date) ' >"$acquire" || true

step() { # NAME COMMAND...: runs the command with its output in NAME.log; on failure, its tail
  local name=$1
  shift
  local start=$SECONDS
  echo "check-fresh: $name ..."
  if "$@" >"$logs/$name.log" 2>&1; then
    echo "check-fresh: $name passed in $((SECONDS - start)) s"
  else
    local status=$?
    echo "check-fresh: $name FAILED (exit $status after $((SECONDS - start)) s); last lines of $logs/$name.log:"
    tail -n 60 "$logs/$name.log" | sed 's/^/  | /'
    fail "$name failed on a fresh Debian 12 root (commit ${head:0:12})"
  fi
}

step bootstrap mmdebstrap --variant=apt --mode=root --aptopt="$acquire" bookworm "$root" "${sources[@]}"
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf" # the host's PyPI settings
# The machine's own name, which a new machine's installer writes into /etc/hosts and a
# bootstrapped root lacks (mmdebstrap copies /etc/hostname only): without it, each lookup of
# the name (every mpirun's) waited for DNS to time out: 5.4 s per mpirun against 0.4.
[[ -f /etc/hosts ]] && cp /etc/hosts "$root/etc/hosts"
mkdir -p "$root/src"
step clone git clone --quiet --no-checkout "$repo" "$root/src/hybridnn"
git -C "$root/src/hybridnn" checkout --quiet "$head"
mkdir "$root/src/shared"
cp -a "$shared/." "$root/src/shared/" # its contents, also when ../shared is a link

for fs in proc sys dev; do
  mount --rbind "/$fs" "$root/$fs"
  mounted+=("$root/$fs")
  mount --make-rslave "$root/$fs"
done

# A clean login environment, as on a new machine; OPENBLAS_* describe this CPU to OpenBLAS
# and are kept, as a user of this machine would have them.
environment=(HOME=/root LANG=C.UTF-8 TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
while IFS='=' read -r name value; do
  [[ $name == OPENBLAS_* ]] && environment+=("$name=$value")
done < <(env)
in_root() { chroot "$root" /usr/bin/env -i "${environment[@]}" bash -c "cd /src/hybridnn && $1"; }

if [[ $only != run ]]; then
  step test in_root scripts/test.sh
fi
if [[ $only != test ]]; then
  step run in_root scripts/run.sh
  # The main job must also have learned: its last test pass, from the metrics it wrote.
  metrics=$root/src/hybridnn/examples/fashion_mnist/output/metrics.jsonl
  [[ -s $metrics ]] || fail "the main job wrote no metrics ($metrics)"
  accuracy=$(grep '"phase":"test"' "$metrics" | tail -n 1 | sed -n 's/.*"accuracy":\([0-9.eE+-]*\).*/\1/p')
  [[ -n $accuracy ]] || fail "no test accuracy in the main job's metrics ($metrics)"
  awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' ||
    fail "the main job ended at test accuracy $accuracy, below $min_accuracy"
  echo "check-fresh: main job final test accuracy $accuracy"
fi
echo "check-fresh: the README's commands work on a fresh Debian 12 root (commit ${head:0:12})"

if [[ -n $cuda ]]; then
  toolkit=$(readlink -f "$cuda")
  mkdir -p "$root$toolkit"
  mount --bind "$toolkit" "$root$toolkit"
  mounted+=("$root$toolkit")
  mount -o remount,bind,ro "$root$toolkit"
  [[ $toolkit == /usr/local/cuda ]] || ln -sfn "$toolkit" "$root/usr/local/cuda"
  # CMAKE_CUDA_COMPILER named: the first configure cached it as not found. The GPU tests
  # exit 77 (every case skipped, with the reason) without a device.
  step cuda in_root "export PATH=/usr/local/cuda/bin:\$PATH &&
    cmake -S . -B build -DHYBRIDNN_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc &&
    cmake --build build --target hybridnn-tests-cuda &&
    { build/bin/hybridnn-tests-cuda; status=\$?; [[ \$status == 0 || \$status == 77 ]]; }"
  tail -n 1 "$logs/cuda.log"
  echo "check-fresh: the CUDA driver and its tests build in the same tree ($toolkit)"
fi
