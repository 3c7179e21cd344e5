// Softmax and LogSoftmax layers: forward and backward over any axis against naive loops on
// every driver, split runs (and the whole-batch rule along axis 0), gradients and the setup errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/softmax_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

constexpr double kTolerance = 1e-5;

struct NaiveSoftmax {
  std::vector<float> y, dx;
};

// Softmax over axis `axis` (already non-negative) in double, and its backward.
NaiveSoftmax naive_softmax(const Shape& s, int axis, const std::vector<float>& x,
                           const std::vector<float>& dy) {
  const index_t outer = s.count(0, axis), channels = s[axis];
  const index_t inner = s.count(axis + 1, s.axes());
  NaiveSoftmax r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  for (index_t o = 0; o < outer; ++o)
    for (index_t i = 0; i < inner; ++i) {
      auto at = [&](index_t c) { return static_cast<std::size_t>((o * channels + c) * inner + i); };
      double total = 0.0;
      for (index_t c = 0; c < channels; ++c)
        total += std::exp(static_cast<double>(x[at(c)]));
      std::vector<double> y(static_cast<std::size_t>(channels));
      double dot = 0.0;
      for (index_t c = 0; c < channels; ++c) {
        y[c] = std::exp(static_cast<double>(x[at(c)])) / total;
        dot += y[c] * dy[at(c)];
      }
      for (index_t c = 0; c < channels; ++c) {
        r.y[at(c)] = static_cast<float>(y[c]);
        r.dx[at(c)] = static_cast<float>(y[c] * (dy[at(c)] - dot));
      }
    }
  return r;
}

}  // namespace

TEST_CASE("Softmax forward and backward equal the naive formula over any axis on every driver",
          "[layer][softmax]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{4, 5, 3, 2};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 30, -5.0f, 5.0f);
    const auto dy = random_floats(x.size(), 31);
    for (const int axis : {1, 2, -1, 0, -4}) {
      INFO("axis " << axis);
      hn::SoftmaxLayer layer("prob", {axis});
      const int canonical = axis < 0 ? axis + 4 : axis;
      const NaiveSoftmax want = naive_softmax(shape, canonical, x, dy);
      const auto run = run_layer(layer, *driver, {shape}, {x}, {dy});
      CHECK(run.outputs[0].size() == x.size());
      CHECK(max_rel_diff(run.outputs[0], want.y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], want.dx) <= kTolerance);
      CHECK(layer.splits_by_rows() == (canonical != 0));
      if (canonical != 0) {
        hn::test::check_split_equals_whole(layer, *driver, {shape}, {x}, RunSpec{{0, 1, 2, 4}});
      }
    }
    SECTION("a 2-axis input (InnerProduct output) with large logits") {
      const Shape logits{3, 10};
      const auto big = random_floats(30, 32, -80.0f, 80.0f);
      const auto dy2 = random_floats(30, 33);
      hn::SoftmaxLayer layer("prob");
      const auto run = run_layer(layer, *driver, {logits}, {big}, {dy2});
      const NaiveSoftmax want = naive_softmax(logits, 1, big, dy2);
      CHECK(max_rel_diff(run.outputs[0], want.y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], want.dx) <= kTolerance);
    }
  }
}

TEST_CASE("Softmax gradients match finite differences", "[layer][softmax][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{2, 4, 2, 3};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 34, -2.0f, 2.0f);
    for (const int axis : {1, 3, 0}) {
      INFO("axis " << axis);
      hn::SoftmaxLayer layer("prob", {axis});
      hn::test::check_layer_gradients(layer, *driver, {shape}, {x});
    }
  }
}

TEST_CASE("Softmax rejects an axis outside the input, naming the layer and shape",
          "[layer][softmax]") {
  hn::SoftmaxLayer layer("prob1", {4});
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4, 5}}),
                    Contains("prob1") && Contains("axis 4") && Contains("2x3x4x5"));
  hn::SoftmaxLayer negative("prob2", {-3});
  CHECK_THROWS_WITH(negative.setup({Shape{2, 3}}), Contains("prob2") && Contains("2x3"));
}

TEST_CASE(
    "LogSoftmax equals the naive log of the softmax over any axis on every driver, "
    "and keeps the logarithms of probabilities that round to 0",
    "[layer][softmax][log_softmax]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{4, 5, 3, 2};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 40, -5.0f, 5.0f);
    const auto dy = random_floats(x.size(), 41);
    for (const int axis : {1, 2, -1, 0}) {
      INFO("axis " << axis);
      hn::SoftmaxLayer layer("logprob", {axis, true});
      CHECK(std::string(layer.type()) == "LogSoftmax");
      const int canonical = axis < 0 ? axis + 4 : axis;
      // log(softmax) in double; d/dx of sum(dy * log p) = dy - p * sum(dy).
      const NaiveSoftmax p = naive_softmax(shape, canonical, x, dy);
      const index_t channels = shape[canonical], inner = shape.count(canonical + 1, 4);
      std::vector<float> want_y(x.size()), want_dx(x.size());
      for (std::size_t e = 0; e < x.size(); ++e) {
        want_y[e] = static_cast<float>(std::log(static_cast<double>(p.y[e])));
        const index_t i = static_cast<index_t>(e) % inner;
        const index_t o = static_cast<index_t>(e) / (inner * channels);
        double total = 0.0;
        for (index_t c = 0; c < channels; ++c)
          total += dy[static_cast<std::size_t>((o * channels + c) * inner + i)];
        want_dx[e] = static_cast<float>(dy[e] - p.y[e] * total);
      }
      const auto run = run_layer(layer, *driver, {shape}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], want_y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], want_dx) <= kTolerance);
      if (canonical != 0) {
        hn::test::check_split_equals_whole(layer, *driver, {shape}, {x}, RunSpec{{0, 1, 2, 4}});
      }
    }
    SECTION("logits 200 apart: the softmax rounds to 0, its logarithm is -200") {
      const Shape logits{1, 2};
      hn::SoftmaxLayer layer("logprob", {1, true});
      const auto run = run_layer(layer, *driver, {logits}, {{0.0f, 200.0f}}, {{1.0f, 0.0f}});
      CHECK(run.outputs[0][0] == Approx(-200.0f).epsilon(1e-6));
      CHECK(run.outputs[0][1] == Approx(0.0f).margin(1e-6));
      CHECK(run.input_diffs[0][0] == Approx(1.0f).epsilon(1e-6));
      CHECK(run.input_diffs[0][1] == Approx(-1.0f).epsilon(1e-6));
    }
  }
}

TEST_CASE("LogSoftmax gradients match finite differences",
          "[layer][softmax][log_softmax][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{2, 4, 2, 3};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 42, -2.0f, 2.0f);
    for (const int axis : {1, 3, 0}) {
      INFO("axis " << axis);
      hn::SoftmaxLayer layer("logprob", {axis, true});
      hn::test::check_layer_gradients(layer, *driver, {shape}, {x});
    }
  }
}
