#!/usr/bin/env bash
# Packs the GPU suite for a machine that has an NVIDIA GPU, its driver and CUDA 13's cuBLAS and
# cuDNN (a CUDA image, a PyTorch install) but none of this project's own dependencies, and
# nothing to build with: the CUDA test binary, the hybridnn tool, the shared libraries they
# need that such a machine lacks (oneDNN, OpenBLAS, protobuf, fmt, LMDB, Open MPI's client
# libraries), ../shared/models and, with --data, Fashion-MNIST.
#
#   scripts/gpu-bundle.sh [--build DIR] [--data]   # writes .gpu/bundle.tar.xz and .gpu/run.sh
#
# Then, from the repository root on the GPU machine: `bash .gpu/run.sh` runs the GPU suite
# first, then times CaffeNet, ResNet-50 and MobileNet v1 (batch 32, forward + backward) on
# cuda:0, with --split auto and with both, and with --data trains LeNet on Fashion-MNIST with --gpu 0.
# Logs and JSON lines go to $OUT (default .gpu/out). The binaries run on a newer glibc than
# Debian 12's; the GPU machine's x86-64 must be this one's. .gpu/ is not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
data=0
while (($#)); do
  case $1 in
    --build) build=${2:?--build needs a directory}; shift ;;
    --data) data=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
models=$PWD/../shared/models  # as the build wrote it into the tests (HYBRIDNN_MODELS_DIR)
[[ -d $models ]] || { echo "gpu-bundle: no $models" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/models" .gpu
cp "$build/bin/hybridnn-tests-cuda" "$build/bin/hybridnn" "$stage/bin/"
strip "$stage/bin/"*
# Every library the two need but the C and C++ runtimes, and CUDA's own (the GPU machine's
# cuBLAS and cuDNN match its driver).
ldd "$build/bin/hybridnn-tests-cuda" "$build/bin/hybridnn" | awk '$3 ~ /^\// { print $3 }' |
  sort -u |
  grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt|libcudnn[a-z_]*|libnccl|libcublas[A-Za-z]*)\.so' |
  xargs -I{} cp -L {} "$stage/lib/"
cp "$models"/*.prototxt "$stage/models/"
(cd "$stage" && tar cf - bin lib models) | xz -T0 -6 >.gpu/bundle.tar.xz
rm -rf .gpu/fashion
if ((data)); then
  mkdir -p .gpu/fashion
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu/fashion/
fi
cat >.gpu/run.sh <<EOF
#!/usr/bin/env bash
# Written by scripts/gpu-bundle.sh at $(git rev-parse --short HEAD); run from the repository root.
set -u -o pipefail
OUT=\${OUT:-.gpu/out}
mkdir -p "\$OUT" /tmp/hybridnn-gpu
tar xJf .gpu/bundle.tar.xz -C /tmp/hybridnn-gpu
B=/tmp/hybridnn-gpu/bin M=/tmp/hybridnn-gpu/models
# The tests read the models where the build put ../shared/models.
mkdir -p "$models" && cp \$M/*.prototxt "$models/"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
dirs=\$(for n in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcudnn_ops.so.9 libnccl.so.2; do
  find /usr/local /opt /usr/lib -name "\$n" 2>/dev/null | head -n 1
done | xargs -r -n 1 dirname | sort -u | paste -sd:)
export LD_LIBRARY_PATH=/tmp/hybridnn-gpu/lib:\$dirs HYBRIDNN_TUNE_CACHE=none
ldd \$B/hybridnn-tests-cuda \$B/hybridnn | grep "not found"
echo "== the GPU suite"
timeout 300 \$B/hybridnn-tests-cuda --durations yes >"\$OUT/cuda-tests.log" 2>&1
echo "exit \$?"
grep -E "FAILED|SKIPPED|test cases|assertions|All tests passed" "\$OUT/cuda-tests.log" | tail -n 12
\$B/hybridnn device_query | grep -E "^(available|cuda)"
for net in bvlc_reference_caffenet resnet50 mobilenet_v1; do
  for how in "--device cuda:0" "--split auto" "--device cuda:0 --split auto"; do
    echo "== \$net \$how"
    log=\$OUT/\$net\$(echo "\$how" | tr -d ': -').jsonl  # names without ':' come back
    timeout 120 \$B/hybridnn time --model \$M/\${net}_deploy.prototxt \$how --iterations 10 \\
      --batch 32 --json >"\$log" 2>&1
    grep '"total"' "\$log" | grep -o '"forward_backward_ms":[0-9.]*'
  done
done
if [[ -d .gpu/fashion ]]; then
  echo "== LeNet on Fashion-MNIST, --gpu 0"
  mkdir -p /usr/share/datasets/fashion-mnist && cp .gpu/fashion/*.gz /usr/share/datasets/fashion-mnist/
  timeout 200 \$B/hybridnn train --solver examples/fashion_mnist/lenet_solver.prototxt --gpu 0 \\
    --metrics "\$OUT/metrics.jsonl" >"\$OUT/train.log" 2>&1
  echo "exit \$?"
  tail -n 3 "\$OUT/train.log"
fi
EOF
echo "gpu-bundle: .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1)) and .gpu/run.sh; on the GPU machine: bash .gpu/run.sh"
