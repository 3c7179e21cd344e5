// The hybrid split inside a Net: Caffe's LeNet and CIFAR-10 quick, cut between the reference
// driver on host memory and a second reference driver with memory of its own (a device),
// compute the same losses and gradients as the unsplit net, and activations stay on the
// device that computed them.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hybridnn/net.h"
#include "hybridnn/runtime.h"

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
