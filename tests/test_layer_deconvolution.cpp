// Deconvolution layer: forward and every gradient against a naive transposed convolution
// written here (each input pixel scatters its weights into the output, double accumulation)
// on every driver; row slices against the whole-batch run; finite-difference gradients;
// setup errors.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/convolution.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::ConvolutionParams;
using hn::index_t;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;

constexpr double kTolerance = 2e-5;

struct Case {
  std::string name;
  Shape input;
  index_t num_output, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
      group, extra_h, extra_w;
  bool bias;
};

ConvolutionParams params_of(const Case& c) {
  ConvolutionParams p;
  p.num_output = c.num_output;
  p.bias_term = c.bias;
  p.kernel_h = c.kernel_h;
  p.kernel_w = c.kernel_w;
  p.stride_h = c.stride_h;
  p.stride_w = c.stride_w;
  p.pad_h = c.pad_h;
  p.pad_w = c.pad_w;
  p.dilation = {c.dilation_h, c.dilation_w};
  p.group = c.group;
  if (c.extra_h != 0 || c.extra_w != 0) p.output_pad = {c.extra_h, c.extra_w};
  return p;
}

struct Naive {
  Shape out;
  std::vector<float> y, dx, dw, db;
};

// y[n][o][oh][ow] = b[o] + sum of x[n][c][ih][iw] * w[c][o - g*O/G][kh][kw] over the input
// pixels and taps with oh = ih * stride - pad + kh * dilation (same for w), c in o's group;
// the gradients by the same loop.
Naive naive(const Case& c, const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& b, const std::vector<float>& dy) {
  const index_t n_ = c.input[0], ch = c.input[1], h = c.input[2], wd = c.input[3];
  const index_t oh_ =
      c.stride_h * (h - 1) + c.dilation_h * (c.kernel_h - 1) + 1 - 2 * c.pad_h + c.extra_h;
  const index_t ow_ =
      c.stride_w * (wd - 1) + c.dilation_w * (c.kernel_w - 1) + 1 - 2 * c.pad_w + c.extra_w;
  const index_t cg = ch / c.group, og = c.num_output / c.group;
  Naive r;
  r.out = Shape{n_, c.num_output, oh_, ow_};
  std::vector<double> y(static_cast<std::size_t>(r.out.count()), 0.0);
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  for (index_t n = 0; n < n_; ++n)
    for (index_t o = 0; o < c.num_output; ++o)
      for (index_t i = 0; i < oh_ * ow_; ++i) {
        const std::size_t at = static_cast<std::size_t>((n * c.num_output + o) * oh_ * ow_ + i);
        if (c.bias) {
          y[at] += b[static_cast<std::size_t>(o)];
          db[static_cast<std::size_t>(o)] += dy[at];
        }
      }
  for (index_t n = 0; n < n_; ++n)
    for (index_t ci = 0; ci < ch; ++ci) {
      const index_t g = ci / cg;
      for (index_t ih = 0; ih < h; ++ih)
        for (index_t iw = 0; iw < wd; ++iw) {
          const std::size_t xi = static_cast<std::size_t>(((n * ch + ci) * h + ih) * wd + iw);
          for (index_t oo = 0; oo < og; ++oo)
            for (index_t kh = 0; kh < c.kernel_h; ++kh)
              for (index_t kw = 0; kw < c.kernel_w; ++kw) {
                const index_t oh = ih * c.stride_h - c.pad_h + kh * c.dilation_h;
                const index_t ow = iw * c.stride_w - c.pad_w + kw * c.dilation_w;
                if (oh < 0 || oh >= oh_ || ow < 0 || ow >= ow_) continue;
                const index_t o = g * og + oo;
                const std::size_t yi =
                    static_cast<std::size_t>(((n * c.num_output + o) * oh_ + oh) * ow_ + ow);
                const std::size_t wi =
                    static_cast<std::size_t>(((ci * og + oo) * c.kernel_h + kh) * c.kernel_w + kw);
                y[yi] += static_cast<double>(x[xi]) * w[wi];
                dx[xi] += static_cast<double>(dy[yi]) * w[wi];
                dw[wi] += static_cast<double>(dy[yi]) * x[xi];
              }
        }
    }
  const auto floats = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  r.y = floats(y);
  r.dx = floats(dx);
  r.dw = floats(dw);
  r.db = floats(db);
  return r;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"2x upsampling (stride 2, kernel 4, pad 1)", Shape{2, 3, 4, 5}, 4, 4, 4, 2, 2, 1, 1, 1, 1, 1,
       0, 0, true},
      {"stride 2 with output_pad 1 (ONNX's output_padding)", Shape{2, 4, 3, 3}, 2, 3, 3, 2, 2, 1, 1,
       1, 1, 1, 1, 1, true},
      {"groups, non-square, dilation", Shape{3, 4, 5, 4}, 6, 3, 2, 1, 2, 1, 0, 2, 1, 2, 0, 1,
       false},
      {"depthwise, stride 3", Shape{2, 3, 3, 4}, 3, 2, 2, 3, 3, 0, 0, 1, 1, 3, 2, 0, true},
      {"1x1", Shape{2, 5, 3, 3}, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, true},
  };
  return all;
}

}  // namespace

TEST_CASE(
    "Deconvolution forward and gradients equal a naive transposed convolution on every "
    "driver, split or whole",
    "[layer][deconvolution]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 300;
    for (const Case& c : cases()) {
      INFO(c.name);
      auto layer = hn::make_deconvolution_layer("deconv", params_of(c));
      CHECK(std::string(layer->type()) == "Deconvolution");
      const std::size_t weights =
          static_cast<std::size_t>(c.input[1] * c.num_output / c.group * c.kernel_h * c.kernel_w);
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
      const auto w = random_floats(weights, seed++);
      const auto b = c.bias ? random_floats(static_cast<std::size_t>(c.num_output), seed++)
                            : std::vector<float>{};
      const Shape out = layer->setup({c.input}).at(0);
      const auto dy = random_floats(static_cast<std::size_t>(out.count()), seed++);
      const Naive want = naive(c, x, w, b, dy);
      REQUIRE(out == want.out);
      for (const std::vector<index_t>& cuts :
           {std::vector<index_t>{}, std::vector<index_t>{0, 1, c.input[0]}}) {
        INFO("cuts " << cuts.size());
        const auto run = hn::test::run_with_params(*layer, *driver, c.input, x, {w, b}, dy, cuts);
        CHECK(max_rel_diff(run.y, want.y) <= kTolerance);
        CHECK(max_rel_diff(run.dx, want.dx) <= kTolerance);
        CHECK(max_rel_diff(run.param_diffs.at(0), want.dw) <= kTolerance);
        if (c.bias) CHECK(max_rel_diff(run.param_diffs.at(1), want.db) <= kTolerance);
      }
    }
  }
}

TEST_CASE("Deconvolution gradients match finite differences", "[layer][deconvolution][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Case c{"", Shape{2, 4, 3, 3}, 2, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1, 0, true};
    auto layer = hn::make_deconvolution_layer("deconv", params_of(c));
    hn::test::check_layer_gradients(*layer, *driver, {c.input},
                                    {random_floats(static_cast<std::size_t>(c.input.count()), 5)});
  }
}

TEST_CASE("Deconvolution setup errors name the layer, the field and the shape",
          "[layer][deconvolution]") {
  ConvolutionParams p;
  p.num_output = 4;
  p.kernel_size = {3};
  p.stride = {2};
  p.output_pad = {2};
  auto extra = hn::make_deconvolution_layer("up1", p);
  CHECK_THROWS_WITH(extra->setup({Shape{1, 2, 3, 3}}),
                    Contains("up1") && Contains("output_pad 2x2") && Contains("stride 2x2"));
  p.output_pad.clear();
  p.pad = {4};
  auto crop = hn::make_deconvolution_layer("up2", p);
  CHECK_THROWS_WITH(crop->setup({Shape{1, 2, 1, 1}}),
                    Contains("up2") && Contains("leaves no output") && Contains("1x2x1x1"));
  p.pad.clear();
  p.group = 3;
  auto groups = hn::make_deconvolution_layer("up3", p);
  CHECK_THROWS_WITH(groups->setup({Shape{1, 2, 3, 3}}),
                    Contains("up3") && Contains("not divisible by group 3"));
  ConvolutionParams conv;
  conv.num_output = 2;
  conv.kernel_size = {3};
  conv.output_pad = {1};
  auto convolution = hn::make_convolution_layer("conv", conv);
  CHECK_THROWS_WITH(convolution->setup({Shape{1, 2, 5, 5}}),
                    Contains("conv") && Contains("output_pad is Deconvolution's"));
}
