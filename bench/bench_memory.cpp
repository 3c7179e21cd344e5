// hybridnn-bench memory: one case per process, its time per iteration beside its peak
// resident memory (the kernel's high-water mark, so a process must run one case only):
// a model's forward + full backward on the CPU driver, or a solver's training iterations
// (the solver's history included). bench/vs_pytorch.py runs it beside PyTorch's figures.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "lib/solver/solver.h"

namespace hn::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct MemoryOptions {
  std::string model;   // forward + backward (empty: CaffeNet's deploy prototxt)
  std::string solver;  // training instead
  int batch = 32;      // of the model (the solver's nets keep theirs)
  int iterations = 3;
  int threads = 0;
};

MemoryOptions parse_memory_options(const std::vector<std::string>& args) {
  MemoryOptions options;
  const auto number = [](const std::string& option, const std::string& value, int high) {
    char* end = nullptr;
    const long n = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n < 1 || n > high) {
      throw UsageError{
          fmt::format("memory: {} needs a number in [1, {}], got '{}'", option, high, value)};
    }
    return static_cast<int>(n);
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg != "--model" && arg != "--solver" && arg != "--batch" && arg != "--iterations" &&
        arg != "--threads") {
      throw UsageError{"memory: unknown option '" + arg + "'"};
    }
    if (i + 1 == args.size()) throw UsageError{"memory: " + arg + " needs a value"};
    const std::string& value = args[++i];
    if (arg == "--model") options.model = value;
    if (arg == "--solver") options.solver = value;
    if (arg == "--batch") options.batch = number(arg, value, 4096);
    if (arg == "--iterations") options.iterations = number(arg, value, 100000);
    if (arg == "--threads") options.threads = parse_threads("memory", value);
  }
  if (!options.model.empty() && !options.solver.empty())
    throw UsageError{"memory: --model and --solver are two cases: run one per process"};
  return options;
}

std::size_t param_bytes(const Net& net) {
  std::size_t bytes = 0;
  for (const NetParam& param : net.learnable_params())
    bytes += 2 * sizeof(float) * static_cast<std::size_t>(param.tensor->count());
  return bytes;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int run_memory(const std::vector<std::string>& args) {
  MemoryOptions options = parse_memory_options(args);
  Runtime runtime;
  DriverOptions driver_options;
  driver_options.set("threads", resolve_threads(options.threads));
  Driver& driver = runtime.add(Device::parse("cpu"), driver_options);
  const bool train = !options.solver.empty();
  std::string fields;
  double seconds = 0.0;
  if (train) {
    Solver solver(options.solver, runtime, driver);
    solver.step(1);  // warm-up: the first iteration allocates the history and workspaces
    const auto start = Clock::now();
    solver.step(options.iterations);
    seconds = seconds_since(start);
    const Net& net = solver.net();
    fields =
        fmt::format(R"("case":"train","solver":"{}","batch":{},"param_bytes":{},)"
                    R"("activation_bytes":{})",
                    options.solver, net.batch_size(), param_bytes(net), net.activation_bytes());
  } else {
    if (options.model.empty()) {
      const char* dir = std::getenv("HYBRIDNN_MODELS_DIR");
      options.model = std::string(dir != nullptr ? dir : HYBRIDNN_MODELS_DIR) +
                      "/bvlc_reference_caffenet_deploy.prototxt";
    }
    NetOptions net_options;
    net_options.batch_size = options.batch;
    net_options.force_backward = true;
    Net net(options.model, runtime, driver, net_options);
    fill_inputs(net);
    const auto iteration = [&] {
      net.forward();
      net.backward();
      driver.synchronize();
    };
    iteration();  // warm-up
    const auto start = Clock::now();
    for (int i = 0; i < options.iterations; ++i)
      iteration();
    seconds = seconds_since(start);
    fields = fmt::format(R"("case":"fwd_bwd","model":"{}","batch":{},"param_bytes":{},)"
                         R"("activation_bytes":{})",
                         options.model, net.batch_size(), param_bytes(net), net.activation_bytes());
  }
  fmt::print(R"({{"bench":"memory",{},"threads":{},"iterations":{},"ms_per_iteration":{:.1f},)"
             R"("peak_rss_bytes":{}}})"
             "\n",
             fields, resolve_threads(options.threads), options.iterations,
             seconds * 1e3 / options.iterations, peak_resident_bytes());
  return 0;
}

}  // namespace hn::bench
