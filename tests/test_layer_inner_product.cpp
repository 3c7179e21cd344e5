// InnerProduct layer: forward and backward against naive loops (double accumulation) on
// every driver, for axis 1 and 2, negative axes and transposed weights; row slices against
// the whole-batch run; finite-difference gradients; setup errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/inner_product_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::InnerProductParams;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;

constexpr double kTolerance = 2e-5;

struct Case {
  std::string name;
  Shape input;
  InnerProductParams params;
  index_t rows_axes;  // the canonical axis: M = count(0, axis), K = count(axis)
};

InnerProductParams ip(index_t num_output, int axis = 1, bool transpose = false,
                      bool bias_term = true) {
  InnerProductParams p;
  p.num_output = num_output;
  p.axis = axis;
  p.transpose = transpose;
  p.bias_term = bias_term;
  return p;
}

std::vector<Case> cases() {
  return {{"axis 1, 4-D input", Shape{4, 3, 2, 5}, ip(7), 1},
          {"axis 1, transpose", Shape{3, 10}, ip(6, 1, true), 1},
          {"axis 2", Shape{3, 4, 6}, ip(5, 2), 2},
          {"axis -1, transpose, no bias", Shape{5, 2, 3}, ip(4, -1, true, false), 2},
          {"batch 1", Shape{1, 9}, ip(3), 1}};
}

struct Result {
  std::vector<float> y, dx, dw, db;
};

// y[m][n] = b[n] + sum_k x[m][k] * W(n, k), W(n, k) = w[n][k] (w[k][n] with transpose).
Result naive(const Case& c, const std::vector<float>& x, const std::vector<float>& w,
             const std::vector<float>& b, const std::vector<float>& dy) {
  const index_t m_count = c.input.count(0, static_cast<int>(c.rows_axes));
  const index_t k_count = c.input.count(static_cast<int>(c.rows_axes), c.input.axes());
  const index_t n_count = c.params.num_output;
  auto w_at = [&](index_t n, index_t k) {
    return static_cast<std::size_t>(c.params.transpose ? k * n_count + n : n * k_count + k);
  };
  std::vector<double> y(static_cast<std::size_t>(m_count * n_count)), dx(x.size()), dw(w.size()),
      db(static_cast<std::size_t>(n_count));
  for (index_t m = 0; m < m_count; ++m) {
    for (index_t n = 0; n < n_count; ++n) {
      const std::size_t yi = static_cast<std::size_t>(m * n_count + n);
      double sum = c.params.bias_term ? b[static_cast<std::size_t>(n)] : 0.0;
      for (index_t k = 0; k < k_count; ++k) {
        const std::size_t xi = static_cast<std::size_t>(m * k_count + k);
        sum += static_cast<double>(x[xi]) * w[w_at(n, k)];
        dx[xi] += static_cast<double>(dy[yi]) * w[w_at(n, k)];
        dw[w_at(n, k)] += static_cast<double>(dy[yi]) * x[xi];
      }
      y[yi] = sum;
      db[static_cast<std::size_t>(n)] += dy[yi];
    }
  }
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  return {to_float(y), to_float(dx), to_float(dw),
          c.params.bias_term ? to_float(db) : std::vector<float>{}};
}

// Forward then backward over the row ranges `cuts`, parameter gradients cleared first.
Result run(hn::InnerProductLayer& layer, hn::Driver& driver, const Shape& in,
           const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
           const std::vector<float>& dy, const std::vector<index_t>& cuts = {}) {
  hn::test::ParamLayerRun run = hn::test::run_with_params(layer, driver, in, x, {w, b}, dy, cuts);
  Result result{std::move(run.y), std::move(run.dx), std::move(run.param_diffs.at(0)), {}};
  if (run.param_diffs.size() > 1) result.db = std::move(run.param_diffs[1]);
  return result;
}

struct Data {
  std::vector<float> x, w, b, dy;
};

Data data_for(const Case& c) {
  const index_t k = c.input.count(static_cast<int>(c.rows_axes), c.input.axes());
  const index_t m = c.input.count(0, static_cast<int>(c.rows_axes));
  return {random_floats(static_cast<std::size_t>(c.input.count()), 21),
          random_floats(static_cast<std::size_t>(k * c.params.num_output), 22),
          c.params.bias_term ? random_floats(static_cast<std::size_t>(c.params.num_output), 23)
                             : std::vector<float>{},
          random_floats(static_cast<std::size_t>(m * c.params.num_output), 24)};
}

}  // namespace

TEST_CASE("InnerProduct forward and backward equal naive loops on every driver",
          "[layer][inner_product]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const auto oracle = hn::make_driver(hn::Device{"reference", 0});
    for (const Case& c : cases()) {
      INFO(c.name << ", input " << c.input.to_string());
      const Data d = data_for(c);
      const Result want = naive(c, d.x, d.w, d.b, d.dy);
      hn::InnerProductLayer layer("fc", c.params);
      const Result got = run(layer, *driver, c.input, d.x, d.w, d.b, d.dy);
      CHECK(max_rel_diff(got.y, want.y) <= kTolerance);
      CHECK(max_rel_diff(got.dx, want.dx) <= kTolerance);
      CHECK(max_rel_diff(got.dw, want.dw) <= kTolerance);
      CHECK(max_rel_diff(got.db, want.db) <= kTolerance);
      hn::InnerProductLayer reference_layer("fc", c.params);
      const Result ref = run(reference_layer, *oracle, c.input, d.x, d.w, d.b, d.dy);
      CHECK(max_rel_diff(got.dx, ref.dx) <= kTolerance);
      CHECK(max_rel_diff(got.dw, ref.dw) <= kTolerance);
      CHECK(max_rel_diff(got.db, ref.db) <= kTolerance);
    }
  }
}

TEST_CASE(
    "InnerProduct on rows b..e gives the whole-batch run's rows, and slice gradients "
    "add up to the whole batch's",
    "[layer][inner_product]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    for (const Case& c : cases()) {
      if (c.input[0] < 3) continue;
      INFO(c.name);
      const Data d = data_for(c);
      hn::InnerProductLayer layer("fc", c.params);
      const Result whole = run(layer, *driver, c.input, d.x, d.w, d.b, d.dy);
      const Result split = run(layer, *driver, c.input, d.x, d.w, d.b, d.dy, {0, 1, 2, c.input[0]});
      CHECK(max_rel_diff(split.y, whole.y) <= kTolerance);
      CHECK(max_rel_diff(split.dx, whole.dx) <= kTolerance);
      CHECK(max_rel_diff(split.dw, whole.dw) <= kTolerance);
      CHECK(max_rel_diff(split.db, whole.db) <= kTolerance);
    }
  }
}

TEST_CASE("InnerProduct gradients match finite differences", "[layer][inner_product]") {
  std::vector<hn::test::DriverConfig> configs;
  for (const auto& config : hn::test::driver_configs()) {
    if (config.label == "reference" ||
        (config.label.find("1 thread") != std::string::npos && configs.size() < 2)) {
      configs.push_back(config);
    }
  }
  const auto config = GENERATE_COPY(from_range(configs));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    for (const Case& c : cases()) {
      INFO(c.name);
      hn::InnerProductLayer layer("fc", c.params);
      hn::Tensor input(c.input), output(layer.setup({c.input}).at(0));
      const Data d = data_for(c);
      hn::test::set_values(input, d.x);
      hn::test::set_values(layer.params()[0], d.w);
      if (c.params.bias_term) hn::test::set_values(layer.params()[1], d.b);
      hn::test::GradientCheck options;
      options.threshold = 1e-3;
      hn::test::check_gradients(layer, *driver, {&input}, {&output}, options);
    }
  }
}

TEST_CASE("InnerProduct setup follows Caffe's shapes and names the layer in errors",
          "[layer][inner_product]") {
  hn::InnerProductLayer fc6("fc6", ip(4096));
  CHECK(fc6.setup({Shape{10, 256, 6, 6}}).at(0) == Shape{10, 4096});
  CHECK(fc6.params().at(0).shape() == Shape{4096, 9216});
  CHECK(fc6.params().at(1).shape() == Shape{4096});
  hn::InnerProductLayer transposed("fc_t", ip(8, 2, true));
  CHECK(transposed.setup({Shape{2, 3, 4, 5}}).at(0) == Shape{2, 3, 8});
  CHECK(transposed.params().at(0).shape() == Shape{20, 8});
  CHECK(transposed.splits_by_rows());
  hn::InnerProductLayer whole("fc_0", ip(3, 0));
  CHECK(whole.setup({Shape{2, 5}}).at(0) == Shape{3});
  CHECK_FALSE(whole.splits_by_rows());

  hn::InnerProductLayer bad_axis("fc_axis", ip(3, 4));
  CHECK_THROWS_WITH(bad_axis.setup({Shape{2, 3, 4}}),
                    Contains("fc_axis") && Contains("InnerProduct") && Contains("2x3x4"));
  hn::InnerProductLayer no_output("fc_zero", ip(0));
  CHECK_THROWS_WITH(no_output.setup({Shape{2, 3}}), Contains("fc_zero") && Contains("num_output"));
  hn::InnerProductLayer two("fc_two", ip(3));
  CHECK_THROWS_WITH(two.setup({Shape{2, 3}, Shape{2, 3}}), Contains("fc_two") && Contains("got 2"));
}
