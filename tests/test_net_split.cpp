// The hybrid split inside a Net: Caffe's LeNet and CIFAR-10 quick, cut between the reference
// driver on host memory and a second reference driver with memory of its own (a device),
// compute the same losses and gradients as the unsplit net, and activations stay on the
// device that computed them.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hybridnn/net.h"
#include "hybridnn/runtime.h"
#include "hybridnn/solver.h"

namespace hn {
namespace {

struct TwoDrivers {
  Runtime runtime;
  Driver* host;
  Driver* device;
  TwoDrivers() {
    host = &runtime.add(Device::parse("reference"));
    DriverOptions separate;
    separate.separate_memory = true;
    device = &runtime.add(Device::parse("reference:1"), separate);
  }
};

struct Result {
  float loss = 0.0f;
  std::vector<std::vector<float>> gradients;  // every parameter's, then the data's
};

Result run(TwoDrivers& d, const std::string& file, const std::string& source, int batch,
           const std::string& split) {
  NetOptions options;
  options.data_source = source;
  options.mean_file = "none";
  options.batch_size = batch;
  options.force_backward = true;
  if (!split.empty()) options.split = Split::parse(split);
  Net net(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), d.runtime, *d.host, options);
  net.clear_param_diffs();
  Result result;
  result.loss = net.forward_backward();
  for (const NetParam& param : net.learnable_params()) {
    const float* diff = param.tensor->host_diff();
    result.gradients.emplace_back(diff, diff + param.tensor->count());
  }
  const BlobRef data = net.blob("data");
  result.gradients.emplace_back(data.host_diff(), data.host_diff() + data.count());
  return result;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1e-6, worst = 0.0;
  for (float x : a)
    scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / scale);
  return worst;
}

TEST_CASE("split nets compute the unsplit losses and gradients") {
  TwoDrivers d;
  const std::pair<const char*, const char*> nets[] = {
      {"mnist_lenet_train_test.prototxt", "synthetic:1x28x28"},
      {"cifar10_cifar10_quick_train_test.prototxt", "synthetic:3x32x32"}};
  for (const auto& [file, source] : nets) {
    for (int batch : {8, 7}) {
      const Result whole = run(d, file, source, batch, "");
      for (const char* split : {"reference:1.0,reference:1:0.0", "reference:0.0,reference:1:1.0",
                                "reference:0.5,reference:1:0.5", "reference:0.75,reference:1:0.25",
                                "reference:0.125,reference:1:0.875"}) {
        INFO(file << " batch " << batch << " split " << split);
        const Result cut = run(d, file, source, batch, split);
        CHECK(cut.loss == Approx(whole.loss).epsilon(1e-6));
        REQUIRE(cut.gradients.size() == whole.gradients.size());
        for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
          INFO("gradient " << g);
          CHECK(max_rel_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("layers split alike keep their activations on the device that computed them") {
  TwoDrivers d;
  NetOptions options;
  options.data_source = "synthetic:1x28x28";
  options.batch_size = 8;
  options.split = Split::parse("reference:1");  // every layer that can: on the device
  Net net(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR), d.runtime,
          *d.host, options);
  net.forward();  // the first forward also copies the parameters
  d.device->reset_transfer_stats();
  net.forward();
  // Copied: only the new images onto the device (the data layer fills host memory) and ip2's
  // output back to the host, where the loss (which needs the whole batch) runs.
  const TransferStats& stats = d.device->transfer_stats();
  CHECK(stats.to_device_bytes == 8 * 28 * 28 * sizeof(float));
  CHECK(stats.to_host_bytes == 8 * 10 * sizeof(float));
  CHECK(stats.within == 0);
}

TEST_CASE("a split naming a device without a driver is an error naming the layer") {
  TwoDrivers d;
  NetOptions options;
  options.data_source = "synthetic:1x28x28";
  options.split = Split::parse("reference:0.5,cuda:3:0.5");
  CHECK_THROWS_WITH(
      Net(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR), d.runtime,
          *d.host, options),
      Catch::Contains("conv1") && Catch::Contains("cuda:3") && Catch::Contains("reference:1"));
}

}  // namespace
}  // namespace hn

namespace hn {
namespace {

// 50 SGD iterations of Caffe's LeNet (at batch 16, to keep the reference drivers quick) with
// the batch cut 1:1 between the reference driver and a second one with memory of its own
// track the unsplit run. With the reference drivers' double accumulation the two runs agree
// to the last bit here; the tolerance is the 1e-4 relative. (On the CPU driver the
// two halves use other convolution algorithms than the whole batch, and the rounding
// differences grow chaotically after some 30 iterations.)
TEST_CASE("LeNet training with a 1:1 split tracks the unsplit losses") {
  const std::string dir = fmt::format("{}/hybridnn_split_solver", P_tmpdir);
  std::filesystem::create_directories(dir);
  std::string net;
  {
    std::ifstream in(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR));
    net.assign(std::istreambuf_iterator<char>(in), {});
    const auto at = net.find("batch_size: 64");
    REQUIRE(at != std::string::npos);
    net.replace(at, 14, "batch_size: 16");
    std::ofstream(dir + "/lenet.prototxt") << net;
  }
  const std::string solver_path = dir + "/solver.prototxt";
  std::ofstream(solver_path) << "net: \"" << dir << "/lenet.prototxt\"\n"
                             << "base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n"
                                "lr_policy: \"inv\"\ngamma: 0.0001\npower: 0.75\n"
                                "max_iter: 50\nsnapshot_after_train: false\nrandom_seed: 3\n";
  auto losses = [&](const std::string& split) {
    TwoDrivers d;
    SolverOptions options;
    options.train_data = "synthetic:1x28x28";
    if (!split.empty()) options.split = Split::parse(split);
    Solver solver(solver_path, d.runtime, *d.host, options);
    std::vector<float> result;
    for (int i = 0; i < 50; ++i) {
      solver.step(1);
      result.push_back(solver.last_loss());
    }
    return result;
  };
  const std::vector<float> whole = losses("");
  const std::vector<float> cut = losses("reference:0.5,reference:1:0.5");
  REQUIRE(cut.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    INFO("iteration " << i);
    CHECK(std::fabs(cut[i] - whole[i]) <= 1e-4 * std::max(1.0f, std::fabs(whole[i])));
  }
  // The weights moved (random labels leave nothing to learn in 50 iterations).
  CHECK(std::count(whole.begin(), whole.end(), whole.front()) == 1);
}

}  // namespace
}  // namespace hn

namespace hn {
namespace {

// Determinism: two runs of the same split training give bitwise identical losses and
// weights (CPU driver instances, two threads each).
TEST_CASE("split training is bitwise reproducible") {
  const std::string dir = fmt::format("{}/hybridnn_split_repro", P_tmpdir);
  std::filesystem::create_directories(dir);
  const std::string solver_path = dir + "/solver.prototxt";
  std::ofstream(solver_path) << "net: \"" << HYBRIDNN_MODELS_DIR
                             << "/mnist_lenet_train_test.prototxt\"\n"
                                "base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n"
                                "lr_policy: \"fixed\"\nmax_iter: 10\n"
                                "snapshot_after_train: false\n";
  auto train = [&]() {
    Runtime runtime;
    Driver& main = runtime.add(Device::parse("cpu"));
    runtime.add(Device::parse("cpu:1"));
    SolverOptions options;
    options.train_data = "synthetic:1x28x28";
    options.split = Split::parse("cpu:0.7,cpu:1:0.3");
    Solver solver(solver_path, runtime, main, options);
    std::vector<float> result;
    for (int i = 0; i < 10; ++i) {
      solver.step(1);
      result.push_back(solver.last_loss());
    }
    for (const NetParam& param : solver.net().learnable_params()) {
      const float* w = param.tensor->host_data();
      result.insert(result.end(), w, w + param.tensor->count());
    }
    return result;
  };
  const std::vector<float> first = train();
  const std::vector<float> second = train();
  REQUIRE(first.size() == second.size());
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

}  // namespace
}  // namespace hn
