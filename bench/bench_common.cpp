// Timing, random data, option parsing and the sgemm peak shared by the benchmarks.
#include "bench/bench_common.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if HYBRIDNN_WITH_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#if HYBRIDNN_WITH_OPENBLAS
#include <cblas.h>
#endif

#include "lib/net/net.h"

namespace hn::bench {

double best_seconds(const std::function<void()>& call, int min_runs, double budget) {
  using Clock = std::chrono::steady_clock;
  call();
  double best = 1e30, spent = 0.0;
  for (int run = 0; run < 40 && (run < min_runs || spent < budget); ++run) {
    const auto start = Clock::now();
    call();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, seconds);
    spent += seconds;
  }
  return best;
}

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values)
    v = dist(rng);
  return values;
}

void fill_inputs(Net& net) {
  for (const std::string& name : net.input_blob_names()) {
    const BlobRef blob = net.blob(name);
    const std::vector<float> values = random_floats(static_cast<std::size_t>(blob.count()), 1);
    std::copy(values.begin(), values.end(), blob.host_data_mut());
  }
}

int parse_threads(const std::string& command, const std::string& value) {
  char* end = nullptr;
  const long threads = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || threads < 0 || threads > 4096) {
    throw UsageError{command + ": --threads needs a number >= 0, got '" + value + "'"};
  }
  return static_cast<int>(threads);
}

int resolve_threads(int threads) {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Peak measure_peak(int threads) {
  Peak peak;
  for (const long size : {1024L, 1536L, 2048L}) {
    const double flops = 2.0 * size * size * size;
    const std::vector<float> a = random_floats(size * size, 1), b = random_floats(size * size, 2);
    std::vector<float> c(size * size);
    auto consider = [&](const char* blas, const std::function<void()>& call) {
      const double g = flops / best_seconds(call) * 1e-9;
      std::fprintf(stderr, "gemm_peak: %s %ld^3: %.1f GFLOP/s\n", blas, size, g);
      if (g > peak.gflops) peak = {blas, g};
    };
#if HYBRIDNN_WITH_ONEDNN
    consider("onednn", [&] {
      omp_set_num_threads(threads);
      dnnl_sgemm('N', 'N', size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(),
                 size);
    });
#endif
#if HYBRIDNN_WITH_OPENBLAS
    consider("openblas", [&] {
      openblas_set_num_threads(threads);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a.data(), size,
                  b.data(), size, 0.0f, c.data(), size);
    });
#endif
  }
  return peak;
}

}  // namespace hn::bench
