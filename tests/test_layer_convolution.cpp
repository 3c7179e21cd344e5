// Convolution layer: forward and backward against a naive direct convolution written here
// (double accumulation) on every driver and with every lowering forced; row slices against
// the whole-batch run; finite-difference gradients; setup errors.
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/affinity.h"
#include "lib/core/runtime.h"
#include "lib/core/tune.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/inner_product.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::ConvolutionParams;
using hn::index_t;
using hn::Lowering;
using hn::Shape;
using hn::test::max_rel_diff;
using hn::test::random_floats;

// GEMM summation order differs between drivers and lowerings.
constexpr double kTolerance = 2e-5;

struct Geometry {
  index_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
};

// The resolved geometry of `p`, by Caffe's rules, independently of the layer.
Geometry geometry_of(const ConvolutionParams& p) {
  auto pick = [](const std::vector<index_t>& v, int axis, index_t fallback) {
    return v.empty() ? fallback : v[v.size() == 1 ? 0 : static_cast<std::size_t>(axis)];
  };
  Geometry g{};
  g.kernel_h = p.kernel_h ? *p.kernel_h : pick(p.kernel_size, 0, 0);
  g.kernel_w = p.kernel_w ? *p.kernel_w : pick(p.kernel_size, 1, 0);
  g.stride_h = p.stride_h ? *p.stride_h : pick(p.stride, 0, 1);
  g.stride_w = p.stride_w ? *p.stride_w : pick(p.stride, 1, 1);
  g.pad_h = p.pad_h ? *p.pad_h : pick(p.pad, 0, 0);
  g.pad_w = p.pad_w ? *p.pad_w : pick(p.pad, 1, 0);
  g.dilation_h = pick(p.dilation, 0, 1);
  g.dilation_w = pick(p.dilation, 1, 1);
  return g;
}

struct Case {
  std::string name;
  Shape input;
  ConvolutionParams params;
};

ConvolutionParams square(index_t num_output, index_t kernel, index_t stride, index_t pad,
                         index_t group = 1) {
  ConvolutionParams p;
  p.num_output = num_output;
  p.kernel_size = {kernel};
  p.stride = {stride};
  p.pad = {pad};
  p.group = group;
  return p;
}

std::vector<Case> cases() {
  std::vector<Case> list;
  list.push_back({"3x3 pad 1, batch 2", Shape{2, 3, 7, 6}, square(4, 3, 1, 1)});
  {
    ConvolutionParams p = square(6, 3, 1, 2, 2);
    p.dilation = {2};
    list.push_back({"group 2, dilation 2, odd batch 3", Shape{3, 4, 9, 8}, p});
  }
  {
    ConvolutionParams p;
    p.num_output = 3;
    p.kernel_h = 3;
    p.kernel_w = 2;
    p.stride_h = 2;
    p.stride_w = 1;
    p.pad_h = 1;
    p.pad_w = 0;
    list.push_back({"non-square kernel/stride/pad, batch 1", Shape{1, 2, 8, 7}, p});
  }
  {
    ConvolutionParams p = square(4, 1, 1, 0, 2);
    p.bias_term = false;
    list.push_back({"1x1 group 2 without bias, batch 3", Shape{3, 6, 5, 4}, p});
  }
  list.push_back({"1x1, batch 2", Shape{2, 5, 3, 4}, square(3, 1, 1, 0)});
  list.push_back(
      {"11x11 stride 4 (conv1-like), batch 5", Shape{5, 3, 19, 19}, square(2, 11, 4, 0)});
  {
    ConvolutionParams p = square(6, 3, 1, 0, 3);
    p.kernel_size = {3, 2};
    p.stride = {1, 2};
    p.pad = {2, 1};
    p.dilation = {2, 1};
    list.push_back({"group 3, two-value kernel/stride/pad/dilation", Shape{2, 6, 6, 7}, p});
  }
  // Depthwise (MobileNet's): one channel per group, 32 of them (whole AVX-512 blocks), and
  // 5 strided.
  list.push_back({"depthwise 3x3 pad 1, 32 channels", Shape{2, 32, 9, 8}, square(32, 3, 1, 1, 32)});
  list.push_back({"depthwise 3x3 stride 2, 5 channels", Shape{3, 5, 7, 7}, square(5, 3, 2, 1, 5)});
  return list;
}

// Every lowering a case can be forced to, plus automatic.
std::vector<Lowering> lowerings_for(const Case& c) {
  const Geometry g = geometry_of(c.params);
  std::vector<Lowering> list = {Lowering::automatic, Lowering::type1, Lowering::direct,
                                Lowering::direct_plain};
  if (c.params.group == 1) list.push_back(Lowering::type3);
  if (g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 &&
      g.pad_w == 0) {
    list.push_back(Lowering::direct_1x1);
  }
  if (g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
      g.dilation_h == 1 && g.dilation_w == 1 && g.pad_h <= 2 && g.pad_w <= 2) {
    list.push_back(Lowering::winograd);
  }
  return list;
}

struct Naive {
  std::vector<float> y, dx, dw, db;
};

// The direct definition: y[n][co][oh][ow] = b[co] + sum over the input channels of co's
// group and the kernel taps of x * w; backward by the same index map.
Naive naive_convolution(const Shape& in, const ConvolutionParams& p, const std::vector<float>& x,
                        const std::vector<float>& w, const std::vector<float>& b,
                        const std::vector<float>& dy) {
  const Geometry g = geometry_of(p);
  const index_t n_count = in[0], channels = in[1], height = in[2], width = in[3];
  const index_t out_h =
      (height + 2 * g.pad_h - (g.dilation_h * (g.kernel_h - 1) + 1)) / g.stride_h + 1;
  const index_t out_w =
      (width + 2 * g.pad_w - (g.dilation_w * (g.kernel_w - 1) + 1)) / g.stride_w + 1;
  const index_t group_in = channels / p.group, group_out = p.num_output / p.group;
  std::vector<double> y(static_cast<std::size_t>(n_count * p.num_output * out_h * out_w));
  std::vector<double> dx(x.size()), dw(w.size()), db(static_cast<std::size_t>(p.num_output));
  auto x_at = [&](index_t n, index_t c, index_t h, index_t wi) {
    return static_cast<std::size_t>(((n * channels + c) * height + h) * width + wi);
  };
  for (index_t n = 0; n < n_count; ++n) {
    for (index_t co = 0; co < p.num_output; ++co) {
      const index_t group = co / group_out;
      for (index_t oh = 0; oh < out_h; ++oh) {
        for (index_t ow = 0; ow < out_w; ++ow) {
          const std::size_t yi =
              static_cast<std::size_t>(((n * p.num_output + co) * out_h + oh) * out_w + ow);
          double sum = p.bias_term ? b[static_cast<std::size_t>(co)] : 0.0;
          const double grad = dy.empty() ? 0.0 : dy[yi];
          if (p.bias_term) db[static_cast<std::size_t>(co)] += grad;
          for (index_t ci = 0; ci < group_in; ++ci) {
            for (index_t kh = 0; kh < g.kernel_h; ++kh) {
              for (index_t kw = 0; kw < g.kernel_w; ++kw) {
                const index_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
                const index_t iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
                if (ih < 0 || ih >= height || iw < 0 || iw >= width) continue;
                const std::size_t xi = x_at(n, group * group_in + ci, ih, iw);
                const std::size_t wi = static_cast<std::size_t>(
                    ((co * group_in + ci) * g.kernel_h + kh) * g.kernel_w + kw);
                sum += static_cast<double>(x[xi]) * w[wi];
                dx[xi] += grad * w[wi];
                dw[wi] += grad * x[xi];
              }
            }
          }
          y[yi] = sum;
        }
      }
    }
  }
  auto to_float = [](const std::vector<double>& v) {
    return std::vector<float>(v.begin(), v.end());
  };
  return {to_float(y), to_float(dx), to_float(dw),
          p.bias_term ? to_float(db) : std::vector<float>{}};
}

struct Run {
  std::vector<float> y, dx, dw, db;
};

// Every output and gradient of `got` within kTolerance of `want`'s (a Run or a Naive).
template <class Want>
void check_close(const Run& got, const Want& want) {
  CHECK(max_rel_diff(got.y, want.y) <= kTolerance);
  CHECK(max_rel_diff(got.dx, want.dx) <= kTolerance);
  CHECK(max_rel_diff(got.dw, want.dw) <= kTolerance);
  CHECK(max_rel_diff(got.db, want.db) <= kTolerance);
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// Runs the layer on `driver` over the row ranges `cuts` ({0, b, N}: rows [0, b) then
// [b, N)), forward and, when dy is given, backward with cleared parameter gradients.
Run run_convolution(hn::ConvolutionLayer& layer, hn::Driver& driver, const Shape& in,
                    const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& b, const std::vector<float>& dy,
                    const std::vector<index_t>& cuts = {}) {
  hn::test::ParamLayerRun run = hn::test::run_with_params(layer, driver, in, x, {w, b}, dy, cuts);
  Run result;
  result.y = std::move(run.y);
  if (dy.empty()) return result;
  result.dx = std::move(run.dx);
  result.dw = std::move(run.param_diffs.at(0));
  if (run.param_diffs.size() > 1) result.db = std::move(run.param_diffs[1]);
  return result;
}

struct Data {
  std::vector<float> x, w, b, dy;
};

Data data_for(const Case& c) {
  const Geometry g = geometry_of(c.params);
  hn::ConvolutionLayer probe("probe", c.params);
  const Shape out = probe.setup({c.input}).at(0);
  const std::size_t weights = static_cast<std::size_t>(c.params.num_output * c.input[1] /
                                                       c.params.group * g.kernel_h * g.kernel_w);
  return {random_floats(static_cast<std::size_t>(c.input.count()), 11), random_floats(weights, 12),
          c.params.bias_term ? random_floats(static_cast<std::size_t>(c.params.num_output), 13)
                             : std::vector<float>{},
          random_floats(static_cast<std::size_t>(out.count()), 14)};
}

std::vector<hn::test::DriverConfig> gradient_configs() {
  std::vector<hn::test::DriverConfig> configs;
  for (const auto& config : hn::test::driver_configs()) {
    if (config.label == "reference" ||
        (config.label.find("1 thread") != std::string::npos && configs.size() < 2)) {
      configs.push_back(config);
    }
  }
  return configs;
}

}  // namespace

TEST_CASE(
    "Convolution forward and backward equal a naive direct convolution on every driver "
    "with every lowering",
    "[layer][convolution]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const auto oracle = hn::make_driver(hn::Device{"reference", 0});
    for (const Case& c : cases()) {
      const Data data = data_for(c);
      const Naive want = naive_convolution(c.input, c.params, data.x, data.w, data.b, data.dy);
      for (const Lowering lowering : lowerings_for(c)) {
        INFO(c.name << ", input " << c.input.to_string() << ", lowering "
                    << hn::lowering_name(lowering));
        ConvolutionParams p = c.params;
        p.lowering = lowering;
        hn::ConvolutionLayer layer("conv", p);
        const Run got = run_convolution(layer, *driver, c.input, data.x, data.w, data.b, data.dy);
        INFO("chosen lowering " << layer.lowering_name());
        check_close(got, want);
        // The same layer on the reference driver.
        hn::ConvolutionLayer reference_layer("conv", p);
        const Run ref =
            run_convolution(reference_layer, *oracle, c.input, data.x, data.w, data.b, data.dy);
        check_close(got, ref);
      }
    }
  }
}

TEST_CASE("Convolution lowered in chunks smaller than the slice equals the naive convolution",
          "[layer][convolution]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    Case c{"group 2, 7 images", Shape{7, 4, 6, 5}, square(6, 3, 1, 1, 2)};
    const Data data = data_for(c);
    const Naive want = naive_convolution(c.input, c.params, data.x, data.w, data.b, data.dy);
    // Per image: 4 * 9 * 30 lowered floats (4320 bytes); type 3 lowers 30 * (6*9 + 4).
    for (const std::size_t chunk_bytes : {std::size_t{1}, std::size_t{9000}, std::size_t{20000}}) {
      for (const Lowering lowering : {Lowering::type1, Lowering::type3}) {
        ConvolutionParams p = c.params;
        p.lowering = lowering;
        p.chunk_bytes = chunk_bytes;
        if (lowering == Lowering::type3) p.group = 1;
        INFO("lowering " << hn::lowering_name(lowering) << ", chunk_bytes " << chunk_bytes);
        const Data d = lowering == Lowering::type3 ? data_for({c.name, c.input, p}) : data;
        const Naive w =
            lowering == Lowering::type3 ? naive_convolution(c.input, p, d.x, d.w, d.b, d.dy) : want;
        hn::ConvolutionLayer layer("conv", p);
        const Run got = run_convolution(layer, *driver, c.input, d.x, d.w, d.b, d.dy);
        INFO("chunks of " << layer.forward_chunk(7) << " / " << layer.backward_chunk(7)
                          << " images");
        CHECK(layer.forward_chunk(7) < 7);
        CHECK(layer.backward_chunk(7) < 7);
        check_close(got, w);
      }
    }
  }
}

TEST_CASE(
    "Convolution on rows b..e gives the whole-batch run's rows, and slice gradients "
    "add up to the whole batch's",
    "[layer][convolution]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    for (const Case& c : cases()) {
      if (c.input[0] < 2) continue;
      const Data data = data_for(c);
      for (const Lowering lowering : lowerings_for(c)) {
        INFO(c.name << ", lowering " << hn::lowering_name(lowering));
        ConvolutionParams p = c.params;
        p.lowering = lowering;
        hn::ConvolutionLayer layer("conv", p);
        const Run whole = run_convolution(layer, *driver, c.input, data.x, data.w, data.b, data.dy);
        const index_t n = c.input[0];
        const Run split = run_convolution(layer, *driver, c.input, data.x, data.w, data.b, data.dy,
                                          {0, 1, n - 1 > 1 ? n - 1 : n, n});
        check_close(split, whole);
      }
    }
  }
}

TEST_CASE("Convolution gradients match finite differences for every lowering",
          "[layer][convolution]") {
  const auto config = GENERATE(from_range(gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::vector<Case> list;
    list.push_back({"3x3 pad 1", Shape{2, 2, 5, 4}, square(3, 3, 1, 1)});
    {
      ConvolutionParams p = square(4, 2, 2, 1, 2);
      p.dilation = {2, 1};
      list.push_back({"group 2, stride 2, dilation 2x1", Shape{2, 4, 6, 5}, p});
    }
    list.push_back({"1x1", Shape{3, 3, 3, 2}, square(2, 1, 1, 0)});
    for (const Case& c : list) {
      for (const Lowering lowering : lowerings_for(c)) {
        INFO(c.name << ", lowering " << hn::lowering_name(lowering));
        ConvolutionParams p = c.params;
        p.lowering = lowering;
        hn::ConvolutionLayer layer("conv", p);
        const Shape out = layer.setup({c.input}).at(0);
        const Data data = data_for(c);
        hn::Tensor input(c.input), output(out);
        hn::test::set_values(input, data.x);
        hn::test::set_values(layer.params()[0], data.w);
        hn::test::set_values(layer.params()[1], data.b);
        hn::test::GradientCheck options;
        options.step = 1e-2f;
        options.threshold = 1e-3;
        hn::test::check_gradients(layer, *driver, {&input}, {&output}, options);
      }
    }
  }
}

TEST_CASE("Convolution setup computes Caffe's output shape and picks a lowering",
          "[layer][convolution]") {
  hn::ConvolutionLayer conv1("conv1", square(96, 11, 4, 0));
  CHECK(conv1.setup({Shape{10, 3, 227, 227}}).at(0) == Shape{10, 96, 55, 55});
  CHECK(conv1.params().at(0).shape() == Shape{96, 3, 11, 11});
  CHECK(conv1.params().at(1).shape() == Shape{96});
  CHECK(std::string(conv1.lowering_name()) == "type1");
  // Caffe's conv2 (group 2): weights hold C / group input channels.
  hn::ConvolutionLayer conv2("conv2", square(256, 5, 1, 2, 2));
  CHECK(conv2.setup({Shape{10, 96, 27, 27}}).at(0) == Shape{10, 256, 27, 27});
  CHECK(conv2.params().at(0).shape() == Shape{256, 48, 5, 5});
  // The workspace of a slice is bounded by the chunk, not by the batch (on a driver without
  // a direct convolution, where the GEMM lowering runs).
  const std::unique_ptr<hn::Driver> bare = hn::make_driver(hn::Device::parse("reference"));
  CHECK(conv2.lowering_for(*bare) == Lowering::direct);  // the reference has one
  hn::ConvolutionParams forced = square(256, 5, 1, 2, 2);
  forced.lowering = Lowering::type1;
  hn::ConvolutionLayer conv2_type1("conv2", forced);
  conv2_type1.setup({Shape{10, 96, 27, 27}});
  CHECK(conv2_type1.lowering_for(*bare) == Lowering::type1);
  CHECK(conv2_type1.workspace_bytes(*bare, 256) == conv2_type1.workspace_bytes(*bare, 32));
  CHECK(conv2_type1.workspace_bytes(*bare, 256) < std::size_t{64} << 20);
  CHECK(conv2_type1.workspace_bytes(*bare, 256) > 0);
  // The direct path needs no workspace.
  CHECK(conv2.workspace_bytes(*bare, 256) == 0);
  // A 1x1 kernel needs no lowering: the cost model picks direct_1x1 among the GEMM paths.
  hn::ConvolutionLayer one("one", square(64, 1, 1, 0));
  one.setup({Shape{4, 32, 14, 14}});
  CHECK(one.lowering() == Lowering::direct_1x1);
  CHECK(one.workspace_bytes(*bare, 4) == 0);
}

TEST_CASE("Convolution setup errors name the layer and the shapes", "[layer][convolution]") {
  SECTION("channels not divisible by group") {
    hn::ConvolutionLayer layer("conv_g", square(4, 3, 1, 1, 2));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 8, 8}}),
                      Contains("conv_g") && Contains("Convolution") && Contains("group 2") &&
                          Contains("2x3x8x8"));
  }
  SECTION("num_output not divisible by group") {
    hn::ConvolutionLayer layer("conv_o", square(5, 3, 1, 1, 2));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 4, 8, 8}}),
                      Contains("conv_o") && Contains("num_output 5"));
  }
  SECTION("kernel larger than the padded input") {
    hn::ConvolutionLayer layer("conv_k", square(4, 7, 1, 1));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4, 4}}), Contains("conv_k") &&
                                                            Contains("kernel 7x7") &&
                                                            Contains("6x6") && Contains("2x3x4x4"));
  }
  SECTION("wrong input count") {
    hn::ConvolutionLayer layer("conv_n", square(4, 3, 1, 1));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 8, 8}, Shape{2, 3, 8, 8}}),
                      Contains("conv_n") && Contains("1 input") && Contains("got 2"));
    CHECK_THROWS_WITH(layer.setup({}), Contains("conv_n") && Contains("got 0"));
  }
  SECTION("input not 4-D") {
    hn::ConvolutionLayer layer("conv_d", square(4, 3, 1, 1));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 8}}), Contains("conv_d") && Contains("2x3x8"));
  }
  SECTION("kernel_size and kernel_h/kernel_w together") {
    ConvolutionParams p = square(4, 3, 1, 1);
    p.kernel_h = 3;
    p.kernel_w = 3;
    hn::ConvolutionLayer layer("conv_b", p);
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 8, 8}}), Contains("conv_b") && Contains("kernel"));
  }
  SECTION("a forced lowering that does not apply") {
    ConvolutionParams p = square(4, 3, 1, 1, 2);
    p.lowering = Lowering::type3;
    hn::ConvolutionLayer type3("conv_t3", p);
    CHECK_THROWS_WITH(type3.setup({Shape{2, 4, 8, 8}}), Contains("conv_t3") && Contains("type3"));
    p.group = 1;
    p.lowering = Lowering::direct_1x1;
    hn::ConvolutionLayer direct("conv_d1", p);
    CHECK_THROWS_WITH(direct.setup({Shape{2, 4, 8, 8}}),
                      Contains("conv_d1") && Contains("direct_1x1") && Contains("3x3"));
    ConvolutionParams strided = square(4, 3, 2, 1);
    strided.lowering = Lowering::winograd;
    hn::ConvolutionLayer winograd("conv_w", strided);
    CHECK_THROWS_WITH(winograd.setup({Shape{2, 4, 8, 8}}),
                      Contains("conv_w") && Contains("winograd") && Contains("stride 2x2"));
  }
  SECTION("num_output missing") {
    ConvolutionParams p;
    p.kernel_size = {3};
    hn::ConvolutionLayer layer("conv_z", p);
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 8, 8}}),
                      Contains("conv_z") && Contains("num_output"));
  }
}

TEST_CASE(
    "a tuning candidate whose first call alone exceeds the bound is judged on its second call, "
    "one far over it is not called again",
    "[tune]") {
  // The first call pays one-time costs (first touch of buffers, a layout of the weights): the
  // CPU driver's Winograd forward on ResNet-50's res5 layers took 81 ms at its first call and
  // 30 after, against 62 for the direct kernel, and was dropped at its first.
  const auto driver = hn::make_driver(hn::Device::parse("reference"));
  const auto sleeping = [](std::vector<int> milliseconds, int& calls) {
    return [milliseconds, &calls] {
      const int at = std::min(calls++, static_cast<int>(milliseconds.size()) - 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds[at]));
    };
  };
  int calls = 0;
  const double slow_start = hn::Tuner::time(*driver, sleeping({200, 1}, calls), 2, 0.1);
  CHECK(slow_start < 0.1);
  CHECK(calls == 3);  // the first, then the two repeats
  calls = 0;
  const double far_out = hn::Tuner::time(*driver, sleeping({500, 1}, calls), 2, 0.1);
  CHECK(far_out >= 0.5);
  CHECK(calls == 1);
  calls = 0;
  const double still_slow = hn::Tuner::time(*driver, sleeping({200, 150}, calls), 2, 0.1);
  CHECK(still_slow >= 0.15);
  CHECK(calls == 2);  // over the bound at its second call too: not repeated
}

TEST_CASE(
    "tuning candidates take turns, so a slow spell of the machine does not fall on one alone, "
    "and leave the race far behind",
    "[tune]") {
  const auto driver = hn::make_driver(hn::Device::parse("reference"));
  // A machine whose first four calls run three times slower (another tenant's burst), and
  // candidates that take 40 and 50 ms outside it. Timed one after the other, the first would
  // take three slow calls and lose; taking turns, each gets two slow calls and one fast.
  int calls = 0;
  std::vector<int> calls_of(4, 0);
  const auto candidate = [&](int index, int milliseconds) {
    return [&, index, milliseconds] {
      const int factor = calls++ < 4 ? 3 : 1;
      ++calls_of[static_cast<std::size_t>(index)];
      std::this_thread::sleep_for(std::chrono::milliseconds(factor * milliseconds));
    };
  };
  const std::vector<double> fair =
      hn::Tuner::race(*driver, {candidate(0, 40), candidate(1, 50)}, 2, 0.5);
  REQUIRE(fair.size() == 2);
  CHECK(fair[0] < fair[1]);
  CHECK(fair[0] < 0.1);     // a call outside the slow spell
  CHECK(calls_of[0] == 3);  // the warm-up and two turns
  CHECK(calls_of[1] == 3);
  // After the slow spell: one over 4 times the fastest warm-up is not called again; one over
  // 1.5 times the fastest after its second call, or over the bound, is not called a third.
  calls = 4;
  calls_of.assign(4, 0);
  const std::vector<double> ranked = hn::Tuner::race(
      *driver, {candidate(0, 40), candidate(1, 300), candidate(2, 90), candidate(3, 55)}, 2, 0.048);
  CHECK(calls_of[0] == 3);
  CHECK(calls_of[1] == 1);
  CHECK(calls_of[2] == 2);
  CHECK(calls_of[3] == 2);  // within 1.5 times the fastest, but over the bound of 48 ms
  CHECK(ranked[1] >= 0.3);
}

TEST_CASE(
    "Convolution with a different lowering for each direction equals a naive direct "
    "convolution on every driver",
    "[layer][convolution][tune]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    for (const Case& c : cases()) {
      const Data data = data_for(c);
      const Naive want = naive_convolution(c.input, c.params, data.x, data.w, data.b, data.dy);
      hn::ConvolutionLayer probe("conv", c.params);
      probe.setup({c.input});
      const std::vector<Lowering> options = probe.candidates(*driver);
      if (options.size() < 2) continue;  // one lowering: the test above covers it
      // Every candidate once in each direction, with its neighbours in the others.
      for (std::size_t i = 0; i < options.size(); ++i) {
        const Lowering forward = options[i], data_grad = options[(i + 1) % options.size()],
                       weight_grad = options[(i + 2) % options.size()];
        hn::ConvolutionLayer layer("conv", c.params);
        layer.setup({c.input});
        layer.choose(*driver, hn::ConvDirection::forward, forward);
        layer.choose(*driver, hn::ConvDirection::backward_data, data_grad);
        layer.choose(*driver, hn::ConvDirection::backward_weights, weight_grad);
        INFO(c.name << ": " << layer.algorithm(*driver));
        CHECK(layer.lowering_for(*driver, hn::ConvDirection::backward_data) == data_grad);
        const Run got = run_convolution(layer, *driver, c.input, data.x, data.w, data.b, data.dy);
        check_close(got, want);
      }
    }
  }
}

TEST_CASE("Convolution choose rejects a lowering the shape does not allow, naming the layer",
          "[layer][convolution][tune]") {
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  hn::ConvolutionLayer grouped("conv_g", square(4, 3, 1, 1, 2));
  grouped.setup({Shape{2, 4, 6, 6}});
  CHECK_THAT(hn::test::error_of(
                 [&] { grouped.choose(*cpu, hn::ConvDirection::forward, Lowering::type3); }),
             Contains("layer 'conv_g' (Convolution)") && Contains("type3"));
  CHECK_THAT(hn::test::error_of(
                 [&] { grouped.choose(*cpu, hn::ConvDirection::forward, Lowering::direct_1x1); }),
             Contains("direct_1x1"));
  // A forced lowering is the only candidate.
  ConvolutionParams forced = square(4, 3, 1, 1);
  forced.lowering = Lowering::type1;
  hn::ConvolutionLayer layer("conv_f", forced);
  layer.setup({Shape{2, 4, 6, 6}});
  CHECK(layer.candidates(*cpu) == std::vector<Lowering>{Lowering::type1});
}

TEST_CASE(
    "A convolution on blocked operands tunes the driver's blocked kernels against its NCHW ones "
    "and its Winograd, keyed by the layouts, and a driver without blocked kernels keeps every "
    "candidate",
    "[layer][convolution][tune]") {
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  const auto reference = hn::make_driver(hn::Device{"reference", 0});
  const hn::Layout blocked = cpu->capabilities().preferred_blocked_layout;
  hn::ConvolutionLayer layer("conv_b", square(16, 3, 1, 1));
  layer.setup({Shape{2, 16, 6, 6}});
  layer.use_layouts({hn::Layout::nchw}, {blocked});
  CHECK(layer.candidates(*cpu) ==
        std::vector<Lowering>{Lowering::direct, Lowering::direct_plain, Lowering::winograd});
  CHECK(layer.candidates(*reference) ==
        std::vector<Lowering>{Lowering::direct, Lowering::type3, Lowering::type1});
  // Groups of whole blocks and at least 16 channels take Winograd too (each group apart);
  // depthwise ones do not (one channel a group).
  const auto grouped_candidates = [&](index_t groups) {
    ConvolutionParams p = square(64, 3, 1, 1);
    p.group = groups;
    hn::ConvolutionLayer grouped("conv_g", p);
    grouped.setup({Shape{2, 64, 6, 6}});
    grouped.use_layouts({blocked}, {blocked});
    return grouped.candidates(*cpu);
  };
  CHECK(grouped_candidates(2) ==
        std::vector<Lowering>{Lowering::direct, Lowering::direct_plain, Lowering::winograd});
  CHECK(grouped_candidates(64) == std::vector<Lowering>{Lowering::direct, Lowering::direct_plain});
  CHECK_THAT(
      hn::test::error_of([&] { layer.choose(*cpu, hn::ConvDirection::forward, Lowering::type1); }),
      Contains("conv_b") && Contains("type1"));
  const std::string direct = std::string("direct (") + hn::layout_name(blocked) + ")";
  CHECK(layer.algorithm(*cpu) == direct);
  layer.choose(*cpu, hn::ConvDirection::backward_weights, Lowering::direct_plain);
  CHECK(layer.lowering_for(*cpu, hn::ConvDirection::backward_weights) == Lowering::direct_plain);
  CHECK(layer.algorithm(*cpu) ==
        "forward " + direct + ", backward data " + direct + ", backward weights direct_plain");

  const hn::test::TempDir dir;
  hn::TuneOptions options;
  options.mode = hn::TuneMode::once;
  options.cache_path = dir.file("tune.txt");
  std::vector<hn::TuneReport> reports;
  options.on_layer = [&](const hn::TuneReport& r) { reports.push_back(r); };
  hn::Tuner tuner(options);
  layer.tune(*cpu, 2, tuner);
  tuner.save();
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].measured);
  CHECK(reports[0].algorithm == layer.algorithm(*cpu));
  CHECK_THAT(read_text(options.cache_path),
             Contains(std::string(" layout NCHW/") + hn::layout_name(blocked) + " forward"));
}

TEST_CASE(
    "In BF16 math on a CPU with BF16 kernels a convolution's candidates add direct_fp32, on "
    "blocked and NCHW operands, and in FP32 math or on the reference driver they do not",
    "[layer][convolution][tune][math]") {
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  const auto reference = hn::make_driver(hn::Device{"reference", 0});
  const bool bf16 = hn::test::computes_bf16(*cpu);
  const hn::Layout blocked = cpu->capabilities().preferred_blocked_layout;
  for (const hn::Layout layout : {hn::Layout::nchw, blocked}) {
    INFO(hn::layout_name(layout));
    hn::ConvolutionLayer layer("conv_m", square(16, 3, 1, 1));
    layer.setup({Shape{2, 16, 6, 6}});
    layer.use_layouts({layout}, {layout});
    const auto offered = [&](hn::Driver& driver, hn::MathMode mode) {
      driver.set_math_mode(mode);
      const std::vector<Lowering> candidates = layer.candidates(driver);
      driver.set_math_mode(hn::MathMode::fp32);
      return std::count(candidates.begin(), candidates.end(), Lowering::direct_fp32) == 1;
    };
    CHECK(offered(*cpu, hn::MathMode::bf16) == bf16);
    CHECK_FALSE(offered(*cpu, hn::MathMode::fp32));
    CHECK_FALSE(offered(*cpu, hn::MathMode::tf32));  // the CPU computes TF32 as FP32
    CHECK_FALSE(offered(*reference, hn::MathMode::bf16));
    if (!bf16) continue;
    cpu->set_math_mode(hn::MathMode::bf16);
    layer.choose(*cpu, hn::ConvDirection::backward_data, Lowering::direct_fp32);
    cpu->set_math_mode(hn::MathMode::fp32);
    CHECK(layer.lowering_for(*cpu, hn::ConvDirection::backward_data) == Lowering::direct_fp32);
    CHECK_THAT(layer.algorithm(*cpu), Contains("backward data direct_fp32"));
  }
  if (!bf16) WARN("cpu has no BF16 kernels: direct_fp32 is never a candidate here");
}

TEST_CASE(
    "Convolution tune measures every candidate, records the fastest, and a cached run reads it "
    "back without measuring",
    "[layer][convolution][tune]") {
  const hn::test::TempDir dir;
  const std::string cache = dir.file("sub/tune.txt");  // the directory is made on save
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  const Shape input{4, 16, 10, 10};
  const ConvolutionParams params = square(24, 1, 1, 0);  // 1x1: six candidates on the CPU
  std::vector<hn::TuneReport> reports;
  hn::TuneOptions options;
  options.cache_path = cache;
  options.on_layer = [&](const hn::TuneReport& r) { reports.push_back(r); };

  // off: no measurement, the cost model's choice.
  options.mode = hn::TuneMode::off;
  {
    hn::Tuner tuner(options);
    hn::ConvolutionLayer layer("c1", params);
    layer.setup({input});
    layer.tune(*cpu, 4, tuner);
    tuner.save();
    CHECK(reports.empty());
    CHECK(layer.algorithm(*cpu) == "direct");
    CHECK_FALSE(std::filesystem::exists(cache));
  }

  // once: measures, records a choice per direction among the candidates.
  options.mode = hn::TuneMode::once;
  std::string measured;
  {
    hn::Tuner tuner(options);
    hn::ConvolutionLayer layer("c1", params);
    layer.setup({input});
    const std::vector<Lowering> candidates = layer.candidates(*cpu);
    CHECK(candidates == std::vector<Lowering>{Lowering::direct, Lowering::direct_plain,
                                              Lowering::pointwise, Lowering::direct_1x1,
                                              Lowering::type3, Lowering::type1});
    layer.tune(*cpu, 4, tuner);
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].measured);
    CHECK(reports[0].layer == "c1");
    CHECK(reports[0].device == "cpu");
    CHECK(reports[0].algorithm == layer.algorithm(*cpu));
    for (const hn::ConvDirection d : {hn::ConvDirection::forward, hn::ConvDirection::backward_data,
                                      hn::ConvDirection::backward_weights}) {
      const Lowering chosen = layer.lowering_for(*cpu, d);
      CHECK(std::find(candidates.begin(), candidates.end(), chosen) != candidates.end());
    }
    measured = layer.algorithm(*cpu);
    tuner.save();
  }
  const std::string text = read_text(cache);
  CHECK_THAT(text, Contains("Convolution 4x16x10x10 out 24 kernel 1x1") && Contains("forward") &&
                       Contains("backward_weights"));
#if defined(__x86_64__)
  // The machine names the widest vector extension (here from CPUID, the cache reads
  // /proc/cpuinfo): AVX-512 and AVX2 machines of one model name tune apart.
  const char* isa = __builtin_cpu_supports("avx512f") ? " (avx512f), hybridnn"
                    : __builtin_cpu_supports("avx2")  ? " (avx2), hybridnn"
                    : __builtin_cpu_supports("avx")   ? " (avx), hybridnn"
                                                      : " (sse4_2), hybridnn";
  CHECK_THAT(text, Contains(isa));
#endif

  // cached: read back, not measured; the file decides (rewritten to type1 everywhere).
  options.mode = hn::TuneMode::cached;
  {
    reports.clear();
    hn::Tuner tuner(options);
    hn::ConvolutionLayer layer("c1", params);
    layer.setup({input});
    layer.tune(*cpu, 4, tuner);
    REQUIRE(reports.size() == 1);
    CHECK_FALSE(reports[0].measured);
    CHECK(layer.algorithm(*cpu) == measured);
  }
  std::string edited;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] != '#') line = line.substr(0, line.rfind('\t')) + "\ttype1";
    edited += line + "\n";
  }
  std::ofstream(cache) << edited;
  {
    reports.clear();
    hn::Tuner tuner(options);
    hn::ConvolutionLayer layer("c1", params);
    layer.setup({input});
    layer.tune(*cpu, 4, tuner);
    REQUIRE(reports.size() == 1);
    CHECK_FALSE(reports[0].measured);
    CHECK(layer.algorithm(*cpu) == "type1");
    // Another slice size is another shape: measured.
    reports.clear();
    layer.tune(*cpu, 3, tuner);
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].measured);
  }

  // A malformed line is an error naming the file and the line.
  std::ofstream(cache) << "# comment\n\nno tabs here\n";
  CHECK_THAT(hn::test::error_of([&] { hn::Tuner tuner(options); }),
             Contains(cache) && Contains("line 3") && Contains("delete the file"));
  CHECK_THAT(hn::test::error_of([] { hn::parse_tune_mode("sometimes"); }),
             Contains("'sometimes'") && Contains("off, once, cached"));
}

TEST_CASE(
    "Convolution tune takes the agreed choice (TuneOptions::agree, rank 0's under data "
    "parallelism) over its own, records it, and names a choice it does not have",
    "[layer][convolution][tune]") {
  const hn::test::TempDir dir;
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  const Shape input{4, 16, 10, 10};
  const ConvolutionParams params = square(24, 1, 1, 0);  // 1x1: six candidates on the CPU
  for (const hn::TuneMode mode : {hn::TuneMode::once, hn::TuneMode::cached}) {
    INFO(hn::tune_mode_name(mode));
    hn::TuneOptions options;
    options.mode = mode;
    options.cache_path = dir.file("tune.txt");
    std::vector<std::string> asked;
    options.agree = [&](const std::string& mine) {
      asked.push_back(mine);
      return std::string("type3");
    };
    {
      hn::Tuner tuner(options);
      hn::ConvolutionLayer layer("c1", params);
      layer.setup({input});
      layer.tune(*cpu, 4, tuner);
      tuner.save();
      CHECK(asked.size() == 3);  // one per direction, measured or cached
      CHECK(layer.algorithm(*cpu) == "type3");
    }
    // What was used is what the cache holds.
    hn::TuneOptions plain = options;
    plain.mode = hn::TuneMode::cached;
    plain.agree = nullptr;
    hn::Tuner tuner(plain);
    hn::ConvolutionLayer layer("c1", params);
    layer.setup({input});
    layer.tune(*cpu, 4, tuner);
    CHECK(layer.algorithm(*cpu) == "type3");
  }
  hn::TuneOptions options;
  options.mode = hn::TuneMode::once;
  options.cache_path = "none";
  options.agree = [](const std::string&) { return std::string("winograd"); };
  hn::Tuner tuner(options);
  hn::ConvolutionLayer layer("c1", params);
  layer.setup({input});
  CHECK_THAT(hn::test::error_of([&] { layer.tune(*cpu, 4, tuner); }),
             Contains("c1") && Contains("'winograd'") && Contains("cpu"));
}

TEST_CASE("A tuning cache that is a FIFO or holds a binary line is refused, quoted briefly",
          "[tune]") {
  const hn::test::TempDir dir;
  hn::TuneOptions options;
  options.mode = hn::TuneMode::cached;
  options.cache_path = dir.file("fifo.txt");
  REQUIRE(mkfifo(options.cache_path.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(hn::Tuner(options), Contains("fifo.txt") && Contains("a FIFO"));
  // A 1 MB line of binary bytes: at most 80 characters of it, escaped, in the message.
  options.cache_path = dir.file("binary.txt");
  std::string line(1 << 20, '\x01');
  line[5] = '\t';
  std::ofstream(options.cache_path) << line << "\n";
  try {
    hn::Tuner tuner(options);
    FAIL("a malformed cache line was accepted");
  } catch (const hn::Error& error) {
    const std::string message = error.what();
    CHECK_THAT(message, Contains("line 1") && Contains("\\x01") && Contains("1048576 bytes"));
    CHECK(message.size() < 1000);
  }
}

TEST_CASE("A tuning cache keeps the choices made in each math mode apart, in the file too",
          "[tune]") {
  const hn::test::TempDir dir;
  hn::TuneOptions options;
  options.mode = hn::TuneMode::cached;
  options.cache_path = dir.file("tune.txt");
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0});
  {
    hn::Tuner tuner(options);
    cpu->set_math_mode(hn::MathMode::tf32);
    tuner.record(*cpu, "Convolution 2x3x8x8", "type1");
    CHECK(tuner.lookup(*cpu, "Convolution 2x3x8x8") == "type1");
    cpu->set_math_mode(hn::MathMode::fp32);
    CHECK_FALSE(tuner.lookup(*cpu, "Convolution 2x3x8x8"));
    tuner.record(*cpu, "Convolution 2x3x8x8", "direct");
    tuner.save();
  }
  hn::Tuner again(options);
  CHECK(again.lookup(*cpu, "Convolution 2x3x8x8") == "direct");
  cpu->set_math_mode(hn::MathMode::tf32);
  CHECK(again.lookup(*cpu, "Convolution 2x3x8x8") == "type1");
  cpu->set_math_mode(hn::MathMode::bf16);
  CHECK_FALSE(again.lookup(*cpu, "Convolution 2x3x8x8"));
}

TEST_CASE(
    "A tuning cache serves a CPU driver bound to cores, or another instance, the choices made "
    "unbound",
    "[tune]") {
  const hn::test::TempDir dir;
  hn::TuneOptions options;
  options.mode = hn::TuneMode::cached;
  options.cache_path = dir.file("tune.txt");
  const std::string core = std::to_string(hn::detail::allowed_cores().front());
  const auto unbound = hn::make_driver(hn::Device{"cpu", 0}, {{"threads", "1"}});
  const auto bound = hn::make_driver(hn::Device{"cpu", 0}, {{"threads", "1"}, {"cores", core}});
  REQUIRE_THAT(bound->description(), Contains("cpu: 1 thread on cores " + core + ", BLAS"));
  REQUIRE_THAT(unbound->description(), !Contains("on cores"));
  {
    hn::Tuner tuner(options);
    tuner.record(*unbound, "Convolution 2x3x8x8", "type1");
    tuner.save();
  }
  hn::Tuner again(options);
  CHECK(again.lookup(*bound, "Convolution 2x3x8x8") == "type1");
  const auto second = hn::make_driver(hn::Device{"cpu", 1}, {{"threads", "1"}, {"cores", core}});
  CHECK(again.lookup(*second, "Convolution 2x3x8x8") == "type1");
  // Another thread count is another driver for the cache.
  const auto two = hn::make_driver(hn::Device{"cpu", 0}, {{"threads", "2"}, {"cores", core}});
  CHECK_FALSE(again.lookup(*two, "Convolution 2x3x8x8"));
}

TEST_CASE(
    "A tuning cache keeps a CPU driver's choices apart by the vector extension of its kernels "
    "and of oneDNN's",
    "[tune]") {
  // A build for AVX2 on an AVX-512 machine, or oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA), runs
  // other kernels than the native build, which may share the cache file.
#if defined(__AVX512F__)
  const std::string vectors = "kernels avx512";
#elif defined(__AVX2__)
  const std::string vectors = "kernels avx2";
#else
  const std::string vectors = "kernels sse";
#endif
  const hn::test::TempDir dir;
  hn::TuneOptions options;
  options.mode = hn::TuneMode::cached;
  options.cache_path = dir.file("tune.txt");
  const auto cpu = hn::make_driver(hn::Device{"cpu", 0}, {{"threads", "1"}});
  {
    hn::Tuner tuner(options);
    tuner.record(*cpu, "Convolution 2x3x8x8", "type1");
    tuner.save();
  }
  std::string text;
  {
    std::ifstream file(options.cache_path);
    text.assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  }
  REQUIRE_THAT(text, Contains(", " + vectors + ", oneDNN "));
  CHECK(hn::Tuner(options).lookup(*cpu, "Convolution 2x3x8x8") == "type1");
  // The same line as another build's: not this driver's choice.
  text.replace(text.find(vectors), vectors.size(), "kernels other");
  {
    std::ofstream file(options.cache_path, std::ios::trunc);
    file << text;
  }
  CHECK_FALSE(hn::Tuner(options).lookup(*cpu, "Convolution 2x3x8x8"));
}

TEST_CASE("Convolution and InnerProduct count their forward FLOPs by hand's formula",
          "[layer][convolution]") {
  // CaffeNet's conv2: 96 -> 256 channels, 5x5, pad 2, group 2, on 27x27: 27x27 outputs.
  hn::ConvolutionLayer conv2("conv2", square(256, 5, 1, 2, 2));
  conv2.setup({Shape{4, 96, 27, 27}});
  CHECK(conv2.forward_flops(4) == 2.0 * 4 * 256 * 27 * 27 * (48 * 25));
  CHECK(conv2.forward_flops(1) == 2.0 * 256 * 27 * 27 * (48 * 25));
  hn::InnerProductParams ip;
  ip.num_output = 10;
  const auto fc = hn::make_inner_product_layer("fc", ip);
  fc->setup({Shape{6, 3, 4, 5}});  // K = 60
  CHECK(fc->forward_flops(6) == 2.0 * 6 * 60 * 10);
  CHECK(fc->forward_flops(2) == 2.0 * 2 * 60 * 10);
}
