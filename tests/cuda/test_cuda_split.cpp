// GPU-only tests of the hybrid split: Caffe's LeNet and CIFAR-10 quick cut between the CPU
// driver and cuda:0 compute the unsplit losses and gradients, activations stay on the GPU
// between layers split alike, split training is bitwise reproducible, and an automatic split
// measures both devices. cuda_test_main.cpp skips the binary (exit 77) when no GPU answers.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "lib/solver/solver.h"
#include "tests/net_runs.h"
#include "tests/support.h"

namespace hn {
namespace {

struct CpuAndGpu {
  Runtime runtime;
  Driver* cpu = &runtime.add(Device::parse("cpu"));
  Driver* gpu = &runtime.add(Device::parse("cuda:0"));
};

TEST_CASE("nets split between cpu and cuda:0 compute the unsplit losses and gradients", "[cuda]") {
  CpuAndGpu d;
  const std::pair<const char*, const char*> nets[] = {
      {"mnist_lenet_train_test.prototxt", "synthetic:1x28x28"},
      {"cifar10_cifar10_quick_train_test.prototxt", "synthetic:3x32x32"}};
  for (const auto& [file, source] : nets) {
    for (int batch : {8, 7}) {
      const test::NetGradients whole =
          test::net_gradients(d.runtime, *d.cpu, file, source, batch, "");
      for (const char* split : {"cpu:1.0,cuda:0:0.0", "cpu:0.0,cuda:0:1.0", "cpu:0.5,cuda:0:0.5",
                                "cpu:0.75,cuda:0:0.25", "cpu:0.125,cuda:0:0.875"}) {
        INFO(file << " batch " << batch << " split " << split);
        const test::NetGradients cut =
            test::net_gradients(d.runtime, *d.cpu, file, source, batch, split);
        CHECK(cut.loss == Approx(whole.loss).epsilon(1e-5));
        REQUIRE(cut.gradients.size() == whole.gradients.size());
        for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
          INFO("gradient " << g);
          CHECK(test::max_scaled_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("layers split alike keep their activations on cuda:0", "[cuda]") {
  CpuAndGpu d;
  NetOptions options;
  options.data_source = "synthetic:1x28x28";
  options.batch_size = 8;
  options.split = Split::parse("cuda:0");
  Net net(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR), d.runtime, *d.cpu,
          options);
  net.forward();
  d.gpu->reset_transfer_stats();
  net.forward();
  const TransferStats& stats = d.gpu->transfer_stats();
  CHECK(stats.to_device_bytes == 8 * 28 * 28 * sizeof(float));
  CHECK(stats.to_host_bytes == 8 * 10 * sizeof(float));
}

TEST_CASE("cpu and cuda:0 split training is bitwise reproducible", "[cuda]") {
  auto train = [] {
    CpuAndGpu d;
    NetOptions options;
    options.data_source = "synthetic:1x28x28";
    options.batch_size = 16;
    options.split = Split::parse("cpu:0.5,cuda:0:0.5");
    Net net(fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR), d.runtime,
            *d.cpu, options);
    std::vector<float> result;
    for (int i = 0; i < 3; ++i) {
      net.clear_param_diffs();
      result.push_back(net.forward_backward());
    }
    for (const NetParam& param : net.learnable_params()) {
      const float* g = param.tensor->host_diff();
      result.insert(result.end(), g, g + param.tensor->count());
    }
    return result;
  };
  const std::vector<float> first = train(), second = train();
  REQUIRE(first.size() == second.size());
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

TEST_CASE("an automatic split over cpu and cuda:0 measures every layer", "[cuda]") {
  CpuAndGpu d;
  NetOptions options;
  options.split = Split::parse("auto:cpu,cuda:0");
  const std::unique_ptr<Net> automatic = test::cifar_quick(d.runtime, *d.cpu, options, 32);
  Net& net = *automatic;
  net.calibrate_splits();
  const LayerSplits splits = net.layer_splits();
  CHECK_FALSE(splits.empty());
  for (const auto& [layer, split] : splits) {
    INFO(layer << ": " << split.to_string());
    REQUIRE(split.shares().size() == 2);
  }
  CHECK(std::isfinite(net.forward_backward()));
}

// Issue 35: a steady-state training iteration on cuda:0 alone (CIFAR-10 quick: convolutions
// with cuDNN's workspace, pooling, inner products) allocates and frees nothing, and says how
// often the host waited for the GPU.
TEST_CASE("a steady-state training iteration on cuda:0 allocates and frees nothing", "[cuda]") {
  test::TempDir dir("hybridnn-cuda-steady");
  const std::string solver_path = dir.write(
      "solver.prototxt",
      fmt::format("net: \"{}/cifar10_cifar10_quick_train_test.prototxt\"\n"
                  "base_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.004\nlr_policy: \"fixed\"\n"
                  "max_iter: 10\nsnapshot_after_train: false\n",
                  HYBRIDNN_MODELS_DIR));
  Runtime runtime;
  Driver& gpu = runtime.add(Device::parse("cuda:0"));
  SolverOptions options;
  options.data = "synthetic:3x32x32";
  options.mean_file = "none";  // the net names examples/cifar10/mean.binaryproto
  Solver solver(solver_path, runtime, gpu, options);
  solver.step(2);
  gpu.reset_transfer_stats();
  solver.step(1);
  const TransferStats& stats = gpu.transfer_stats();
  WARN("cuda:0 in a steady-state iteration: " << stats.waits << " host waits, " << stats.to_device
                                              << " copies in, " << stats.to_host << " out");
  CHECK(stats.allocations == 0);
  CHECK(stats.frees == 0);
}

// Issue 35 item 4: training on cuda:0 replays one recorded iteration (a CUDA graph: the
// gradients cleared, forward, backward, the update reading its rate and the loss on the
// GPU) from the second iteration, with the losses and weights of training call by call,
// bit for bit (cuDNN's heuristic algorithms, the same in both runs).
TEST_CASE(
    "training on cuda:0 replays a recorded iteration with the losses and weights of "
    "training call by call",
    "[cuda]") {
  test::TempDir dir("hybridnn-cuda-graph-train");
  const std::string solver_path = dir.write(
      "solver.prototxt",
      fmt::format("net: \"{}/cifar10_cifar10_quick_train_test.prototxt\"\n"
                  "base_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.004\nlr_policy: \"inv\"\n"
                  "gamma: 0.1\npower: 0.75\nmax_iter: 6\ndisplay: 1\naverage_loss: 1\n"
                  "snapshot_after_train: false\n",
                  HYBRIDNN_MODELS_DIR));
  struct Run {
    std::map<int, float> losses;
    std::vector<std::vector<float>> weights;
    bool recorded = false;
    std::string why;
  };
  const auto train = [&](bool graphs) {
    Runtime runtime;
    Driver& gpu = runtime.add(Device::parse("cuda:0"));
    SolverOptions options;
    options.data = "synthetic:3x32x32";
    options.mean_file = "none";
    options.graphs = graphs;
    Solver solver(solver_path, runtime, gpu, options);
    Run run;
    solver.on_event([&](const SolverEvent& e) {
      if (e.phase == Phase::train) run.losses[e.iter] = e.loss;
    });
    solver.solve();
    for (const NetParam& p : solver.net().learnable_params())
      run.weights.emplace_back(p.tensor->host_data(), p.tensor->host_data() + p.tensor->count());
    run.recorded = solver.iteration_recorded();
    run.why = solver.unrecorded_why();
    return run;
  };
  const Run eager = train(false);
  const Run replayed = train(true);
  INFO(replayed.why);
  CHECK_FALSE(eager.recorded);
  CHECK(replayed.recorded);
  CHECK(replayed.losses == eager.losses);
  CHECK(replayed.weights == eager.weights);
}

// Issue 35: an iteration recorded on cuda:0 (a CUDA graph) and replayed computes what the
// same layers run call by call compute, bitwise, on the inputs in memory when it is
// replayed (a BatchNorm on stored statistics fused with Scale and ReLU among the layers);
// host reads after a replay see its results. SoftmaxWithLoss keeps its loss on the GPU and
// records; a layer that reads a value back inside the iteration (SoftmaxWithLoss counting
// an ignore_label's labels) cannot be recorded: the recording fails, naming why, and the
// net runs as before.
TEST_CASE("an iteration recorded on cuda:0 replays the layers' calls bitwise", "[cuda]") {
  test::TempDir dir("hybridnn-cuda-graph");
  const std::string layers = R"(
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 8 dim: 3 dim: 12 dim: 12 } shape { dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
  batch_norm_param { use_global_stats: true } }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "silence" type: "Silence" bottom: "label" }
)";
  Runtime runtime;
  Driver& gpu = runtime.add(Device::parse("cuda:0"));
  REQUIRE(gpu.records());
  NetOptions options;
  options.force_backward = true;
  Net net(dir.write("graphed.prototxt", std::string("name: \"graphed\"") + layers), runtime, gpu,
          options);
  // BatchNorm's stored statistics (mean 0.1, variance 2, factor 1) and Scale's gamma (1.5):
  // fused with the ReLU, their factor read once, not inside the recording.
  for (const NetParam& param : net.learnable_params()) {
    const float value = param.layer == "bn"                          ? (param.index == 0   ? 0.1f
                                                                        : param.index == 1 ? 2.0f
                                                                                           : 1.0f)
                        : param.layer == "scale" && param.index == 0 ? 1.5f
                                                                     : std::nanf("");
    if (std::isnan(value)) continue;
    float* values = static_cast<float*>(param.tensor->data().host_write());
    std::fill(values, values + param.tensor->count(), value);
  }
  // The inputs and the output's gradient (where backward starts), on the GPU.
  const auto set_inputs = [&](int seed) {
    const BlobRef data = net.blob("data"), ip = net.blob("ip");
    float* x = data.host_data_mut();
    for (index_t i = 0; i < data.count(); ++i)
      x[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
    float* dy = ip.host_diff_mut();
    for (index_t i = 0; i < ip.count(); ++i)
      dy[i] = std::cos(0.11f * static_cast<float>(i * seed));
    ip.diff->read(gpu);
  };
  // The parameters' gradients, the output and the data's gradient.
  const auto results = [&] {
    std::vector<std::vector<float>> r = test::param_gradients(net);
    const BlobRef ip = net.blob("ip"), data = net.blob("data");
    r.emplace_back(ip.host_data(), ip.host_data() + ip.count());
    r.emplace_back(data.host_diff(), data.host_diff() + data.count());
    return r;
  };
  const auto eager = [&] {
    net.clear_param_diffs();
    net.forward();
    net.backward();
    return results();
  };
  set_inputs(1);
  const auto first = eager();  // cuDNN's plans and workspace made
  std::string why;
  net.clear_param_diffs();
  const std::unique_ptr<Driver::Recording> recording = net.record_iteration(why);
  INFO(why);
  REQUIRE(recording != nullptr);
  set_inputs(2);
  net.clear_param_diffs();
  net.replay_iteration(*recording);
  const auto replayed = results();
  set_inputs(2);
  CHECK(replayed == eager());
  CHECK(replayed != first);
  set_inputs(1);
  net.clear_param_diffs();
  net.replay_iteration(*recording);
  CHECK(results() == first);

  // A wait inside a recording fails it; the driver runs calls again afterwards.
  REQUIRE(gpu.begin_recording(why));
  CHECK_THROWS(gpu.synchronize());
  why.clear();
  CHECK(gpu.end_recording(why) == nullptr);
  CHECK(why.find("capture") != std::string::npos);
  set_inputs(1);
  CHECK(eager() == first);

  // SoftmaxWithLoss keeps its loss on the GPU: its iteration records, and the replay's loss,
  // read back after it, is the eager one.
  const auto with_loss = [&](const std::string& loss_param) {
    std::string text(layers);
    text.replace(text.find("layer { name: \"silence\""), std::string::npos,
                 "layer { name: \"loss\" type: \"SoftmaxWithLoss\" bottom: \"ip\" "
                 "bottom: \"label\" top: \"loss\" " +
                     loss_param + " }\n");
    return "name: \"lossy\"" + text;
  };
  Net trained(dir.write("trained.prototxt", with_loss("")), runtime, gpu, options);
  std::fill(trained.blob("label").host_data_mut(),
            trained.blob("label").host_data_mut() + trained.blob("label").count(), 1.0f);
  trained.clear_param_diffs();
  const float eager_loss = trained.forward_backward();
  why.clear();
  trained.clear_param_diffs();
  const std::unique_ptr<Driver::Recording> loss_recording = trained.record_iteration(why);
  INFO(why);
  REQUIRE(loss_recording != nullptr);
  trained.replay_iteration(*loss_recording, false);
  CHECK(trained.read_loss() == eager_loss);
  // With an ignore_label, VALID reads its count of valid labels back: not recordable, said,
  // nothing lost.
  Net lossy(dir.write("lossy.prototxt", with_loss("loss_param { ignore_label: 3 }")), runtime, gpu,
            options);
  const BlobRef label = lossy.blob("label");
  std::fill(label.host_data_mut(), label.host_data_mut() + label.count(), 1.0f);
  const float loss = lossy.forward_backward();
  why.clear();
  CHECK(lossy.record_iteration(why) == nullptr);
  CHECK(!why.empty());
  CHECK(lossy.forward_backward() == loss);
}

}  // namespace
}  // namespace hn
