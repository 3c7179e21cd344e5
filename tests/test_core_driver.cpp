// The core-only driver (tests/core_driver.h) trains a real net: every optional call runs its
// generic implementation, and LeNet's losses follow the reference driver's.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/solver/solver.h"
#include "tests/core_driver.h"
#include "tests/support.h"

using namespace hn;

namespace {

// Caffe's LeNet solver settings and train/test net, at batch 16, on generated images.
std::vector<float> lenet_losses(const std::string& device, const DriverOptions& options,
                                int iterations) {
  test::TempDir dir{"hybridnn-core"};
  std::ifstream in(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR));
  std::stringstream text;
  text << in.rdbuf();
  std::string net = text.str();
  for (std::size_t at = net.find("batch_size: 64"); at != std::string::npos;
       at = net.find("batch_size: 64", at)) {
    net.replace(at, 14, "batch_size: 16");
  }
  const std::string net_file = dir.write("lenet.prototxt", net);
  const std::string solver_file =
      dir.write("solver.prototxt",
                fmt::format("net: \"{}\"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n"
                            "lr_policy: \"inv\"\ngamma: 0.0001\npower: 0.75\nmax_iter: 100\n"
                            "snapshot_after_train: false\n",
                            net_file));
  SolverOptions solver_options;
  solver_options.train_data = solver_options.test_data = "synthetic:1x28x28";
  solver_options.seed = 5;
  Runtime runtime;
  Solver solver(solver_file, runtime, runtime.add(Device::parse(device), options), solver_options);
  std::vector<float> losses;
  for (int i = 0; i < iterations; ++i) {
    solver.step(1);
    losses.push_back(solver.last_loss());
  }
  return losses;
}

}  // namespace

TEST_CASE("a driver implementing only the core trains LeNet to the reference driver's losses",
          "[generic][solver]") {
  test::register_core_driver();
  const int iterations = 6;
  const std::vector<float> reference = lenet_losses("reference", {}, iterations);
  const bool separate = GENERATE(false, true);
  DYNAMIC_SECTION((separate ? "separate memory" : "host memory")) {
    DriverOptions options;
    options.set("separate_memory", separate);
    const std::vector<float> core = lenet_losses("core", options, iterations);
    REQUIRE(core.size() == reference.size());
    for (int i = 0; i < iterations; ++i) {
      INFO("iteration " << i + 1);
      CHECK(core[i] == Approx(reference[i]).epsilon(1e-4));
    }
    // Training moved the loss: the comparison is not between two idle nets.
    CHECK(reference.back() != reference.front());
  }
}
