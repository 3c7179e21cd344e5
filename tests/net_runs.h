// Whole-net runs for the split tests (host and GPU): one forward and complete backward of a
// Caffe example net from ../shared/models on generated data, with its loss and every
// gradient, so that a split run can be compared with the unsplit one.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/net/net.h"

namespace hn::test {

// The reference driver, and a second one with memory of its own (every access copies), so
// that a split between them shows its copies without a GPU.
struct TwoDrivers {
  Runtime runtime;
  Driver* host;
  Driver* device;
  TwoDrivers() {
    host = &runtime.add(Device::parse("reference"));
    DriverOptions separate;
    separate.set("separate_memory", true);
    device = &runtime.add(Device::parse("reference:1"), separate);
  }
};

struct NetGradients {
  float loss = 0.0f;
  std::vector<std::vector<float>> gradients;  // every parameter's, then the data's
};

// Every learnable parameter's gradient, whole (a layer cut by outputs holds one shard per
// device), in the Net's order.
inline std::vector<std::vector<float>> param_gradients(const Net& net) {
  std::vector<std::vector<float>> gradients;
  const std::vector<NetParam>& params = net.learnable_params();
  for (const WholeParam& whole : whole_params(params)) {
    std::vector<const float*> diffs;
    for (std::size_t i = whole.first; i < whole.last; ++i)
      diffs.push_back(params[i].tensor->host_diff());
    gradients.push_back(net.whole_values(whole, diffs));
  }
  return gradients;
}

// `file` in HYBRIDNN_MODELS_DIR on `source` at `batch`, on `main` with `split` ("" = none)
// in math mode `math` (unset: the prototxt's).
inline NetGradients net_gradients(Runtime& runtime, Driver& main, const std::string& file,
                                  const std::string& source, int batch, const std::string& split,
                                  const TuneOptions& tune = {},
                                  std::optional<MathMode> math = std::nullopt) {
  NetOptions options;
  options.tune = tune;
  options.math = math;
  options.data_source = source;
  options.mean_file = "none";
  options.batch_size = batch;
  options.force_backward = true;
  if (!split.empty()) options.split = Split::parse(split);
  Net net(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), runtime, main, options);
  net.clear_param_diffs();
  NetGradients result;
  result.loss = net.forward_backward();
  result.gradients = param_gradients(net);
  const BlobRef data = net.blob("data");
  result.gradients.emplace_back(data.host_diff(), data.host_diff() + data.count());
  return result;
}

// Caffe's CIFAR-10 quick net (HYBRIDNN_MODELS_DIR) on generated images at `batch`, on `main`,
// with `options` otherwise.
inline std::unique_ptr<Net> cifar_quick(Runtime& runtime, Driver& main, NetOptions options,
                                        index_t batch) {
  options.data_source = "synthetic:3x32x32";
  options.mean_file = "none";
  options.batch_size = batch;
  return std::make_unique<Net>(
      fmt::format("{}/cifar10_cifar10_quick_train_test.prototxt", HYBRIDNN_MODELS_DIR), runtime,
      main, options);
}

// Largest |a - b| relative to the largest |a|: the error of a gradient as a whole.
inline double max_scaled_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double scale = 1e-6, worst = 0.0;
  for (float x : a)
    scale = std::max(scale, static_cast<double>(std::fabs(x)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]) / scale;
    if (!(d <= worst)) worst = d;  // NaN propagates as a failure
  }
  return worst;
}

// The fraction of elements whose |a - b| exceeds `tolerance` times the largest |a|.
inline double fraction_beyond(const std::vector<float>& a, const std::vector<float>& b,
                              double tolerance) {
  if (a.size() != b.size() || a.empty()) return 1.0;
  double scale = 1e-6;
  for (float x : a)
    scale = std::max(scale, static_cast<double>(std::fabs(x)));
  std::size_t beyond = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(static_cast<double>(a[i]) - b[i]) <= tolerance * scale)) ++beyond;
  return static_cast<double>(beyond) / static_cast<double>(a.size());
}

}  // namespace hn::test
