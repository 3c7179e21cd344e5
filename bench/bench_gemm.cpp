// hybridnn-bench gemm: the CPU driver's GEMM (through hn::Driver) on square sizes and on
// CaffeNet's conv GEMMs at batch 32, against the best sgemm any BLAS reaches here.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"

namespace hn::bench {

namespace {

struct GemmOptions {
  int threads = 0;
  std::string blas;
};

struct GemmShape {
  const char* name;
  long m, n, k;
};

double gflops(const GemmShape& s, double seconds) {
  return 2.0 * static_cast<double>(s.m) * s.n * s.k / seconds * 1e-9;
}

// The driver's GEMM through the public API, on driver-allocated buffers.
double measure_driver(hn::Driver& driver, const GemmShape& s) {
  const std::size_t a_count = s.m * s.k, b_count = s.k * s.n, c_count = s.m * s.n;
  hn::Buffer a(driver, a_count * sizeof(float)), b(driver, b_count * sizeof(float)),
      c(driver, c_count * sizeof(float));
  driver.copy_from_host(a.address(), random_floats(a_count, 3).data(), a.bytes());
  driver.copy_from_host(b.address(), random_floats(b_count, 4).data(), b.bytes());
  return gflops(s, best_seconds([&] {
                  driver.gemm(hn::Transpose::no, hn::Transpose::no, s.m, s.n, s.k, 1.0f,
                              a.as<float>(), s.k, b.as<float>(), s.n, 0.0f, c.as<float>(), s.n);
                  driver.synchronize();
                }));
}

GemmOptions parse_gemm(const std::vector<std::string>& args) {
  GemmOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if ((arg == "--threads" || arg == "--blas") && i + 1 == args.size()) {
      throw UsageError{"gemm: " + arg + " needs a value"};
    }
    if (arg == "--threads") {
      options.threads = parse_threads("gemm", args[++i]);
    } else if (arg == "--blas") {
      options.blas = args[++i];
    } else {
      throw UsageError{"gemm: unknown option '" + arg + "'"};
    }
  }
  return options;
}

}  // namespace

int run_gemm(const std::vector<std::string>& args) {
  const GemmOptions options = parse_gemm(args);
  const int threads = resolve_threads(options.threads);
  hn::DriverOptions driver_options;
  driver_options.set("threads", threads);
  if (!options.blas.empty()) driver_options.set("blas", options.blas);
  const std::unique_ptr<hn::Driver> driver = hn::make_driver(hn::Device{"cpu", 0}, driver_options);
  const std::string blas =
      options.blas.empty() ? hn::driver_kind("cpu").choices("blas").front() : options.blas;
  std::fprintf(stderr, "gemm: %s\n", driver->description().c_str());

  const Peak peak = measure_peak(threads);
  // Forward GEMMs of CaffeNet's conv layers over a batch of 32 with batched lowering:
  // m = C_out / group, k = C_in / group * kh * kw, n = 32 * H_out * W_out.
  const std::vector<GemmShape> shapes = {{"square", 256, 256, 256},
                                         {"square", 512, 512, 512},
                                         {"square", 1024, 1024, 1024},
                                         {"square", 1536, 1536, 1536},
                                         {"square", 2048, 2048, 2048},
                                         {"conv1", 96, 32 * 55 * 55, 3 * 11 * 11},
                                         {"conv2", 128, 32 * 27 * 27, 48 * 5 * 5},
                                         {"conv3", 384, 32 * 13 * 13, 256 * 3 * 3},
                                         {"conv4", 192, 32 * 13 * 13, 192 * 3 * 3},
                                         {"conv5", 128, 32 * 13 * 13, 192 * 3 * 3}};
  for (const GemmShape& s : shapes) {
    const double g = measure_driver(*driver, s);
    std::fprintf(stderr, "gemm: %s %ldx%ldx%ld: %.1f GFLOP/s\n", s.name, s.m, s.n, s.k, g);
    fmt::print(
        "{{\"bench\":\"gemm\",\"driver\":\"cpu\",\"blas\":\"{}\",\"threads\":{},\"m\":{},"
        "\"n\":{},\"k\":{},\"gflops\":{:.1f},\"ratio_to_peak\":{:.3f}}}\n",
        blas, threads, s.m, s.n, s.k, g, g / peak.gflops);
    std::fflush(stdout);
  }
  fmt::print("{{\"bench\":\"gemm_peak\",\"blas\":\"{}\",\"threads\":{},\"gflops\":{:.1f}}}\n",
             peak.blas, threads, peak.gflops);
  return 0;
}

}  // namespace hn::bench
