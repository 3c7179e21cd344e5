// Layers cut by outputs (split_axis: OUTPUT: InnerProduct by outputs, Convolution by output
// channels) between two reference drivers, one with memory of its own: the cut net against the
// uncut one built from the same prototxt and seed (initial weights, loss, every gradient,
// training with SGD and Adam), each device holding only its rows, snapshots that are the uncut
// model, and resumes across the cut.
#include <fmt/format.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "lib/solver/solver.h"
#include "tests/net_runs.h"
#include "tests/support.h"

namespace hn {
namespace {

namespace fs = std::filesystem;

using test::TwoDrivers;

// `split { ... } split_axis: OUTPUT` giving reference `first` of the outputs and reference:1
// the rest; empty when first is negative (the uncut layer).
std::string cut(double first) {
  if (first < 0.0) return "";
  return fmt::format(
      "split {{ device: \"reference\" fraction: {} }} split {{ device: \"reference:1\" fraction: "
      "{} }} split_axis: OUTPUT",
      first, 1.0 - first);
}

// DummyData -> InnerProduct (cut or not) -> EuclideanLoss against a DummyData target.
std::string one_layer(int outputs, bool transpose, bool bias, double first) {
  return fmt::format(R"(
name: "one"
force_backward: true
layer {{ name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param {{ shape {{ dim: 4 dim: 3 dim: 2 dim: 5 }} shape {{ dim: 4 dim: {} }}
                           data_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "y"
        inner_product_param {{ num_output: {} transpose: {} bias_term: {}
                              weight_filler {{ type: "gaussian" std: 0.5 }}
                              bias_filler {{ type: "gaussian" std: 0.5 }} }} {} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }}
)",
                     outputs, outputs, transpose, bias, cut(first));
}

// Every parameter whole (the shards of a cut one joined), values or gradients, in order.
std::vector<std::vector<float>> whole_values(Net& net, bool diff) {
  const std::vector<NetParam>& params = net.learnable_params();
  std::vector<std::vector<float>> values;
  for (const WholeParam& whole : whole_params(params)) {
    values.emplace_back(static_cast<std::size_t>(whole.shape.count()));
    for (std::size_t i = whole.first; i < whole.last; ++i) {
      Tensor& tensor = *params[i].tensor;
      shard_to_whole(params[i], diff ? tensor.host_diff() : tensor.host_data(),
                     values.back().data());
    }
  }
  return values;
}

TEST_CASE("an InnerProduct cut by outputs computes the uncut layer: output, every gradient",
          "[split]") {
  struct Case {
    int outputs;
    double first;
  };
  // 1:1, 3:1, an odd num_output, one output on one device, none on one device.
  const Case cases[] = {{8, 0.5}, {8, 0.75}, {7, 0.5}, {5, 0.8}, {6, 1.0}, {6, 0.0}};
  for (const Case& c : cases) {
    for (const bool transpose : {false, true}) {
      for (const bool bias : {true, false}) {
        INFO("num_output " << c.outputs << ", reference's share " << c.first << ", transpose "
                           << transpose << ", bias " << bias);
        TwoDrivers d;
        const auto plain_net = Net::from_text(one_layer(c.outputs, transpose, bias, -1.0), "plain",
                                              d.runtime, *d.host);
        const auto cut_net = Net::from_text(one_layer(c.outputs, transpose, bias, c.first), "cut",
                                            d.runtime, *d.host);
        Net& plain = *plain_net;
        Net& split = *cut_net;
        // The same initial weights: the cut layer draws the whole parameter and keeps rows.
        CHECK(whole_values(split, false) == whole_values(plain, false));
        plain.clear_param_diffs();
        split.clear_param_diffs();
        const float want = plain.forward_backward();
        const float got = split.forward_backward();
        CHECK(got == Approx(want).epsilon(1e-6));
        const BlobRef py = plain.blob("y"), sy = split.blob("y");
        const std::vector<float> y0(py.host_data(), py.host_data() + py.count());
        const std::vector<float> y1(sy.host_data(), sy.host_data() + sy.count());
        CHECK(test::max_scaled_diff(y0, y1) <= 1e-6);
        const BlobRef pd = plain.blob("data"), sd = split.blob("data");
        CHECK(test::max_scaled_diff(
                  std::vector<float>(pd.host_diff(), pd.host_diff() + pd.count()),
                  std::vector<float>(sd.host_diff(), sd.host_diff() + sd.count())) <= 1e-5);
        const auto want_grads = whole_values(plain, true);
        const auto got_grads = whole_values(split, true);
        REQUIRE(got_grads.size() == want_grads.size());
        for (std::size_t p = 0; p < want_grads.size(); ++p)
          CHECK(test::max_scaled_diff(want_grads[p], got_grads[p]) <= 1e-5);
      }
    }
  }
}

// DummyData -> conv1 -> ReLU -> conv2 -> EuclideanLoss, each convolution cut by output
// channels (or not: first < 0). Both cut: the ReLU runs on each device's channels and conv2
// reads them there, nothing gathered between.
std::string two_convs(double first1, double first2) {
  return fmt::format(R"(
name: "convs"
force_backward: true
layer {{ name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param {{ shape {{ dim: 3 dim: 2 dim: 6 dim: 5 }}
                           shape {{ dim: 3 dim: 4 dim: 4 dim: 3 }}
                           data_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "c1"
        convolution_param {{ num_output: 5 kernel_size: 3 pad: 1
                            weight_filler {{ type: "gaussian" std: 0.5 }}
                            bias_filler {{ type: "gaussian" std: 0.5 }} }} {} }}
layer {{ name: "relu" type: "ReLU" bottom: "c1" top: "c1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "c1" top: "y"
        convolution_param {{ num_output: 4 kernel_size: 3
                            weight_filler {{ type: "gaussian" std: 0.5 }}
                            bias_filler {{ type: "gaussian" std: 0.5 }} }} {} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }}
)",
                     cut(first1), cut(first2));
}

TEST_CASE("convolutions cut by output channels compute the uncut net: output, every gradient",
          "[split]") {
  struct Case {
    double first1, first2;
  };
  // Both cut (channels chained between them), each alone, unequal shares, one device empty.
  const Case cases[] = {{0.5, 0.5}, {0.6, 0.25}, {-1.0, 0.5}, {0.4, -1.0}, {1.0, 0.0}};
  TwoDrivers d;
  const auto plain_net = Net::from_text(two_convs(-1.0, -1.0), "plain", d.runtime, *d.host);
  Net& plain = *plain_net;
  plain.clear_param_diffs();
  const float want = plain.forward_backward();
  const BlobRef py = plain.blob("y"), pd = plain.blob("data");
  const std::vector<float> want_y(py.host_data(), py.host_data() + py.count());
  const std::vector<float> want_dx(pd.host_diff(), pd.host_diff() + pd.count());
  const auto want_grads = whole_values(plain, true);
  for (const Case& c : cases) {
    INFO("reference's shares " << c.first1 << ", " << c.first2);
    const auto cut_net = Net::from_text(two_convs(c.first1, c.first2), "cut", d.runtime, *d.host);
    Net& split = *cut_net;
    CHECK(whole_values(split, false) == whole_values(plain, false));
    split.clear_param_diffs();
    CHECK(split.forward_backward() == Approx(want).epsilon(1e-6));
    const BlobRef sy = split.blob("y"), sd = split.blob("data");
    CHECK(test::max_scaled_diff(
              want_y, std::vector<float>(sy.host_data(), sy.host_data() + sy.count())) <= 1e-6);
    CHECK(test::max_scaled_diff(
              want_dx, std::vector<float>(sd.host_diff(), sd.host_diff() + sd.count())) <= 1e-5);
    const auto got_grads = whole_values(split, true);
    REQUIRE(got_grads.size() == want_grads.size());
    for (std::size_t p = 0; p < want_grads.size(); ++p) {
      INFO("parameter " << p);
      CHECK(test::max_scaled_diff(want_grads[p], got_grads[p]) <= 1e-5);
    }
    if (c.first1 > 0.0 && c.first1 < 1.0 && c.first2 >= 0.0) {
      // The ReLU ran on each device's channels, and conv1's top was never gathered.
      for (int l = 0; l < split.num_layers(); ++l) {
        if (split.layer_name(l) == "relu") CHECK(split.layer_algorithm(l) == "fused into 'conv1'");
      }
      CHECK_THROWS_WITH(split.blob("c1").host_data(), Catch::Contains("keep_blobs"));
    }
  }
}

TEST_CASE("each device holds only its rows of a layer cut by outputs, and reruns are bitwise equal",
          "[split]") {
  TwoDrivers d;
  auto run = [&] {
    const auto made = Net::from_text(one_layer(10, false, true, 0.3), "cut", d.runtime, *d.host);
    Net& net = *made;
    const std::vector<NetParam>& params = net.learnable_params();
    REQUIRE(params.size() == 4);  // weights on each device, then bias on each
    CHECK(params[0].tensor->shape() == Shape{3, 30});
    CHECK(params[1].tensor->shape() == Shape{7, 30});
    CHECK(params[2].tensor->shape() == Shape{3});
    CHECK(params[3].tensor->shape() == Shape{7});
    CHECK(params[0].driver == d.host);
    CHECK(params[1].driver == d.device);
    CHECK(params[1].shard.begin == 3);
    CHECK(params[1].shard.end == 10);
    CHECK(params[1].shard.whole == Shape{10, 30});
    net.clear_param_diffs();
    net.forward_backward();
    // reference:1's gradients were computed in its memory and never copied to the host.
    const MemorySpace own = d.device->memory_space();
    CHECK(params[1].tensor->diff().current_on(own));
    CHECK_FALSE(params[1].tensor->diff().current_on(d.host->memory_space()));
    return whole_values(net, true);
  };
  const auto first = run();
  const auto second = run();
  REQUIRE(first.size() == second.size());
  for (std::size_t p = 0; p < first.size(); ++p)
    CHECK(std::memcmp(first[p].data(), second[p].data(), first[p].size() * sizeof(float)) == 0);
}

// CaffeNet (shared/models' deploy prototxt) made trainable at a small size: 67x67 inputs
// (pool5 1x1), fillers for every layer, fc6 and fc7 of 64 outputs and fc8 of 10, a
// SoftmaxWithLoss; fc6, fc7 and fc8 cut by outputs with `cuts` (uncut when empty).
std::string small_caffenet(const std::vector<double>& cuts) {
  std::ifstream file(HYBRIDNN_MODELS_DIR "/bvlc_reference_caffenet_deploy.prototxt");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  std::string net = text.str();
  const auto replace_all = [&net](const std::string& from, const std::string& to) {
    int count = 0;
    for (std::size_t at = net.find(from); at != std::string::npos;
         at = net.find(from, at + to.size())) {
      net.replace(at, from.size(), to);
      ++count;
    }
    REQUIRE(count > 0);
  };
  replace_all("name: \"CaffeNet\"", "name: \"CaffeNet\"\nforce_backward: true");
  replace_all(
      "type: \"Input\"\n  top: \"data\"\n  input_param { shape: { dim: 10 dim: 3 dim: 227 dim: "
      "227 } }",
      "type: \"DummyData\"\n  top: \"data\"\n  top: \"label\"\n  dummy_data_param { shape { dim: 4 "
      "dim: 3 dim: 67 dim: 67 } shape { dim: 4 } data_filler { type: \"gaussian\" std: 1 } "
      "data_filler { type: \"constant\" value: 3 } }");
  const std::string fillers =
      " weight_filler { type: \"gaussian\" std: 0.05 } bias_filler { type: \"gaussian\" std: 0.1 }";
  replace_all("convolution_param {", "convolution_param {" + fillers);
  replace_all("inner_product_param {", "inner_product_param {" + fillers);
  int fc = 0;
  const auto cut_fc = [&](const std::string& from, int outputs) {
    const std::size_t at = net.find(from);
    REQUIRE(at != std::string::npos);
    const std::string split = cuts.empty() ? "" : cut(cuts[static_cast<std::size_t>(fc)]);
    net.replace(at, from.size(), fmt::format("num_output: {}\n  }}\n  {}", outputs, split));
    ++fc;
  };
  cut_fc("num_output: 4096\n  }", 64);
  cut_fc("num_output: 4096\n  }", 64);
  cut_fc("num_output: 1000\n  }", 10);
  replace_all("type: \"Softmax\"\n  bottom: \"fc8\"\n  top: \"prob\"",
              "type: \"SoftmaxWithLoss\"\n  bottom: \"fc8\"\n  bottom: \"label\"\n  top: \"loss\"");
  return net;
}

TEST_CASE(
    "CaffeNet's fc6-fc8 cut by outputs inside a net whose convolutions are batch-split "
    "compute the unsplit net",
    "[split]") {
  TwoDrivers d;
  NetOptions plain_options;
  plain_options.state.phase = Phase::train;  // dropout on: the same masks cut or not
  const auto plain_net =
      Net::from_text(small_caffenet({}), "caffenet", d.runtime, *d.host, plain_options);
  NetOptions split_options = plain_options;
  split_options.split = Split::parse("reference:0.5,reference:1:0.5");
  auto run = [&] {
    auto net = Net::from_text(small_caffenet({0.5, 0.75, 0.3}), "caffenet cut", d.runtime, *d.host,
                              split_options);
    // Two shards each of fc6's, fc7's and fc8's weights and biases.
    CHECK(net->learnable_params().size() == 16 + 6);
    // fc7 and fc8 read the columns where fc6 and fc7 left them: ReLU and Dropout run on
    // each device's columns, and nothing is gathered in between.
    for (int l = 0; l < net->num_layers(); ++l) {
      const std::string& name = net->layer_name(l);
      if (name == "relu6" || name == "drop6") CHECK(net->layer_algorithm(l) == "fused into 'fc6'");
      if (name == "relu7" || name == "drop7") CHECK(net->layer_algorithm(l) == "fused into 'fc7'");
    }
    net->clear_param_diffs();
    const float loss = net->forward_backward();
    // fc6's top is never gathered: reading it is an error, not stale numbers.
    CHECK_THROWS_WITH(net->blob("fc6").host_data(),
                      Catch::Contains("'fc6'") && Catch::Contains("keep_blobs"));
    auto grads = whole_values(*net, true);
    const BlobRef data = net->blob("data");
    grads.emplace_back(data.host_diff(), data.host_diff() + data.count());
    return std::make_pair(loss, grads);
  };
  Net& plain = *plain_net;
  plain.clear_param_diffs();
  const float want = plain.forward_backward();
  auto want_grads = whole_values(plain, true);
  const BlobRef data = plain.blob("data");
  want_grads.emplace_back(data.host_diff(), data.host_diff() + data.count());
  // The gradients reach the data through every layer.
  CHECK(test::max_scaled_diff(want_grads.back(),
                              std::vector<float>(want_grads.back().size(), 0.0f)) > 1e-3);
  const auto [got, got_grads] = run();
  CHECK(got == Approx(want).epsilon(1e-5));
  REQUIRE(got_grads.size() == want_grads.size());
  for (std::size_t p = 0; p < want_grads.size(); ++p) {
    INFO("gradient " << p << " of " << want_grads.size() << " (the last: the data's)");
    CHECK(test::max_scaled_diff(want_grads[p], got_grads[p]) <= 1e-5);
  }
  // Bitwise reproducible run to run.
  const auto [again, again_grads] = run();
  CHECK(std::memcmp(&again, &got, sizeof(float)) == 0);
  for (std::size_t p = 0; p < got_grads.size(); ++p) {
    CHECK(std::memcmp(again_grads[p].data(), got_grads[p].data(),
                      got_grads[p].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("a layer cut by outputs is refused where it cannot be, naming the layer", "[split]") {
  TwoDrivers d;
  const std::string conv = R"(
name: "bad"
layer { name: "data" type: "DummyData" top: "data"
        dummy_data_param { shape { dim: 2 dim: 1 dim: 4 dim: 4 } } }
layer { name: "pool" type: "Pooling" bottom: "data" top: "c"
        pooling_param { pool: MAX kernel_size: 2 } )" +
                           cut(0.5) + " }\n";
  CHECK_THROWS_WITH(Net::from_text(conv, "bad.prototxt", d.runtime, *d.host),
                    Catch::Contains("bad.prototxt") && Catch::Contains("'pool'") &&
                        Catch::Contains("a Pooling layer cannot be cut") &&
                        Catch::Contains("types that can: Convolution, InnerProduct"));
  // A grouped convolution's parts would each need whole groups.
  const std::string grouped = R"(
name: "bad"
layer { name: "data" type: "DummyData" top: "data"
        dummy_data_param { shape { dim: 2 dim: 4 dim: 4 dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
        convolution_param { num_output: 4 kernel_size: 3 group: 2 } )" +
                              cut(0.5) + " }\n";
  CHECK_THROWS_WITH(Net::from_text(grouped, "grouped.prototxt", d.runtime, *d.host),
                    Catch::Contains("'conv'") && Catch::Contains("2 groups"));
  const std::string bare = one_layer(4, false, true, 0.5);
  const std::string without = bare.substr(0, bare.find("split {")) + "split_axis: OUTPUT }\n" +
                              bare.substr(bare.find("layer { name: \"loss\""));
  CHECK_THROWS_WITH(Net::from_text(without, "none.prototxt", d.runtime, *d.host),
                    Catch::Contains("'ip'") && Catch::Contains("without a split"));
  NetOptions automatic;
  automatic.layer_splits = {{"ip", Split::parse("auto")}};
  CHECK_THROWS_WITH(Net::from_text(bare, "auto.prototxt", d.runtime, *d.host, automatic),
                    Catch::Contains("'ip'") && Catch::Contains("not measured (auto)"));
}

// ---- training ----------------------------------------------------------------------------

test::TempDir scratch(const std::string& name) {
  return test::TempDir(fmt::format("hybridnn_test_output_cut_{}", name));
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Data -> ip1 (8 outputs) -> ReLU -> Dropout -> ip2 (3 outputs) -> SoftmaxWithLoss, the two
// InnerProducts cut by outputs when `cut_layers`.
std::string training_net(bool cut_layers) {
  return fmt::format(R"(
name: "generated"
layer {{ name: "data" type: "Data" top: "data" top: "label"
        transform_param {{ scale: 0.00390625 }}
        data_param {{ source: "synthetic:1x4x4:3" batch_size: 5 }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param {{ num_output: 8 weight_filler {{ type: "xavier" }}
                              bias_filler {{ type: "constant" value: 0.1 }} }} {} }}
layer {{ name: "relu" type: "ReLU" bottom: "h" top: "h" }}
layer {{ name: "drop" type: "Dropout" bottom: "h" top: "h" dropout_param {{ dropout_ratio: 0.5 }} }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "logits"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.3 }}
                              bias_filler {{ type: "constant" value: 0.2 }} }} {} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }}
)",
                     cut_layers ? cut(0.5) : "", cut_layers ? cut(0.34) : "");
}

fs::path write_solver(const fs::path& dir, bool cut_layers, const std::string& type) {
  const std::string net = cut_layers ? "cut.prototxt" : "plain.prototxt";
  write_file(dir / net, training_net(cut_layers));
  const fs::path solver = dir / (cut_layers ? "cut_solver.prototxt" : "plain_solver.prototxt");
  write_file(
      solver,
      fmt::format("net: \"{}\"\ntype: \"{}\"\nbase_lr: 0.05\nmomentum: 0.9\n"
                  "weight_decay: 0.0005\nlr_policy: \"fixed\"\nmax_iter: 10\n"
                  "display: 1\nsnapshot: 5\nrandom_seed: 7\nsnapshot_prefix: \"{}\"\n",
                  (dir / net).string(), type, (dir / (cut_layers ? "cut" : "plain")).string()));
  return solver;
}

TEST_CASE(
    "training with layers cut by outputs tracks the uncut net, its snapshots are the uncut "
    "model and resume across the cut",
    "[split]") {
  for (const std::string type : {"SGD", "Adam"}) {
    INFO(type);
    const test::TempDir temp = scratch(type);
    const fs::path dir = temp.path();
    std::map<bool, std::map<int, float>> losses;
    std::map<bool, std::vector<std::vector<float>>> weights;
    for (const bool cut_layers : {false, true}) {
      TwoDrivers d;
      Solver solver(write_solver(dir, cut_layers, type).string(), d.runtime, *d.host);
      solver.on_event([&, cut_layers](const SolverEvent& e) {
        if (e.snapshot.empty() && e.phase == Phase::train) losses[cut_layers][e.iter] = e.loss;
      });
      solver.solve();
      if (cut_layers) {
        // The second device's rows were updated where they live (the snapshots read them).
        const NetParam& shard = solver.net().learnable_params()[1];
        REQUIRE(shard.driver == d.device);
        CHECK(shard.tensor->data().current_on(d.device->memory_space()));
      }
      weights[cut_layers] = whole_values(solver.net(), false);
    }
    REQUIRE(losses[true].size() == losses[false].size());
    for (const auto& [iter, loss] : losses[false]) {
      INFO("iteration " << iter);
      CHECK(losses[true].at(iter) == Approx(loss).epsilon(1e-5));
    }
    REQUIRE(weights[true].size() == weights[false].size());
    for (std::size_t p = 0; p < weights[false].size(); ++p)
      CHECK(test::max_scaled_diff(weights[false][p], weights[true][p]) <= 1e-5);

    // The cut run's model file is the uncut model: an uncut net reads it.
    {
      TwoDrivers d;
      Net plain((dir / "plain.prototxt").string(), d.runtime, *d.host);
      CHECK(plain.copy_trained_layers_from((dir / "cut_iter_10.caffemodel").string()).empty());
      const auto read = whole_values(plain, false);
      for (std::size_t p = 0; p < read.size(); ++p)
        CHECK(read[p] == weights[true][p]);
    }
    // Resumes across the cut: the uncut run from the cut run's snapshot and the other way
    // round continue as the uninterrupted runs.
    for (const bool cut_layers : {false, true}) {
      INFO("resuming " << (cut_layers ? "cut" : "uncut") << " from the other's snapshot");
      TwoDrivers d;
      Solver solver(write_solver(dir, cut_layers, type).string(), d.runtime, *d.host);
      std::map<int, float> resumed;
      solver.on_event([&](const SolverEvent& e) {
        if (e.snapshot.empty() && e.phase == Phase::train) resumed[e.iter] = e.loss;
      });
      solver.restore(
          (dir / fmt::format("{}_iter_5.solverstate", cut_layers ? "plain" : "cut")).string());
      solver.step(5);
      for (int iter = 5; iter < 10; ++iter) {
        INFO("iteration " << iter);
        CHECK(resumed.at(iter) == Approx(losses[false].at(iter)).epsilon(1e-5));
      }
    }
  }
}

}  // namespace
}  // namespace hn
