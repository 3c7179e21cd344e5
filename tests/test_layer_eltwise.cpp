// Eltwise layer: SUM with coefficients, PROD (both gradient forms) and MAX (Caffe's ties:
// input 1 over input 0, then the earlier input) against naive loops on every driver, split runs,
// gradients and the setup errors.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/eltwise_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::EltwiseOp;
using hn::EltwiseParams;
using hn::Shape;
using hn::test::HostValues;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

constexpr double kTolerance = 1e-5;
const Shape kShape{3, 2, 3, 2};

EltwiseParams params(EltwiseOp op, std::vector<float> coeff = {}, bool stable = true) {
  EltwiseParams p;
  p.operation = op;
  p.coeff = std::move(coeff);
  p.stable_prod_grad = stable;
  return p;
}

struct NaiveEltwise {
  std::vector<float> y;
  HostValues dx;
};

NaiveEltwise naive(const EltwiseParams& p, const HostValues& x, const std::vector<float>& dy) {
  const std::size_t n = x[0].size(), inputs = x.size();
  NaiveEltwise r;
  r.y.resize(n);
  r.dx.assign(inputs, std::vector<float>(n, 0.0f));
  for (std::size_t e = 0; e < n; ++e) {
    switch (p.operation) {
      case EltwiseOp::sum: {
        double sum = 0.0;
        for (std::size_t i = 0; i < inputs; ++i) {
          const double c = p.coeff.empty() ? 1.0 : p.coeff[i];
          sum += c * x[i][e];
          r.dx[i][e] = static_cast<float>(c * dy[e]);
        }
        r.y[e] = static_cast<float>(sum);
        break;
      }
      case EltwiseOp::prod: {
        double product = 1.0;
        for (std::size_t i = 0; i < inputs; ++i)
          product *= x[i][e];
        r.y[e] = static_cast<float>(product);
        for (std::size_t i = 0; i < inputs; ++i) {
          double others = 1.0;
          for (std::size_t j = 0; j < inputs; ++j)
            if (j != i) others *= x[j][e];
          r.dx[i][e] = static_cast<float>(dy[e] * others);
        }
        break;
      }
      case EltwiseOp::max: {
        // Caffe's EltwiseLayer::Forward_cpu: `a > b ? 0 : 1` for the first two inputs, then
        // strictly greater for each later one.
        std::size_t best = x[0][e] > x[1][e] ? 0 : 1;
        for (std::size_t i = 2; i < inputs; ++i)
          if (x[i][e] > x[best][e]) best = i;
        r.y[e] = x[best][e];
        r.dx[best][e] = dy[e];
        break;
      }
    }
  }
  return r;
}

// Per element, the inputs differ by at least 0.1 (in random order), so finite differences
// with step 0.01 never change which input is the maximum.
HostValues separated_inputs(std::size_t inputs, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> base(-1.0f, 1.0f);
  HostValues x(inputs, std::vector<float>(n));
  std::vector<float> offsets(inputs);
  for (std::size_t i = 0; i < inputs; ++i)
    offsets[i] = 0.1f * static_cast<float>(i);
  for (std::size_t e = 0; e < n; ++e) {
    std::shuffle(offsets.begin(), offsets.end(), rng);
    const float b = base(rng);
    for (std::size_t i = 0; i < inputs; ++i)
      x[i][e] = b + offsets[i];
  }
  return x;
}

// Values with |x| in [0.5, 1.5], so y / x_i is well conditioned.
std::vector<float> away_from_zero(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, 0.5f, 1.5f);
  std::mt19937 rng(seed);
  for (float& value : v)
    if (rng() % 2 == 0) value = -value;
  return v;
}

}  // namespace

TEST_CASE("Eltwise SUM, PROD and MAX equal naive loops on every driver", "[layer][eltwise]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const auto n = static_cast<std::size_t>(kShape.count());
    struct Case {
      std::string label;
      EltwiseParams params;
      std::size_t inputs;
    };
    const std::vector<Case> cases = {
        {"SUM", params(EltwiseOp::sum), 2},
        {"SUM with coeff", params(EltwiseOp::sum, {0.5f, -2.0f, 1.0f}), 3},
        {"PROD of 2", params(EltwiseOp::prod), 2},
        {"PROD of 3", params(EltwiseOp::prod), 3},
        {"PROD of 3, stable_prod_grad false", params(EltwiseOp::prod, {}, false), 3},
        {"MAX of 2", params(EltwiseOp::max), 2},
        {"MAX of 4", params(EltwiseOp::max), 4},
    };
    std::uint32_t seed = 100;
    for (const Case& c : cases) {
      INFO(c.label);
      hn::EltwiseLayer layer("eltwise", c.params);
      HostValues x;
      for (std::size_t i = 0; i < c.inputs; ++i)
        x.push_back(away_from_zero(n, seed++));
      const auto dy = random_floats(n, seed++);
      const std::vector<Shape> shapes(c.inputs, kShape);
      const NaiveEltwise want = naive(c.params, x, dy);
      const auto run = run_layer(layer, *driver, shapes, x, {dy});
      CHECK(max_rel_diff(run.outputs[0], want.y) <= kTolerance);
      for (std::size_t i = 0; i < c.inputs; ++i) {
        INFO("input " << i);
        CHECK(max_rel_diff(run.input_diffs[i], want.dx[i]) <= kTolerance);
      }
      hn::test::check_split_equals_whole(layer, *driver, shapes, x, RunSpec{{0, 1, 3}});
    }
  }
}

TEST_CASE("Eltwise MAX breaks ties as Caffe does, forward and backward", "[layer][eltwise]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    hn::EltwiseLayer layer("eltwise", params(EltwiseOp::max));
    const Shape shape{2, 3};
    const HostValues x = {{1, 2, 3, -1, 0, 5}, {1, 1, 4, -1, 0, 5}, {0, 2, 4, -2, 0, 6}};
    const std::vector<float> dy = {10, 20, 30, 40, 50, 60};
    const auto run = run_layer(layer, *driver, {shape, shape, shape}, x, {dy});
    // Caffe: input 1 takes ties with input 0 (elements 0, 3, 4, 5), input 2 only where it is
    // greater (element 5), not on its tie at element 1 (with input 0) or 2 (with input 1).
    CHECK(run.outputs[0] == std::vector<float>{1, 2, 4, -1, 0, 6});
    CHECK(run.input_diffs[0] == std::vector<float>{0, 20, 0, 0, 0, 0});
    CHECK(run.input_diffs[1] == std::vector<float>{10, 0, 30, 40, 50, 0});
    CHECK(run.input_diffs[2] == std::vector<float>{0, 0, 0, 0, 0, 60});
  }
}

TEST_CASE("Eltwise gradients match finite differences", "[layer][eltwise][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{2, 3, 2};
    const auto n = static_cast<std::size_t>(shape.count());
    const std::vector<Shape> three(3, shape);
    const HostValues x = {away_from_zero(n, 1), away_from_zero(n, 2), away_from_zero(n, 3)};
    hn::EltwiseLayer sum("sum", params(EltwiseOp::sum, {0.5f, -2.0f, 1.5f}));
    hn::test::check_layer_gradients(sum, *driver, three, x);
    hn::EltwiseLayer prod("prod", params(EltwiseOp::prod));
    hn::test::check_layer_gradients(prod, *driver, three, x);
    hn::EltwiseLayer fast_prod("prod", params(EltwiseOp::prod, {}, false));
    hn::test::check_layer_gradients(fast_prod, *driver, three, x);
    hn::EltwiseLayer max("max", params(EltwiseOp::max));
    hn::test::check_layer_gradients(max, *driver, three, separated_inputs(3, n, 4));
  }
}

TEST_CASE("Eltwise setup errors name the layer and the shapes", "[layer][eltwise]") {
  hn::EltwiseLayer layer("eltwise1", params(EltwiseOp::sum));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}, Shape{2, 4, 3}}),
                    Contains("eltwise1") && Contains("2x3x4") && Contains("2x4x3"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}}), Contains("eltwise1"));
  hn::EltwiseLayer coeffs("eltwise2", params(EltwiseOp::sum, {1.0f, 2.0f, 3.0f}));
  CHECK_THROWS_WITH(
      coeffs.setup({Shape{2, 3}, Shape{2, 3}}),
      Contains("eltwise2") && Contains("3 coefficients for 2 inputs") && Contains("2x3"));
  hn::EltwiseLayer prod_coeff("eltwise3", params(EltwiseOp::prod, {1.0f, 2.0f}));
  CHECK_THROWS_WITH(prod_coeff.setup({Shape{2, 3}, Shape{2, 3}}),
                    Contains("eltwise3") && Contains("SUM"));
}
