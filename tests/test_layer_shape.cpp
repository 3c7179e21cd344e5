// Concat, Slice, Split, Flatten and Reshape layers: forward and backward against naive
// coordinate-wise references on every driver, split runs, gradients, Caffe's shape rules
// and the setup errors.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/shape_layer.h"
#include "tests/layer_runs.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Shape;
using hn::test::HostValues;
using hn::test::random_floats;
using hn::test::run_layer;
using hn::test::RunSpec;

// Row-major coordinates of element `flat` of `shape`, and back.
std::vector<index_t> coords_of(const Shape& shape, index_t flat) {
  std::vector<index_t> c(static_cast<std::size_t>(shape.axes()));
  for (int a = shape.axes() - 1; a >= 0; --a) {
    c[a] = flat % shape[a];
    flat /= shape[a];
  }
  return c;
}
index_t flat_of(const Shape& shape, const std::vector<index_t>& c) {
  index_t flat = 0;
  for (int a = 0; a < shape.axes(); ++a)
    flat = flat * shape[a] + c[a];
  return flat;
}

// For every element of the joined tensor: which part along `axis` holds it, and where.
struct Place {
  std::size_t part;
  index_t flat;
};
std::vector<Place> joined_places(const Shape& joined, const std::vector<Shape>& parts, int axis) {
  std::vector<Place> places;
  for (index_t e = 0; e < joined.count(); ++e) {
    std::vector<index_t> c = coords_of(joined, e);
    std::size_t part = 0;
    while (c[axis] >= parts[part][axis]) {
      c[axis] -= parts[part][axis];
      ++part;
    }
    places.push_back({part, flat_of(parts[part], c)});
  }
  return places;
}

std::vector<float> sequence(index_t n, float start) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

HostValues random_parts(const std::vector<Shape>& shapes, std::uint32_t seed) {
  HostValues v;
  for (const Shape& s : shapes)
    v.push_back(random_floats(static_cast<std::size_t>(s.count()), seed++));
  return v;
}

// Named builders: brace-initialising these structs inside initializer lists trips GCC 12's
// -Wmaybe-uninitialized at -O3.
hn::SliceParams slice_params(int axis, int slice_dim, std::vector<index_t> points) {
  hn::SliceParams p;
  p.axis = axis;
  p.slice_dim = slice_dim;
  p.slice_point = std::move(points);
  return p;
}
hn::ReshapeParams reshape_params(std::vector<index_t> shape, int axis, int num_axes) {
  hn::ReshapeParams p;
  p.shape = std::move(shape);
  p.axis = axis;
  p.num_axes = num_axes;
  return p;
}

std::vector<index_t> dims(const Shape& s) {
  return s.dims();
}

}  // namespace

TEST_CASE("Concat joins inputs along the axis and routes gradients back on every driver",
          "[layer][concat]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    struct Case {
      hn::ConcatParams params;
      std::vector<Shape> inputs;
      int axis;
    };
    const std::vector<Case> cases = {
        {{1, -1}, {Shape{3, 2, 4, 2}, Shape{3, 5, 4, 2}, Shape{3, 1, 4, 2}}, 1},
        {{-1, -1}, {Shape{3, 2, 3}, Shape{3, 2, 1}}, 2},
        {{2, -1}, {Shape{3, 2, 2, 2}, Shape{3, 2, 3, 2}}, 2},
        {{1, 0}, {Shape{2, 3, 2}, Shape{4, 3, 2}}, 0},  // legacy concat_dim, the batch axis
        {{0, -1}, {Shape{1, 3}, Shape{2, 3}, Shape{3, 3}}, 0},
    };
    std::uint32_t seed = 50;
    for (const Case& c : cases) {
      INFO("axis " << c.axis << ", first input " << c.inputs[0].to_string());
      hn::ConcatLayer layer("concat", c.params);
      const Shape out = layer.setup(c.inputs)[0];
      std::vector<index_t> want_dims = dims(c.inputs[0]);
      want_dims[c.axis] = 0;
      for (const Shape& s : c.inputs)
        want_dims[c.axis] += s[c.axis];
      REQUIRE(out == Shape(want_dims));
      CHECK(layer.splits_by_rows() == (c.axis != 0));

      const HostValues x = random_parts(c.inputs, seed);
      seed += 10;
      const auto dy = random_floats(static_cast<std::size_t>(out.count()), seed++);
      const std::vector<Place> places = joined_places(out, c.inputs, c.axis);
      std::vector<float> y(places.size());
      HostValues dx;
      for (const Shape& s : c.inputs)
        dx.emplace_back(static_cast<std::size_t>(s.count()), 0.0f);
      for (std::size_t e = 0; e < places.size(); ++e) {
        y[e] = x[places[e].part][places[e].flat];
        dx[places[e].part][places[e].flat] = dy[e];
      }
      const auto run = run_layer(layer, *driver, c.inputs, x, {dy});
      CHECK(run.outputs[0] == y);
      CHECK(run.input_diffs == dx);
      if (c.axis != 0) {
        hn::test::check_split_equals_whole(layer, *driver, c.inputs, x, RunSpec{{0, 1, 3}}, 0.0);
      }
    }
  }
}

TEST_CASE("Slice cuts the input at slice points or evenly and routes gradients back",
          "[layer][slice]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    struct Case {
      hn::SliceParams params;
      int num_outputs;
      Shape input;
      int axis;
      std::vector<index_t> sizes;
    };
    const std::vector<Case> cases = {
        {slice_params(1, -1, {2, 3}), 0, Shape{3, 6, 2, 2}, 1, {2, 1, 3}},
        {slice_params(1, -1, {}), 3, Shape{3, 6, 2}, 1, {2, 2, 2}},
        {slice_params(-1, -1, {1}), 0, Shape{3, 2, 4}, 2, {1, 3}},
        {slice_params(1, 2, {}), 2, Shape{3, 2, 4}, 2, {2, 2}},       // legacy slice_dim
        {slice_params(0, -1, {1, 3}), 0, Shape{4, 3}, 0, {1, 2, 1}},  // the batch axis
    };
    std::uint32_t seed = 60;
    for (const Case& c : cases) {
      INFO("axis " << c.axis << ", input " << c.input.to_string());
      hn::SliceLayer layer("slice", c.params, c.num_outputs);
      const std::vector<Shape> outs = layer.setup({c.input});
      REQUIRE(outs.size() == c.sizes.size());
      for (std::size_t j = 0; j < outs.size(); ++j) {
        std::vector<index_t> want = dims(c.input);
        want[c.axis] = c.sizes[j];
        CHECK(outs[j] == Shape(want));
      }
      CHECK(layer.splits_by_rows() == (c.axis != 0));
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
      const HostValues dy = random_parts(outs, seed);
      seed += 10;
      const std::vector<Place> places = joined_places(c.input, outs, c.axis);
      HostValues y;
      for (const Shape& s : outs)
        y.emplace_back(static_cast<std::size_t>(s.count()), 0.0f);
      std::vector<float> dx(x.size());
      for (std::size_t e = 0; e < places.size(); ++e) {
        y[places[e].part][places[e].flat] = x[e];
        dx[e] = dy[places[e].part][places[e].flat];
      }
      const auto run = run_layer(layer, *driver, {c.input}, {x}, dy);
      CHECK(run.outputs == y);
      CHECK(run.input_diffs[0] == dx);
      if (c.axis != 0) {
        hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 2, 3}}, 0.0);
      }
    }
  }
}

TEST_CASE("Split copies its input to every output and sums the output gradients",
          "[layer][split]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{3, 4, 5};
    const auto x = random_floats(static_cast<std::size_t>(shape.count()), 70);
    for (const int outputs : {1, 2, 3}) {
      INFO(outputs << " outputs");
      hn::SplitLayer layer("split", outputs);
      const HostValues dy = random_parts(std::vector<Shape>(outputs, shape), 71);
      std::vector<float> dx(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        double sum = 0.0;
        for (const auto& d : dy)
          sum += d[i];
        dx[i] = static_cast<float>(sum);
      }
      const auto run = run_layer(layer, *driver, {shape}, {x}, dy);
      REQUIRE(run.outputs.size() == static_cast<std::size_t>(outputs));
      for (const auto& y : run.outputs)
        CHECK(y == x);
      CHECK(hn::test::max_rel_diff(run.input_diffs[0], dx) <= 1e-6);
      hn::test::check_split_equals_whole(layer, *driver, {shape}, {x}, RunSpec{{0, 1, 3}}, 0.0);
    }
  }
}

TEST_CASE("Flatten and Reshape keep the values and follow Caffe's shape rules on every driver",
          "[layer][flatten][reshape]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape in{2, 3, 4, 5};
    const auto x = sequence(in.count(), 1.0f);
    const auto dy = random_floats(x.size(), 80);
    auto check_copy = [&](hn::Layer& layer, const Shape& want, bool by_rows) {
      const auto out = layer.setup({in});
      REQUIRE(out.size() == 1);
      CHECK(out[0] == want);
      CHECK(layer.splits_by_rows() == by_rows);
      const auto run = run_layer(layer, *driver, {in}, {x}, {dy});
      CHECK(run.outputs[0] == x);
      CHECK(run.input_diffs[0] == dy);
      if (by_rows) {
        hn::test::check_split_equals_whole(layer, *driver, {in}, {x}, RunSpec{{0, 1, 2}}, 0.0);
      }
    };
    SECTION("Flatten") {
      struct Case {
        hn::FlattenParams params;
        Shape out;
        bool by_rows;
      };
      for (const Case& c : std::vector<Case>{{{1, -1}, Shape{2, 60}, true},
                                             {{2, 3}, Shape{2, 3, 20}, true},
                                             {{1, 2}, Shape{2, 12, 5}, true},
                                             {{-3, -2}, Shape{2, 12, 5}, true},
                                             {{0, -1}, Shape{120}, false},
                                             {{0, 1}, Shape{6, 4, 5}, false},
                                             {{2, 2}, Shape{2, 3, 4, 5}, true}}) {
        INFO("axis " << c.params.axis << " end_axis " << c.params.end_axis);
        hn::FlattenLayer layer("flat", c.params);
        check_copy(layer, c.out, c.by_rows);
      }
    }
    SECTION("Reshape") {
      struct Case {
        hn::ReshapeParams params;
        Shape out;
        bool by_rows;
      };
      for (const Case& c : std::vector<Case>{
               {reshape_params({0, -1}, 0, -1), Shape{2, 60}, true},
               {reshape_params({0, 0, -1}, 0, -1), Shape{2, 3, 20}, true},
               {reshape_params({-1}, 0, -1), Shape{120}, false},
               {reshape_params({6, -1}, 0, -1), Shape{6, 20}, false},
               {reshape_params({2, 5, 3, 4}, 0, -1), Shape{2, 5, 3, 4}, true},
               {reshape_params({12}, 1, 2), Shape{2, 12, 5}, true},
               {reshape_params({-1}, 1, 2), Shape{2, 12, 5}, true},
               {reshape_params({1, 1}, -1, 0), Shape{2, 3, 4, 5, 1, 1},
                true},  // after the last axis
               {reshape_params({1, -1}, 0, 1), Shape{1, 2, 3, 4, 5}, false},
               {reshape_params({}, 1, 0), Shape{2, 3, 4, 5}, true},
               {reshape_params({0, 2, -1, 0}, 0, -1), Shape{2, 2, 6, 5}, true},
           }) {
        INFO("axis " << c.params.axis << " num_axes " << c.params.num_axes << " -> "
                     << c.out.to_string());
        hn::ReshapeLayer layer("reshape", c.params);
        check_copy(layer, c.out, c.by_rows);
      }
    }
  }
}

// A fuzz finding (an ONNX model's Reshape): the product of the shape's dimensions overflowed
// (undefined behaviour, caught by UBSan) before any check could refuse it.
TEST_CASE("Reshape to a shape too large to address is an error, not an overflow",
          "[layer][reshape]") {
  hn::ReshapeLayer layer("big", reshape_params({35184506306560, 197568495620}, 0, -1));
  CHECK_THROWS_WITH(
      layer.setup({Shape{1, 4, 6, 6}}),
      Catch::Contains("big") && Catch::Contains("more elements than can be addressed"));
}

// y[i'] = x[i] where i' is i with its axes in `order` (a naive loop over every element).
std::vector<float> naive_permute(const Shape& in, const std::vector<int>& order,
                                 const std::vector<float>& x) {
  const std::vector<index_t> dims = in.dims();
  const std::size_t rank = dims.size();
  std::vector<index_t> out_dims(rank);
  for (std::size_t k = 0; k < rank; ++k)
    out_dims[k] = dims[static_cast<std::size_t>(order[k])];
  std::vector<float> y(x.size());
  std::vector<index_t> index(rank, 0);
  for (std::size_t e = 0; e < x.size(); ++e) {
    // index: e's position in the input; its place in the output.
    index_t rest = static_cast<index_t>(e);
    for (std::size_t a = rank; a-- > 0;) {
      index[a] = rest % dims[a];
      rest /= dims[a];
    }
    index_t at = 0;
    for (std::size_t k = 0; k < rank; ++k)
      at = at * out_dims[k] + index[static_cast<std::size_t>(order[k])];
    y[static_cast<std::size_t>(at)] = x[e];
  }
  return y;
}

TEST_CASE(
    "Permute reorders the axes as a naive loop does and routes gradients back on every "
    "driver",
    "[layer][permute]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    struct Case {
      std::vector<int> order;  // as given
      std::vector<int> full;   // completed
      Shape input;
    };
    const std::vector<Case> cases = {
        {{0, 2, 1, 3, 4}, {0, 2, 1, 3, 4}, Shape{3, 2, 5, 2, 3}},  // ShuffleNet's shuffle
        {{0, 2, 3, 1}, {0, 2, 3, 1}, Shape{3, 4, 2, 5}},           // NCHW -> NHWC (SSD)
        {{0, 3}, {0, 3, 1, 2}, Shape{3, 2, 3, 4}},                 // axes left out follow
        {{1, 0, 2}, {1, 0, 2}, Shape{3, 4, 2}},                    // the batch moves
        {{0, 1, 2}, {0, 1, 2}, Shape{3, 4, 2}},                    // nothing moves
    };
    std::uint32_t seed = 70;
    for (const Case& c : cases) {
      INFO("order of " << c.order.size() << " axes, input " << c.input.to_string());
      hn::PermuteLayer layer("permute", hn::PermuteParams{c.order});
      const std::vector<Shape> outs = layer.setup({c.input});
      std::vector<index_t> want;
      for (int axis : c.full)
        want.push_back(c.input[axis]);
      REQUIRE(outs == std::vector<Shape>{Shape(want)});
      CHECK(layer.splits_by_rows() == (c.full[0] == 0));
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
      const auto dy = random_floats(x.size(), seed++);
      // dx: dy moved back, the inverse permutation.
      std::vector<int> inverse(c.full.size());
      for (std::size_t k = 0; k < c.full.size(); ++k)
        inverse[static_cast<std::size_t>(c.full[k])] = static_cast<int>(k);
      const auto run = run_layer(layer, *driver, {c.input}, {x}, {dy});
      CHECK(run.outputs[0] == naive_permute(c.input, c.full, x));
      CHECK(run.input_diffs[0] == naive_permute(outs[0], inverse, dy));
      if (c.full[0] == 0) {
        hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 2, 3}}, 0.0);
      }
    }
    hn::PermuteLayer bad("perm7", hn::PermuteParams{{0, 0, 1}});
    CHECK_THROWS_WITH(bad.setup({Shape{2, 3, 4}}),
                      Contains("perm7") && Contains("not a permutation"));
  }
}

// The inputs joined along axis 1, then output channel k * group + j = joined channel
// j * K + k (K = C / group): a naive loop over every output element.
std::vector<float> naive_shuffle(const std::vector<Shape>& ins,
                                 const std::vector<std::vector<float>>& xs, index_t group) {
  const index_t images = ins[0][0], inner = ins[0].count(2, ins[0].axes());
  index_t channels = 0;
  for (const Shape& in : ins)
    channels += in[1];
  std::vector<float> joined;
  for (index_t n = 0; n < images; ++n)
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const index_t per_image = ins[i][1] * inner;
      joined.insert(joined.end(), xs[i].begin() + n * per_image,
                    xs[i].begin() + (n + 1) * per_image);
    }
  const index_t per_group = channels / group;
  std::vector<float> y(joined.size());
  for (index_t n = 0; n < images; ++n)
    for (index_t c = 0; c < channels; ++c)
      for (index_t e = 0; e < inner; ++e) {
        const index_t k = c / group, j = c % group;
        y[static_cast<std::size_t>((n * channels + c) * inner + e)] =
            joined[static_cast<std::size_t>((n * channels + j * per_group + k) * inner + e)];
      }
  return y;
}

// The channels of `y` (images x channels x inner) cut at `points` (none: in `parts` equal
// pieces): each piece's values, image by image (a naive loop).
std::vector<std::vector<float>> naive_cut(const std::vector<float>& y, index_t images,
                                          index_t channels, std::vector<index_t> points,
                                          index_t parts) {
  const index_t inner = static_cast<index_t>(y.size()) / (images * channels);
  if (points.empty())
    for (index_t p = 1; p < parts; ++p)
      points.push_back(p * channels / parts);
  points.insert(points.begin(), 0);
  points.push_back(channels);
  std::vector<std::vector<float>> pieces;
  for (std::size_t p = 0; p + 1 < points.size(); ++p) {
    std::vector<float> piece;
    for (index_t n = 0; n < images; ++n)
      for (index_t c = points[p]; c < points[p + 1]; ++c)
        for (index_t e = 0; e < inner; ++e)
          piece.push_back(y[static_cast<std::size_t>((n * channels + c) * inner + e)]);
    pieces.push_back(piece);
  }
  return pieces;
}

TEST_CASE(
    "ShuffleChannel joins, shuffles and cuts the channels as a naive loop does and routes "
    "gradients back on every driver",
    "[layer][shuffle_channel]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    struct Case {
      std::vector<Shape> inputs;
      int group;
      std::vector<index_t> points;  // slice points of the outputs
      int outputs;                  // 0: one per point and one more
    };
    const std::vector<Case> cases = {
        {{Shape{3, 6, 2, 5}}, 2, {}, 0},                     // one input (ShuffleNet v1's)
        {{Shape{3, 6, 2, 5}}, 3, {}, 0},                     //
        {{Shape{3, 4, 3, 2}, Shape{3, 4, 3, 2}}, 2, {}, 0},  // a ShuffleNet v2 unit's shuffle
        {{Shape{2, 2, 5}, Shape{2, 4, 5}}, 3, {}, 0},        // inputs across the groups
        {{Shape{2, 3, 4}, Shape{2, 1, 4}, Shape{2, 2, 4}}, 2, {}, 0},
        {{Shape{4, 6}}, 2, {}, 0},  // two axes
        // cut: a ShuffleNet v2 unit's shuffle and the next one's chunk in two
        {{Shape{3, 6, 2, 3}, Shape{3, 6, 2, 3}}, 2, {}, 2},
        {{Shape{3, 5, 2, 3}, Shape{3, 5, 2, 3}}, 2, {}, 2},  // odd halves
        {{Shape{2, 2, 5}, Shape{2, 4, 5}}, 3, {1, 4}, 0},    // uneven pieces across groups
        {{Shape{2, 7, 3}}, 7, {3}, 0},                       // one input, pieces of 3 and 4
    };
    std::uint32_t seed = 120;
    for (const Case& c : cases) {
      INFO(c.inputs.size() << " inputs, the first " << c.inputs[0].to_string() << ", group "
                           << c.group << ", " << c.points.size() << " slice points, " << c.outputs
                           << " outputs");
      hn::ShuffleChannelLayer layer("shuffle", hn::ShuffleChannelParams{c.group, c.points},
                                    c.outputs);
      const std::vector<Shape> outs = layer.setup(c.inputs);
      const index_t images = c.inputs[0][0];
      index_t channels = 0;
      for (const Shape& in : c.inputs)
        channels += in[1];
      const index_t parts = c.outputs > 0 ? c.outputs : static_cast<index_t>(c.points.size()) + 1;
      REQUIRE(static_cast<index_t>(outs.size()) == parts);
      std::vector<std::vector<float>> xs;
      for (const Shape& in : c.inputs)
        xs.push_back(random_floats(static_cast<std::size_t>(in.count()), seed++));
      std::vector<std::vector<float>> dys;
      std::vector<float> dy_whole;  // the outputs' gradients joined back, image by image
      for (const Shape& out : outs)
        dys.push_back(random_floats(static_cast<std::size_t>(out.count()), seed++));
      for (index_t n = 0; n < images; ++n)
        for (std::size_t o = 0; o < outs.size(); ++o) {
          const index_t per_image = outs[o].count() / images;
          dy_whole.insert(dy_whole.end(), dys[o].begin() + n * per_image,
                          dys[o].begin() + (n + 1) * per_image);
        }
      const std::vector<std::vector<float>> want =
          naive_cut(naive_shuffle(c.inputs, xs, c.group), images, channels, c.points, parts);
      for (std::size_t o = 0; o < outs.size(); ++o) {
        std::vector<index_t> dims = c.inputs[0].dims();
        dims[1] = static_cast<index_t>(want[o].size()) / (outs[o].count() / outs[o][1]);
        CHECK(outs[o] == Shape(dims));
      }
      const auto run = run_layer(layer, *driver, c.inputs, xs, dys);
      CHECK(run.outputs == want);
      // dx: dy's channels back where they came from, checked by shuffling the gradients
      // forward again.
      CHECK(naive_shuffle(c.inputs, run.input_diffs, c.group) == dy_whole);
      hn::test::check_split_equals_whole(layer, *driver, c.inputs, xs,
                                         RunSpec{{0, 1, c.inputs[0][0]}}, 0.0);
    }
  }
}

// x (of `in`) padded: out[i] = x[i - before] inside, `value` elsewhere (a naive loop over
// every output element); with `mode` reflect or edge, each index outside mapped inside on
// its own (mirrored about the edge, or clamped to it), as numpy.pad's reflect and edge.
std::vector<float> naive_pad(const Shape& in, const std::vector<index_t>& before,
                             const std::vector<index_t>& after, float value,
                             const std::vector<float>& x,
                             hn::PadMode mode = hn::PadMode::constant) {
  const std::size_t rank = static_cast<std::size_t>(in.axes());
  std::vector<index_t> out(rank);
  index_t total = 1;
  for (std::size_t a = 0; a < rank; ++a) {
    out[a] = in[static_cast<int>(a)] + before[a] + after[a];
    total *= out[a];
  }
  std::vector<float> y(static_cast<std::size_t>(total), value);
  for (index_t e = 0; e < total; ++e) {
    index_t rest = e, from = 0, stride = 1;
    bool inside = true;
    for (std::size_t a = rank; a-- > 0;) {
      index_t i = rest % out[a] - before[a];
      rest /= out[a];
      const index_t n = in[static_cast<int>(a)];
      if (mode == hn::PadMode::reflect) i = i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
      if (mode == hn::PadMode::edge) i = std::clamp<index_t>(i, 0, n - 1);
      inside = inside && i >= 0 && i < n;
      from += i * stride;
      stride *= in[static_cast<int>(a)];
    }
    if (inside) y[static_cast<std::size_t>(e)] = x[static_cast<std::size_t>(from)];
  }
  return y;
}

// A Pad layer's parameters, the counts they give per axis of the input, and the input.
struct PadCase {
  hn::PadParams params;
  std::vector<index_t> before, after;
  Shape input;
};

// For every output element of the naive pad of `c`, the input element it copies (-1: the
// constant).
std::vector<float> pad_sources(const PadCase& c, hn::PadMode mode) {
  std::vector<float> index(static_cast<std::size_t>(c.input.count()));
  for (std::size_t e = 0; e < index.size(); ++e)
    index[e] = static_cast<float>(e);
  return naive_pad(c.input, c.before, c.after, -1.0f, index, mode);
}

TEST_CASE(
    "Pad fills around the input as a naive loop does and takes back the interior's "
    "gradients on every driver",
    "[layer][pad]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const std::vector<PadCase> cases = {
        {{2, {1, 0}, {0, 1}, 0.0f}, {0, 0, 1, 0}, {0, 0, 0, 1}, Shape{3, 2, 4, 5}},  // SAME
        {{2, {2}, {}, -1.5f}, {0, 0, 2, 2}, {0, 0, 2, 2}, Shape{3, 2, 3, 3}},        // one for all
        {{1, {1, 0, 0}, {2, 0, 0}, 0.0f}, {0, 1, 0, 0}, {0, 2, 0, 0}, Shape{3, 2, 2, 3}},  // C
        {{-1, {3}, {1}, 7.0f}, {0, 0, 3}, {0, 0, 1}, Shape{3, 4, 2}},  // the last axis
        {{1, {0}, {}, 0.0f}, {0, 0}, {0, 0}, Shape{3, 5}},             // nothing
    };
    std::uint32_t seed = 170;
    for (const PadCase& c : cases) {
      INFO("input " << c.input.to_string() << ", axis " << c.params.axis);
      hn::PadLayer layer("pad", c.params);
      const std::vector<Shape> outs = layer.setup({c.input});
      std::vector<index_t> want;
      for (int a = 0; a < c.input.axes(); ++a)
        want.push_back(c.input[a] + c.before[static_cast<std::size_t>(a)] +
                       c.after[static_cast<std::size_t>(a)]);
      REQUIRE(outs == std::vector<Shape>{Shape(want)});
      const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
      const auto dy = random_floats(static_cast<std::size_t>(outs[0].count()), seed++);
      const auto run = run_layer(layer, *driver, {c.input}, {x}, {dy});
      CHECK(run.outputs[0] == naive_pad(c.input, c.before, c.after, c.params.value, x));
      // dx[i] = dy[i + before]: the naive pad's inverse, read through an index map.
      const auto where = pad_sources(c, hn::PadMode::constant);
      std::vector<float> want_dx(x.size());
      for (std::size_t e = 0; e < where.size(); ++e)
        if (where[e] >= 0.0f) want_dx[static_cast<std::size_t>(where[e])] = dy[e];
      CHECK(run.input_diffs[0] == want_dx);
      hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 2, 3}}, 0.0);
    }
  }
}

TEST_CASE(
    "Pad in reflect and edge modes mirrors or repeats the edges as a naive loop does, corners "
    "too, and adds each border's gradient to the element it copied, on every driver",
    "[layer][pad]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 270;
    for (const hn::PadMode mode : {hn::PadMode::reflect, hn::PadMode::edge}) {
      const std::vector<PadCase> cases = {
          // H and W, unequal sides: the corners come from both passes.
          {{2, {2, 1}, {1, 3}, 0.0f, mode}, {0, 0, 2, 1}, {0, 0, 1, 3}, Shape{3, 3, 4, 5}},
          // C, H and W, one count for all (reflect: below every length).
          {{1, {1}, {}, 0.0f, mode}, {0, 1, 1, 1}, {0, 1, 1, 1}, Shape{3, 2, 3, 2}},
          // The last axis only.
          {{-1, {3}, {2}, 0.0f, mode}, {0, 0, 3}, {0, 0, 2}, Shape{3, 3, 4}},
      };
      for (const PadCase& c : cases) {
        INFO((mode == hn::PadMode::reflect ? "reflect" : "edge")
             << ", input " << c.input.to_string() << ", axis " << c.params.axis);
        hn::PadLayer layer("pad", c.params);
        const std::vector<Shape> outs = layer.setup({c.input});
        const auto x = random_floats(static_cast<std::size_t>(c.input.count()), seed++);
        const auto dy = random_floats(static_cast<std::size_t>(outs[0].count()), seed++);
        const auto run = run_layer(layer, *driver, {c.input}, {x}, {dy});
        CHECK(run.outputs[0] == naive_pad(c.input, c.before, c.after, 0.0f, x, mode));
        // dx[i]: the sum of dy over every output element that copied x[i], in the order the
        // layer adds them (the interior's, then each axis's borders from the first axis),
        // within a float rounding of a naive sum through the index map.
        const auto where = pad_sources(c, mode);
        std::vector<double> want_dx(x.size(), 0.0);
        for (std::size_t e = 0; e < where.size(); ++e)
          want_dx[static_cast<std::size_t>(where[e])] += dy[e];
        REQUIRE(run.input_diffs[0].size() == want_dx.size());
        for (std::size_t e = 0; e < want_dx.size(); ++e)
          CHECK(run.input_diffs[0][e] == Approx(want_dx[e]).margin(1e-5));
        hn::test::check_split_equals_whole(layer, *driver, {c.input}, {x}, RunSpec{{0, 2, 3}}, 0.0);
      }
    }
    hn::PadLayer wide("pad6", {2, {3}, {}, 0.0f, hn::PadMode::reflect});
    CHECK_THROWS_WITH(wide.setup({Shape{2, 3, 3}}),
                      Contains("pad6") && Contains("reflect") && Contains("2x3x3"));
  }
}

TEST_CASE("Pad setup errors name the layer, the field and the shape", "[layer][pad]") {
  hn::PadLayer batch("pad1", {0, {1}, {}, 0.0f});
  CHECK_THROWS_WITH(batch.setup({Shape{2, 3, 4}}), Contains("pad1") && Contains("batch axis"));
  hn::PadLayer counts("pad2", {1, {1, 2, 3}, {}, 0.0f});
  CHECK_THROWS_WITH(counts.setup({Shape{2, 3, 4}}),
                    Contains("pad2") && Contains("pad_before has 3 counts") && Contains("2x3x4"));
  hn::PadLayer after("pad3", {1, {1}, {1, 2, 3}, 0.0f});
  CHECK_THROWS_WITH(after.setup({Shape{2, 3, 4}}), Contains("pad3") && Contains("pad_after"));
  hn::PadLayer none("pad4", {2, {}, {}, 0.0f});
  CHECK_THROWS_WITH(none.setup({Shape{2, 3, 4}}), Contains("pad4") && Contains("pad_before"));
  hn::PadLayer negative("pad5", {2, {-1}, {}, 0.0f});
  CHECK_THROWS_WITH(negative.setup({Shape{2, 3, 4}}), Contains("pad5") && Contains("negative"));
}

TEST_CASE("Silence takes its inputs and zeroes their gradients on every driver",
          "[layer][silence]") {
  const auto config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    hn::SilenceLayer layer("silence");
    const Shape a{3, 2, 2}, b{5, 3};
    CHECK(layer.setup({a, b}).empty());
    // The gradients start as anything (7 here) and end as zeros, in one whole call (the
    // inputs' batches may differ).
    CHECK_FALSE(layer.splits_by_rows());
    hn::Tensor ta(a), tb(b);
    for (hn::Tensor* t : {&ta, &tb})
      std::fill(t->host_diff_mut(), t->host_diff_mut() + t->count(), 7.0f);
    hn::run_forward(layer, *driver, {&ta, &tb}, {});
    hn::run_backward(layer, *driver, {&ta, &tb}, {});
    CHECK(std::vector<float>(ta.host_diff(), ta.host_diff() + 12) == std::vector<float>(12, 0.0f));
    CHECK(std::vector<float>(tb.host_diff(), tb.host_diff() + 15) == std::vector<float>(15, 0.0f));
  }
}

TEST_CASE(
    "Concat, Slice, Split, Flatten, Reshape, Permute, Pad and ShuffleChannel gradients match "
    "finite differences",
    "[layer][concat][slice][split][flatten][reshape][permute][pad][shuffle_channel][gradient]") {
  const auto config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const Shape a{2, 2, 3}, b{2, 1, 3};
    const auto xa = random_floats(12, 90), xb = random_floats(6, 91);
    hn::ConcatLayer concat("concat");
    hn::test::check_layer_gradients(concat, *driver, {a, b}, {xa, xb});
    hn::ConcatLayer concat0("concat0", {0, -1});
    hn::test::check_layer_gradients(concat0, *driver, {a, Shape{1, 2, 3}},
                                    {xa, random_floats(6, 92)});
    hn::SliceLayer slice("slice", slice_params(2, -1, {1}));
    hn::test::check_layer_gradients(slice, *driver, {a}, {xa});
    hn::SplitLayer split("split", 3);
    hn::test::check_layer_gradients(split, *driver, {a}, {xa});
    hn::FlattenLayer flatten("flat");
    hn::test::check_layer_gradients(flatten, *driver, {a}, {xa});
    hn::ReshapeLayer reshape("reshape", reshape_params({3, -1}, 0, -1));
    hn::test::check_layer_gradients(reshape, *driver, {a}, {xa});
    hn::PermuteLayer permute("permute", hn::PermuteParams{{0, 2, 1}});
    hn::test::check_layer_gradients(permute, *driver, {a}, {xa});
    hn::PadLayer pad("pad", hn::PadParams{1, {1, 0}, {0, 2}, 0.5f});
    hn::test::check_layer_gradients(pad, *driver, {a}, {xa});
    hn::PadLayer reflect("reflect", hn::PadParams{1, {1, 2}, {1, 1}, 0.0f, hn::PadMode::reflect});
    hn::test::check_layer_gradients(reflect, *driver, {a}, {xa});
    hn::PadLayer edge("edge", hn::PadParams{1, {0, 2}, {1, 3}, 0.0f, hn::PadMode::edge});
    hn::test::check_layer_gradients(edge, *driver, {a}, {xa});
    hn::ShuffleChannelLayer shuffle("shuffle", hn::ShuffleChannelParams{3, {}});
    hn::test::check_layer_gradients(shuffle, *driver, {a, b}, {xa, xb});
    hn::ShuffleChannelLayer cut("cut", hn::ShuffleChannelParams{3, {2}});
    hn::test::check_layer_gradients(cut, *driver, {a, b}, {xa, xb});
  }
}

TEST_CASE("Shape layer setup errors name the layer and the shapes",
          "[layer][concat][slice][flatten][reshape]") {
  SECTION("Concat with mismatched shapes") {
    hn::ConcatLayer layer("concat1");
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}, Shape{2, 5, 3}}),
                      Contains("concat1") && Contains("2x3x4") && Contains("2x5x3"));
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}, Shape{2, 3}}),
                      Contains("concat1") && Contains("2x3x4") && Contains("2x3"));
  }
  SECTION("Concat with axis and concat_dim, or an axis out of range") {
    hn::ConcatLayer both("concat2", {2, 0});
    CHECK_THROWS_WITH(both.setup({Shape{2, 3, 4}}), Contains("concat2") && Contains("concat_dim"));
    hn::ConcatLayer far("concat3", {3, -1});
    CHECK_THROWS_WITH(far.setup({Shape{2, 3, 4}}), Contains("concat3") && Contains("2x3x4"));
  }
  SECTION("Slice points out of range or out of order") {
    hn::SliceLayer beyond("slice1", slice_params(1, -1, {2, 6}));
    CHECK_THROWS_WITH(beyond.setup({Shape{2, 6, 3}}),
                      Contains("slice1") && Contains("6") && Contains("2x6x3"));
    hn::SliceLayer zero("slice2", slice_params(1, -1, {0}));
    CHECK_THROWS_WITH(zero.setup({Shape{2, 6, 3}}), Contains("slice2") && Contains("2x6x3"));
    hn::SliceLayer unordered("slice3", slice_params(1, -1, {4, 2}));
    CHECK_THROWS_WITH(unordered.setup({Shape{2, 6, 3}}), Contains("slice3") && Contains("2x6x3"));
    hn::SliceLayer counted("slice4", slice_params(1, -1, {2}), 3);
    CHECK_THROWS_WITH(counted.setup({Shape{2, 6, 3}}),
                      Contains("slice4") && Contains("3 outputs") && Contains("2x6x3"));
    hn::SliceLayer uneven("slice5", slice_params(1, -1, {}), 4);
    CHECK_THROWS_WITH(uneven.setup({Shape{2, 6, 3}}),
                      Contains("slice5") && Contains("evenly") && Contains("2x6x3"));
  }
  SECTION(
      "ShuffleChannel with a group that does not divide the channels, inputs apart, or a cut "
      "that does not fit") {
    hn::ShuffleChannelLayer layer("shuffle1", hn::ShuffleChannelParams{4, {}});
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}, Shape{2, 3, 4}}),
                      Contains("shuffle1") && Contains("group 4") && Contains("6 channels"));
    hn::ShuffleChannelLayer apart("shuffle2", hn::ShuffleChannelParams{2, {}});
    CHECK_THROWS_WITH(apart.setup({Shape{2, 3, 4}, Shape{2, 3, 5}}),
                      Contains("shuffle2") && Contains("2x3x4") && Contains("2x3x5"));
    hn::ShuffleChannelLayer beyond("shuffle3", hn::ShuffleChannelParams{2, {2, 6}});
    CHECK_THROWS_WITH(beyond.setup({Shape{2, 3, 4}, Shape{2, 3, 4}}),
                      Contains("shuffle3") && Contains("(0, 6)") && Contains("2x3x4"));
    hn::ShuffleChannelLayer counted("shuffle4", hn::ShuffleChannelParams{2, {2}}, 3);
    CHECK_THROWS_WITH(counted.setup({Shape{2, 6, 4}}),
                      Contains("shuffle4") && Contains("3 outputs"));
    hn::ShuffleChannelLayer uneven("shuffle5", hn::ShuffleChannelParams{2, {}}, 4);
    CHECK_THROWS_WITH(uneven.setup({Shape{2, 6, 4}}),
                      Contains("shuffle5") && Contains("evenly") && Contains("2x6x4"));
  }
  SECTION("Flatten with axis after end_axis + 1") {
    // {2, 1} is Caffe's count(2, 2): an axis of 1 inserted.
    hn::FlattenLayer layer("flat1", {2, 0});
    CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}}), Contains("flat1") && Contains("2x3x4"));
  }
  SECTION("Reshape with two -1, an impossible count, or a 0 beyond the input") {
    const Shape in{2, 3, 4};
    hn::ReshapeLayer two("reshape1", reshape_params({-1, -1}, 0, -1));
    CHECK_THROWS_WITH(two.setup({in}),
                      Contains("reshape1") && Contains("more than one -1") && Contains("2x3x4"));
    hn::ReshapeLayer indivisible("reshape2", reshape_params({5, -1}, 0, -1));
    CHECK_THROWS_WITH(indivisible.setup({in}),
                      Contains("reshape2") && Contains("[5, -1]") && Contains("2x3x4"));
    hn::ReshapeLayer wrong_count("reshape3", reshape_params({5, 5}, 0, -1));
    CHECK_THROWS_WITH(wrong_count.setup({in}),
                      Contains("reshape3") && Contains("5x5") && Contains("2x3x4"));
    hn::ReshapeLayer copy_missing("reshape4", reshape_params({0, 0, 0, 0}, 0, -1));
    CHECK_THROWS_WITH(copy_missing.setup({in}), Contains("reshape4") && Contains("2x3x4"));
    hn::ReshapeLayer bad_axis("reshape5", reshape_params({-1}, 4, -1));
    CHECK_THROWS_WITH(bad_axis.setup({in}), Contains("reshape5") && Contains("2x3x4"));
  }
}
