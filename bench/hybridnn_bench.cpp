// hybridnn-bench: performance measurements as JSON lines on stdout (progress on stderr).
// Every figure comes with a ratio against a reference measured in the same run.
//
//   hybridnn-bench gemm [--threads N] [--blas NAME]
//     The CPU driver's GEMM (through hn::Driver) on square sizes and on CaffeNet's conv
//     GEMMs at batch 32, against the best sgemm any BLAS reaches here ("gemm_peak").
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hybridnn/error.h"
#include "hybridnn/memory.h"
#include "hybridnn/runtime.h"

#if HYBRIDNN_WITH_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#if HYBRIDNN_WITH_OPENBLAS
#include <cblas.h>
#endif

namespace {

constexpr int kUsageError = 2;

const char* const kUsage =
    "usage: hybridnn-bench <command> [options]\n"
    "commands:\n"
    "  gemm [--threads N] [--blas onednn|openblas]\n"
    "      GEMM of the CPU driver on square sizes and CaffeNet's conv layers (batch 32),\n"
    "      as GFLOP/s and as a ratio to the best sgemm of any BLAS on this machine.\n"
    "      --threads: 0 (default) = every core; --blas: default = the build's default\n";

struct UsageError {
  std::string message;
};

struct GemmOptions {
  int threads = 0;
  std::string blas;
};

struct GemmShape {
  const char* name;
  long m, n, k;
};

// Best time of one call: one warm-up, then at least 5 and at most 40 runs, stopping once
// 1 s is spent. The best run is the one least disturbed by the rest of the machine (the
// development machine has 2 cores shared with other work, so medians wander by 10 %).
double best_seconds(const std::function<void()>& call) {
  using Clock = std::chrono::steady_clock;
  call();
  double best = 1e30, spent = 0.0;
  for (int run = 0; run < 40 && (run < 5 || spent < 1.0); ++run) {
    const auto start = Clock::now();
    call();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, seconds);
    spent += seconds;
  }
  return best;
}

double gflops(const GemmShape& s, double seconds) {
  return 2.0 * static_cast<double>(s.m) * s.n * s.k / seconds * 1e-9;
}

std::vector<float> random_floats(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values)
    v = dist(rng);
  return values;
}

// The practical peak: each BLAS called directly at the large square sizes.
struct Peak {
  std::string blas;
  double gflops = 0.0;
};

Peak measure_peak(int threads) {
  Peak peak;
  for (const long size : {1024L, 1536L, 2048L}) {
    const GemmShape s{"square", size, size, size};
    const std::vector<float> a = random_floats(size * size, 1), b = random_floats(size * size, 2);
    std::vector<float> c(size * size);
    auto consider = [&](const char* blas, const std::function<void()>& call) {
      const double g = gflops(s, best_seconds(call));
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

int run_gemm(const GemmOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  hn::DriverOptions driver_options;
  driver_options.threads = threads;
  driver_options.blas = options.blas;
  const std::unique_ptr<hn::Driver> driver =
      hn::make_driver(hn::Device{hn::DeviceKind::cpu, 0}, driver_options);
  const std::string blas = options.blas.empty() ? hn::cpu_blas_backends().front() : options.blas;
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

GemmOptions parse_gemm(const std::vector<std::string>& args) {
  GemmOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if ((arg == "--threads" || arg == "--blas") && i + 1 == args.size()) {
      throw UsageError{"gemm: " + arg + " needs a value"};
    }
    if (arg == "--threads") {
      const std::string& value = args[++i];
      char* end = nullptr;
      const long threads = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || threads < 0 || threads > 4096) {
        throw UsageError{"gemm: --threads needs a number >= 0, got '" + value + "'"};
      }
      options.threads = static_cast<int>(threads);
    } else if (arg == "--blas") {
      options.blas = args[++i];
    } else {
      throw UsageError{"gemm: unknown option '" + arg + "'"};
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + std::min(argc, 2), argv + argc);
  const std::string command = argc >= 2 ? argv[1] : "";
  try {
    if (command == "gemm") return run_gemm(parse_gemm(args));
    if (command == "-h" || command == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    throw UsageError{command.empty() ? "missing command" : "unknown command '" + command + "'"};
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hybridnn-bench: %s\n%s", e.message.c_str(), kUsage);
    return kUsageError;
  } catch (const hn::Error& e) {
    std::fprintf(stderr, "hybridnn-bench: %s\n", e.what());
    return 1;
  }
}
