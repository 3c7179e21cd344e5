#!/usr/bin/env bash
# Packs the GPU suite for a machine that has an NVIDIA GPU, its driver and CUDA 13's cuBLAS and
# cuDNN (a CUDA image, a PyTorch install) but none of this project's own dependencies, and
# nothing to build with: the CUDA test binary, the hybridnn tool (and hybridnn-bench where
# built), the shared libraries they need that such a machine lacks (oneDNN, OpenBLAS,
# protobuf, fmt, LMDB, Open MPI's client libraries), ../shared/models and SqueezeNet's
# prototxt, bench/gpu_profile.py with the zoo.py and vs_pytorch.py whose PyTorch twins it
# imports, bench/gpu_table.py and, with --data, Fashion-MNIST.
#
#   scripts/gpu-bundle.sh [--build DIR] [--data] [--baseline BUNDLE]
#                         # writes .gpu/bundle.tar.xz and .gpu/run.sh
#
# --baseline takes the tool of an earlier .gpu/bundle.tar.xz (into .gpu/baseline.tar.xz; it
# stays there for later bundles until --baseline none), which run.sh times beside this one,
# FP32 on cuda:0, for a before/after within one call.
#
# Then, from the repository root on the GPU machine, `bash .gpu/run.sh` (every step under
# `timeout` and within RUN_BUDGET_S, default 480 s, past which the steps left print SKIPPED)
# runs, in this order: the GPU suite; CaffeNet, SqueezeNet, GoogLeNet and ResNet-50 at batch 1, 8 and 32
# with whole iterations as one CUDA graph and call by call (--graphs on, off), and cuDNN's
# candidates per ResNet-50 convolution (HYBRIDNN_CUDNN_LOG=1, measured); CaffeNet, ResNet-50, MobileNet v1, GoogLeNet and
# SqueezeNet v1.1 (batch 32, forward + backward) with `hybridnn time` on cuda:0 in each math
# mode (--math fp32, tf32, bf16; the FP32 per-layer tables kept); the baseline tool, if any;
# PyTorch's twins (bench/gpu_profile.py: FP32 with TF32 off, its defaults, BF16 autocast with
# channels_last; SKIPPED without PyTorch or CUDA); FP32 with cuDNN's algorithms measured
# (HYBRIDNN_CUDNN_ALGO=find), with non-deterministic ones allowed, both, and measured with
# FFT and Winograd allowed (HYBRIDNN_CUDNN_TRANSFORMS=1), deterministic and not; with --data, LeNet trained on Fashion-MNIST on cuda:0 in each mode
# (its recorded iterations, a CUDA graph each) and in FP32 call by call (--graphs off);
# ResNet-50 and GoogLeNet at batch 128 in each mode, and their twins; torch.profiler's top
# kernels and per-op table of ResNet-50; --split auto (each beside cuda:0 alone, back to
# back), the CPU alone (ResNet-50 in BF16 too; at batch 2 and 8 too), the fixed splits
# cuda:0:0.95,cpu:0.05 and cuda:0:0.9,cpu:0.1 (the 0.9 split of CaffeNet and ResNet-50
# again with the CPU driver not bound to its cores, --cores any), and at batch 128 cuda:0:0.97,cpu:0.03 and auto
# (issue 36); hybridnn-bench split on cuda:0 and cpu, runs of layers cut alike against a
# barrier per layer (CaffeNet, ResNet-50); hybridnn-bench gemm (the CPU's sgemm GFLOP/s);
# and bench/gpu_table.py's markdown table of hybridnn against PyTorch per net, batch and mode.
# Logs and JSON lines go to $OUT (default .gpu/out); a summary (a line per net and
# configuration) prints at the end and stays in $OUT/summary.txt, the table in $OUT/table.md.
# The binaries run on a newer glibc than Debian 12's; the GPU machine's x86-64 must be this
# one's. .gpu/ is not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
data=0
baseline=""
while (($#)); do
  case $1 in
    --build) build=${2:?--build needs a directory}; shift ;;
    --data) data=1 ;;
    --baseline) baseline=${2:?--baseline needs an earlier bundle}; shift ;;
    -h | --help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for binary in hybridnn-tests-cuda hybridnn; do
  [[ -x $build/bin/$binary ]] || {
    echo "gpu-bundle: no $build/bin/$binary: build with the CUDA driver first (scripts/build.sh)" >&2
    exit 1
  }
done
binaries=("$build/bin/hybridnn-tests-cuda" "$build/bin/hybridnn")
[[ -x $build/bin/hybridnn-bench ]] && binaries+=("$build/bin/hybridnn-bench")
models=$PWD/../shared/models  # as the build wrote it into the tests (HYBRIDNN_MODELS_DIR)
[[ -d $models ]] || { echo "gpu-bundle: no $models" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/models" "$stage/py" .gpu
cp "${binaries[@]}" "$stage/bin/"
strip "$stage/bin/"*
# Every library they need but the C and C++ runtimes, and CUDA's own (the GPU machine's
# cuBLAS and cuDNN match its driver).
ldd "${binaries[@]}" | awk '$3 ~ /^\// { print $3 }' |
  sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|libcudnn[a-z_]*|libnccl|libcublas[A-Za-z]*)\.so' |
  xargs -I{} cp -L {} "$stage/lib/"
cp "$models"/*.prototxt "$stage/models/"
cp bench/models/squeezenet_v1.1_deploy.prototxt "$stage/models/"
cp bench/gpu_profile.py bench/gpu_table.py bench/zoo.py bench/vs_pytorch.py "$stage/py/"
[[ $baseline == none ]] && { rm -f .gpu/baseline.tar.xz; baseline=""; }
if [[ -n $baseline ]]; then
  # Its tool alone: the libraries it needs are this bundle's (the same machine built both).
  [[ -f $baseline ]] || { echo "gpu-bundle: no baseline bundle $baseline" >&2; exit 1; }
  mkdir -p "$stage/baseline"
  tar xJf "$baseline" -C "$stage/baseline" bin/hybridnn
  (cd "$stage/baseline" && tar cf - bin) | xz -T0 -6 >.gpu/baseline.tar.xz.new
  mv .gpu/baseline.tar.xz.new .gpu/baseline.tar.xz
fi
(cd "$stage" && tar cf - bin lib models py) | xz -T0 -6 >.gpu/bundle.tar.xz
rm -rf .gpu/fashion
if ((data)); then
  mkdir -p .gpu/fashion
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion/
fi
revision=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- 2>/dev/null || revision+=" with uncommitted changes"
{
  printf '#!/usr/bin/env bash\n'
  printf '# Written by scripts/gpu-bundle.sh at %s; run from the repository root.\n' "$revision"
  printf '# The tests read the models where the build put ../shared/models.\n'
  printf 'MODELS_DIR=%q\n' "$models"
  cat <<'EOF'
set -u -o pipefail
OUT=${OUT:-.gpu/out}
# Every step runs under `timeout`, limited further to what is left of RUN_BUDGET_S (less 15 s
# for the summary); a step that would get less than its minimum prints SKIPPED instead. No
# step's failure stops the others.
BUDGET=${RUN_BUDGET_S:-480}
mkdir -p "$OUT" /tmp/hybridnn-gpu
: >"$OUT/summary.txt"
# note: a line on stdout and in the summary.
note() { printf '%s\n' "$*" | tee -a "$OUT/summary.txt"; }
# step NAME MAX MIN COMMAND...: COMMAND under `timeout` for MAX seconds or what the budget has
# left; SKIPPED (rc 125) when that is under MIN. Redirections apply to COMMAND's output; the
# SKIPPED and timed-out lines go to fd 3 (stdout) and the summary.
exec 3>&1
step() {
  local name=$1 max=$2 min=$3 rc left
  shift 3
  left=$((BUDGET - SECONDS - 15))
  ((left < max)) && max=$left
  if ((max < min)); then
    note "SKIPPED: $name: ${left}s left of the ${BUDGET}s budget" >&3
    return 125
  fi
  timeout -k 10 "$max" "$@"
  rc=$?
  ((rc == 124 || rc == 137)) && note "TIMED OUT: $name after ${max}s" >&3
  return $rc
}
# field JSONL KEY: KEY's value in the log's "total" line.
field() { grep '"total"' "$1" 2>/dev/null | tail -n 1 | grep -o "\"$2\":[-0-9.eE+]*" | cut -d: -f2; }
# layers JSONL: hybridnn time --json's per-layer lines as a table, slowest first.
layers() {
  awk -F'"' '/^\{"layer"/ && !/"device":/ {
    f = b = 0; a = ""
    if (match($0, /"forward_ms":[-0-9.eE+]+/)) f = substr($0, RSTART + 13, RLENGTH - 13)
    if (match($0, /"backward_ms":[-0-9.eE+]+/)) b = substr($0, RSTART + 14, RLENGTH - 14)
    if (match($0, /"algorithm":"[^"]*"/)) a = substr($0, RSTART + 13, RLENGTH - 14)
    printf "%9.3f %9.3f %9.3f  %-22s %-18s %s\n", f + b, f, b, $4, $8, a }' "$1" | sort -rn
}
# time_net NET ITERATIONS MAX MIN ARGS...: `hybridnn time` forward + backward at batch 32
# unless ARGS say --batch, its JSON lines in $OUT/[LABEL]NET<ARGS without ':, -.'>.jsonl
# (names without ':' come back), a summary line. LABEL (baseline, find, nondet) prefixes the
# log and the line; TOOL replaces the bundle's tool (the baseline's).
time_net() {
  local net=$1 iterations=$2 max=$3 min=$4 log ms rc why batch=(--batch 32)
  shift 4
  [[ " $* " == *" --batch "* ]] && batch=()
  log=$OUT/${LABEL:-}$net$(echo "$*" | tr -d ':, .-').jsonl
  step "${LABEL:-} $net $*" "$max" "$min" "${TOOL:-$B/hybridnn}" time --model "$M/${net}_deploy.prototxt" "$@" \
    --iterations "$iterations" "${batch[@]}" --json >"$log" 2>&1
  rc=$?
  ((rc == 125)) && return
  ms=$(field "$log" forward_backward_ms)
  if [[ -n $ms ]]; then
    note "$(printf '%-10s%-24s %-40s fb_ms=%-8.2f (fwd %.2f, bwd %.2f)' "${LABEL:-}" "$net" "$*" \
      "$ms" "$(field "$log" forward_ms)" "$(field "$log" backward_ms)")"
  else
    why=$(grep -v '^{' "$log" | tail -n 1)
    note "$(printf '%-10s%-24s %-40s FAILED: exit %s: %s' "${LABEL:-}" "$net" "$*" "$rc" "${why:0:100}")"
  fi
}
nets="bvlc_reference_caffenet resnet50 mobilenet_v1"
zoo="$nets bvlc_googlenet squeezenet_v1.1"

echo "== setup"
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
step "unpacking the bundle" 120 10 tar xJf .gpu/bundle.tar.xz -C /tmp/hybridnn-gpu
B=/tmp/hybridnn-gpu/bin M=/tmp/hybridnn-gpu/models
mkdir -p "$MODELS_DIR" && cp $M/*.prototxt "$MODELS_DIR/"
note "gpu: $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
note "cpu: $(nproc) cores, $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)$(grep -q avx512f /proc/cpuinfo && echo ', AVX-512')$(grep -q avx512_bf16 /proc/cpuinfo && echo ', AVX512_BF16')$(grep -q amx_bf16 /proc/cpuinfo && echo ', AMX')"
dirs=$(for n in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcudnn_ops.so.9 libnccl.so.2; do
  timeout 60 find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -n 1
done | xargs -r -n 1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=/tmp/hybridnn-gpu/lib:$dirs HYBRIDNN_TUNE_CACHE=none
ldd $B/* | grep "not found"
timeout 60 $B/hybridnn device_query | grep -E "^(available|cuda|cpu)"

echo "== the GPU suite"
step "the GPU suite" 300 30 $B/hybridnn-tests-cuda --durations yes >"$OUT/cuda-tests.log" 2>&1
rc=$?
if ((rc != 125)); then
  grep -E "FAILED|SKIPPED|test cases|assertions|All tests passed" "$OUT/cuda-tests.log" | tail -n 12
  note "GPU suite: exit $rc; $(grep -E 'test cases' "$OUT/cuda-tests.log" | tail -n 1)"
fi

echo "== whole iterations as one CUDA graph (the default) and call by call (--graphs off)"
# Back to back per net and batch.
for net in bvlc_reference_caffenet squeezenet_v1.1 bvlc_googlenet resnet50; do
  for batch in 1 8 32; do
    for graphs in on off; do
      LABEL=graphs$graphs time_net "$net" 20 60 10 --device cuda:0 --batch $batch --graphs $graphs
    done
  done
done
grep -h "^Note:" "$OUT"/graphson*.jsonl 2>/dev/null | sort -u | head -n 5
# cuDNN's candidates and choices per convolution shape (HYBRIDNN_CUDNN_LOG=1), measured,
# non-deterministic ones allowed: ResNet-50 at batch 32.
HYBRIDNN_CUDNN_LOG=1 HYBRIDNN_CUDNN_ALGO=find HYBRIDNN_CUDNN_DETERMINISTIC=0 \
  LABEL=cudnnlog time_net resnet50 2 60 10 --device cuda:0
grep -h "^cuDNN " "$OUT"/cudnnlog*.jsonl >"$OUT/cudnn-resnet50-algorithms.txt" 2>/dev/null
note "cuDNN's ResNet-50 candidates: $(wc -l <"$OUT/cudnn-resnet50-algorithms.txt") lines in $OUT/cudnn-resnet50-algorithms.txt"

echo "== the zoo on cuda:0 in each math mode (batch 32, 10 iterations)"
for net in $zoo; do
  for math in fp32 tf32 bf16; do
    time_net "$net" 10 120 15 --device cuda:0 --math $math
  done
  # Per-layer times on cuda:0 in FP32 (CUDA events), slowest first.
  log=$OUT/${net}devicecuda0mathfp32.jsonl table=$OUT/hybridnn-layers-$net-cuda0.txt
  if [[ -s $log ]]; then
    { echo "    fb_ms    fwd_ms    bwd_ms  layer                  type               algorithm"
      layers "$log"; } >"$table"
    echo "-- $net on cuda:0, slowest layers (all: $table)"
    head -n 6 "$table"
  fi
done

if [[ -f .gpu/baseline.tar.xz ]]; then
  echo "== the baseline build (scripts/gpu-bundle.sh --baseline), FP32 on cuda:0"
  mkdir -p /tmp/hybridnn-gpu-baseline
  if step "unpacking the baseline" 60 10 tar xJf .gpu/baseline.tar.xz -C /tmp/hybridnn-gpu-baseline; then
    for net in $nets; do
      LABEL=baseline TOOL=/tmp/hybridnn-gpu-baseline/bin/hybridnn time_net "$net" 10 120 15 \
        --device cuda:0
    done
  fi
fi

echo "== PyTorch's twins: FP32 (TF32 off), its defaults (TF32 convolutions), BF16 autocast"
# Python runs with the machine's own library path, not the bundle's.
if [[ -n $ORIG_LD_LIBRARY_PATH ]]; then orig_env=(env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH")
else orig_env=(env -u LD_LIBRARY_PATH); fi
py="" why="no python3 on PATH" seen=""
for candidate in python3 /usr/bin/python3; do
  path=$(command -v "$candidate") || continue
  [[ $(readlink -f "$path") == "$seen" ]] && continue
  seen=$(readlink -f "$path")
  if why=$(step "import torch ($path)" 90 20 "${orig_env[@]}" "$path" -c 'import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"' 2>&1); then
    py=$path
    break
  fi
  why="$path: $(printf '%s\n' "$why" | tail -n 1)"
done
# pytorch BATCH NETS PROFILE_ITERATIONS MODES: bench/gpu_profile.py into $OUT/pytorch-bBATCH*.
pytorch() {
  local dir=$OUT/pytorch-b$1 rc
  if [[ -z $py ]]; then
    note "SKIPPED: PyTorch b$1: $why"
    return
  fi
  step "PyTorch b$1 $2" 200 30 "${orig_env[@]}" "$py" /tmp/hybridnn-gpu/py/gpu_profile.py \
    --out "$dir" --models "$M" --batch "$1" --nets "$2" --modes "$4" --warmup 5 \
    --iterations 20 --profile-iterations "$3" --top 5 >"$dir.log" 2>&1
  rc=$?
  grep -E '^(pytorch |  |SKIPPED|FAILED)' "$dir.log"
  grep -E '^(pytorch [a-z]|SKIPPED|FAILED)' "$dir.log" | grep -v '^pytorch setup' |
    sed "s/ (median of .*\$//; s/^pytorch /pytorch b$1 /" >>"$OUT/summary.txt"
  ((rc == 0 || rc == 125)) || note "PyTorch b$1: exit $rc (last lines: $dir.log)"
}
mkdir -p "$OUT/pytorch-b32" "$OUT/pytorch-b128"
pytorch 32 caffenet,resnet50,mobilenet,googlenet,squeezenet 0 fp32,default,bf16

echo "== cuDNN's algorithms measured, non-deterministic ones and FFT and Winograd allowed (FP32)"
# Measured alone and non-deterministic alone changed ResNet-50 by +7 % and -3 % on an H200
# (docs/benchmarks.md, 2026-11-28, second session), so they are no longer run. Both: the fastest measured algorithm, non-deterministic ones (PyTorch's default choice,
# cuDNN's ALGO_0 gradients) included, with its per-layer table.
export HYBRIDNN_CUDNN_ALGO=find HYBRIDNN_CUDNN_DETERMINISTIC=0
for net in resnet50 bvlc_googlenet bvlc_reference_caffenet squeezenet_v1.1; do
  LABEL=findnondet time_net "$net" 10 120 15 --device cuda:0
done
log=$OUT/findnondetresnet50devicecuda0.jsonl
[[ -s $log ]] && { echo "    fb_ms    fwd_ms    bwd_ms  layer                  type               algorithm"
  layers "$log"; } >"$OUT/hybridnn-layers-resnet50-cuda0-findnondet.txt"
# FFT and Winograd let in (HYBRIDNN_CUDNN_TRANSFORMS=1), measured: deterministic
# (transforms), then non-deterministic ones too (fastest).
export HYBRIDNN_CUDNN_TRANSFORMS=1 HYBRIDNN_CUDNN_DETERMINISTIC=1
for net in resnet50 bvlc_googlenet bvlc_reference_caffenet squeezenet_v1.1 mobilenet_v1; do
  LABEL=transforms time_net "$net" 10 120 15 --device cuda:0
done
export HYBRIDNN_CUDNN_DETERMINISTIC=0
for net in resnet50 bvlc_googlenet bvlc_reference_caffenet squeezenet_v1.1 mobilenet_v1; do
  LABEL=fastest time_net "$net" 10 120 15 --device cuda:0
done
log=$OUT/fastestresnet50devicecuda0.jsonl
[[ -s $log ]] && { echo "    fb_ms    fwd_ms    bwd_ms  layer                  type               algorithm"
  layers "$log"; } >"$OUT/hybridnn-layers-resnet50-cuda0-fastest.txt"
unset HYBRIDNN_CUDNN_ALGO HYBRIDNN_CUDNN_DETERMINISTIC HYBRIDNN_CUDNN_TRANSFORMS

if [[ -d .gpu/fashion ]]; then
  echo "== LeNet on Fashion-MNIST on cuda:0 in each math mode"
  mkdir -p /usr/share/datasets/fashion-mnist && cp .gpu/fashion/*.gz /usr/share/datasets/fashion-mnist/
  for math in fp32 tf32 bf16; do
    step "LeNet on Fashion-MNIST, $math" 100 20 $B/hybridnn train \
      --solver examples/fashion_mnist/lenet_solver.prototxt --gpu 0 --math $math \
      --metrics "$OUT/metrics-$math.jsonl" >"$OUT/train-$math.log" 2>&1
    rc=$?
    ((rc == 125)) || note "LeNet on Fashion-MNIST, --gpu 0 --math $math: exit $rc; $(grep 'accuracy =' "$OUT/train-$math.log" | tail -n 1 | sed 's/^ *//'); $(grep -m1 'recorded' "$OUT/train-$math.log"); $(tail -n 1 "$OUT/train-$math.log")"
  done
  # Training's recorded iterations (issue 35 item 4) against call by call: time and accuracy.
  step "LeNet on Fashion-MNIST, fp32, --graphs off" 100 20 $B/hybridnn train \
    --solver examples/fashion_mnist/lenet_solver.prototxt --gpu 0 --math fp32 --graphs off \
    --metrics "$OUT/metrics-fp32-graphs-off.jsonl" >"$OUT/train-fp32-graphs-off.log" 2>&1
  rc=$?
  ((rc == 125)) || note "LeNet on Fashion-MNIST, --gpu 0 --math fp32 --graphs off: exit $rc; $(grep 'accuracy =' "$OUT/train-fp32-graphs-off.log" | tail -n 1 | sed 's/^ *//'); $(tail -n 1 "$OUT/train-fp32-graphs-off.log")"
fi

echo "== batch 128, each math mode"
for net in resnet50 bvlc_googlenet; do
  for math in fp32 tf32 bf16; do
    time_net "$net" 5 120 25 --device cuda:0 --math $math --batch 128
  done
done
pytorch 128 resnet50,googlenet 0 fp32,default,bf16

echo "== PyTorch's profile of ResNet-50 (FP32, its defaults)"
mkdir -p "$OUT/pytorch-profile"
if [[ -n $py ]]; then
  step "PyTorch profile" 120 40 "${orig_env[@]}" "$py" /tmp/hybridnn-gpu/py/gpu_profile.py \
    --out "$OUT/pytorch-profile" --models "$M" --batch 32 --nets resnet50 --modes fp32,default \
    --warmup 3 --iterations 5 --profile-iterations 3 --top 5 >"$OUT/pytorch-profile.log" 2>&1
  grep -E '^(  |SKIPPED|FAILED)' "$OUT/pytorch-profile.log"
fi

echo "== --split auto and the CPU alone (issue 36; 2-3 iterations)"
# cuda:0 alone again just before each auto (LABEL beside): the two compare back to back.
for net in $nets; do
  LABEL=beside time_net "$net" 5 60 10 --device cuda:0
  time_net "$net" 5 120 20 --split auto
done
time_net bvlc_reference_caffenet 3 90 20 --device cpu
time_net resnet50 2 150 30 --device cpu
# The CPU's BF16 convolutions where it has AVX512_BF16 or AMX (issue 35; FP32 elsewhere).
time_net resnet50 2 150 30 --device cpu --math BF16
time_net mobilenet_v1 3 90 20 --device cpu
for net in $nets; do
  for split in cuda:0:0.95,cpu:0.05 cuda:0:0.9,cpu:0.1; do
    time_net "$net" 5 120 20 --split "$split"
  done
done
# The CPU driver not bound to cores of its own (--cores any), against bound (the default,
# just above; issue 36, item 6).
for net in bvlc_reference_caffenet resnet50; do
  LABEL=unbound time_net "$net" 5 120 20 --split cuda:0:0.9,cpu:0.1 --cores any
done
# The CPU's cost per image at the small batches a split leaves it (batch 2 took 65 ms per
# ResNet-50 image on 16 Xeon cores, against 27 at batch 32), and batch 128: cuda:0 alone, a
# small CPU share and auto, back to back.
for batch in 2 8; do
  for net in bvlc_reference_caffenet resnet50; do
    time_net "$net" 3 60 15 --device cpu --batch "$batch"
  done
done
for net in bvlc_reference_caffenet resnet50; do
  LABEL=beside time_net "$net" 3 60 15 --device cuda:0 --batch 128
  time_net "$net" 3 90 20 --split cuda:0:0.97,cpu:0.03 --batch 128
  time_net "$net" 3 150 20 --split auto --batch 128
done

if [[ -x $B/hybridnn-bench ]]; then
  # Runs of layers cut alike against a wait after every layer, the same split in one call
  # (fixed and fixed_barrier_per_layer), then auto (issue 36).
  echo "== hybridnn-bench split: cuda:0 and cpu, runs against a barrier per layer"
  for net in bvlc_reference_caffenet resnet50; do
    step "bench split $net" 150 40 $B/hybridnn-bench split --model "$M/${net}_deploy.prototxt" \
      --devices cuda:0,cpu --split cuda:0:0.9,cpu:0.1 --threads $(($(nproc) - 1)) \
      --iterations 5 --rounds 1 --tune off >"$OUT/bench-split-$net.jsonl" 2>"$OUT/bench-split-$net.log"
    while read -r line; do
      note "bench split $net: $(echo "$line" | grep -o '"config":"[a-z_]*"\|"devices":"[^"]*"\|"images_per_s":[0-9.]*\|"efficiency":[0-9.]*\|"runs_speedup":[0-9.]*' | tr '\n' ' ')"
    done <"$OUT/bench-split-$net.jsonl"
  done
fi

if [[ -x $B/hybridnn-bench ]]; then
  echo "== the CPU's GEMM (hybridnn-bench gemm, every core)"
  step "hybridnn-bench gemm" 60 20 $B/hybridnn-bench gemm >"$OUT/cpu-gemm.jsonl" 2>&1
  peak=$(grep -o '"gflops":[0-9.eE+]*' "$OUT/cpu-gemm.jsonl" | cut -d: -f2 | sort -g | tail -n 1)
  [[ -n $peak ]] && note "cpu sgemm peak: $peak GFLOP/s (hybridnn-bench gemm; $OUT/cpu-gemm.jsonl)"
fi

echo "== the table (bench/gpu_table.py)"
if [[ -n $py ]]; then
  "${orig_env[@]}" "$py" /tmp/hybridnn-gpu/py/gpu_table.py "$OUT" | tee "$OUT/table.md"
else
  "${orig_env[@]}" python3 /tmp/hybridnn-gpu/py/gpu_table.py "$OUT" | tee "$OUT/table.md"
fi

echo "== summary ($SECONDS s of the ${BUDGET} s budget; logs and JSON lines in $OUT)"
cat "$OUT/summary.txt"
EOF
} >.gpu/run.sh
echo "gpu-bundle: .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1)) and .gpu/run.sh; on the GPU machine: bash .gpu/run.sh"
