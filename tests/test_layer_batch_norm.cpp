// BatchNorm on every driver against naive double-precision statistics written here: batch
// statistics and their gradient, Caffe's moving-average blobs over two forwards, global
// statistics scaled by 1 / factor, in-place runs, splits, gradient checks and errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/batch_norm_layer.h"
#include "lib/net/net.h"
#include "tests/layer_runs.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Shape;
using hn::test::DriverConfig;
using hn::test::max_rel_diff;
using hn::test::random_floats;

constexpr double kTolerance = 1e-4;
constexpr double kEps = 1e-5;

struct Dims {
  index_t n, c, s;  // batch, channels, spatial
};

Dims dims_of(const Shape& shape) {
  return {shape[0], shape.axes() > 1 ? shape[1] : 1,
          shape.axes() > 2 ? shape.count(2, shape.axes()) : 1};
}

std::size_t at(const Dims& d, index_t n, index_t c, index_t s) {
  return static_cast<std::size_t>((n * d.c + c) * d.s + s);
}

struct Statistics {
  std::vector<double> mean, variance;  // variance biased (divided by m)
};

Statistics batch_statistics(const std::vector<float>& x, const Dims& d) {
  Statistics st{std::vector<double>(d.c, 0.0), std::vector<double>(d.c, 0.0)};
  const double m = static_cast<double>(d.n * d.s);
  for (index_t c = 0; c < d.c; ++c) {
    for (index_t n = 0; n < d.n; ++n)
      for (index_t s = 0; s < d.s; ++s)
        st.mean[c] += x[at(d, n, c, s)] / m;
    for (index_t n = 0; n < d.n; ++n)
      for (index_t s = 0; s < d.s; ++s)
        st.variance[c] += std::pow(x[at(d, n, c, s)] - st.mean[c], 2) / m;
  }
  return st;
}

std::vector<float> normalise(const std::vector<float>& x, const Dims& d, const Statistics& st) {
  std::vector<float> y(x.size());
  for (index_t n = 0; n < d.n; ++n)
    for (index_t c = 0; c < d.c; ++c)
      for (index_t s = 0; s < d.s; ++s)
        y[at(d, n, c, s)] =
            static_cast<float>((x[at(d, n, c, s)] - st.mean[c]) / std::sqrt(st.variance[c] + kEps));
  return y;
}

// Caffe's formula: dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(var + eps).
std::vector<float> batch_gradient(const std::vector<float>& x, const std::vector<float>& dy,
                                  const Dims& d) {
  const Statistics st = batch_statistics(x, d);
  const std::vector<float> y = normalise(x, d, st);
  std::vector<float> dx(x.size());
  const double m = static_cast<double>(d.n * d.s);
  for (index_t c = 0; c < d.c; ++c) {
    double mean_dy = 0.0, mean_dy_y = 0.0;
    for (index_t n = 0; n < d.n; ++n)
      for (index_t s = 0; s < d.s; ++s) {
        mean_dy += dy[at(d, n, c, s)] / m;
        mean_dy_y += static_cast<double>(dy[at(d, n, c, s)]) * y[at(d, n, c, s)] / m;
      }
    for (index_t n = 0; n < d.n; ++n)
      for (index_t s = 0; s < d.s; ++s) {
        const std::size_t k = at(d, n, c, s);
        dx[k] = static_cast<float>((dy[k] - mean_dy - mean_dy_y * y[k]) /
                                   std::sqrt(st.variance[c] + kEps));
      }
  }
  return dx;
}

std::vector<float> to_floats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {Shape{4, 3, 2, 3}, Shape{5, 2}, Shape{3, 2, 5}};
  return s;
}

TEST_CASE("BatchNorm in training matches naive batch statistics and stores them in the blobs",
          "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 70;
    for (const Shape& shape : shapes()) {
      INFO("input " << shape.to_string());
      const Dims d = dims_of(shape);
      const std::vector<float> x = random_floats(shape.count(), ++seed, -2.0f, 3.0f);
      const std::vector<float> dy = random_floats(shape.count(), ++seed);
      hn::BatchNormLayer layer("bn");  // use_global_stats unset: batch statistics in train
      const hn::test::LayerRun run = hn::test::run_layer(layer, *driver, {shape}, {x}, {dy});
      const Statistics st = batch_statistics(x, d);
      CHECK(max_rel_diff(run.outputs[0], normalise(x, d, st)) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], batch_gradient(x, dy, d)) <= kTolerance);
      // From zero blobs: factor 1, mean, and the unbiased variance m / (m - 1) * var.
      const double m = static_cast<double>(d.n * d.s);
      std::vector<double> unbiased = st.variance;
      for (double& v : unbiased)
        v *= m / (m - 1.0);
      CHECK(max_rel_diff(hn::test::values(layer.params()[0]), to_floats(st.mean)) <= kTolerance);
      CHECK(max_rel_diff(hn::test::values(layer.params()[1]), to_floats(unbiased)) <= kTolerance);
      CHECK(hn::test::values(layer.params()[2]) == std::vector<float>{1.0f});
    }
  }
}

TEST_CASE("BatchNorm's moving averages over two forwards match a hand computation",
          "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    hn::BatchNormParams params;
    params.moving_average_fraction = 0.9f;
    hn::BatchNormLayer layer("bn", params);
    const Shape shape{2, 2};
    // Channel 0: {1, 3} then {0, 2}; channel 1: {2, 6} then {1, 1}. m = 2, so the stored
    // variance is twice the batch variance: {2, 8} then {2, 0}.
    hn::test::run_layer(layer, *driver, {shape}, {{1, 2, 3, 6}});
    CHECK(hn::test::values(layer.params()[0]) == std::vector<float>{2.0f, 4.0f});
    CHECK(hn::test::values(layer.params()[1]) == std::vector<float>{2.0f, 8.0f});
    CHECK(hn::test::values(layer.params()[2]) == std::vector<float>{1.0f});
    hn::test::run_layer(layer, *driver, {shape}, {{0, 1, 2, 1}});
    // factor 1 * 0.9 + 1; mean 0.9 * {2, 4} + {1, 1}; variance 0.9 * {2, 8} + {2, 0}.
    const std::vector<float> factor = hn::test::values(layer.params()[2]);
    const std::vector<float> mean = hn::test::values(layer.params()[0]);
    const std::vector<float> variance = hn::test::values(layer.params()[1]);
    CHECK(factor[0] == Approx(1.9).epsilon(1e-6));
    CHECK(mean[0] == Approx(2.8).epsilon(1e-6));
    CHECK(mean[1] == Approx(4.6).epsilon(1e-6));
    CHECK(variance[0] == Approx(3.8).epsilon(1e-6));
    CHECK(variance[1] == Approx(7.2).epsilon(1e-6));

    // The test phase then normalises with the blobs over the factor: mean {2.8, 4.6} / 1.9,
    // variance {3.8, 7.2} / 1.9.
    hn::test::RunSpec test_phase;
    test_phase.phase = hn::Phase::test;
    const std::vector<float> x = {1, -1, 4, 2};
    const std::vector<float> y =
        hn::test::run_layer(layer, *driver, {shape}, {x}, {}, test_phase).outputs[0];
    for (index_t n = 0; n < 2; ++n) {
      for (index_t c = 0; c < 2; ++c) {
        const double mu = (c == 0 ? 2.8 : 4.6) / 1.9, var = (c == 0 ? 3.8 : 7.2) / 1.9;
        CHECK(y[n * 2 + c] == Approx((x[n * 2 + c] - mu) / std::sqrt(var + kEps)).epsilon(1e-5));
      }
    }
    CHECK(hn::test::values(layer.params()[2]) == std::vector<float>{factor});  // not updated
  }
}

TEST_CASE("BatchNorm with global statistics uses the blobs scaled by 1 / factor",
          "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{3, 3, 2, 2};
    const Dims d = dims_of(shape);
    const std::vector<float> x = random_floats(shape.count(), 80, -2.0f, 2.0f);
    const std::vector<float> dy = random_floats(shape.count(), 81);
    for (const float factor : {2.0f, 0.0f}) {
      for (const bool explicit_flag : {true, false}) {
        INFO("factor " << factor
                       << (explicit_flag ? ", use_global_stats: true in train"
                                         : ", use_global_stats unset in test"));
        hn::BatchNormParams params;
        hn::test::RunSpec spec;
        if (explicit_flag) {
          params.use_global_stats = true;
        } else {
          spec.phase = hn::Phase::test;
        }
        hn::BatchNormLayer layer("bn", params);
        layer.setup({shape});
        hn::test::set_values(layer.params()[0], {2.0f, -1.0f, 0.5f});
        hn::test::set_values(layer.params()[1], {4.0f, 1.0f, 9.0f});
        hn::test::set_values(layer.params()[2], {factor});
        // Caffe: scale 1 / factor, or 0 when the factor is 0.
        const double scale = factor == 0.0f ? 0.0 : 1.0 / factor;
        const Statistics st{{2.0 * scale, -1.0 * scale, 0.5 * scale},
                            {4.0 * scale, 1.0 * scale, 9.0 * scale}};
        const hn::test::LayerRun run =
            hn::test::run_layer(layer, *driver, {shape}, {x}, {dy}, spec);
        CHECK(max_rel_diff(run.outputs[0], normalise(x, d, st)) <= kTolerance);
        std::vector<float> dx(dy.size());
        for (index_t n = 0; n < d.n; ++n)
          for (index_t c = 0; c < d.c; ++c)
            for (index_t s = 0; s < d.s; ++s)
              dx[at(d, n, c, s)] =
                  static_cast<float>(dy[at(d, n, c, s)] / std::sqrt(st.variance[c] + kEps));
        CHECK(max_rel_diff(run.input_diffs[0], dx) <= kTolerance);
        // The blobs are read, never updated.
        CHECK(hn::test::values(layer.params()[2]) == std::vector<float>{factor});
        CHECK(hn::test::values(layer.params()[0]) == std::vector<float>{2.0f, -1.0f, 0.5f});
      }
    }
  }
}

// The factor is read back from a separate-memory driver once per version of its blob (a
// GPU's steady-state forward then waits for nothing, as a CUDA graph needs), and a new
// value written to it is used at once: y against Caffe's formula, alone and fused with
// Scale + ReLU.
TEST_CASE("BatchNorm reads its stored statistics' factor once per change", "[layer][batch_norm]") {
  hn::DriverOptions separate;
  separate.set("separate_memory", true);
  for (const bool fused : {false, true}) {
    INFO((fused ? "fused with Scale and ReLU" : "alone"));
    hn::Runtime runtime;
    hn::Driver& driver = runtime.add(hn::Device{"reference", 0}, separate);
    std::string text = R"(
      layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 2 dim: 2 } } }
      layer { name: "bn" type: "BatchNorm" bottom: "x" top: "y"
              batch_norm_param { use_global_stats: true } })";
    if (fused) {
      text += R"(
      layer { name: "scale" type: "Scale" bottom: "y" top: "y" scale_param { bias_term: true } }
      layer { name: "relu" type: "ReLU" bottom: "y" top: "y" })";
    }
    auto net = hn::Net::from_text(text, "bn.prototxt", runtime, driver);
    const std::vector<float> x = random_floats(24, 90, -2.0f, 2.0f);
    std::copy(x.begin(), x.end(), net->blob("x").host_data_mut());
    const auto& params = net->learnable_params();
    REQUIRE(params.size() == (fused ? 5u : 3u));
    const auto set = [](hn::Tensor& t, const std::vector<float>& v) {
      std::copy(v.begin(), v.end(), static_cast<float*>(t.data().host_write()));
    };
    set(*params[0].tensor, {2.0f, -1.0f, 0.5f});
    set(*params[1].tensor, {4.0f, 1.0f, 9.0f});
    if (fused) {
      set(*params[3].tensor, {1.0f, 1.0f, 1.0f});  // Scale's gamma and beta: identity
      set(*params[4].tensor, {0.0f, 0.0f, 0.0f});
    }
    const Dims d{2, 3, 4};
    const auto expected = [&](double factor) {
      const Statistics st{{2.0 / factor, -1.0 / factor, 0.5 / factor},
                          {4.0 / factor, 1.0 / factor, 9.0 / factor}};
      std::vector<float> y = normalise(x, d, st);
      if (fused)
        for (float& v : y)
          v = std::max(v, 0.0f);
      return y;
    };
    for (const float factor : {2.0f, 4.0f}) {
      INFO("factor " << factor);
      set(*params[2].tensor, {factor});
      net->forward();
      const std::vector<float> first(net->blob("y").host_data(), net->blob("y").host_data() + 24);
      CHECK(max_rel_diff(first, expected(factor)) <= kTolerance);
      driver.reset_transfer_stats();
      net->forward();
      CHECK(driver.transfer_stats().to_host == 0);  // the factor was not read again
    }
  }
}

TEST_CASE("BatchNorm in place equals BatchNorm out of place", "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{3, 2, 5};
    const std::vector<float> x = random_floats(shape.count(), 90);
    const std::vector<float> dy = random_floats(shape.count(), 91);
    for (const hn::Phase phase : {hn::Phase::train, hn::Phase::test}) {
      INFO((phase == hn::Phase::train ? "batch statistics" : "global statistics"));
      hn::BatchNormLayer reference_layer("bn");
      hn::test::RunSpec spec;
      spec.phase = phase;
      const hn::test::LayerRun want =
          hn::test::run_layer(reference_layer, *driver, {shape}, {x}, {dy}, spec);

      hn::BatchNormLayer layer("bn");
      REQUIRE(layer.allows_in_place());
      layer.setup({shape});
      hn::Tensor blob(shape);
      hn::test::set_values(blob, x);
      hn::RunOptions options;
      options.phase = phase;
      hn::run_forward(layer, *driver, {&blob}, {&blob}, options);
      CHECK(max_rel_diff(hn::test::values(blob), want.outputs[0]) == 0.0);
      std::copy(dy.begin(), dy.end(), blob.host_diff_mut());
      hn::run_backward(layer, *driver, {&blob}, {&blob}, {}, options);
      CHECK(max_rel_diff(hn::test::diffs(blob), want.input_diffs[0]) <= 1e-6);
    }
  }
}

TEST_CASE("BatchNorm with global statistics splits by rows exactly", "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    hn::BatchNormParams params;
    params.use_global_stats = true;
    hn::BatchNormLayer layer("bn", params);
    CHECK(layer.splits_by_rows());
    CHECK_FALSE(hn::BatchNormLayer("bn").splits_by_rows());
    const Shape shape{5, 2, 3};
    layer.setup({shape});
    hn::test::set_values(layer.params()[0], {1.0f, -2.0f});
    hn::test::set_values(layer.params()[1], {3.0f, 0.5f});
    hn::test::set_values(layer.params()[2], {1.5f});
    hn::test::RunSpec spec;
    spec.cuts = {0, 2, 3, 5};
    hn::test::check_split_equals_whole(layer, *driver, {shape}, {random_floats(shape.count(), 95)},
                                       spec);
  }
}

TEST_CASE("BatchNorm input gradients match finite differences", "[layer][batch_norm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    hn::test::GradientCheck check;
    check.check_params = false;  // statistics, not trained (Caffe fixes lr_mult at 0)
    for (const Shape& shape : {Shape{3, 2, 2, 2}, Shape{4, 3}}) {
      INFO("batch statistics, input " << shape.to_string());
      hn::BatchNormLayer layer("bn");
      hn::test::check_layer_gradients(layer, *driver, {shape},
                                      {random_floats(shape.count(), 100, -2.0f, 2.0f)}, check);
    }
    hn::BatchNormLayer layer("bn");
    const Shape shape{3, 2, 2, 2};
    layer.setup({shape});
    hn::test::set_values(layer.params()[0], {0.5f, -1.0f});
    hn::test::set_values(layer.params()[1], {2.0f, 0.25f});
    hn::test::set_values(layer.params()[2], {1.0f});
    check.phase = hn::Phase::test;
    INFO("global statistics");
    hn::test::check_layer_gradients(layer, *driver, {shape}, {random_floats(24, 101)}, check);
  }
}

TEST_CASE("BatchNorm rejects an input without axes", "[layer][batch_norm]") {
  hn::BatchNormLayer layer("bn");
  CHECK_THROWS_WITH(layer.setup({Shape{}}),
                    Contains("layer 'bn' (BatchNorm)") && Contains("(scalar)"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3}, Shape{2, 3}}), Contains("layer 'bn' (BatchNorm)"));
}

}  // namespace
