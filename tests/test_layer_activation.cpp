// ReLU, Sigmoid, TanH, Swish, Clip and Dropout layers: forward against naive loops on every driver,
// split runs against whole-batch runs, in-place runs, and finite-difference gradients.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/philox.h"
#include "lib/core/runtime.h"
#include "lib/layers/activation_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::Shape;
using hn::test::check_layer_gradients;
using hn::test::check_split_equals_whole;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

constexpr double kTolerance = 1e-5;  // vectorised exp/tanh on the CPU driver
const Shape kShape{5, 3, 4, 2};

std::vector<float> naive_map(const std::vector<float>& x, double (*f)(double)) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<float>(f(x[i]));
  return y;
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double tanh_of(double x) {
  return std::tanh(x);
}

// Runs a layer in place (output 0 is input 0's tensor): forward, then backward with `dy`.
struct InPlaceRun {
  std::vector<float> y, dx;
};
InPlaceRun run_in_place(hn::Layer& layer, hn::Driver& driver, const Shape& shape,
                        const std::vector<float>& x, const std::vector<float>& dy,
                        hn::Phase phase = hn::Phase::train) {
  layer.setup({shape});
  hn::Tensor blob(shape);
  hn::test::set_values(blob, x);
  hn::RunOptions options;
  options.phase = phase;
  options.seed = 1;
  hn::run_forward(layer, driver, {&blob}, {&blob}, options);
  InPlaceRun run;
  run.y = hn::test::values(blob);
  std::copy(dy.begin(), dy.end(), blob.host_diff_mut());
  hn::run_backward(layer, driver, {&blob}, {&blob}, {}, options);
  run.dx = hn::test::diffs(blob);
  return run;
}

}  // namespace

TEST_CASE("ReLU forward and backward equal the naive negative_slope rule on every driver",
          "[layer][relu]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    for (const float slope : {0.0f, 0.1f}) {
      INFO("negative_slope " << slope);
      hn::ReluLayer layer("relu", {slope});
      const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 1);
      const auto dy = random_floats(x.size(), 2);
      std::vector<float> y(x.size()), dx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        y[i] = x[i] > 0 ? x[i] : slope * x[i];
        dx[i] = x[i] > 0 ? dy[i] : slope * dy[i];
      }
      const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
      check_split_equals_whole(layer, *driver, {kShape}, {x}, RunSpec{{0, 1, 3, 5}});

      const auto in_place = run_in_place(layer, *driver, kShape, x, dy);
      CHECK(max_rel_diff(in_place.y, y) <= kTolerance);
      CHECK(max_rel_diff(in_place.dx, dx) <= kTolerance);
    }
  }
}

TEST_CASE("ReLU with a negative slope in place is an error naming the layer", "[layer][relu]") {
  const auto driver = hn::make_driver(hn::Device::parse("reference"));
  hn::ReluLayer layer("leaky", {-0.5f});
  const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 5);
  // Backward from y would pass dy where x < 0 (y = -0.5 x > 0) and scale it where x > 0.
  CHECK_THROWS_WITH(run_in_place(layer, *driver, kShape, x, x),
                    Contains("'leaky'") && Contains("negative_slope -0.5") && Contains("in place"));
  hn::ReluLayer told("told", {-0.5f});
  told.set_in_place({true});
  CHECK_THROWS_WITH(told.setup({kShape}), Contains("'told'") && Contains("in place"));
}

TEST_CASE("Sigmoid and TanH forward and backward equal naive formulas on every driver",
          "[layer][sigmoid][tanh]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 3, -4.0f, 4.0f);
    const auto dy = random_floats(x.size(), 4);
    {
      hn::SigmoidLayer layer("sigmoid");
      const auto y = naive_map(x, sigmoid);
      std::vector<float> dx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        dx[i] = static_cast<float>(dy[i] * sigmoid(x[i]) * (1.0 - sigmoid(x[i])));
      const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
      check_split_equals_whole(layer, *driver, {kShape}, {x}, RunSpec{{0, 2, 5}});
      const auto in_place = run_in_place(layer, *driver, kShape, x, dy);
      CHECK(max_rel_diff(in_place.y, y) <= kTolerance);
      CHECK(max_rel_diff(in_place.dx, dx) <= kTolerance);
    }
    {
      hn::TanhLayer layer("tanh");
      const auto y = naive_map(x, tanh_of);
      std::vector<float> dx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        dx[i] = static_cast<float>(dy[i] * (1.0 - std::tanh(x[i]) * std::tanh(x[i])));
      const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
      check_split_equals_whole(layer, *driver, {kShape}, {x}, RunSpec{{0, 4, 5}});
      const auto in_place = run_in_place(layer, *driver, kShape, x, dy);
      CHECK(max_rel_diff(in_place.y, y) <= kTolerance);
      CHECK(max_rel_diff(in_place.dx, dx) <= kTolerance);
    }
  }
}

TEST_CASE(
    "Clip forward and backward equal naive formulas on every driver, the bounds passing "
    "the gradient",
    "[layer][clip]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    auto x = random_floats(static_cast<std::size_t>(kShape.count()), 31, -3.0f, 3.0f);
    const float lo = -1.0f, hi = 0.5f;
    x[0] = lo;
    x[1] = hi;
    const auto dy = random_floats(x.size(), 32);
    hn::ClipLayer layer("clip", {lo, hi});
    std::vector<float> y(x.size()), dx(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      y[i] = std::min(std::max(x[i], lo), hi);
      dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
    }
    const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy});
    CHECK(run.outputs[0] == y);
    CHECK(run.input_diffs[0] == dx);
    CHECK(std::count(dx.begin(), dx.end(), 0.0f) > 0);  // some gradients stopped
    check_split_equals_whole(layer, *driver, {kShape}, {x}, RunSpec{{0, 2, 5}});

    // In place the gradient comes from y: PyTorch's ReLU6 rule, stopped at the bounds too.
    for (std::size_t i = 0; i < x.size(); ++i)
      dx[i] = x[i] > lo && x[i] < hi ? dy[i] : 0.0f;
    CHECK(dx[0] == 0.0f);
    CHECK(dx[1] == 0.0f);
    const auto in_place = run_in_place(layer, *driver, kShape, x, dy);
    CHECK(in_place.y == y);
    CHECK(in_place.dx == dx);
    // Bounds with no float strictly between them stop every gradient.
    hn::ClipLayer point("point", {0.25f, 0.25f});
    const auto flat = run_in_place(point, *driver, kShape, x, dy);
    CHECK(flat.dx == std::vector<float>(x.size(), 0.0f));
  }
}

TEST_CASE("Swish forward and backward equal the naive formula in double on every driver",
          "[layer][swish]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 33, -6.0f, 6.0f);
    const auto dy = random_floats(x.size(), 34);
    for (const float beta : {1.0f, 0.5f, -2.0f}) {
      INFO("beta " << beta);
      hn::SwishLayer layer("swish", {beta});
      std::vector<float> y(x.size()), dx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double v = x[i], s = 1.0 / (1.0 + std::exp(-beta * v));
        y[i] = static_cast<float>(v * s);
        dx[i] = static_cast<float>(dy[i] * (s + beta * v * s * (1.0 - s)));
      }
      const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
      check_split_equals_whole(layer, *driver, {kShape}, {x}, RunSpec{{0, 2, 5}});
    }
    hn::SwishLayer bad("swish9", {std::nanf("")});
    CHECK_THROWS_WITH(bad.setup({kShape}), Contains("swish9") && Contains("beta"));
  }
}

TEST_CASE("Clip with min above max is an error naming the layer", "[layer][clip]") {
  hn::ClipLayer layer("clip7", {1.0f, 0.0f});
  CHECK_THROWS_WITH(layer.setup({kShape}), Contains("clip7") && Contains("min 1"));
}

TEST_CASE("Dropout in train phase keeps the Philox mask scaled by 1/(1-ratio) on every driver",
          "[layer][dropout]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const float ratio = 0.3f;
    hn::DropoutLayer layer("drop", {ratio});
    const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 5);
    const auto dy = random_floats(x.size(), 6);
    const std::uint64_t seed = 77;
    // The mask the layer documents: element i of the batch keeps when
    // philox_uniform(mask_seed(seed), i) >= ratio.
    const std::uint64_t key = layer.mask_seed(seed);
    const float scale = 1.0f / (1.0f - ratio);
    std::vector<float> y(x.size()), dx(x.size());
    std::size_t kept = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const bool keep = hn::detail::philox_uniform(key, i) >= ratio;
      kept += keep ? 1 : 0;
      y[i] = keep ? x[i] * scale : 0.0f;
      dx[i] = keep ? dy[i] * scale : 0.0f;
    }
    CHECK(kept > 0);
    CHECK(kept < x.size());
    RunSpec spec;
    spec.seed = seed;
    const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy}, spec);
    CHECK(run.outputs[0] == y);  // bitwise: every driver draws and scales identically
    CHECK(run.input_diffs[0] == dx);

    spec.cuts = {0, 2, 3, 5};  // a split draws the whole-batch mask
    check_split_equals_whole(layer, *driver, {kShape}, {x}, spec, 0.0);

    const auto in_place = run_in_place(layer, *driver, kShape, x, dy);
    hn::DropoutLayer same_seed("drop", {ratio});
    RunSpec seed_one;
    const auto out_of_place = run_layer(same_seed, *driver, {kShape}, {x}, {dy}, seed_one);
    CHECK(in_place.y == out_of_place.outputs[0]);
    CHECK(in_place.dx == out_of_place.input_diffs[0]);
  }
}

TEST_CASE("Dropout is the identity in test phase, forward and backward, on every driver",
          "[layer][dropout]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    hn::DropoutLayer layer("drop", {0.5f});
    const auto x = random_floats(static_cast<std::size_t>(kShape.count()), 7);
    const auto dy = random_floats(x.size(), 8);
    RunSpec spec;
    spec.phase = hn::Phase::test;
    const auto run = run_layer(layer, *driver, {kShape}, {x}, {dy}, spec);
    CHECK(run.outputs[0] == x);
    CHECK(run.input_diffs[0] == dy);
    const auto in_place = run_in_place(layer, *driver, kShape, x, dy, hn::Phase::test);
    CHECK(in_place.y == x);
    CHECK(in_place.dx == dy);
  }
}

TEST_CASE("Dropout layers with different names draw different masks from one seed",
          "[layer][dropout]") {
  const auto driver = hn::make_driver(hn::Device{"reference", 0});
  hn::DropoutLayer first("drop6", {0.5f});
  hn::DropoutLayer second("drop7", {0.5f});
  const std::vector<float> ones(static_cast<std::size_t>(kShape.count()), 1.0f);
  RunSpec spec;
  spec.seed = 3;
  const auto a = run_layer(first, *driver, {kShape}, {ones}, {}, spec);
  const auto b = run_layer(second, *driver, {kShape}, {ones}, {}, spec);
  CHECK(a.outputs[0] != b.outputs[0]);
  CHECK(first.mask_seed(3) != first.mask_seed(4));
}

TEST_CASE("Dropout rejects a ratio outside 0 <= ratio < 1, naming the layer", "[layer][dropout]") {
  hn::DropoutLayer layer("drop1", {1.0f});
  CHECK_THROWS_WITH(layer.setup({kShape}),
                    Contains("drop1") && Contains("dropout_ratio") && Contains(kShape.to_string()));
}

TEST_CASE("ReLU, Sigmoid, TanH, Swish, Clip and Dropout gradients match finite differences",
          "[layer][relu][sigmoid][tanh][swish][clip][dropout][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{2, 3, 2, 3};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 9, -2.0f, 2.0f);
    hn::test::GradientCheck relu_check;
    relu_check.kink = 0.0f;
    relu_check.kink_range = 0.03f;  // the step is 0.01: stay off the kink
    for (const float slope : {0.0f, 0.25f}) {
      hn::ReluLayer relu("relu", {slope});
      check_layer_gradients(relu, *driver, {shape}, {x}, relu_check);
    }
    hn::SigmoidLayer sigmoid_layer("sigmoid");
    check_layer_gradients(sigmoid_layer, *driver, {shape}, {x});
    hn::TanhLayer tanh_layer("tanh");
    check_layer_gradients(tanh_layer, *driver, {shape}, {x});
    hn::SwishLayer swish("swish", {1.5f});
    check_layer_gradients(swish, *driver, {shape}, {x});
    // Clip's kinks at its bounds: the inputs keep 0.03 away from both.
    std::vector<float> clip_x = x;
    for (float& v : clip_x)
      for (const float bound : {-0.75f, 1.0f})
        if (std::fabs(v - bound) < 0.03f) v = bound + 0.05f;
    hn::ClipLayer clip("clip", {-0.75f, 1.0f});
    check_layer_gradients(clip, *driver, {shape}, {clip_x});

    hn::DropoutLayer dropout("drop", {0.4f});
    hn::test::GradientCheck train;  // a fixed seed: every forward draws the same mask
    train.seed = 11;
    check_layer_gradients(dropout, *driver, {shape}, {x}, train);
    hn::test::GradientCheck test_phase;
    test_phase.phase = hn::Phase::test;
    check_layer_gradients(dropout, *driver, {shape}, {x}, test_phase);
  }
}
