// Loss layers (SoftmaxWithLoss, EuclideanLoss, SigmoidCrossEntropyLoss) on every driver
// against naive double-precision references written here, Caffe's normalization modes and
// ignore_label, finite-difference gradient checks, and the shape errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/loss_layer.h"
#include "tests/layer_runs.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::LossNormalization;
using hn::Shape;
using hn::test::DriverConfig;
using hn::test::HostValues;
using hn::test::max_rel_diff;
using hn::test::random_floats;

constexpr double kTolerance = 1e-5;
constexpr float kLossWeight = 2.5f;

// Caffe's divisor, written out per mode for the tests.
double expected_normalizer(LossNormalization mode, index_t outer, index_t inner, index_t valid) {
  double n = 1.0;
  if (mode == LossNormalization::full) n = static_cast<double>(outer * inner);
  if (mode == LossNormalization::valid) n = static_cast<double>(valid);
  if (mode == LossNormalization::batch_size) n = static_cast<double>(outer);
  return n < 1.0 ? 1.0 : n;
}

// A LossParams setting and the mode Caffe resolves it to.
struct NormalizationCase {
  std::string label;
  hn::LossParams params;
  LossNormalization softmax_mode;  // SoftmaxWithLoss (default VALID)
  LossNormalization sigmoid_mode;  // SigmoidCrossEntropyLoss (default BATCH_SIZE)
};

std::vector<NormalizationCase> normalization_cases(std::optional<int> ignore_label) {
  std::vector<NormalizationCase> cases;
  auto add = [&](std::string label, std::optional<LossNormalization> mode,
                 std::optional<bool> normalize, LossNormalization softmax,
                 LossNormalization sigmoid) {
    hn::LossParams p;
    p.ignore_label = ignore_label;
    p.normalization = mode;
    p.normalize = normalize;
    cases.push_back({std::move(label), p, softmax, sigmoid});
  };
  add("default", std::nullopt, std::nullopt, LossNormalization::valid,
      LossNormalization::batch_size);
  add("FULL", LossNormalization::full, std::nullopt, LossNormalization::full,
      LossNormalization::full);
  add("VALID", LossNormalization::valid, std::nullopt, LossNormalization::valid,
      LossNormalization::valid);
  add("BATCH_SIZE", LossNormalization::batch_size, std::nullopt, LossNormalization::batch_size,
      LossNormalization::batch_size);
  add("NONE", LossNormalization::none, std::nullopt, LossNormalization::none,
      LossNormalization::none);
  add("normalize: true", std::nullopt, true, LossNormalization::valid, LossNormalization::valid);
  add("normalize: false", std::nullopt, false, LossNormalization::batch_size,
      LossNormalization::batch_size);
  add("normalization overrides normalize", LossNormalization::full, false, LossNormalization::full,
      LossNormalization::full);
  return cases;
}

// ---- SoftmaxWithLoss reference ----------------------------------------------------------

struct SoftmaxLossReference {
  double loss = 0.0;
  std::vector<float> prob;
  std::vector<float> dx;  // for loss weight kLossWeight
};

SoftmaxLossReference naive_softmax_loss(const std::vector<float>& x,
                                        const std::vector<float>& labels, index_t outer,
                                        index_t channels, index_t inner,
                                        std::optional<int> ignore_label, LossNormalization mode) {
  SoftmaxLossReference ref;
  ref.prob.resize(x.size());
  ref.dx.assign(x.size(), 0.0f);
  std::vector<double> p(static_cast<std::size_t>(channels));
  double total = 0.0;
  index_t valid = 0;
  auto at = [&](index_t o, index_t c, index_t i) {
    return static_cast<std::size_t>((o * channels + c) * inner + i);
  };
  for (index_t o = 0; o < outer; ++o) {
    for (index_t i = 0; i < inner; ++i) {
      double max = -INFINITY, sum = 0.0;
      for (index_t c = 0; c < channels; ++c)
        max = std::max(max, static_cast<double>(x[at(o, c, i)]));
      for (index_t c = 0; c < channels; ++c) {
        p[c] = std::exp(x[at(o, c, i)] - max);
        sum += p[c];
      }
      for (index_t c = 0; c < channels; ++c) {
        p[c] /= sum;
        ref.prob[at(o, c, i)] = static_cast<float>(p[c]);
      }
      const int label = static_cast<int>(labels[static_cast<std::size_t>(o * inner + i)]);
      if (ignore_label && label == *ignore_label) continue;
      total -= std::log(std::max(p[label], static_cast<double>(FLT_MIN)));
      ++valid;
      for (index_t c = 0; c < channels; ++c) {
        ref.dx[at(o, c, i)] = static_cast<float>(p[c] - (c == label ? 1.0 : 0.0));
      }
    }
  }
  const double n = expected_normalizer(mode, outer, inner, valid);
  ref.loss = total / n;
  for (float& d : ref.dx)
    d = static_cast<float>(d * kLossWeight / n);
  return ref;
}

// Labels in [0, channels) with every fourth position set to `ignore` (when given).
std::vector<float> make_labels(index_t count, index_t channels, std::optional<int> ignore,
                               std::uint32_t seed) {
  const std::vector<float> r = random_floats(static_cast<std::size_t>(count), seed, 0.0f, 1.0f);
  std::vector<float> labels(r.size());
  for (std::size_t k = 0; k < r.size(); ++k) {
    labels[k] =
        std::min(std::floor(r[k] * static_cast<float>(channels)), static_cast<float>(channels - 1));
    if (ignore && k % 4 == 1) labels[k] = static_cast<float>(*ignore);
  }
  return labels;
}

struct SoftmaxCase {
  std::string label;
  Shape scores, labels;
  int axis;
  index_t outer, channels, inner;
};

const std::vector<SoftmaxCase>& softmax_cases() {
  static const std::vector<SoftmaxCase> cases = {
      {"2x5 classes on axis 1", Shape{2, 5}, Shape{2}, 1, 2, 5, 1},
      {"2x4x3x2 spatial labels", Shape{2, 4, 3, 2}, Shape{2, 1, 3, 2}, 1, 2, 4, 6},
      {"3x2x5 classes on axis 2", Shape{3, 2, 5}, Shape{3, 2}, 2, 6, 5, 1},
      {"3x2x5 classes on axis -1", Shape{3, 2, 5}, Shape{3, 2}, -1, 6, 5, 1},
      {"2x3x4 classes on axis 1 (inner 4)", Shape{2, 3, 4}, Shape{2, 4}, 1, 2, 3, 4},
  };
  return cases;
}

TEST_CASE("SoftmaxWithLoss forward and backward match a naive softmax cross-entropy",
          "[layer][softmax_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 10;
    for (const SoftmaxCase& sc : softmax_cases()) {
      for (const std::optional<int> ignore : {std::optional<int>{}, std::optional<int>{255}}) {
        for (const NormalizationCase& nc : normalization_cases(ignore)) {
          INFO(sc.label << ", ignore_label " << (ignore ? std::to_string(*ignore) : "none")
                        << ", normalization " << nc.label);
          const std::vector<float> x =
              random_floats(static_cast<std::size_t>(sc.scores.count()), ++seed, -3.0f, 3.0f);
          const std::vector<float> labels =
              make_labels(sc.labels.count(), sc.channels, ignore, ++seed);
          const SoftmaxLossReference ref = naive_softmax_loss(x, labels, sc.outer, sc.channels,
                                                              sc.inner, ignore, nc.softmax_mode);
          hn::SoftmaxWithLossParams params;
          params.axis = sc.axis;
          params.loss_param = nc.params;
          // With the probabilities as a second output: their gradient is ignored, as in Caffe.
          hn::SoftmaxWithLossLayer layer("loss", params, 2);
          const HostValues diffs = {{kLossWeight},
                                    random_floats(static_cast<std::size_t>(sc.scores.count()), 7)};
          const hn::test::LayerRun run =
              hn::test::run_layer(layer, *driver, {sc.scores, sc.labels}, {x, labels}, diffs);
          REQUIRE(run.outputs[0].size() == 1);
          CHECK(std::abs(run.outputs[0][0] - ref.loss) <= kTolerance * std::max(1.0, ref.loss));
          CHECK(max_rel_diff(run.outputs[1], ref.prob) <= kTolerance);
          CHECK(max_rel_diff(run.input_diffs[0], ref.dx) <= kTolerance);
          CHECK(run.input_diffs[1].empty());  // labels get no gradient

          // One output: the probabilities live in the layer's state.
          hn::SoftmaxWithLossLayer single("loss", params);
          const hn::test::LayerRun one = hn::test::run_layer(
              single, *driver, {sc.scores, sc.labels}, {x, labels}, {{kLossWeight}});
          CHECK(one.outputs.size() == 1);
          CHECK(one.outputs[0][0] == run.outputs[0][0]);
          CHECK(max_rel_diff(one.input_diffs[0], run.input_diffs[0]) == 0.0);
        }
      }
    }
  }
}

TEST_CASE("SoftmaxWithLoss: ignored positions add no loss and no gradient",
          "[layer][softmax_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const Shape scores{2, 3, 2}, labels{2, 2};  // outer 2, 3 classes, inner 2
    const std::vector<float> x = random_floats(12, 3, -2.0f, 2.0f);
    hn::SoftmaxWithLossParams params;
    params.loss_param.ignore_label = -1;
    SECTION("the loss over the other positions, the VALID normalizer counting only them") {
      hn::SoftmaxWithLossLayer layer("loss", params);
      // Positions (o, i): (0,0) label 2, (0,1) ignored, (1,0) ignored, (1,1) label 0.
      const hn::test::LayerRun run =
          hn::test::run_layer(layer, *driver, {scores, labels}, {x, {2, -1, -1, 0}}, {{1.0f}});
      auto log_softmax = [&](index_t o, index_t c, index_t i) {
        double sum = 0.0;
        for (index_t k = 0; k < 3; ++k)
          sum += std::exp(static_cast<double>(x[(o * 3 + k) * 2 + i]));
        return x[(o * 3 + c) * 2 + i] - std::log(sum);
      };
      const double want = -(log_softmax(0, 2, 0) + log_softmax(1, 0, 1)) / 2.0;
      CHECK(std::abs(run.outputs[0][0] - want) <= kTolerance);
      for (index_t c = 0; c < 3; ++c) {
        CHECK(run.input_diffs[0][(0 * 3 + c) * 2 + 1] == 0.0f);
        CHECK(run.input_diffs[0][(1 * 3 + c) * 2 + 0] == 0.0f);
        CHECK(run.input_diffs[0][(0 * 3 + c) * 2 + 0] != 0.0f);
      }
    }
    SECTION("every label ignored: loss 0 and gradient 0 (normalizer at least 1, no NaN)") {
      hn::SoftmaxWithLossLayer layer("loss", params);
      const hn::test::LayerRun run =
          hn::test::run_layer(layer, *driver, {scores, labels}, {x, {-1, -1, -1, -1}}, {{1.0f}});
      CHECK(run.outputs[0][0] == 0.0f);
      CHECK(run.input_diffs[0] == std::vector<float>(12, 0.0f));
    }
  }
}

TEST_CASE("SoftmaxWithLoss gradients match finite differences", "[layer][softmax_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    for (const LossNormalization mode : {LossNormalization::valid, LossNormalization::full,
                                         LossNormalization::batch_size, LossNormalization::none}) {
      INFO("normalization " << static_cast<int>(mode));
      hn::SoftmaxWithLossParams params;
      params.loss_param.ignore_label = 255;
      params.loss_param.normalization = mode;
      hn::SoftmaxWithLossLayer layer("loss", params);
      const Shape scores{2, 4, 3, 2}, labels{2, 3, 2};
      hn::test::check_layer_gradients(
          layer, *driver, {scores, labels},
          {random_floats(48, 21, -2.0f, 2.0f), make_labels(12, 4, 255, 22)});
    }
    hn::SoftmaxWithLossParams params;
    params.axis = -1;
    hn::SoftmaxWithLossLayer layer("loss", params);
    hn::test::check_layer_gradients(
        layer, *driver, {Shape{3, 2, 5}, Shape{3, 2}},
        {random_floats(30, 23, -2.0f, 2.0f), make_labels(6, 5, std::nullopt, 24)});
  }
}

TEST_CASE("SoftmaxWithLoss rejects impossible shapes and label gradients",
          "[layer][softmax_loss]") {
  hn::SoftmaxWithLossLayer layer("loss");
  CHECK_THROWS_WITH(layer.setup({Shape{2, 4, 3}, Shape{2, 2}}),
                    Contains("layer 'loss' (SoftmaxWithLoss)") && Contains("2x4x3") &&
                        Contains("2x2") && Contains("needs one label per position, 6"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 4}}), Contains("layer 'loss' (SoftmaxWithLoss)"));
  hn::SoftmaxWithLossParams bad_axis;
  bad_axis.axis = 3;
  hn::SoftmaxWithLossLayer axis_layer("loss", bad_axis);
  CHECK_THROWS_WITH(
      axis_layer.setup({Shape{2, 4, 3}, Shape{2, 3}}),
      Contains("layer 'loss' (SoftmaxWithLoss)") && Contains("axis 3") && Contains("2x4x3"));
  hn::SoftmaxWithLossLayer three("loss", {}, 3);
  CHECK_THROWS_WITH(three.setup({Shape{2, 4}, Shape{2}}), Contains("num_outputs"));

  auto driver = hn::make_driver(hn::Device{"reference", 0});
  hn::SoftmaxWithLossLayer loss("loss");
  hn::Tensor x(Shape{2, 3}), labels(Shape{2}), out(Shape{});
  REQUIRE(loss.setup({x.shape(), labels.shape()}).size() == 1);
  hn::test::set_values(labels, {0, 2});
  hn::run_forward(loss, *driver, {&x, &labels}, {&out});
  out.host_diff_mut()[0] = 1.0f;
  CHECK_THROWS_WITH(
      hn::run_backward(loss, *driver, {&x, &labels}, {&out}, {true, true}),
      Contains("layer 'loss' (SoftmaxWithLoss)") && Contains("cannot back-propagate to the label"));
  SECTION("a label outside the classes is an error") {
    hn::test::set_values(labels, {0, 3});
    CHECK_THROWS_AS(hn::run_forward(loss, *driver, {&x, &labels}, {&out}), hn::Error);
  }
}

// ---- EuclideanLoss ----------------------------------------------------------------------

TEST_CASE("EuclideanLoss forward and backward match sum((a-b)^2)/(2N)", "[layer][euclidean_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    // b may have another shape with the same count per item (Caffe checks count(1)).
    const Shape a_shape{3, 2, 5}, b_shape{3, 10};
    const std::vector<float> a = random_floats(30, 31), b = random_floats(30, 32);
    double squares = 0.0;
    std::vector<float> da(30), db(30);
    for (std::size_t k = 0; k < 30; ++k) {
      const double d = static_cast<double>(a[k]) - b[k];
      squares += d * d;
      da[k] = static_cast<float>(d * kLossWeight / 3.0);
      db[k] = -da[k];
    }
    hn::EuclideanLossLayer layer("euclid");
    const hn::test::LayerRun run =
        hn::test::run_layer(layer, *driver, {a_shape, b_shape}, {a, b}, {{kLossWeight}});
    CHECK(std::abs(run.outputs[0][0] - squares / 6.0) <= kTolerance);
    CHECK(max_rel_diff(run.input_diffs[0], da) <= kTolerance);
    CHECK(max_rel_diff(run.input_diffs[1], db) <= kTolerance);
  }
}

TEST_CASE("EuclideanLoss gradients match finite differences", "[layer][euclidean_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    hn::EuclideanLossLayer layer("euclid");
    hn::test::check_layer_gradients(layer, *driver, {Shape{2, 3, 2}, Shape{2, 6}},
                                    {random_floats(12, 33), random_floats(12, 34)});
  }
}

TEST_CASE("EuclideanLoss rejects inputs of different sizes", "[layer][euclidean_loss]") {
  hn::EuclideanLossLayer layer("euclid");
  CHECK_THROWS_WITH(
      layer.setup({Shape{2, 3}, Shape{2, 4}}),
      Contains("layer 'euclid' (EuclideanLoss)") && Contains("2x3") && Contains("2x4"));
  CHECK_THROWS_WITH(
      layer.setup({Shape{2, 6}, Shape{3, 4}}),
      Contains("layer 'euclid' (EuclideanLoss)") && Contains("2x6") && Contains("3x4"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 6}}), Contains("layer 'euclid' (EuclideanLoss)"));
}

// ---- SigmoidCrossEntropyLoss ------------------------------------------------------------

TEST_CASE("SigmoidCrossEntropyLoss forward and backward match the logistic loss",
          "[layer][sigmoid_cross_entropy_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{3, 2, 4};
    const index_t outer = 3, inner = 8, count = 24;
    for (const std::optional<int> ignore : {std::optional<int>{}, std::optional<int>{-1}}) {
      for (const NormalizationCase& nc : normalization_cases(ignore)) {
        INFO("ignore_label " << (ignore ? "-1" : "none") << ", normalization " << nc.label);
        const std::vector<float> x = random_floats(count, 41, -6.0f, 6.0f);
        std::vector<float> t = random_floats(count, 42, 0.0f, 1.0f);
        for (std::size_t k = 0; k < t.size(); k += 5)
          t[k] = -1.0f;  // an ignored target (or, without ignore_label, an odd one)
        double total = 0.0;
        index_t valid = 0;
        std::vector<double> grad(t.size(), 0.0);
        for (std::size_t k = 0; k < t.size(); ++k) {
          if (ignore && static_cast<int>(t[k]) == *ignore) continue;
          const double v = x[k];
          total += std::log(1.0 + std::exp(v)) - v * t[k];  // -t log s - (1-t) log(1-s)
          grad[k] = 1.0 / (1.0 + std::exp(-v)) - t[k];
          ++valid;
        }
        const double n = expected_normalizer(nc.sigmoid_mode, outer, inner, valid);
        std::vector<float> dx(t.size());
        for (std::size_t k = 0; k < t.size(); ++k)
          dx[k] = static_cast<float>(grad[k] * kLossWeight / n);
        hn::SigmoidCrossEntropyLossParams params;
        params.loss_param = nc.params;
        hn::SigmoidCrossEntropyLossLayer layer("sce", params);
        const hn::test::LayerRun run =
            hn::test::run_layer(layer, *driver, {shape, shape}, {x, t}, {{kLossWeight}});
        CHECK(std::abs(run.outputs[0][0] - total / n) <= kTolerance * std::max(1.0, total / n));
        CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
      }
    }
  }
}

TEST_CASE("SigmoidCrossEntropyLoss gradients match finite differences",
          "[layer][sigmoid_cross_entropy_loss]") {
  const DriverConfig config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    std::vector<float> t = random_floats(12, 52, 0.0f, 1.0f);
    t[3] = t[7] = -1.0f;
    for (const LossNormalization mode : {LossNormalization::valid, LossNormalization::batch_size,
                                         LossNormalization::full, LossNormalization::none}) {
      hn::SigmoidCrossEntropyLossParams params;
      params.loss_param.ignore_label = -1;
      params.loss_param.normalization = mode;
      hn::SigmoidCrossEntropyLossLayer layer("sce", params);
      hn::test::check_layer_gradients(layer, *driver, {Shape{2, 6}, Shape{2, 6}},
                                      {random_floats(12, 51, -3.0f, 3.0f), t});
    }
  }
}

TEST_CASE("SigmoidCrossEntropyLoss rejects mismatched targets and target gradients",
          "[layer][sigmoid_cross_entropy_loss]") {
  hn::SigmoidCrossEntropyLossLayer layer("sce");
  CHECK_THROWS_WITH(layer.setup({Shape{2, 6}, Shape{2, 5}}),
                    Contains("layer 'sce' (SigmoidCrossEntropyLoss)") && Contains("2x6") &&
                        Contains("2x5") && Contains("same count"));
  auto driver = hn::make_driver(hn::Device{"reference", 0});
  hn::Tensor x(Shape{2, 3}), t(Shape{2, 3}), out(Shape{});
  layer.setup({x.shape(), t.shape()});
  hn::run_forward(layer, *driver, {&x, &t}, {&out});
  out.host_diff_mut()[0] = 1.0f;
  CHECK_THROWS_WITH(hn::run_backward(layer, *driver, {&x, &t}, {&out}, {true, true}),
                    Contains("layer 'sce' (SigmoidCrossEntropyLoss)") &&
                        Contains("cannot back-propagate to the label"));
}

}  // namespace
