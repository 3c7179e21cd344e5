// LRN layer: ACROSS_CHANNELS and WITHIN_CHANNEL forward, scale and backward against naive
// loops on every driver (local_size 5 at the channel borders with C = 3 and C = 7), split
// runs, finite-difference gradients and the setup errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/lrn_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::LrnParams;
using hn::LrnRegion;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

constexpr double kTolerance = 2e-5;

struct NaiveLrn {
  std::vector<float> y, scale, dx;
};

// Caffe's CrossChannelForward_cpu / CrossChannelBackward_cpu, one element at a time.
NaiveLrn naive_across(const Shape& s, const LrnParams& p, const std::vector<float>& x,
                      const std::vector<float>& dy) {
  const index_t n_count = s[0], channels = s[1], plane = s[2] * s[3];
  const index_t pre = (p.local_size - 1) / 2;
  NaiveLrn r;
  r.y.resize(x.size());
  r.scale.resize(x.size());
  r.dx.resize(x.size());
  std::vector<double> scale(x.size());
  auto at = [&](index_t n, index_t c, index_t i) {
    return static_cast<std::size_t>((n * channels + c) * plane + i);
  };
  for (index_t n = 0; n < n_count; ++n)
    for (index_t c = 0; c < channels; ++c)
      for (index_t i = 0; i < plane; ++i) {
        double sum = 0.0;
        for (index_t c2 = std::max<index_t>(0, c - pre);
             c2 <= std::min<index_t>(channels - 1, c + pre); ++c2)
          sum += static_cast<double>(x[at(n, c2, i)]) * x[at(n, c2, i)];
        scale[at(n, c, i)] = p.k + p.alpha / p.local_size * sum;
      }
  for (std::size_t e = 0; e < x.size(); ++e) {
    r.scale[e] = static_cast<float>(scale[e]);
    r.y[e] = static_cast<float>(x[e] * std::pow(scale[e], -p.beta));
  }
  for (index_t n = 0; n < n_count; ++n)
    for (index_t c = 0; c < channels; ++c)
      for (index_t i = 0; i < plane; ++i) {
        const std::size_t e = at(n, c, i);
        double sum = 0.0;
        for (index_t c2 = std::max<index_t>(0, c - pre);
             c2 <= std::min<index_t>(channels - 1, c + pre); ++c2) {
          const std::size_t e2 = at(n, c2, i);
          sum += dy[e2] * (x[e2] * std::pow(scale[e2], -p.beta)) / scale[e2];
        }
        r.dx[e] = static_cast<float>(dy[e] * std::pow(scale[e], -p.beta) -
                                     2.0 * p.alpha * p.beta / p.local_size * x[e] * sum);
      }
  return r;
}

// WITHIN_CHANNEL: scale = 1 + alpha * (sum of x^2 over the clipped window) / pool_size,
// Caffe's AVE pooling divisor (window clipped at size + pad only); backward is the exact
// derivative.
NaiveLrn naive_within(const Shape& s, const LrnParams& p, const std::vector<float>& x,
                      const std::vector<float>& dy) {
  const index_t planes = s[0] * s[1], height = s[2], width = s[3];
  const index_t pad = (p.local_size - 1) / 2, size = p.local_size;
  NaiveLrn r;
  r.y.resize(x.size());
  r.scale.resize(x.size());
  r.dx.assign(x.size(), 0.0f);
  std::vector<double> dx(x.size(), 0.0), scale(x.size());
  for (index_t q = 0; q < planes; ++q) {
    const index_t base = q * height * width;
    // Window of output (oh, ow): [h0, h1) x [w0, w1) clipped, and its divisor.
    auto window = [&](index_t oh, index_t ow, index_t* h0, index_t* h1, index_t* w0, index_t* w1) {
      *h0 = oh - pad;
      *w0 = ow - pad;
      *h1 = std::min(*h0 + size, height + pad);
      *w1 = std::min(*w0 + size, width + pad);
      const index_t pool = (*h1 - *h0) * (*w1 - *w0);
      *h0 = std::max<index_t>(*h0, 0);
      *w0 = std::max<index_t>(*w0, 0);
      *h1 = std::min(*h1, height);
      *w1 = std::min(*w1, width);
      return pool;
    };
    for (index_t oh = 0; oh < height; ++oh)
      for (index_t ow = 0; ow < width; ++ow) {
        index_t h0, h1, w0, w1;
        const index_t pool = window(oh, ow, &h0, &h1, &w0, &w1);
        double sum = 0.0;
        for (index_t h = h0; h < h1; ++h)
          for (index_t w = w0; w < w1; ++w)
            sum += static_cast<double>(x[base + h * width + w]) * x[base + h * width + w];
        scale[base + oh * width + ow] = 1.0 + p.alpha * sum / pool;
      }
    for (index_t oh = 0; oh < height; ++oh)
      for (index_t ow = 0; ow < width; ++ow) {
        const index_t e = base + oh * width + ow;
        index_t h0, h1, w0, w1;
        const index_t pool = window(oh, ow, &h0, &h1, &w0, &w1);
        dx[e] += dy[e] * std::pow(scale[e], -p.beta);
        const double common =
            dy[e] * x[e] * (-p.beta) * std::pow(scale[e], -p.beta - 1.0) * p.alpha / pool;
        for (index_t h = h0; h < h1; ++h)
          for (index_t w = w0; w < w1; ++w)
            dx[base + h * width + w] += 2.0 * x[base + h * width + w] * common;
      }
  }
  for (std::size_t e = 0; e < x.size(); ++e) {
    r.scale[e] = static_cast<float>(scale[e]);
    r.y[e] = static_cast<float>(x[e] * std::pow(scale[e], -p.beta));
    r.dx[e] = static_cast<float>(dx[e]);
  }
  return r;
}

struct Case {
  std::string label;
  Shape input;
  LrnParams params;
};

std::vector<Case> cases() {
  LrnParams caffe_default;  // local_size 5, alpha 1, beta 0.75, k 1
  LrnParams alexnet;
  alexnet.alpha = 1e-4f;
  alexnet.beta = 0.75f;
  alexnet.k = 2.0f;
  LrnParams strong;
  strong.local_size = 3;
  strong.alpha = 2.0f;
  strong.beta = 0.5f;
  strong.k = 1.5f;
  LrnParams within;
  within.norm_region = LrnRegion::within_channel;
  within.local_size = 3;
  within.alpha = 1.5f;
  LrnParams within5 = within;
  within5.local_size = 5;
  within5.beta = 0.9f;
  return {
      {"ACROSS size 5, C = 3 (window wider than the channels)", Shape{3, 3, 2, 3}, caffe_default},
      {"ACROSS size 5, C = 7 (borders clipped)", Shape{3, 7, 3, 2}, caffe_default},
      {"ACROSS size 5, C = 7, AlexNet's alpha and k", Shape{3, 7, 2, 2}, alexnet},
      {"ACROSS size 3, C = 4", Shape{3, 4, 3, 3}, strong},
      {"WITHIN size 3", Shape{3, 2, 4, 5}, within},
      {"WITHIN size 5 on 3x4 planes", Shape{3, 2, 3, 4}, within5},
  };
}

}  // namespace

TEST_CASE("LRN forward, scale and backward equal Caffe's formulas on every driver",
          "[layer][lrn]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 20;
    for (const Case& c : cases()) {
      INFO(c.label);
      hn::LrnLayer layer("norm", c.params);
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++, -2.0f, 2.0f);
      const auto dy = random_floats(x.size(), seed++);
      const NaiveLrn want = c.params.norm_region == LrnRegion::across_channels
                                ? naive_across(c.input, c.params, x, dy)
                                : naive_within(c.input, c.params, x, dy);
      const auto run = run_layer(layer, *driver, {c.input}, {x}, {dy});
      CHECK(run.outputs[0].size() == x.size());
      CHECK(max_rel_diff(run.outputs[0], want.y) <= kTolerance);
      CHECK(max_rel_diff(hn::test::values(layer.state()[0]), want.scale) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], want.dx) <= kTolerance);
      hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 1, 3}});
    }
  }
}

TEST_CASE("LRN gradients match finite differences", "[layer][lrn][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 40;
    for (const Case& c : cases()) {
      INFO(c.label);
      hn::LrnLayer layer("norm", c.params);
      const Shape small{2, c.input[1], c.input[2], c.input[3]};
      const auto x = random_floats(static_cast<std::size_t>(small.count()), seed++, -2.0f, 2.0f);
      hn::test::check_layer_gradients(layer, *driver, {small}, {x});
    }
  }
}

TEST_CASE("LRN setup errors name the layer and the shapes", "[layer][lrn]") {
  LrnParams even;
  even.local_size = 4;
  hn::LrnLayer layer("norm1", even);
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4, 4}}),
                    Contains("norm1") && Contains("local_size") && Contains("2x3x4x4"));
  hn::LrnLayer flat("norm2");
  CHECK_THROWS_WITH(flat.setup({Shape{2, 12}}), Contains("norm2") && Contains("2x12"));
}
