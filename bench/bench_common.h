// Shared pieces of hybridnn-bench: timing, random data, option parsing, and the practical
// sgemm peak that every benchmark reports its ratios against.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace hn {
class Net;
}  // namespace hn

namespace hn::bench {

// A command-line mistake: main prints it with the usage and exits with status 2.
struct UsageError {
  std::string message;
};

// Best time of one call in seconds: one warm-up, then at least `min_runs` and at most 40
// runs, stopping once `budget` seconds are spent. The best run is the one least disturbed
// by the rest of the machine (the development machine has 2 cores shared with other work,
// so medians wander by 10 %).
double best_seconds(const std::function<void()>& call, int min_runs = 5, double budget = 1.0);

std::vector<float> random_floats(std::size_t count, unsigned seed);
// Fills every input blob of `net` with random_floats (seed 1).
void fill_inputs(Net& net);

// Parses a thread count (0 = every core) for `command`'s --threads.
int parse_threads(const std::string& command, const std::string& value);
// Every core when `threads` is 0.
int resolve_threads(int threads);

// The practical peak: each BLAS built in, called directly (not through a driver) at large
// square sizes on `threads` threads; the best GFLOP/s of any.
struct Peak {
  std::string blas;
  double gflops = 0.0;
};
Peak measure_peak(int threads);

// hybridnn-bench gemm / layers / split / allreduce / memory; argument lists exclude the command
// name.
int run_gemm(const std::vector<std::string>& args);
int run_layers(const std::vector<std::string>& args);
int run_split(const std::vector<std::string>& args);
int run_allreduce(const std::vector<std::string>& args);
int run_memory(const std::vector<std::string>& args);

}  // namespace hn::bench
