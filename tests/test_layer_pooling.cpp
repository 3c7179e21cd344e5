// Pooling layer: Caffe's output sizes (rounding up, padding, global pooling), MAX and AVE
// forward and backward against naive loops on every driver, split runs, finite-difference
// gradients and the setup errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/pooling_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::PoolingParams;
using hn::PoolMethod;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

constexpr double kTolerance = 1e-5;

// Resolved geometry of one naive pooling run.
struct Geometry {
  index_t kh, kw, sh, sw, ph, pw;
};

// Caffe's PoolingLayer::Reshape (round_mode CEIL): the last window is dropped on both axes
// when either is padded (`if (pad_h_ || pad_w_)`).
index_t caffe_pooled(index_t in, index_t k, index_t s, index_t p, bool padded) {
  index_t out = static_cast<index_t>(std::ceil(static_cast<double>(in + 2 * p - k) / s)) + 1;
  if (padded && (out - 1) * s >= in + p) --out;
  return out;
}

struct NaivePool {
  std::vector<float> y, dx;
  index_t out_h, out_w;
};

// Caffe's Forward_cpu / Backward_cpu loops, written out for one input and output diff.
NaivePool naive_pool(PoolMethod method, const Shape& in, const Geometry& g,
                     const std::vector<float>& x, const std::vector<float>& dy) {
  const index_t planes = in[0] * in[1], height = in[2], width = in[3];
  NaivePool r;
  r.out_h = caffe_pooled(height, g.kh, g.sh, g.ph, g.ph > 0 || g.pw > 0);
  r.out_w = caffe_pooled(width, g.kw, g.sw, g.pw, g.ph > 0 || g.pw > 0);
  r.y.assign(static_cast<std::size_t>(planes * r.out_h * r.out_w), 0.0f);
  r.dx.assign(x.size(), 0.0f);
  for (index_t p = 0; p < planes; ++p) {
    const float* xp = x.data() + p * height * width;
    float* dxp = r.dx.data() + p * height * width;
    for (index_t oh = 0; oh < r.out_h; ++oh) {
      for (index_t ow = 0; ow < r.out_w; ++ow) {
        const index_t o = (p * r.out_h + oh) * r.out_w + ow;
        index_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        if (method == PoolMethod::max) {
          const index_t h1 = std::min(h0 + g.kh, height), w1 = std::min(w0 + g.kw, width);
          h0 = std::max<index_t>(h0, 0);
          w0 = std::max<index_t>(w0, 0);
          float best = -FLT_MAX;
          index_t arg = -1;
          for (index_t h = h0; h < h1; ++h)
            for (index_t w = w0; w < w1; ++w)
              if (xp[h * width + w] > best) {
                best = xp[h * width + w];
                arg = h * width + w;
              }
          r.y[o] = best;
          dxp[arg] += dy[o];
        } else {
          index_t h1 = std::min(h0 + g.kh, height + g.ph), w1 = std::min(w0 + g.kw, width + g.pw);
          const index_t size = (h1 - h0) * (w1 - w0);
          h0 = std::max<index_t>(h0, 0);
          w0 = std::max<index_t>(w0, 0);
          h1 = std::min(h1, height);
          w1 = std::min(w1, width);
          double sum = 0.0;
          for (index_t h = h0; h < h1; ++h)
            for (index_t w = w0; w < w1; ++w)
              sum += xp[h * width + w];
          r.y[o] = static_cast<float>(sum / size);
          for (index_t h = h0; h < h1; ++h)
            for (index_t w = w0; w < w1; ++w)
              dxp[h * width + w] += dy[o] / static_cast<float>(size);
        }
      }
    }
  }
  return r;
}

PoolingParams square(PoolMethod method, index_t kernel, index_t stride, index_t pad) {
  PoolingParams p;
  p.pool = method;
  p.kernel_size = kernel;
  p.stride = stride;
  p.pad = pad;
  return p;
}

// Kernel 3x2, stride 2x3, pad 1x1 through the _h/_w fields.
PoolingParams rectangular(PoolMethod method) {
  PoolingParams p;
  p.pool = method;
  p.kernel_h = 3;
  p.kernel_w = 2;
  p.stride_h = 2;
  p.stride_w = 3;
  p.pad_h = 1;
  p.pad_w = 1;
  return p;
}

// Distinct values at least 0.05 apart in random order: finite differences with step 0.01
// never change a window's maximum.
std::vector<float> spaced_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = 0.05f * static_cast<float>(i) - 0.025f * static_cast<float>(n);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

struct Case {
  std::string label;
  Shape input;
  PoolingParams params;
  Geometry geometry;
};

std::vector<Case> forward_cases() {
  std::vector<Case> cases;
  for (const PoolMethod m : {PoolMethod::max, PoolMethod::ave}) {
    const std::string name = m == PoolMethod::max ? "MAX" : "AVE";
    cases.push_back(
        {name + " 6x6 k3 s2", Shape{3, 2, 6, 6}, square(m, 3, 2, 0), {3, 3, 2, 2, 0, 0}});
    cases.push_back(
        {name + " 7x7 k3 s2 p1", Shape{3, 2, 7, 7}, square(m, 3, 2, 1), {3, 3, 2, 2, 1, 1}});
    cases.push_back(
        {name + " 3x3 k2 s2 p1", Shape{3, 2, 3, 3}, square(m, 2, 2, 1), {2, 2, 2, 2, 1, 1}});
    cases.push_back(
        {name + " 7x9 k3x2 s2x3 p1x1", Shape{3, 2, 7, 9}, rectangular(m), {3, 2, 2, 3, 1, 1}});
    PoolingParams global;
    global.pool = m;
    global.global_pooling = true;
    cases.push_back({name + " global 5x7", Shape{3, 2, 5, 7}, global, {5, 7, 1, 1, 0, 0}});
    // A kernel past the input is clipped to it, as Caffe does: ceil(-0.5) + 1 = 1 window.
    cases.push_back({name + " 2x2 k3 s2 (kernel past the input)",
                     Shape{3, 2, 2, 2},
                     square(m, 3, 2, 0),
                     {3, 3, 2, 2, 0, 0}});
    // One axis padded: the unpadded axis loses its last window too (a window starting at
    // column 14 of 14 without the drop).
    PoolingParams unequal = rectangular(m);
    unequal.kernel_h = 4;
    unequal.kernel_w = 1;
    unequal.stride_h = unequal.stride_w = 2;
    unequal.pad_h = 2;
    unequal.pad_w = 0;
    cases.push_back({name + " 6x14 k4x1 s2 p2x0", Shape{3, 2, 6, 14}, unequal, {4, 1, 2, 2, 2, 0}});
  }
  return cases;
}

}  // namespace

TEST_CASE("Pooling output sizes follow Caffe: round up, drop a window starting in the padding",
          "[layer][pooling]") {
  struct Size {
    Shape input;
    PoolingParams params;
    index_t out_h, out_w;
  };
  const PoolingParams rect = rectangular(PoolMethod::max);
  PoolingParams unequal_pads = rect;
  unequal_pads.kernel_h = 4;
  unequal_pads.kernel_w = 1;
  unequal_pads.stride_h = unequal_pads.stride_w = 2;
  unequal_pads.pad_h = 2;
  unequal_pads.pad_w = 0;
  PoolingParams floor_mode = square(PoolMethod::max, 3, 2, 0);
  floor_mode.ceil_mode = false;
  PoolingParams global;
  global.pool = PoolMethod::ave;
  global.global_pooling = true;
  const std::vector<Size> sizes = {
      {Shape{2, 3, 6, 6}, square(PoolMethod::max, 3, 2, 0), 3, 3},  // ceil(1.5) + 1
      {Shape{2, 3, 7, 7}, square(PoolMethod::max, 3, 2, 1), 4, 4},  // ceil(3) + 1
      {Shape{2, 3, 3, 3}, square(PoolMethod::ave, 2, 2, 1), 2, 2},  // 3, last starts in pad
      {Shape{2, 3, 5, 5}, square(PoolMethod::max, 2, 3, 0), 2, 2},  // ceil(1) + 1
      {Shape{2, 3, 7, 9}, rect, 4, 4},
      {Shape{2, 3, 5, 7}, global, 1, 1},
      {Shape{2, 3, 4, 4}, square(PoolMethod::max, 4, 1, 0), 1, 1},  // kernel == input
      // Caffe and PyTorch: 4x7 (the last column window is dropped as pad_h is set).
      {Shape{1, 1, 6, 14}, unequal_pads, 4, 7},
      {Shape{2, 3, 6, 6}, floor_mode, 2, 2},  // floor(1.5) + 1
  };
  for (const Size& s : sizes) {
    INFO("input " << s.input.to_string());
    hn::PoolingLayer layer("pool", s.params);
    const auto out = layer.setup({s.input});
    REQUIRE(out.size() == 1);
    CHECK(out[0] == Shape{s.input[0], s.input[1], s.out_h, s.out_w});
  }
}

TEST_CASE("Pooling forward and backward equal Caffe's loops on every driver", "[layer][pooling]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 10;
    for (const Case& c : forward_cases()) {
      INFO(c.label);
      hn::PoolingLayer layer("pool", c.params);
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
      const auto out_shape = layer.setup({c.input})[0];
      const auto dy = random_floats(static_cast<std::size_t>(out_shape.count()), seed++);
      const NaivePool want = naive_pool(c.params.pool, c.input, c.geometry, x, dy);
      REQUIRE(out_shape == Shape{c.input[0], c.input[1], want.out_h, want.out_w});
      const auto run = run_layer(layer, *driver, {c.input}, {x}, {dy});
      CHECK(max_rel_diff(run.outputs[0], want.y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], want.dx) <= kTolerance);
      hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 1, 3}});
    }
  }
}

TEST_CASE("Pooling gradients match finite differences", "[layer][pooling][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape input{2, 2, 5, 5};
    const auto x = spaced_values(static_cast<std::size_t>(input.count()), 3);
    for (const PoolMethod m : {PoolMethod::max, PoolMethod::ave}) {
      hn::PoolingLayer padded("pool", square(m, 3, 2, 1));
      hn::test::check_layer_gradients(padded, *driver, {input}, {x});
      hn::PoolingLayer overlapping("pool", square(m, 2, 1, 0));
      hn::test::check_layer_gradients(overlapping, *driver, {input}, {x});
      PoolingParams global;
      global.pool = m;
      global.global_pooling = true;
      hn::PoolingLayer global_layer("pool", global);
      hn::test::check_layer_gradients(global_layer, *driver, {input}, {x});
    }
  }
}

TEST_CASE("Pooling setup errors name the layer and the shapes", "[layer][pooling]") {
  const Shape input{2, 8, 3, 3};
  SECTION("no window on the padded input") {
    hn::PoolingLayer layer("pool1", square(PoolMethod::max, 5, 1, 0));
    CHECK_THROWS_WITH(layer.setup({input}), Contains("layer 'pool1' (Pooling)") &&
                                                Contains("kernel 5x5 stride 1x1 leaves no window "
                                                         "on the padded input 3x3") &&
                                                Contains("2x8x3x3"));
  }
  SECTION("pad not smaller than the kernel") {
    hn::PoolingLayer layer("pool2", square(PoolMethod::ave, 2, 1, 2));
    CHECK_THROWS_WITH(layer.setup({input}), Contains("pool2") && Contains("pad 2x2") &&
                                                Contains("kernel 2x2") && Contains("2x8x3x3"));
  }
  SECTION("kernel_size and kernel_h/kernel_w together") {
    PoolingParams p = square(PoolMethod::max, 2, 1, 0);
    p.kernel_h = 2;
    p.kernel_w = 2;
    hn::PoolingLayer layer("pool3", p);
    CHECK_THROWS_WITH(layer.setup({input}), Contains("pool3") && Contains("not both"));
  }
  SECTION("no kernel at all") {
    hn::PoolingLayer layer("pool4", PoolingParams{});
    CHECK_THROWS_WITH(layer.setup({input}), Contains("pool4") && Contains("kernel_size"));
  }
  SECTION("global pooling with a kernel, or with padding") {
    PoolingParams p = square(PoolMethod::max, 2, 1, 0);
    p.global_pooling = true;
    hn::PoolingLayer with_kernel("pool5", p);
    CHECK_THROWS_WITH(with_kernel.setup({input}), Contains("pool5") && Contains("global_pooling"));
    PoolingParams q;
    q.global_pooling = true;
    q.pad = 1;
    hn::PoolingLayer with_pad("pool6", q);
    CHECK_THROWS_WITH(with_pad.setup({input}), Contains("pool6") && Contains("pad 1x1"));
  }
  SECTION("input without 4 axes") {
    hn::PoolingLayer layer("pool7", square(PoolMethod::max, 2, 1, 0));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 8, 9}}), Contains("pool7") && Contains("2x8x9"));
  }
  SECTION("only one of kernel_h / kernel_w") {
    PoolingParams p;
    p.kernel_h = 2;
    hn::PoolingLayer layer("pool8", p);
    CHECK_THROWS_WITH(layer.setup({input}), Contains("pool8") && Contains("kernel_w"));
  }
}
