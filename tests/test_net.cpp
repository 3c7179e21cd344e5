// Net: phase rules, splits, in-place layers, shared parameters and loss weights checked
// against finite differences of the whole net's loss; memory reuse against the unshared
// run; caffemodel round trips; Caffe's example nets; errors that name the file and layer.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/layers/convolution_layer.h"
#include "lib/net/net.h"
#include "tests/net_runs.h"
#include "tests/recording_driver.h"
#include "tests/support.h"

namespace hn {
namespace {

using Catch::Matchers::Contains;

// Two fully connected layers sharing their weights, an in-place TanH, a blob consumed
// twice (split), a loss weight on a consumed blob and a softmax loss.
const char* kSmallNet = R"(
name: "small"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h"
        param { name: "w" } param { name: "b" lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "act" type: "TanH" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "h2"
        param { name: "w" } param { name: "b" } inner_product_param { num_output: 6 } }
layer { name: "sum" type: "Eltwise" bottom: "h" bottom: "h2" top: "s" }
layer { name: "ip3" type: "InnerProduct" bottom: "s" top: "logits" loss_weight: 0.01
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

struct Fixture {
  Runtime runtime;
  Driver* driver;
  explicit Fixture(const Device& device = Device::parse("reference"))
      : driver(&runtime.add(device)) {}
};

void set_inputs(Net& net) {
  const std::vector<float> x = test::random_floats(24, 7);
  std::copy(x.begin(), x.end(), net.blob("x").host_data_mut());
  float* label = net.blob("label").host_data_mut();
  for (int i = 0; i < 4; ++i)
    label[i] = static_cast<float>(i % 3);
}

std::string temp_path(const std::string& name) {
  return fmt::format("{}/hybridnn_test_net_{}", P_tmpdir, name);
}

TEST_CASE("Net inserts a split for a blob consumed twice and shares named parameters") {
  Fixture f;
  auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
  std::vector<std::string> types;
  for (int l = 0; l < net->num_layers(); ++l)
    types.emplace_back(net->layer_type(l));
  CHECK(std::count(types.begin(), types.end(), std::string("Split")) == 2);  // h and logits
  // w and b are owned by ip1 and reused by ip2: 2 + ip3's 2.
  REQUIRE(net->learnable_params().size() == 4);
  CHECK(net->learnable_params()[0].name == "w");
  CHECK(net->learnable_params()[1].lr_mult == 2.0f);
  CHECK(net->learnable_params()[1].decay_mult == 0.0f);
  CHECK(net->learnable_params()[2].name == "ip3.0");
  const float* bias = net->learnable_params()[1].tensor->host_data();
  for (int i = 0; i < 6; ++i)
    CHECK(bias[i] == 0.1f);
  // The loss, and the logits' loss weight moved onto their split (as Caffe does).
  const auto outputs = net->outputs();
  REQUIRE(outputs.size() == 2);
  CHECK(outputs[0].second == 0.01f);
  CHECK(outputs[1].first == "loss");
  CHECK(outputs[1].second == 1.0f);
}

// The whole net's gradient (parameters and the input, through splits, the in-place layer,
// the shared weights and the extra loss weight) against central differences of forward().
// Central differences of the net's loss (one forward each side, step eps) against the
// analytic gradients of every stride-th element of each (values, gradient) target: the
// largest error relative to max(1, |numeric|), and the largest |numeric|.
struct FiniteDifferences {
  double worst = 0.0, largest = 0.0;
};

FiniteDifferences finite_differences(
    Net& net, const std::vector<std::pair<float*, std::vector<float>>>& targets, float eps,
    std::size_t stride) {
  FiniteDifferences result;
  for (const auto& [values, gradient] : targets) {
    for (std::size_t i = 0; i < gradient.size(); i += stride) {
      const float saved = values[i];
      values[i] = saved + eps;
      const double plus = net.forward();
      values[i] = saved - eps;
      const double minus = net.forward();
      values[i] = saved;
      const double numeric = (plus - minus) / (2.0 * eps);
      const double error = std::fabs(numeric - gradient[i]) / std::max(1.0, std::fabs(numeric));
      result.worst = std::max(result.worst, error);
      result.largest = std::max(result.largest, std::fabs(numeric));
    }
  }
  return result;
}

// Caffe's Layer constructor takes the blobs written into a layer's parameter as its weights
// (the ONNX layer's expansion relies on it); they used to be dropped for the fillers'.
TEST_CASE("weights written into a prototxt layer (Caffe's inline blobs) are its weights") {
  Fixture f;
  const char* text = R"(
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
            inner_product_param { num_output: 2 }
            blobs { shape { dim: 2 dim: 3 } data: 1 data: 2 data: 3 data: 4 data: 5 data: 6 }
            blobs { shape { dim: 2 } data: 0.5 data: -0.5 } })";
  auto net = Net::from_text(text, "inline.prototxt", f.runtime, *f.driver);
  const float x[3] = {1.0f, 10.0f, 100.0f};
  std::copy(x, x + 3, net->blob("x").host_data_mut());
  net->forward();
  const float* y = net->blob("y").host_data();
  CHECK(y[0] == 321.5f);  // 1 + 20 + 300 + 0.5
  CHECK(y[1] == 653.5f);  // 4 + 50 + 600 - 0.5
  const char* wrong = R"(
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
            inner_product_param { num_output: 2 bias_term: false }
            blobs { shape { dim: 3 dim: 2 } data: 1 data: 2 data: 3 data: 4 data: 5 data: 6 } })";
  CHECK_THROWS_WITH(Net::from_text(wrong, "inline.prototxt", f.runtime, *f.driver),
                    Contains("inline.prototxt") && Contains("'ip'"));
}

// Issue 35's recorded iterations (CUDA graphs; the GPU suite replays one): drivers whose
// calls run as they are made record nothing, say so, and the net runs as before.
TEST_CASE("a net on a driver that runs calls as they are made records no iteration") {
  for (const char* device : {"reference", "cpu"}) {
    INFO(device);
    Fixture f{Device::parse(device)};
    CHECK_FALSE(f.driver->records());
    std::string why;
    CHECK_FALSE(f.driver->begin_recording(why));
    CHECK_THAT(why, Contains(device) && Contains("records none"));
    auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
    set_inputs(*net);
    net->clear_param_diffs();
    const float loss = net->forward_backward();
    const std::vector<std::vector<float>> gradients = test::param_gradients(*net);
    why.clear();
    CHECK(net->record_iteration(why) == nullptr);
    CHECK_THAT(why, Contains(device));
    net->clear_param_diffs();
    CHECK(net->forward_backward() == loss);
    CHECK(test::param_gradients(*net) == gradients);
  }
  // A split net is refused before any driver is asked: its calls run on several drivers.
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  runtime.add(Device::parse("reference"));
  NetOptions options;
  options.split = Split::parse("cpu:0.5,reference:0.5");
  auto split = Net::from_text(kSmallNet, "small.prototxt", runtime, cpu, options);
  set_inputs(*split);
  split->forward_backward();
  std::string why;
  CHECK(split->record_iteration(why) == nullptr);
  CHECK_THAT(why, Contains("split") && Contains("'ip1'"));
}

// The same on a driver that records (test::RecordingDriver, the reference driver's calls kept
// and replayed, as a CUDA graph holds a stream's): a net with a loss records its forward and
// backward, and each replay computes on the inputs of its time what the calls made one by
// one compute, bit for bit; a wait inside a recording fails it, naming the call.
TEST_CASE("a net on a driver that records replays its iteration as the calls made one by one") {
  Runtime runtime;
  auto& recorder =
      static_cast<test::RecordingDriver&>(runtime.add(std::make_unique<test::RecordingDriver>()));
  auto net = Net::from_text(kSmallNet, "small.prototxt", runtime, recorder);
  const auto set_x = [&](unsigned seed) {
    const std::vector<float> x = test::random_floats(24, seed);
    std::copy(x.begin(), x.end(), net->blob("x").host_data_mut());
  };
  set_inputs(*net);
  const auto eager = [&](unsigned seed) {
    set_x(seed);
    net->clear_param_diffs();
    const float loss = net->forward_backward();
    return std::pair{loss, test::param_gradients(*net)};
  };
  const auto first = eager(7);
  std::string why;
  net->clear_param_diffs();
  const std::unique_ptr<Driver::Recording> recording = net->record_iteration(why);
  INFO(why);
  REQUIRE(recording != nullptr);
  CHECK(recorder.recorded_calls() > 0);
  net->replay_iteration(*recording, false);
  CHECK(net->read_loss() == first.first);
  CHECK(test::param_gradients(*net) == first.second);
  // New inputs: the replay reads them where the recorded calls do.
  const auto second = eager(8);
  CHECK(second.first != first.first);
  set_x(8);
  net->clear_param_diffs();
  net->replay_iteration(*recording);
  CHECK(net->read_loss() == second.first);
  CHECK(test::param_gradients(*net) == second.second);
  // A wait inside a recording fails it, naming the call; the driver runs calls again after.
  REQUIRE(recorder.begin_recording(why));
  CHECK_THROWS_WITH(recorder.synchronize(), Contains("synchronize"));
  CHECK(recorder.end_recording(why) == nullptr);
  CHECK_THAT(why, Contains("synchronize") && Contains("cannot be recorded"));
  CHECK(eager(8) == second);
}

// The loss layers keep their loss, normaliser and loss weight on the driver (no value read
// back), so a net ending in each records; a loss weight of 2.5 reaches the gradients from
// the output's gradient on the driver.
TEST_CASE(
    "a net ending in each loss layer records its iteration and replays its loss and gradients") {
  const char* losses[] = {
      R"(layer { name: "loss" type: "SoftmaxWithLoss" bottom: "y" bottom: "label" top: "loss"
                 loss_weight: 2.5 loss_param { normalization: FULL } })",
      R"(layer { name: "loss" type: "SoftmaxWithLoss" bottom: "y" bottom: "label" top: "loss"
                 loss_weight: 2.5 })",
      R"(layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss"
                 loss_weight: 2.5 })",
      R"(layer { name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "y" bottom: "target"
                 top: "loss" loss_weight: 2.5 })"};
  for (const char* loss : losses) {
    INFO(loss);
    const std::string text = std::string(R"(
name: "losses"
layer { name: "in" type: "Input" top: "x" top: "label" top: "target"
        input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "silence" type: "Silence" bottom: "label" bottom: "target" }
)") + loss;
    Runtime runtime;
    Driver& recorder = runtime.add(std::make_unique<test::RecordingDriver>());
    auto net = Net::from_text(text, "losses.prototxt", runtime, recorder);
    const std::vector<float> x = test::random_floats(20, 3);
    std::copy(x.begin(), x.end(), net->blob("x").host_data_mut());
    float* label = net->blob("label").host_data_mut();
    for (int i = 0; i < 4; ++i)
      label[i] = static_cast<float>(i % 3);
    const std::vector<float> target = test::random_floats(12, 4);
    float* t = net->blob("target").host_data_mut();
    for (int i = 0; i < 12; ++i)
      t[i] = target[i] > 0.0f ? 1.0f : 0.0f;  // a probability for the cross entropy
    net->clear_param_diffs();
    const float eager = net->forward_backward();
    const std::vector<std::vector<float>> gradients = test::param_gradients(*net);
    CHECK(eager != 0.0f);
    std::string why;
    net->clear_param_diffs();
    const std::unique_ptr<Driver::Recording> recording = net->record_iteration(why);
    INFO(why);
    REQUIRE(recording != nullptr);
    net->replay_iteration(*recording, false);
    CHECK(net->read_loss() == eager);
    CHECK(test::param_gradients(*net) == gradients);
  }
}

TEST_CASE("Net backward matches finite differences of the net loss") {
  Fixture f;
  NetOptions options;
  options.force_backward = true;
  auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver, options);
  set_inputs(*net);
  net->clear_param_diffs();
  net->forward();
  net->backward();
  std::vector<std::pair<float*, std::vector<float>>> targets;  // value, analytic gradient
  for (const NetParam& param : net->learnable_params()) {
    const float* diff = param.tensor->host_diff();
    targets.emplace_back(param.tensor->host_data_mut(),
                         std::vector<float>(diff, diff + param.tensor->count()));
  }
  {
    const BlobRef x = net->blob("x");
    targets.emplace_back(x.host_data_mut(),
                         std::vector<float>(x.host_diff(), x.host_diff() + x.count()));
  }
  CHECK(finite_differences(*net, targets, 1e-2f, 1).worst < 2e-3);
}

// BatchNorm + Scale [+ ReLU] chains for NetOptions::fuse_layers: bn1 (stored statistics)
// -> scale1 -> relu1 in place after a pooling fuses whole into scale1 (relu1's output is
// read twice: a split); bn2 uses batch statistics in training and stays, in the test phase
// it folds into conv2 (no bias of its own) with relu2 (slope 0.1) its activation; bn3 ->
// scale3 (no bias) folds into conv3 (a bias) without a ReLU; bn4 is not in place and stays.
// (No in-place layer follows a ReLU: its backward reads the blob as the ReLU's output, as
// Caffe's does.)
const char* kNormNet = R"(
name: "norms"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 16 dim: 5 dim: 4 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "pool1" type: "Pooling" bottom: "c1" top: "p1"
        pooling_param { pool: AVE kernel_size: 1 } }
layer { name: "bn1" type: "BatchNorm" bottom: "p1" top: "p1"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "p1" top: "p1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "p1" top: "p1" }
layer { name: "conv2" type: "Convolution" bottom: "p1" top: "c2"
        convolution_param { num_output: 16 kernel_size: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn2" type: "BatchNorm" bottom: "c2" top: "c2" }
layer { name: "scale2" type: "Scale" bottom: "c2" top: "c2" scale_param { bias_term: true } }
layer { name: "relu2" type: "ReLU" bottom: "c2" top: "c2" relu_param { negative_slope: 0.1 } }
layer { name: "conv3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn3" type: "BatchNorm" bottom: "c3" top: "c3"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale3" type: "Scale" bottom: "c3" top: "c3" }
layer { name: "sum" type: "Eltwise" bottom: "c3" bottom: "p1" top: "s"
        eltwise_param { coeff: 1 coeff: 0.5 } }
layer { name: "relu_sum" type: "ReLU" bottom: "s" top: "s" relu_param { negative_slope: 0.05 } }
layer { name: "bn4" type: "BatchNorm" bottom: "s" top: "n4"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale4" type: "Scale" bottom: "n4" top: "n4" scale_param { bias_term: true } }
layer { name: "ip" type: "InnerProduct" bottom: "n4" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

struct NormRun {
  float loss = 0.0f;
  std::vector<std::vector<float>> gradients;  // every parameter's, then the input's
  std::map<std::string, std::string> algorithms;
};

// One forward + backward of a net with inputs "x" (random values from `seed`) and "label"
// (classes 0, 1, 2 for its 3 images).
NormRun run_labelled(Net& net, std::uint32_t seed) {
  const BlobRef x = net.blob("x");
  const std::vector<float> values = test::random_floats(static_cast<std::size_t>(x.count()), seed);
  std::copy(values.begin(), values.end(), x.host_data_mut());
  float* label = net.blob("label").host_data_mut();
  for (int i = 0; i < 3; ++i)
    label[i] = static_cast<float>(i);
  net.clear_param_diffs();
  NormRun run;
  run.loss = net.forward_backward();
  run.gradients = test::param_gradients(net);
  run.gradients.emplace_back(x.host_diff(), x.host_diff() + x.count());
  for (int l = 0; l < net.num_layers(); ++l)
    run.algorithms[net.layer_name(l)] = net.layer_algorithm(l);
  return run;
}

// `conv_choice`: the algorithm every convolution takes in every direction (measured, then
// overridden through TuneOptions::agree as rank 0's choice would be); empty: no tuning.
NormRun run_norm_net(const Device& device, bool fuse, bool blocked, Phase phase,
                     const std::string& conv_choice = "", const std::string& split = "",
                     const char* text = kNormNet,
                     const std::function<void(Net&, Driver&)>& before_run = {}) {
  Runtime runtime;
  Driver& driver = runtime.add(device);
  NetOptions options;
  if (!split.empty()) {
    DriverOptions separate;  // a device with memory of its own, as a GPU
    separate.set("separate_memory", true);
    runtime.add(Device::parse("reference:1"), separate);
    options.split = Split::parse(split);
  }
  options.force_backward = true;
  options.fuse_layers = fuse;
  options.blocked_layout = blocked;
  options.state.phase = phase;
  if (!conv_choice.empty()) {
    options.tune.mode = TuneMode::once;
    options.tune.cache_path = "none";
    options.tune.agree = [conv_choice](const std::string&) { return conv_choice; };
  }
  auto net = Net::from_text(text, "norms.prototxt", runtime, driver, options);
  std::uint32_t seed = 40;
  for (const NetParam& p : net->learnable_params()) {
    const std::vector<float> r =
        test::random_floats(static_cast<std::size_t>(p.tensor->count()), seed++);
    float* data = p.tensor->host_data_mut();
    for (index_t i = 0; i < p.tensor->count(); ++i) {
      const float v = r[static_cast<std::size_t>(i)];
      // BatchNorm: means, variances around 1, factor 2; Scale: multipliers around 1.
      if (p.layer.rfind("bn", 0) == 0) {
        data[i] = p.index == 0 ? 0.2f * v : p.index == 1 ? 1.6f + v : 2.0f;
      } else if (p.layer.rfind("scale", 0) == 0) {
        data[i] = p.index == 0 ? 1.0f + 0.5f * v : 0.2f * v;
      } else if (p.layer.rfind("conv", 0) != 0 && p.layer != "ip") {
        data[i] = v;
      }
    }
  }
  if (before_run) before_run(*net, driver);
  return run_labelled(*net, 9);
}

TEST_CASE(
    "Net fuses in-place BatchNorm (stored statistics) + Scale (+ ReLU) and Eltwise SUM + ReLU "
    "chains and computes what the unfused layers do, NCHW and blocked, on the CPU and "
    "reference drivers",
    "[net][fusion]") {
  const char* device = GENERATE("cpu", "reference");
  const bool blocked = GENERATE(false, true);
  INFO(device << (blocked ? ", blocked" : ", NCHW"));
  const NormRun fused = run_norm_net(Device::parse(device), true, blocked, Phase::train);
  const NormRun plain = run_norm_net(Device::parse(device), false, blocked, Phase::train);
  CHECK(fused.algorithms.at("bn1") == "fused into 'scale1'");
  CHECK(fused.algorithms.at("relu1") == "fused into 'scale1'");
  CHECK(fused.algorithms.at("scale1") == "fused: BatchNorm 'bn1' + Scale + ReLU 'relu1'");
  CHECK(fused.algorithms.at("bn2").empty());  // batch statistics in training
  CHECK(fused.algorithms.at("scale2").empty());
  CHECK(fused.algorithms.at("relu2").empty());
  CHECK(fused.algorithms.at("bn3") == "fused into 'conv3'");
  CHECK(fused.algorithms.at("scale3") == "fused into 'conv3'");
  CHECK_THAT(fused.algorithms.at("conv3"),
             Catch::EndsWith(", folded: BatchNorm 'bn3' + Scale 'scale3'"));
  CHECK(fused.algorithms.at("bn4").empty());  // not in place
  CHECK(fused.algorithms.at("relu_sum") == "fused into 'sum'");
  CHECK(fused.algorithms.at("sum") == "fused: Eltwise + ReLU 'relu_sum'");
  CHECK(plain.algorithms.at("scale1").empty());
  CHECK(plain.algorithms.at("sum").empty());
  CHECK(std::fabs(fused.loss - plain.loss) <= 1e-5 * std::max(1.0f, std::fabs(plain.loss)));
  REQUIRE(fused.gradients.size() == plain.gradients.size());
  for (std::size_t g = 0; g < plain.gradients.size(); ++g) {
    INFO("gradient " << g);
    CHECK(test::max_scaled_diff(plain.gradients[g], fused.gradients[g]) <= 1e-5);
  }
  // In the test phase bn2 normalises with its stored statistics too: its chain fuses.
  const NormRun test_phase = run_norm_net(Device::parse(device), true, blocked, Phase::test);
  CHECK(test_phase.algorithms.at("scale2") == "fused into 'conv2'");
  CHECK(test_phase.algorithms.at("relu2") == "fused into 'conv2'");
  CHECK_THAT(test_phase.algorithms.at("conv2"),
             Catch::EndsWith(", folded: BatchNorm 'bn2' + Scale 'scale2'"));
  // Folded, the test phase's loss and gradients are the layers' apart too.
  const NormRun test_plain = run_norm_net(Device::parse(device), false, blocked, Phase::test);
  CHECK(std::fabs(test_phase.loss - test_plain.loss) <=
        1e-5 * std::max(1.0f, std::fabs(test_plain.loss)));
  REQUIRE(test_phase.gradients.size() == test_plain.gradients.size());
  for (std::size_t g = 0; g < test_plain.gradients.size(); ++g) {
    INFO("test phase, gradient " << g);
    CHECK(test::max_scaled_diff(test_plain.gradients[g], test_phase.gradients[g]) <= 1e-5);
  }
}

TEST_CASE(
    "Net fuses BatchNorm + Scale + ReLU and Eltwise SUM + ReLU under a split too, each device "
    "on its rows, and computes what the unfused unsplit layers do",
    "[net][fusion][split]") {
  const Device reference = Device::parse("reference");
  const NormRun plain = run_norm_net(reference, false, false, Phase::train);
  for (const char* split : {"reference:0.5,reference:1:0.5", "auto:reference,reference:1"}) {
    INFO(split);
    const NormRun fused = run_norm_net(reference, true, false, Phase::train, "", split);
    const bool automatic = std::string(split).rfind("auto", 0) == 0;
    if (!automatic) {
      // Each device runs the fused chains on its rows (an automatic split may keep a layer on
      // one device).
      CHECK(fused.algorithms.at("scale1") ==
            "reference: fused: BatchNorm 'bn1' + Scale + ReLU 'relu1'; reference:1: fused: "
            "BatchNorm 'bn1' + Scale + ReLU 'relu1'");
      CHECK(fused.algorithms.at("sum") ==
            "reference: fused: Eltwise + ReLU 'relu_sum'; reference:1: fused: Eltwise + ReLU "
            "'relu_sum'");
    }
    CHECK(fused.algorithms.at("bn1") == "fused into 'scale1'");
    CHECK(fused.algorithms.at("relu1") == "fused into 'scale1'");
    CHECK(fused.algorithms.at("bn3") == "fused into 'conv3'");
    CHECK(fused.algorithms.at("relu_sum") == "fused into 'sum'");
    CHECK(std::fabs(fused.loss - plain.loss) <= 1e-5 * std::max(1.0f, std::fabs(plain.loss)));
    REQUIRE(fused.gradients.size() == plain.gradients.size());
    for (std::size_t g = 0; g < plain.gradients.size(); ++g) {
      INFO("gradient " << g);
      CHECK(test::max_scaled_diff(plain.gradients[g], fused.gradients[g]) <= 1e-5);
    }
  }
}

// Rectifiers in place after convolutions for NetOptions::fuse_layers: relu1, clip2 and relu3
// (a depthwise convolution's, slope 0.1) fuse; clip4 and relu5 are not in place: they stay.
const char* kConvActivationNet = R"(
name: "conv_activations"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 16 dim: 6 dim: 5 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 32 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "clip2" type: "Clip" bottom: "c2" top: "c2" clip_param { min: -0.2 max: 0.3 } }
layer { name: "conv3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 32 group: 32 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.6 } } }
layer { name: "relu3" type: "ReLU" bottom: "c3" top: "c3" relu_param { negative_slope: 0.1 } }
layer { name: "conv4" type: "Convolution" bottom: "c3" top: "c4"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "clip4" type: "Clip" bottom: "c4" top: "r4" clip_param { min: 0 max: 0.5 } }
layer { name: "conv5" type: "Convolution" bottom: "r4" top: "c5"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu5" type: "ReLU" bottom: "c5" top: "r5" relu_param { negative_slope: -0.5 } }
layer { name: "pool" type: "Pooling" bottom: "r5" top: "p"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

// The loss and every gradient of `fused` equal `plain`'s within float rounding.
void check_same_run(const NormRun& fused, const NormRun& plain) {
  CHECK(std::fabs(fused.loss - plain.loss) <= 1e-5 * std::max(1.0f, std::fabs(plain.loss)));
  REQUIRE(fused.gradients.size() == plain.gradients.size());
  for (std::size_t g = 0; g < plain.gradients.size(); ++g) {
    INFO("gradient " << g);
    CHECK(test::max_scaled_diff(plain.gradients[g], fused.gradients[g]) <= 1e-5);
  }
}

// Makes every convolution of `net` that has the driver's pointwise kernels run on them in
// every direction, listing their names in `chosen`.
void choose_pointwise(Net& net, Driver& driver, std::vector<std::string>& chosen) {
  for (int l = 0; l < net.num_layers(); ++l) {
    if (std::string(net.layer_type(l)) != "Convolution") continue;
    auto* conv = dynamic_cast<ConvolutionLayer*>(&net.layer(l));
    REQUIRE(conv != nullptr);
    const std::vector<Lowering> options = conv->candidates(driver);
    if (std::find(options.begin(), options.end(), Lowering::pointwise) == options.end()) continue;
    for (const ConvDirection d : kConvDirections)
      conv->choose(driver, d, Lowering::pointwise);
    chosen.push_back(net.layer_name(l));
  }
}

TEST_CASE(
    "Net runs an in-place ReLU or Clip as the convolution before it and computes what the "
    "layers apart do, NCHW and blocked, unsplit and split, on the CPU and reference drivers",
    "[net][fusion]") {
  const auto check_fused = [](const NormRun& fused) {
    CHECK(fused.algorithms.at("relu1") == "fused into 'conv1'");
    CHECK(fused.algorithms.at("clip2") == "fused into 'conv2'");
    CHECK(fused.algorithms.at("relu3") == "fused into 'conv3'");
    CHECK(fused.algorithms.at("clip4").empty());
    CHECK(fused.algorithms.at("relu5").empty());
  };
  for (const char* device : {"cpu", "reference"}) {
    for (const bool blocked : {false, true}) {
      INFO(device << (blocked ? ", blocked" : ", NCHW"));
      const NormRun fused = run_norm_net(Device::parse(device), true, blocked, Phase::train, "", "",
                                         kConvActivationNet);
      const NormRun plain = run_norm_net(Device::parse(device), false, blocked, Phase::train, "",
                                         "", kConvActivationNet);
      check_fused(fused);
      CHECK(plain.algorithms.at("relu1").empty());
      check_same_run(fused, plain);
    }
  }
  // Each device of a split runs the activation on its rows, its gradient on its copy of dy.
  const NormRun plain = run_norm_net(Device::parse("reference"), false, false, Phase::train, "", "",
                                     kConvActivationNet);
  for (const char* split : {"reference:0.5,reference:1:0.5", "cpu:0.34,reference:1:0.66"}) {
    INFO(split);
    const Device device = Device::parse(split[0] == 'c' ? "cpu" : "reference");
    const NormRun fused =
        run_norm_net(device, true, false, Phase::train, "", split, kConvActivationNet);
    check_fused(fused);
    check_same_run(fused, plain);
  }
}

// Residual sums for NetOptions::fuse_layers: add2 (conv2's output + conv1's, a ReLU in place
// after it) runs as conv2; add4 as conv4, the input computed last (conv3's output came
// first, as ResNet's shortcut convolution after conv3), with bn4 and scale4 folded into it
// (ResNet's block ends in Caffe's zoo); add5 has a coefficient other than 1 and stays
// apart.
const char* kResidualNet = R"(
name: "residuals"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 16 dim: 6 dim: 5 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "add2" type: "Eltwise" bottom: "c2" bottom: "c1" top: "s2" }
layer { name: "relu2" type: "ReLU" bottom: "s2" top: "s2" }
layer { name: "conv3" type: "Convolution" bottom: "s2" top: "c3"
        convolution_param { num_output: 16 kernel_size: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "conv4" type: "Convolution" bottom: "s2" top: "c4"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn4" type: "BatchNorm" bottom: "c4" top: "c4"
        batch_norm_param { use_global_stats: true } }
layer { name: "scale4" type: "Scale" bottom: "c4" top: "c4" scale_param { bias_term: true } }
layer { name: "add4" type: "Eltwise" bottom: "c3" bottom: "c4" top: "s4" }
layer { name: "conv5" type: "Convolution" bottom: "s4" top: "c5"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "add5" type: "Eltwise" bottom: "c5" bottom: "s4" top: "s5"
        eltwise_param { coeff: 1 coeff: 0.5 } }
layer { name: "pool" type: "Pooling" bottom: "s5" top: "p"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

TEST_CASE(
    "Net runs an Eltwise SUM as the convolution computing one of its inputs and computes what "
    "the layers apart do, with every algorithm, NCHW and blocked, unsplit and split",
    "[net][fusion]") {
  const auto check_fused = [](const NormRun& fused) {
    CHECK(fused.algorithms.at("add2") == "fused into 'conv2'");
    CHECK(fused.algorithms.at("relu2") == "fused into 'conv2'");
    CHECK_THAT(fused.algorithms.at("conv2"), Catch::EndsWith(", fused: + Eltwise 'add2'"));
    CHECK(fused.algorithms.at("add4") == "fused into 'conv4'");
    CHECK_THAT(fused.algorithms.at("conv4"),
               Catch::EndsWith(", folded: BatchNorm 'bn4' + Scale 'scale4', fused: + Eltwise "
                               "'add4'"));
    CHECK(fused.algorithms.at("scale4") == "fused into 'conv4'");
    CHECK_THAT(fused.algorithms.at("conv3"), !Catch::Contains("Eltwise"));
    CHECK(fused.algorithms.at("add5").empty());
  };
  const NormRun reference =
      run_norm_net(Device::parse("reference"), false, false, Phase::train, "", "", kResidualNet);
  for (const char* device : {"cpu", "reference"}) {
    for (const bool blocked : {false, true}) {
      INFO(device << (blocked ? ", blocked" : ", NCHW"));
      const NormRun fused =
          run_norm_net(Device::parse(device), true, blocked, Phase::train, "", "", kResidualNet);
      const NormRun plain =
          run_norm_net(Device::parse(device), false, blocked, Phase::train, "", "", kResidualNet);
      check_fused(fused);
      CHECK(plain.algorithms.at("add2").empty());
      check_same_run(fused, plain);
      check_same_run(fused, reference);
    }
  }
  // The CPU driver's kernels: oneDNN's (the sum as its post-op), a lowering (the sum in a
  // pass after it), and its own 1x1 kernels on blocked activations (in their last step).
  for (const auto& [choice, blocked] : std::vector<std::pair<const char*, bool>>{
           {"direct", true}, {"direct", false}, {"type1", false}}) {
    INFO(choice << (blocked ? ", blocked" : ", NCHW"));
    const NormRun fused =
        run_norm_net(Device::parse("cpu"), true, blocked, Phase::train, choice, "", kResidualNet);
    check_fused(fused);
    check_same_run(fused, reference);
  }
  std::vector<std::string> pointwise;
  const NormRun on_pointwise =
      run_norm_net(Device::parse("cpu"), true, true, Phase::train, "", "", kResidualNet,
                   [&](Net& net, Driver& driver) { choose_pointwise(net, driver, pointwise); });
  CHECK(pointwise == std::vector<std::string>{"conv2", "conv3", "conv5"});
  check_fused(on_pointwise);
  check_same_run(on_pointwise, reference);
  // Each device of a split adds its rows of the other input and copies its rows of the
  // gradient.
  for (const char* split : {"reference:0.5,reference:1:0.5", "cpu:0.34,reference:1:0.66"}) {
    INFO(split);
    const Device device = Device::parse(split[0] == 'c' ? "cpu" : "reference");
    const NormRun fused = run_norm_net(device, true, false, Phase::train, "", split, kResidualNet);
    check_fused(fused);
    check_same_run(fused, reference);
  }
}

TEST_CASE("Reading a convolution output that a fused sum never writes is an error naming it",
          "[net][fusion]") {
  Fixture f(Device::parse("cpu"));
  NetOptions options;
  options.fuse_layers = true;
  auto net = Net::from_text(kResidualNet, "residuals.prototxt", f.runtime, *f.driver, options);
  net->forward();
  CHECK_THAT(test::error_of([&] { static_cast<void>(net->blob("c2").host_data()); }),
             Catch::Contains("'c2'") && Catch::Contains("conv2") && Catch::Contains("keep_blobs"));
  // Kept, it is written: the two layers run apart.
  options.keep_blobs = {"c2"};
  auto kept = Net::from_text(kResidualNet, "residuals.prototxt", f.runtime, *f.driver, options);
  for (int l = 0; l < kept->num_layers(); ++l) {
    if (kept->layer_name(l) == "add2")
      CHECK(kept->layer_algorithm(l) == "fused: Eltwise + ReLU 'relu2'");
  }
  kept->forward();
  CHECK(kept->blob("c2").host_data() != nullptr);
}

TEST_CASE(
    "A net with ReLUs and Clips fused into its convolutions has gradients that match "
    "finite differences",
    "[net][fusion]") {
  const bool fuse = GENERATE(true, false);
  INFO((fuse ? "fused" : "apart"));
  Fixture f(Device::parse("cpu"));
  NetOptions options;
  options.force_backward = true;
  options.fuse_layers = fuse;
  auto net = Net::from_text(kConvActivationNet, "conv_activations.prototxt", f.runtime, *f.driver,
                            options);
  REQUIRE(net->layer_algorithm(2) == (fuse ? "fused into 'conv1'" : ""));
  const BlobRef x = net->blob("x");
  const std::vector<float> values = test::random_floats(static_cast<std::size_t>(x.count()), 8);
  std::copy(values.begin(), values.end(), x.host_data_mut());
  for (int i = 0; i < 3; ++i)
    net->blob("label").host_data_mut()[i] = static_cast<float>(i);
  net->clear_param_diffs();
  net->forward();
  net->backward();
  std::vector<std::pair<float*, std::vector<float>>> targets;
  for (const NetParam& p : net->learnable_params()) {
    if (p.layer != "conv1" && p.layer != "conv2" && p.layer != "conv3") continue;
    const float* diff = p.tensor->host_diff();
    p.tensor->data().retain();  // written through the pointer kept below, between forwards
    targets.emplace_back(p.tensor->host_data_mut(),
                         std::vector<float>(diff, diff + p.tensor->count()));
  }
  targets.emplace_back(x.host_data_mut(),
                       std::vector<float>(x.host_diff(), x.host_diff() + x.count()));
  // Every 5th element. The clips' and ReLUs' kinks lie close to some values, and a weight
  // moves the whole plane of outputs: a few steps cross one, so 98 % must agree to 2e-3 and
  // all to 1e-2 (the gradients are up to 0.05; leaving out the activation's gradient in the
  // fused convolutions puts a third of the elements off by more).
  std::size_t samples = 0, off = 0;
  double worst = 0.0, largest = 0.0;
  for (const auto& [data, gradient] : targets) {
    for (std::size_t i = 0; i < gradient.size(); i += 5) {
      const FiniteDifferences fd =
          finite_differences(*net, {{data + i, std::vector<float>{gradient[i]}}}, 1e-3f, 1);
      ++samples;
      off += fd.worst < 2e-3 ? 0 : 1;
      worst = std::max(worst, fd.worst);
      largest = std::max(largest, fd.largest);
    }
  }
  INFO(off << " of " << samples << " off by more than 2e-3, worst " << worst);
  CHECK(largest > 1e-2);
  CHECK(static_cast<double>(off) <= 0.02 * static_cast<double>(samples));
  CHECK(worst < 1e-2);
}

TEST_CASE(
    "Convolutions on blocked activations computed by the driver's NCHW kernels (direct_plain, a "
    "tuning candidate) equal the reference driver's, as the blocked kernels do",
    "[net][layout][tune]") {
  const NormRun reference = run_norm_net(Device::parse("reference"), false, false, Phase::train);
  const std::string blocked_name = fmt::format(
      "direct ({})",
      layout_name(make_driver(Device::parse("cpu"))->capabilities().preferred_blocked_layout));
  for (const char* choice : {"direct", "direct_plain"}) {
    INFO(choice);
    const NormRun cpu = run_norm_net(Device::parse("cpu"), true, true, Phase::train, choice);
    // The Net keeps conv1's input and output NCHW here; conv2 and conv3 compute on blocked
    // activations.
    CHECK(cpu.algorithms.at("conv1") == choice);
    for (const char* conv : {"conv2", "conv3"}) {
      INFO(conv);
      // (conv3 has bn3 and scale3 folded in: the text goes on to say so.)
      CHECK_THAT(
          cpu.algorithms.at(conv),
          Catch::StartsWith(std::string(choice) == "direct" ? blocked_name : std::string(choice)));
    }
    CHECK(std::fabs(cpu.loss - reference.loss) <= 1e-5 * std::max(1.0f, std::fabs(reference.loss)));
    REQUIRE(cpu.gradients.size() == reference.gradients.size());
    for (std::size_t g = 0; g < reference.gradients.size(); ++g) {
      INFO("gradient " << g);
      CHECK(test::max_scaled_diff(reference.gradients[g], cpu.gradients[g]) <= 1e-5);
    }
  }
  // A lowering cannot run blocked operands: the agreed choice names what the layer has.
  CHECK_THAT(
      test::error_of([] { run_norm_net(Device::parse("cpu"), true, true, Phase::train, "type1"); }),
      Catch::Contains("conv2") && Catch::Contains("'type1'"));
}

// 1x1 convolutions between blocked activations, one of them strided, with a bias and a
// fused ReLU (conv1 takes the NCHW input, conv4 gives the InnerProduct an NCHW one).
constexpr const char* kPointwiseNet = R"(
name: "pointwise"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 16 dim: 7 dim: 6 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 32 kernel_size: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu2" type: "ReLU" bottom: "c2" top: "c2" }
layer { name: "conv3" type: "Convolution" bottom: "c2" top: "c3"
        convolution_param { num_output: 16 kernel_size: 1 stride: 2
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu3" type: "ReLU" bottom: "c3" top: "c3" relu_param { negative_slope: 0.1 } }
layer { name: "conv4" type: "Convolution" bottom: "c3" top: "c4"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "c4" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

TEST_CASE(
    "1x1 convolutions on blocked and NCHW activations computed by the driver's pointwise "
    "kernels (a tuning candidate), a fused ReLU's gradient with them, equal the reference "
    "driver's",
    "[net][layout][tune][pointwise]") {
  const NormRun reference =
      run_norm_net(Device::parse("reference"), false, false, Phase::train, "", "", kPointwiseNet);
  for (const bool blocked : {true, false}) {
    INFO((blocked ? "blocked" : "NCHW"));
    std::vector<std::string> chosen;
    const NormRun cpu =
        run_norm_net(Device::parse("cpu"), true, blocked, Phase::train, "", "", kPointwiseNet,
                     [&](Net& net, Driver& driver) { choose_pointwise(net, driver, chosen); });
    // conv1 and conv4 (3x3, one side NCHW) have no pointwise kernel; conv2 and conv3 (1x1)
    // do where they are blocked; on NCHW conv2 (stride 1, its ReLU's gradient in the
    // driver's conv_backward_relu), not conv3 (stride 2).
    const std::vector<std::string> expected =
        blocked ? std::vector<std::string>{"conv2", "conv3"} : std::vector<std::string>{"conv2"};
    CHECK(chosen == expected);
    for (const std::string& conv : expected)
      CHECK(cpu.algorithms.at(conv) == "pointwise");
    CHECK(std::fabs(cpu.loss - reference.loss) <= 1e-5 * std::max(1.0f, std::fabs(reference.loss)));
    REQUIRE(cpu.gradients.size() == reference.gradients.size());
    for (std::size_t g = 0; g < reference.gradients.size(); ++g) {
      INFO("gradient " << g);
      CHECK(test::max_scaled_diff(reference.gradients[g], cpu.gradients[g]) <= 1e-5);
    }
  }
}

// conv1's weights are frozen (lr_mult 0) and its bias is not: its backward computes the
// bias gradient alone, from its output's gradient in whatever layout that blob is kept.
constexpr const char* kFrozenNet = R"(
name: "frozen"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 16 dim: 6 dim: 5 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        param { lr_mult: 0 } param { lr_mult: 1 }
        convolution_param { num_output: 16 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 }
                            bias_filler { type: "gaussian" std: 0.2 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
)";

TEST_CASE(
    "A convolution with frozen weights learns its bias from blocked output gradients as "
    "from NCHW ones",
    "[net][layout]") {
  const auto run = [](const char* device, bool blocked, Layout* c1_layout) {
    Runtime runtime;
    Driver& driver = runtime.add(Device::parse(device));
    NetOptions options;
    options.force_backward = true;
    options.blocked_layout = blocked;
    auto net = Net::from_text(kFrozenNet, "frozen.prototxt", runtime, driver, options);
    const BlobRef x = net->blob("x");
    const std::vector<float> v = test::random_floats(static_cast<std::size_t>(x.count()), 21);
    std::copy(v.begin(), v.end(), x.host_data_mut());
    net->forward();
    const BlobRef y = net->blob("c2");
    const std::vector<float> dy = test::random_floats(static_cast<std::size_t>(y.count()), 22);
    std::copy(dy.begin(), dy.end(), y.host_diff_mut());
    net->clear_param_diffs();
    net->backward();
    if (c1_layout != nullptr) *c1_layout = net->blob("c1").layout;
    for (const NetParam& p : net->learnable_params()) {
      if (p.layer == "conv1" && p.index == 1)
        return std::vector<float>(p.tensor->host_diff(), p.tensor->host_diff() + 16);
    }
    return std::vector<float>();
  };
  const std::vector<float> expected = run("reference", false, nullptr);
  REQUIRE(expected.size() == 16);
  CHECK(std::any_of(expected.begin(), expected.end(), [](float g) { return g != 0.0f; }));
  for (const bool blocked : {false, true}) {
    INFO((blocked ? "blocked" : "NCHW"));
    Layout layout = Layout::nchw;
    const std::vector<float> got = run("cpu", blocked, &layout);
    CHECK((layout != Layout::nchw) == blocked);
    CHECK(test::max_scaled_diff(expected, got) <= 1e-4);
  }
}

// SqueezeNet's tail: Dropout in place on blocked activations between two convolutions.
constexpr const char* kDropoutNet = R"(
name: "dropout"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 3 dim: 16 dim: 6 dim: 5 } shape { dim: 3 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 32 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "drop" type: "Dropout" bottom: "c1" top: "c1" dropout_param { dropout_ratio: 0.4 } }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "pool" type: "Pooling" bottom: "c2" top: "p"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

TEST_CASE(
    "Dropout on blocked activations keeps the NCHW mask: the net equals the reference driver's",
    "[net][layout]") {
  // The run, and the layout of c1, where the Dropout runs.
  const auto run = [](const char* device, bool blocked) {
    Runtime runtime;
    Driver& driver = runtime.add(Device::parse(device));
    NetOptions options;
    options.force_backward = true;
    options.blocked_layout = blocked;
    options.state.phase = Phase::train;
    auto net = Net::from_text(kDropoutNet, "dropout.prototxt", runtime, driver, options);
    return std::make_pair(run_labelled(*net, 31), net->blob("c1").layout);
  };
  const NormRun reference = run("reference", false).first;
  const auto [cpu, cpu_layout] = run("cpu", true);
  CHECK(cpu_layout != Layout::nchw);
  CHECK(std::fabs(cpu.loss - reference.loss) <= 1e-5 * std::max(1.0f, std::fabs(reference.loss)));
  REQUIRE(cpu.gradients.size() == reference.gradients.size());
  for (std::size_t g = 0; g < reference.gradients.size(); ++g) {
    INFO("gradient " << g);
    CHECK(test::max_scaled_diff(reference.gradients[g], cpu.gradients[g]) <= 1e-5);
  }
  // A mask drawn in memory order instead of the NCHW positions' order moves the loss by
  // 0.065 and the gradients by up to 0.9 of their largest element (checked). The NCHW run
  // on the same driver agrees too.
  const auto [nchw, nchw_layout] = run("cpu", false);
  CHECK(nchw_layout == Layout::nchw);
  CHECK(std::fabs(cpu.loss - nchw.loss) <= 1e-5 * std::max(1.0f, std::fabs(nchw.loss)));
}

TEST_CASE("A fused BatchNorm + Scale + ReLU net's gradients match finite differences",
          "[net][fusion]") {
  const bool fuse = GENERATE(true, false);
  INFO((fuse ? "fused" : "apart"));
  Fixture f(Device::parse("cpu"));
  NetOptions options;
  options.force_backward = true;
  options.fuse_layers = fuse;
  options.state.phase = Phase::test;  // every BatchNorm on its stored statistics
  auto net = Net::from_text(kNormNet, "norms.prototxt", f.runtime, *f.driver, options);
  for (const NetParam& p : net->learnable_params()) {
    float* data = p.tensor->host_data_mut();
    for (index_t i = 0; i < p.tensor->count(); ++i) {
      if (p.layer.rfind("bn", 0) == 0) data[i] = p.index == 1 ? 1.5f : p.index == 2 ? 1.0f : 0.1f;
      if (p.layer.rfind("scale", 0) == 0) data[i] = p.index == 0 ? 0.8f : 0.05f;
    }
  }
  const BlobRef x = net->blob("x");
  const std::vector<float> values = test::random_floats(static_cast<std::size_t>(x.count()), 3);
  std::copy(values.begin(), values.end(), x.host_data_mut());
  for (int i = 0; i < 3; ++i)
    net->blob("label").host_data_mut()[i] = static_cast<float>(2 - i);
  net->clear_param_diffs();
  net->forward();
  net->backward();
  // The fused layers' own parameters (Scale's multipliers and biases) and the input.
  std::vector<std::pair<float*, std::vector<float>>> targets;
  for (const NetParam& p : net->learnable_params()) {
    if (p.layer != "scale1" && p.layer != "scale3") continue;
    const float* diff = p.tensor->host_diff();
    p.tensor->data().retain();  // written through the pointer kept below, between forwards
    targets.emplace_back(p.tensor->host_data_mut(),
                         std::vector<float>(diff, diff + p.tensor->count()));
  }
  REQUIRE(targets.size() == 3);  // scale1's two, scale3's one
  targets.emplace_back(x.host_data_mut(),
                       std::vector<float>(x.host_diff(), x.host_diff() + x.count()));
  // Small steps: the ReLUs' kinks lie close to some of the values. Every 7th element.
  const FiniteDifferences fd = finite_differences(*net, targets, 2e-3f, 7);
  CHECK(fd.largest > 1e-3);  // the loss depends on them
  CHECK(fd.worst < 2e-3);
}

TEST_CASE("Net without memory reuse computes the same losses and gradients") {
  Fixture f;
  NetOptions shared, separate;
  separate.reuse_memory = false;
  auto a = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver, shared);
  auto b = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver, separate);
  set_inputs(*a);
  set_inputs(*b);
  a->clear_param_diffs();
  b->clear_param_diffs();
  CHECK(a->forward_backward() == b->forward_backward());
  for (std::size_t p = 0; p < a->learnable_params().size(); ++p) {
    const Tensor& ta = *a->learnable_params()[p].tensor;
    const Tensor& tb = *b->learnable_params()[p].tensor;
    const std::vector<float> da(const_cast<Tensor&>(ta).host_diff(),
                                const_cast<Tensor&>(ta).host_diff() + ta.count());
    CHECK(std::equal(da.begin(), da.end(), const_cast<Tensor&>(tb).host_diff()));
  }
}

// Caffe's DummyData fills constant tops once, at setup: the memory plan's zero-filled slots
// must not count as filled. Half the mean squared difference of 1s and 0.25s over 2 rows:
// 0.5 * 6 * 0.75^2 / 2.
TEST_CASE("Net DummyData constant fillers give their value from the first forward on") {
  const char* text = R"(
layer { name: "a" type: "DummyData" top: "a" dummy_data_param { shape { dim: 2 dim: 3 }
        data_filler { type: "constant" value: 1 } } }
layer { name: "b" type: "DummyData" top: "b" dummy_data_param { shape { dim: 2 dim: 3 }
        data_filler { type: "constant" value: 0.25 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "loss" }
)";
  for (const char* device : {"reference", "cpu"}) {
    CAPTURE(device);
    Fixture f{Device::parse(device)};
    auto net = Net::from_text(text, "dummy.prototxt", f.runtime, *f.driver);
    const double expected = 0.5 * 6 * 0.75 * 0.75 / 2;
    CHECK(net->forward() == Approx(expected).epsilon(1e-6));
    CHECK(net->forward() == Approx(expected).epsilon(1e-6));
    CHECK(net->blob("b").host_data()[5] == 0.25f);
  }
}

// s = ReLU(a + b) in place, y = sum(s) through a loss weight on an InnerProduct of ones:
// Caffe's diff(s) is the ReLU's masked gradient, 1 0 1 0 for a = [1, -1, 2, -2], b = 0.
// Fused (the default), the Eltwise writes the ReLU's gradient into its inputs' and never
// into s: reading it must fail; keep_blobs keeps the pair apart and gives Caffe's value.
TEST_CASE("Net gradient of a fused Eltwise + ReLU output is Caffe's or an error naming it",
          "[net][fusion]") {
  const char* text = R"(
force_backward: true
layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 1 dim: 4 } } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
layer { name: "relu" type: "ReLU" bottom: "s" top: "s" }
layer { name: "y" type: "InnerProduct" bottom: "s" top: "y" loss_weight: 1
        inner_product_param { num_output: 1 bias_term: false
                              weight_filler { type: "constant" value: 1 } } }
)";
  for (const bool keep : {false, true}) {
    CAPTURE(keep);
    Fixture f;
    NetOptions options;
    if (keep) options.keep_blobs = {"s"};
    auto net = Net::from_text(text, "fused.prototxt", f.runtime, *f.driver, options);
    const float a[] = {1, -1, 2, -2};
    std::copy(a, a + 4, net->blob("a").host_data_mut());
    std::fill_n(net->blob("b").host_data_mut(), 4, 0.0f);
    CHECK(net->forward() == Approx(3.0));
    net->backward();
    const std::vector<float> da(net->blob("a").host_diff(), net->blob("a").host_diff() + 4);
    CHECK(da == std::vector<float>{1, 0, 1, 0});
    if (keep) {
      CHECK(net->layer_algorithm(1).empty());  // not fused
      const float* ds = net->blob("s").host_diff();
      CHECK(std::vector<float>(ds, ds + 4) == std::vector<float>{1, 0, 1, 0});
    } else {
      CHECK(net->layer_algorithm(1) == "fused: Eltwise + ReLU 'relu'");
      CHECK_THROWS_WITH(net->blob("s").host_diff(),
                        Contains("'s'") && Contains("fused") && Contains("keep_blobs"));
    }
  }
}

// A blob whose memory the plan gave to a later blob reads as an error naming keep_blobs,
// through BlobRef as through the C ABI; before its memory is taken it reads its own values.
TEST_CASE("Net refuses to read a blob whose memory a later blob reused", "[net]") {
  const char* text = R"(
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 8 } } }
layer { name: "a" type: "TanH" bottom: "x" top: "a" }
layer { name: "b" type: "TanH" bottom: "a" top: "b" }
layer { name: "c" type: "TanH" bottom: "b" top: "c" }
layer { name: "d" type: "TanH" bottom: "c" top: "d" }
)";
  Fixture f;
  NetOptions options;
  options.state.phase = Phase::test;
  auto net = Net::from_text(text, "chain.prototxt", f.runtime, *f.driver, options);
  const std::vector<float> x = test::random_floats(16, 3);
  std::copy(x.begin(), x.end(), net->blob("x").host_data_mut());
  net->forward_layer(0);
  net->forward_layer(1);
  // 'a' holds tanh(x) until 'c' takes its memory (a and c are never live together).
  CHECK(net->blob("a").host_data()[0] == Approx(std::tanh(x[0])));
  net->forward_layer(2);
  net->forward_layer(3);
  CHECK_THROWS_WITH(net->blob("a").host_data(),
                    Contains("'a'") && Contains("'c'") && Contains("keep_blobs"));
  net->forward_layer(4);
  CHECK(net->blob("d").host_data()[0] ==
        Approx(std::tanh(std::tanh(std::tanh(std::tanh(x[0]))))).epsilon(1e-5));
}

// Caffe's shape and parameter rules that the net enforces (checked against Caffe's source:
// net.cpp, upgrade_proto.cpp, batch_norm_layer.cpp, input_layer.hpp).
TEST_CASE("Net follows Caffe's rules on param specs, propagate_down, inputs and legacy inputs",
          "[net]") {
  Fixture f;
  const auto build = [&](const std::string& text) {
    return Net::from_text(text, "rules.prototxt", f.runtime, *f.driver);
  };
  const std::string input =
      R"(layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
)";
  // BatchNorm's statistics cannot be learnable (three specs are an old net's, upgraded).
  CHECK_THROWS_WITH(build(input + R"(layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y"
                                             param { lr_mult: 1 } })"),
                    Contains("'bn'") && Contains("lr_mult"));
  CHECK_NOTHROW(build(input + R"(layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y"
      param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 } })"));
  // propagate_down: 0 or once per bottom.
  CHECK_THROWS_WITH(build(input + R"(layer { name: "in2" type: "Input" top: "z"
                                             input_param { shape { dim: 2 dim: 3 } } }
      layer { name: "e" type: "Eltwise" bottom: "x" bottom: "z" top: "y" propagate_down: false })"),
                    Contains("'e'") && Contains("propagate_down"));
  // Shared parameters: multipliers set twice must agree; one set later applies.
  const std::string shared = input + R"(
layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h" param { name: "w" LR1 }
        inner_product_param { num_output: 3 bias_term: false } }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "y" param { name: "w" LR2 }
        inner_product_param { num_output: 3 bias_term: false } })";
  const auto with = [&](const std::string& first, const std::string& second) {
    std::string text = shared;
    text.replace(text.find("LR1"), 3, first);
    text.replace(text.find("LR2"), 3, second);
    return text;
  };
  CHECK_THROWS_WITH(build(with("lr_mult: 1", "lr_mult: 2")),
                    Contains("'w'") && Contains("lr_mult 2") && Contains("'ip1'"));
  CHECK(build(with("", "lr_mult: 0"))->learnable_params().at(0).lr_mult == 0.0f);
  // Input takes no bottom.
  CHECK_THROWS_WITH(build(input + R"(layer { name: "in2" type: "Input" bottom: "x" top: "z"
                                             input_param { shape { dim: 1 } } })"),
                    Contains("'in2'") && Contains("no bottom"));
  // Legacy inputs: input_shape wins over input_dim, as Caffe's UpgradeNetInput reads.
  const auto legacy = build(R"(input: "data" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
                               input_dim: 1 input_dim: 1 input_dim: 1 input_dim: 1)");
  CHECK(*legacy->blob("data").shape == Shape{1, 3, 8, 8});
  // DummyData's legacy fields count one by one: 1 or once per top (Caffe accepts this).
  const auto dummy = build(R"(layer { name: "d" type: "DummyData" top: "a" top: "b"
      dummy_data_param { num: 10 channels: 3 channels: 1 height: 1 width: 1 } })");
  CHECK(*dummy->blob("a").shape == Shape{10, 3, 1, 1});
  CHECK(*dummy->blob("b").shape == Shape{10, 1, 1, 1});
  CHECK_THROWS_WITH(build(R"(layer { name: "d" type: "DummyData" top: "a"
                                     dummy_data_param { shape { dim: 2 } channels: 3 } })"),
                    Contains("either as shape or as num"));
  // A loss layer with no top still gives the loss (Caffe's anonymous top, weight 1): the
  // half squared distance of 1s and 0s over 2 rows of 3.
  const auto loss = build(R"(
layer { name: "a" type: "DummyData" top: "a" dummy_data_param { shape { dim: 2 dim: 3 }
        data_filler { type: "constant" value: 1 } } }
layer { name: "b" type: "DummyData" top: "b" dummy_data_param { shape { dim: 2 dim: 3 } } }
layer { name: "l" type: "EuclideanLoss" bottom: "a" bottom: "b" })");
  CHECK(loss->forward() == Approx(1.5));
  // Convolution's axis -3 is axis 1 of its 4-D input.
  CHECK(*build(R"(layer { name: "in" type: "Input" top: "x"
                          input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
                  layer { name: "c" type: "Convolution" bottom: "x" top: "y"
                          convolution_param { axis: -3 num_output: 4 kernel_size: 3 } })")
             ->blob("y")
             .shape == Shape{1, 4, 6, 6});
}

TEST_CASE("Net errors name the layer: a label out of range, model_parallel on a convolution",
          "[net]") {
  Fixture f{Device::parse("cpu")};
  auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
  set_inputs(*net);
  net->blob("label").host_data_mut()[2] = 7.0f;  // 3 classes
  CHECK_THROWS_WITH(net->forward(),
                    Contains("small.prototxt") && Contains("'loss'") && Contains("label 7"));
  // Refused with one rank as under mpirun (it was ignored alone).
  NetOptions options;
  options.model_parallel = {"conv"};
  CHECK_THROWS_WITH(Net::from_text(R"(layer { name: "in" type: "Input" top: "x"
                                input_param { shape { dim: 1 dim: 1 dim: 4 dim: 4 } } }
                        layer { name: "conv" type: "Convolution" bottom: "x" top: "y"
                                convolution_param { num_output: 2 kernel_size: 3 } })",
                                   "mp.prototxt", f.runtime, *f.driver, options),
                    Contains("'conv'") && Contains("model_parallel") && Contains("InnerProduct"));
}

TEST_CASE("Net include and exclude rules select layers by phase level and stage") {
  const char* text = R"(
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "train_only" type: "ReLU" bottom: "x" top: "a" include { phase: TRAIN } }
layer { name: "test_only" type: "ReLU" bottom: "x" top: "b" include { phase: TEST } }
layer { name: "deep" type: "ReLU" bottom: "x" top: "c" include { min_level: 2 } }
layer { name: "staged" type: "ReLU" bottom: "x" top: "d" include { stage: "s1" stage: "s2" } }
layer { name: "not_staged" type: "ReLU" bottom: "x" top: "e" exclude { stage: "s1" } }
)";
  Fixture f;
  auto names = [&](NetState state) {
    NetOptions options;
    options.state = state;
    auto net = Net::from_text(text, "rules.prototxt", f.runtime, *f.driver, options);
    std::vector<std::string> result;
    for (int l = 0; l < net->num_layers(); ++l)
      if (std::string(net->layer_type(l)) != "Split") result.push_back(net->layer_name(l));
    return result;
  };
  using V = std::vector<std::string>;
  CHECK(names({Phase::train, 0, {}}) == V{"in", "train_only", "not_staged"});
  CHECK(names({Phase::test, 2, {}}) == V{"in", "test_only", "deep", "not_staged"});
  CHECK(names({Phase::test, 0, {"s1"}}) == V{"in", "test_only"});
  CHECK(names({Phase::test, 0, {"s1", "s2"}}) == V{"in", "test_only", "staged"});
}

TEST_CASE("Net weights saved as a caffemodel reload into a net with other initial weights") {
  Fixture f;
  auto a = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
  NetOptions other_seed;
  other_seed.seed = 99;
  auto b = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver, other_seed);
  set_inputs(*a);
  set_inputs(*b);
  const float loss_a = a->forward();
  REQUIRE(b->forward() != loss_a);
  const std::string path = temp_path("roundtrip.caffemodel");
  a->save(path);
  CHECK(b->copy_trained_layers_from(path).empty());  // every layer found its weights
  CHECK(b->forward() == loss_a);
  std::remove(path.c_str());
}

TEST_CASE(
    "Net names the layers a caffemodel has no weights for, and refuses one that matches "
    "no layer") {
  Fixture f;
  auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
  const std::string path = temp_path("renamed.caffemodel");
  // The same net with ip3 renamed: ip3 keeps its values and is reported.
  std::string renamed = kSmallNet;
  for (std::size_t at = renamed.find("\"ip3\""); at != std::string::npos;
       at = renamed.find("\"ip3\"", at))
    renamed.replace(at, 5, "\"fc3\"");
  auto other = Net::from_text(renamed, "renamed.prototxt", f.runtime, *f.driver);
  other->save(path);
  CHECK(net->copy_trained_layers_from(path) == std::vector<std::string>{"ip3"});
  // Every layer renamed: the weights of another net, an error naming both sides' layers.
  std::string foreign = renamed;
  for (const char* name : {"ip1", "ip2"}) {
    const std::string quoted = fmt::format("\"{}\"", name);
    for (std::size_t at = foreign.find(quoted); at != std::string::npos;
         at = foreign.find(quoted, at))
      foreign.replace(at, quoted.size(), fmt::format("\"x_{}\"", name));
  }
  auto stranger = Net::from_text(foreign, "foreign.prototxt", f.runtime, *f.driver);
  stranger->save(path);
  CHECK_THROWS_WITH(net->copy_trained_layers_from(path),
                    Catch::Contains(path) && Catch::Contains("none of its 3 layers with weights") &&
                        Catch::Contains("x_ip1") && Catch::Contains("weights: ip1, ip3)") &&
                        Catch::Contains("another net"));
  std::remove(path.c_str());
}

TEST_CASE("Net rejects a caffemodel with a mismatched, truncated or foreign content") {
  Fixture f;
  auto net = Net::from_text(kSmallNet, "small.prototxt", f.runtime, *f.driver);
  const std::string path = temp_path("bad.caffemodel");
  // Same layer names, ip3 with 4 outputs instead of 3.
  std::string wider = kSmallNet;
  wider.replace(wider.find("num_output: 3"), 13, "num_output: 4");
  auto other = Net::from_text(wider, "wider.prototxt", f.runtime, *f.driver);
  other->save(path);
  CHECK_THROWS_WITH(net->copy_trained_layers_from(path),
                    Catch::Contains("ip3") && Catch::Contains("4x6") && Catch::Contains("3x6"));
  // Truncated: the first half of a good file.
  net->save(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  CHECK_THROWS_WITH(net->copy_trained_layers_from(path),
                    Catch::Contains(path) && Catch::Contains("truncated"));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "this is a text file, not a caffemodel\n";
  }
  CHECK_THROWS_WITH(net->copy_trained_layers_from(path), Catch::Contains(path));
  std::remove(path.c_str());
}

TEST_CASE("Net errors name the file, the layer and the shapes at fault") {
  Fixture f;
  auto build = [&](const std::string& text) {
    return Net::from_text(text, "bad.prototxt", f.runtime, *f.driver);
  };
  const std::string input =
      R"(layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } })";
  CHECK_THROWS_WITH(build(input + R"(layer { name: "z" type: "Frobnicate" bottom: "x" top: "y" })"),
                    Catch::Contains("bad.prototxt") && Catch::Contains("Frobnicate") &&
                        Catch::Contains("Convolution") && Catch::Contains("Input"));
  CHECK_THROWS_WITH(build(input + R"(layer { name: "r" type: "ReLU" bottom: "nope" top: "y" })"),
                    Catch::Contains("'r'") && Catch::Contains("nope") && Catch::Contains("x"));
  CHECK_THROWS_WITH(
      build(input + R"(layer { name: "e" type: "Eltwise" bottom: "x" bottom: "p" top: "y" }
                       layer { name: "p0" type: "Input" top: "p" input_param { shape { dim: 2 dim: 3 } } })"),
      Catch::Contains("'e'") && Catch::Contains("'p'"));
  CHECK_THROWS_WITH(
      build(input +
            R"(layer { name: "p" type: "Input" top: "q" input_param { shape { dim: 2 dim: 5 } } }
                       layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "q" top: "y" })"),
      Catch::Contains("'sum'") && Catch::Contains("2x3x4x4") && Catch::Contains("2x5"));
  CHECK_THROWS_WITH(build("layer { name: \"a\" type: \"ReLU\" \n bottom: x }"),
                    Catch::Contains("bad.prototxt:2:"));
}

TEST_CASE("a net too large for host memory fails at build naming the layer and blob") {
  Fixture f;
  auto build = [&](const std::string& text) {
    return Net::from_text(text, "big.prototxt", f.runtime, *f.driver);
  };
  // The issue's case: 4 x 1e12 floats (16 TB) into an InnerProduct, on this machine's real
  // limit (memory + swap): refused at build, before any allocation, naming the InnerProduct
  // weights that need 72.8 TiB (its 16 TB input would be refused next).
  CHECK_THROWS_WITH(
      build(
          R"(layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 4 dim: 1000000000000 } } }
               layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 10 } })"),
      Catch::Contains("big.prototxt") && Catch::Contains("layer 'ip' (InnerProduct)") &&
          Catch::Contains("parameter 0 (10x1000000000000") && Catch::Contains("TiB") &&
          Catch::Contains("host memory limit"));
  struct Limit {  // 1 MiB for this test, then the default again
    Limit() { set_host_memory_limit(std::size_t{1} << 20); }
    ~Limit() { set_host_memory_limit(0); }
  } limit;
  CHECK(host_memory_limit() == std::size_t{1} << 20);
  // 1000 x 1000 weights and their gradient: 7.6 MiB.
  CHECK_THROWS_WITH(
      build(
          R"(layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 1000 } } }
               layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 1000 } })"),
      Catch::Contains("layer 'fc' (InnerProduct): parameter 0 (1000x1000, data and gradient) "
                      "needs 7.6 MiB (8000000 bytes)") &&
          Catch::Contains("limit of 1.0 MiB"));
  // A 64 x 10000 activation: 2.4 MiB, named by the layer that produces it.
  CHECK_THROWS_WITH(
      build(
          R"(layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 64 dim: 10000 } } }
               layer { name: "act" type: "ReLU" bottom: "x" top: "r" })"),
      Catch::Contains("layer 'in' (Input): top 'x' (64x10000) needs 2.4 MiB"));
  // Every allocation of a host driver is bounded too.
  CHECK_THROWS_WITH(f.driver->allocate(std::size_t{2} << 20),
                    Catch::Contains("allocate on") && Catch::Contains("2.0 MiB"));
  Buffer small(*f.driver, 1024);  // below the limit: allocated
  CHECK(small.address() != nullptr);
}

TEST_CASE("Caffe example deploy nets build and run forward and backward") {
  Fixture f(Device::parse("cpu"));
  for (const char* file : {"bvlc_reference_caffenet_deploy.prototxt",
                           "bvlc_alexnet_deploy.prototxt", "mnist_lenet.prototxt"}) {
    INFO(file);
    NetOptions options;
    options.batch_size = 2;
    options.force_backward = true;
    Net net(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), f.runtime, *f.driver, options);
    REQUIRE(net.input_blob_names().size() == 1);
    const BlobRef data = net.blob(net.input_blob_names()[0]);
    CHECK((*data.shape)[0] == 2);
    const std::vector<float> x = test::random_floats(static_cast<std::size_t>(data.count()), 3);
    std::copy(x.begin(), x.end(), data.host_data_mut());
    net.forward();
    const std::string out = net.output_blob_names().back();
    const BlobRef prob = net.blob(out);
    const float* p = prob.host_data();
    double sum = 0.0;
    for (index_t i = 0; i < prob.count(); ++i)
      sum += p[i];
    CHECK(sum == Approx(2.0).epsilon(1e-4));  // softmax rows of the 2 images
    net.backward();
    const float* dx = data.host_diff();
    CHECK(std::isfinite(dx[0]));
  }
}

TEST_CASE("Caffe example train and test nets run on generated data in both phases") {
  Fixture f(Device::parse("cpu"));
  const std::pair<const char*, const char*> nets[] = {
      {"mnist_lenet_train_test.prototxt", "synthetic:1x28x28"},
      {"cifar10_cifar10_quick_train_test.prototxt", "synthetic:3x32x32"},
      {"cifar10_cifar10_full_train_test.prototxt", "synthetic:3x32x32"}};
  for (const auto& [file, source] : nets) {
    for (Phase phase : {Phase::train, Phase::test}) {
      INFO(file << (phase == Phase::train ? " TRAIN" : " TEST"));
      NetOptions options;
      options.state.phase = phase;
      options.data_source = source;
      options.mean_file = "none";
      options.batch_size = 4;
      Net net(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), f.runtime, *f.driver, options);
      CHECK(net.batch_size() == 4);
      net.clear_param_diffs();
      const float loss = net.forward_backward();
      // Ten classes, small random weights: the softmax loss starts near log(10).
      CHECK(loss == Approx(std::log(10.0f)).margin(1.0f));
      CHECK(net.has_blob(phase == Phase::test ? "accuracy" : "loss"));
    }
  }
}

TEST_CASE("Net memory reuse shrinks the activations of a forward-only CaffeNet") {
  Fixture f(Device::parse("cpu"));
  NetOptions options;
  options.state.phase = Phase::test;
  options.batch_size = 1;
  Net net(fmt::format("{}/bvlc_reference_caffenet_deploy.prototxt", HYBRIDNN_MODELS_DIR), f.runtime,
          *f.driver, options);
  CHECK(static_cast<double>(net.activation_bytes()) <
        0.65 * static_cast<double>(net.activation_bytes_without_reuse()));
  // Train-phase backward reuses gradient memory.
  NetOptions train = options;
  train.force_backward = true;
  Net trained(fmt::format("{}/bvlc_reference_caffenet_deploy.prototxt", HYBRIDNN_MODELS_DIR),
              f.runtime, *f.driver, train);
  // Gradients take the memory of values no longer needed, however their sizes differ
  // (largest placed first, best fit): 0.75 of the unshared bytes here; placed first fit in
  // schedule order, as before, CaffeNet at batch 32 kept 0.91.
  INFO(trained.activation_bytes() << " of " << trained.activation_bytes_without_reuse());
  CHECK(static_cast<double>(trained.activation_bytes()) <
        0.78 * static_cast<double>(trained.activation_bytes_without_reuse()));
}

}  // namespace
}  // namespace hn

namespace hn {
namespace {

// Values for every parameter of a deploy net that keep activations in range through many
// layers: convolution and inner-product weights uniform with He's variance (2 / fan-in),
// biases and BatchNorm means small, BatchNorm variances near 1 (scale factor 1), Scale
// multipliers near 1.
void set_zoo_weights(Net& net) {
  std::map<std::string, std::string> types;
  for (int l = 0; l < net.num_layers(); ++l)
    types[net.layer_name(l)] = net.layer_type(l);
  std::uint32_t seed = 100;
  for (const NetParam& p : net.learnable_params()) {
    Tensor& t = *p.tensor;
    const std::string& type = types.at(p.layer);
    std::vector<float> v = test::random_floats(static_cast<std::size_t>(t.count()), seed++);
    float* data = t.host_data_mut();
    const index_t count = t.count();
    const index_t fan_in = t.shape().axes() > 1 ? count / t.shape()[0] : 1;
    for (index_t i = 0; i < count; ++i) {
      const float r = v[static_cast<std::size_t>(i)];  // in [-1, 1)
      if (type == "BatchNorm") {
        data[i] = p.index == 0 ? 0.1f * r : p.index == 1 ? 1.0f + 0.5f * (r + 1.0f) : 1.0f;
      } else if (type == "Scale") {
        data[i] = p.index == 0 ? 1.0f + 0.25f * r : 0.1f * r;
      } else if (t.shape().axes() > 1) {
        data[i] = r * std::sqrt(6.0f / static_cast<float>(fan_in));
      } else {
        data[i] = 0.1f * r;
      }
    }
  }
}

// Under AddressSanitizer the reference driver's loops run several times slower, and the zoo
// nets run at batch 1 (ResNet-50 took 617 s at batch 2 in the ASan step of CI); the test
// names say so.
#if defined(__SANITIZE_ADDRESS__)
constexpr int kZooBatch = 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kZooBatch = 1;
#else
constexpr int kZooBatch = 2;
#endif
#else
constexpr int kZooBatch = 2;
#endif

struct ZooRun {
  std::vector<float> output, input_gradient;
  std::vector<std::vector<float>> gradients;
  int blocked_blobs = 0;        // kept blocked between layers
  bool preferred_block = true;  // each of them in the driver's preferred blocked layout
  int fused_layers = 0;         // run by another layer (NetOptions::fuse_layers)
};

ZooRun run_zoo_net(const std::string& file, const Device& device, bool blocked_layout = false,
                   bool fuse_layers = true) {
  Runtime runtime;
  Driver& driver = runtime.add(device);
  NetOptions options;
  options.batch_size = kZooBatch;
  options.force_backward = true;
  options.blocked_layout = blocked_layout;
  options.fuse_layers = fuse_layers;
  Net net(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), runtime, driver, options);
  set_zoo_weights(net);
  const BlobRef data = net.blob(net.input_blob_names().at(0));
  const std::vector<float> x = test::random_floats(static_cast<std::size_t>(data.count()), 5);
  std::copy(x.begin(), x.end(), data.host_data_mut());
  net.clear_param_diffs();
  net.forward();
  const BlobRef out = net.blob(net.output_blob_names().back());
  ZooRun run;
  for (const std::string& name : net.blob_names()) {
    const Layout layout = net.blob(name).layout;
    if (layout == Layout::nchw) continue;
    ++run.blocked_blobs;
    run.preferred_block =
        run.preferred_block && layout == driver.capabilities().preferred_blocked_layout;
  }
  for (int l = 0; l < net.num_layers(); ++l)
    run.fused_layers += net.layer_algorithm(l).rfind("fused into", 0) == 0 ? 1 : 0;
  run.output.assign(out.host_data(), out.host_data() + out.count());
  // Backward from a random gradient of the output (a deploy net has no loss).
  const std::vector<float> dy = test::random_floats(static_cast<std::size_t>(out.count()), 6);
  std::copy(dy.begin(), dy.end(), out.host_diff_mut());
  net.backward();
  run.input_gradient.assign(data.host_diff(), data.host_diff() + data.count());
  run.gradients = test::param_gradients(net);
  return run;
}

// Runs Caffe's zoo net `file` at batch kZooBatch on the CPU driver, with NCHW and with blocked
// activations between layers (nChw16c with AVX-512, nChw8c without), against the reference driver
// (the slow side, once).
void check_zoo_net(const char* file) {
  // The reference runs every layer apart.
  const ZooRun reference = run_zoo_net(file, Device::parse("reference"), false, false);
  CHECK(reference.fused_layers == 0);
  for (const bool blocked : {false, true}) {
    INFO(file << (blocked ? ", blocked activations" : ", NCHW activations"));
    const ZooRun cpu = run_zoo_net(file, Device::parse("cpu"), blocked);
    CHECK((cpu.blocked_blobs > 0) == blocked);
    CHECK(cpu.preferred_block);
    // ResNet-50: 53 BatchNorm + Scale chains after convolutions, both folded into them, 33
    // with a ReLU fused too, and the 16 Eltwise sums each with its ReLU run by the
    // convolution before them; MobileNet: 27 chains, every one with a ReLU.
    const std::string name = file;
    if (name.rfind("resnet", 0) == 0) CHECK(cpu.fused_layers == 2 * 53 + 33 + 2 * 16);
    if (name.rfind("mobilenet", 0) == 0) CHECK(cpu.fused_layers == 3 * 27);
    // Float sums in other orders (Winograd among them) over tens of layers: 1e-3. Max pooling
    // adds a discontinuity: where two inputs of a window differ only by rounding, the drivers
    // may pick different maxima and send that window's gradient to a neighbouring element
    // (CaffeNet at these values: 2 of conv1's 580,800 output gradients, inputs 0.4258975 and
    // 0.4258973). Everything below such a window then differs by one moved value: conv1's
    // weights of that channel, the input under its 11x11 field; each flip in GoogLeNet's
    // pool1 moves one of conv1's 64 output channels, 1.6 % of its weight gradients (4 flips
    // seen with nChw16c activations). So a gradient may differ by more than 1e-3 in a few
    // elements (at most 10 %), and by at most 5e-2 anywhere. Without AVX-512, oneDNN's
    // kernels (8-channel blocks, other summation orders and Winograd choices) move more:
    // on an AVX2 EPYC, up to 52 % of CaffeNet's conv1-conv3 gradients differ by 1e-3 to
    // 1e-2 and 0.3 % by more, so there the bound is 1e-2 for at most 2 %, or 2 elements of a
    // small parameter (clang's build under ASan: 12.5 % of one of GoogLeNet's). clang's
    // ASan build moves more on AVX-512 too: on an AVX-512 EPYC its CPU driver's GoogLeNet
    // gradients were 3-4 times further from the reference's than GCC's build's (conv1's
    // weight gradient 3.2e-3 at worst, 21 % of it beyond 1e-3, against 7.6e-4 and none at
    // batch 1 with GCC; the reference's bits and the algorithms chosen were the same in both
    // builds, the OpenMP runtime not: LLVM's libomp there). So the tight bound holds for
    // AVX-512 outside the sanitizer build only.
    const bool tight = __builtin_cpu_supports("avx512f") && kZooBatch == 2;
    const double tolerance = 1e-3;
    const double gradient_tolerance = tight ? 1e-3 : 1e-2;
    const double gradient_fraction = tight ? 0.10 : 0.02;
    const auto check_gradient = [&](const std::vector<float>& expected,
                                    const std::vector<float>& got) {
      CHECK(test::max_scaled_diff(expected, got) <= 5e-2);
      // A small parameter may have 2 such elements, 3 at batch 1 (clang's ASan build on an
      // AVX2 EPYC: 3 of the 16 biases of GoogLeNet's parameter 37, each sum over one image
      // having fewer terms to average a moved value out).
      const double few = kZooBatch == 1 ? 3.0 : 2.0;
      const double allowed = std::max(
          gradient_fraction, few / static_cast<double>(std::max<std::size_t>(1, expected.size())));
      CHECK(test::fraction_beyond(expected, got, gradient_tolerance) <= allowed);
    };
    double largest_gradient = 0.0;
    for (float g : reference.input_gradient)
      largest_gradient = std::max(largest_gradient, static_cast<double>(std::fabs(g)));
    CHECK(largest_gradient > 0.0);  // the backward reached the input
    CHECK(test::max_scaled_diff(reference.output, cpu.output) <= tolerance);
    check_gradient(reference.input_gradient, cpu.input_gradient);
    REQUIRE(cpu.gradients.size() == reference.gradients.size());
    for (std::size_t g = 0; g < cpu.gradients.size(); ++g) {
      INFO("parameter " << g);
      check_gradient(reference.gradients[g], cpu.gradients[g]);
    }
  }
}

}  // namespace

// One test case per net, so that ctest runs them side by side.
TEST_CASE(
    "CaffeNet from Caffe's zoo computes on the CPU driver what it computes on the reference "
    "driver, forward and backward at batch 2 (1 under AddressSanitizer), with NCHW and blocked "
    "activations",
    "[zoo]") {
  check_zoo_net("bvlc_reference_caffenet_deploy.prototxt");
}

TEST_CASE(
    "GoogLeNet from Caffe's zoo computes on the CPU driver what it computes on the reference "
    "driver, forward and backward at batch 2 (1 under AddressSanitizer), with NCHW and blocked "
    "activations",
    "[zoo]") {
  check_zoo_net("bvlc_googlenet_deploy.prototxt");
}

TEST_CASE(
    "ResNet-50 from Caffe's zoo computes on the CPU driver what it computes on the reference "
    "driver, forward and backward at batch 2 (1 under AddressSanitizer), with NCHW and blocked "
    "activations and BatchNorm + Scale + ReLU and Eltwise + ReLU fused",
    "[zoo]") {
  check_zoo_net("resnet50_deploy.prototxt");
}

TEST_CASE(
    "MobileNet v1 from Caffe's zoo computes on the CPU driver what it computes on the "
    "reference driver, forward and backward at batch 2 (1 under AddressSanitizer), with NCHW and "
    "blocked activations and BatchNorm + Scale + ReLU fused",
    "[zoo]") {
  check_zoo_net("mobilenet_v1_deploy.prototxt");
}

}  // namespace hn
