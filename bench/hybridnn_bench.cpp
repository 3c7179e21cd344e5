// hybridnn-bench: performance measurements as JSON lines on stdout (progress on stderr).
// Every figure comes with a ratio against a reference measured in the same run.
//
//   hybridnn-bench gemm [--threads N] [--blas NAME]      (bench_gemm.cpp)
//   hybridnn-bench layers [--net caffenet|lenet] [--threads N] [--batch B]  (bench_layers.cpp)
//   hybridnn-bench split [--devices LIST] [--split SPEC] [--batch B] ...  (bench_split.cpp)
//   mpirun -np N hybridnn-bench allreduce [--min BYTES] [--max BYTES] ...  (bench_allreduce.cpp)
//   hybridnn-bench memory [--model FILE | --solver FILE] [--batch B]  (bench_memory.cpp)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "hybridnn/error.h"
#include "lib/drivers/builtin.h"

namespace {

constexpr int kUsageError = 2;

const char* const kUsage =
    "usage: hybridnn-bench <command> [options]\n"
    "commands:\n"
    "  gemm [--threads N] [--blas onednn|openblas]\n"
    "      GEMM of the CPU driver on square sizes and CaffeNet's conv layers (batch 32),\n"
    "      as GFLOP/s and as a ratio to the best sgemm of any BLAS on this machine.\n"
    "      --threads: 0 (default) = every core; --blas: default = the build's default\n"
    "  layers [--net caffenet|lenet|resnet50|squeezenet] [--threads N] [--blas NAME] [--batch B]\n"
    "         [--only NAME,...] [--chunk-bytes N] [--layout nchw|blocked]\n"
    "         [--lowering L[,L...]]  L: automatic|type1|type3|direct_1x1|direct|direct_plain|\n"
    "                                   winograd|pointwise\n"
    "         [--force-backward]\n"
    "      CaffeNet's layers (conv1..conv5, pooling, LRN, ReLU, fc6..fc8), or Caffe's LeNet\n"
    "      at batch 64 with --net lenet, or ResNet-50's convolutions (one of each shape) with\n"
    "      --net resnet50, or SqueezeNet v1.1's (one of each shape) with --net squeezenet,\n"
    "      forward and backward on the CPU driver, one JSON line per layer\n"
    "      with the ratio of the convolutions to the sgemm peak measured in the same run.\n"
    "      --batch: default 32; --only: a comma-separated list of layer names to run;\n"
    "      --chunk-bytes and --lowering override the convolutions' choices (for tuning;\n"
    "      several lowerings: each layer timed with each in turn, the best of 3 rounds, one\n"
    "      line per lowering, compared in the same moments of a noisy machine);\n"
    "      --layout blocked: the operands in the driver's blocked layout (default nchw);\n"
    "      --force-backward: the first layer's data gradient too (as hybridnn time)\n"
    "  split [--devices LIST] [--split SPEC] [--batch B] [--iterations N] [--rounds R]\n"
    "        [--threads N] [--model FILE] [--layout blocked|nchw] [--tune off|once|cached]\n"
    "        [--cores shared|any]\n"
    "      CaffeNet (shared/models) forward + complete backward through a Net, in images/s:\n"
    "      each device alone (ratio to the fastest), each device on its rows of the fixed\n"
    "      split with a Net of its own, all at the same time (side_by_side: the split's\n"
    "      ceiling on this machine), a fixed split (--split, default equal fractions) and the\n"
    "      automatic split (measured first, untimed: calibration_s; the chosen per-layer\n"
    "      splits go to stderr), each with its efficiency = its images/s / the sum of the\n"
    "      single devices', its ratio to side_by_side, and per-device busy and waiting\n"
    "      fractions of the wall time (fields: docs/benchmarks.md). --devices: default cpu\n"
    "      and every cuda:N; without a GPU, cpu,cpu:1 with 1 thread each, which on a 2-core\n"
    "      machine shows how close the scheduler gets to running two drivers side by side.\n"
    "      reference may be listed (with its own memory) but is the naive oracle: minutes\n"
    "      per iteration.\n"
    "      --batch: default 32; --iterations: timed per round after 1 warm-up, default 3;\n"
    "      --rounds: every configuration is built first, then timed in R alternating rounds\n"
    "      (default 3), each reporting its fastest; --threads: per cpu driver, default every\n"
    "      core shared out among the cpu drivers listed;\n"
    "      --layout: activations between CPU layers, default blocked (the tool's default);\n"
    "      --tune: the convolutions' measured choice, default cached (the tool's default);\n"
    "      --cores: shared (default, the tool's) binds each split's cpu drivers to cores of\n"
    "      their own, the last left to the GPUs' threads; any: not bound\n"
    "  allreduce [--min BYTES] [--max BYTES] [--iterations N] [--chunk-bytes BYTES]\n"
    "            [--chunks-in-flight K] [--busy-threads N]   (under mpirun -np N)\n"
    "      the ring allreduce and MPI_Allreduce in the same run, sizes from --min (64K) to\n"
    "      --max (256M) by x4: time, algbw, busbw = algbw * 2(n-1)/n and #wrong per backend,\n"
    "      and the ring with BF16 on the wire (ring_bf16, --grad-compress bf16's), then\n"
    "      ring's and ring_bf16's busbw / mpi's; --chunk-bytes and --chunks-in-flight set\n"
    "      the ring's pipeline (CommOptions; default: chunks of 256 KiB, 2 in flight);\n"
    "      --busy-threads: N threads of arithmetic on every rank throughout (the compute\n"
    "      that training's collective overlaps)\n";

}  // namespace

int main(int argc, char** argv) {
  hn::register_builtin_drivers();
  const std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  const std::string command = argc >= 2 ? argv[1] : "";
  try {
    if (command == "gemm") return hn::bench::run_gemm(args);
    if (command == "layers") return hn::bench::run_layers(args);
    if (command == "split") return hn::bench::run_split(args);
    if (command == "allreduce") return hn::bench::run_allreduce(args);
    if (command == "memory") return hn::bench::run_memory(args);
    if (command == "-h" || command == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    throw hn::bench::UsageError{command.empty() ? "missing command"
                                                : "unknown command '" + command + "'"};
  } catch (const hn::bench::UsageError& e) {
    std::fprintf(stderr, "hybridnn-bench: %s\n%s", e.message.c_str(), kUsage);
    return kUsageError;
  } catch (const hn::Error& e) {
    std::fprintf(stderr, "hybridnn-bench: %s\n", e.what());
    return 1;
  }
}
