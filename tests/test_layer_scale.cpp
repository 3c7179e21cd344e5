// Scale on every driver against a naive broadcast written here: learned scale (1 to all
// axes, or a scalar) or scale as a second input, with and without bias; accumulated
// parameter gradients, splits, finite-difference gradient checks and shape errors.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/scale_layer.h"
#include "tests/layer_runs.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Shape;
using hn::test::DriverConfig;
using hn::test::HostValues;
using hn::test::max_rel_diff;
using hn::test::random_floats;

constexpr double kTolerance = 1e-5;

struct ScaleCase {
  std::string label;
  Shape x;
  std::vector<Shape> extra_inputs;  // the scale, when it is an input
  hn::ScaleParams params;
  // The input viewed as [outer][scale][inner] (written out by hand per case).
  index_t outer, scale, inner;
};

hn::ScaleParams make_params(int axis, int num_axes, bool bias) {
  hn::ScaleParams p;
  p.axis = axis;
  p.num_axes = num_axes;
  p.bias_term = bias;
  return p;
}

const std::vector<ScaleCase>& cases() {
  static const std::vector<ScaleCase> c = {
      {"2x3x4x5, per channel, bias", Shape{2, 3, 4, 5}, {}, make_params(1, 1, true), 2, 3, 20},
      {"2x3x4x5, scale 3x4", Shape{2, 3, 4, 5}, {}, make_params(1, 2, false), 2, 12, 5},
      {"2x3x4x5, scalar, bias", Shape{2, 3, 4, 5}, {}, make_params(1, 0, true), 1, 1, 120},
      {"2x3x4x5, axis 2 to the end", Shape{2, 3, 4, 5}, {}, make_params(2, -1, false), 6, 20, 1},
      {"2x3x4x5, axis -1", Shape{2, 3, 4, 5}, {}, make_params(-1, 1, true), 24, 5, 1},
      {"input scale 3 on 2x3x4, bias",
       Shape{2, 3, 4},
       {Shape{3}},
       make_params(1, 1, true),
       2,
       3,
       4},
      {"input scale 2x3 on 2x3x4 at axis 0",
       Shape{2, 3, 4},
       {Shape{2, 3}},
       make_params(0, 1, false),
       1,
       6,
       4},
      {"input scalar scale on 2x3", Shape{2, 3}, {Shape{}}, make_params(1, 1, false), 1, 1, 6},
  };
  return c;
}

struct Reference {
  std::vector<float> y, dx, dscale, dbias;
};

Reference naive_scale(const ScaleCase& c, const std::vector<float>& x,
                      const std::vector<float>& scale, const std::vector<float>& bias,
                      const std::vector<float>& dy) {
  Reference r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  std::vector<double> ds(static_cast<std::size_t>(c.scale), 0.0), db(ds);
  for (index_t o = 0; o < c.outer; ++o) {
    for (index_t d = 0; d < c.scale; ++d) {
      for (index_t i = 0; i < c.inner; ++i) {
        const std::size_t k = static_cast<std::size_t>((o * c.scale + d) * c.inner + i);
        const std::size_t dd = static_cast<std::size_t>(d);
        r.y[k] = x[k] * scale[dd] + (bias.empty() ? 0.0f : bias[dd]);
        r.dx[k] = dy[k] * scale[dd];
        ds[dd] += static_cast<double>(dy[k]) * x[k];
        db[dd] += dy[k];
      }
    }
  }
  r.dscale.assign(ds.begin(), ds.end());
  r.dbias.assign(db.begin(), db.end());
  return r;
}

TEST_CASE("Scale forward and backward match a naive broadcast multiply", "[layer][scale]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 200;
    for (const ScaleCase& c : cases()) {
      INFO(c.label);
      const bool scale_input = !c.extra_inputs.empty();
      const std::size_t count = static_cast<std::size_t>(c.x.count());
      const std::size_t scale_count = static_cast<std::size_t>(c.scale);
      const std::vector<float> x = random_floats(count, ++seed);
      const std::vector<float> dy = random_floats(count, ++seed);
      const std::vector<float> scale = random_floats(scale_count, ++seed, -2.0f, 2.0f);
      const std::vector<float> bias =
          c.params.bias_term ? random_floats(scale_count, ++seed) : std::vector<float>{};
      hn::ScaleLayer layer("scale", c.params);
      std::vector<Shape> shapes{c.x};
      HostValues inputs{x};
      if (scale_input) {
        shapes.push_back(c.extra_inputs[0]);
        inputs.push_back(scale);
      }
      REQUIRE(layer.setup(shapes) == std::vector<Shape>{c.x});
      REQUIRE(layer.params().size() == (scale_input ? 0u : 1u) + (c.params.bias_term ? 1u : 0u));
      // Fresh parameters hold Caffe's default fillers: scale 1, bias 0.
      if (!scale_input) {
        CHECK(hn::test::values(layer.params()[0]) == std::vector<float>(scale_count, 1.0f));
        hn::test::set_values(layer.params()[0], scale);
      }
      if (c.params.bias_term) {
        CHECK(hn::test::values(layer.params().back()) == std::vector<float>(scale_count, 0.0f));
        hn::test::set_values(layer.params().back(), bias);
        // Parameter gradients accumulate onto what is there (Caffe's +=).
        std::fill(layer.params().back().host_diff_mut(),
                  layer.params().back().host_diff_mut() + scale_count, 1.0f);
      }
      const Reference ref = naive_scale(c, x, scale, bias, dy);
      const hn::test::LayerRun run = hn::test::run_layer(layer, *driver, shapes, inputs, {dy});
      CHECK(max_rel_diff(run.outputs[0], ref.y) <= kTolerance);
      CHECK(max_rel_diff(run.input_diffs[0], ref.dx) <= kTolerance);
      if (scale_input) {
        CHECK(max_rel_diff(run.input_diffs[1], ref.dscale) <= 1e-4);
      } else {
        CHECK(max_rel_diff(hn::test::diffs(layer.params()[0]), ref.dscale) <= 1e-4);
      }
      if (c.params.bias_term) {
        std::vector<float> want = ref.dbias;
        for (float& w : want)
          w += 1.0f;
        CHECK(max_rel_diff(hn::test::diffs(layer.params().back()), want) <= 1e-4);
      }
    }
  }
}

TEST_CASE("Scale splits by rows exactly where its rows are independent", "[layer][scale]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    hn::test::RunSpec spec;
    spec.cuts = {0, 1, 3, 4};
    SECTION("a learned per-channel scale with bias") {
      hn::ScaleLayer layer("scale", make_params(1, 1, true));
      layer.setup({Shape{4, 3, 2}});
      CHECK(layer.splits_by_rows());
      hn::test::set_values(layer.params()[0], {0.5f, -2.0f, 3.0f});
      hn::test::check_split_equals_whole(layer, *driver, {Shape{4, 3, 2}}, {random_floats(24, 300)},
                                         spec);
    }
    SECTION("a scale input with its own rows (axis 0)") {
      hn::ScaleLayer layer("scale", make_params(0, 1, false));
      layer.setup({Shape{4, 3, 2}, Shape{4, 3}});
      CHECK(layer.splits_by_rows());
      hn::test::check_split_equals_whole(layer, *driver, {Shape{4, 3, 2}, Shape{4, 3}},
                                         {random_floats(24, 301), random_floats(12, 302)}, spec);
    }
  }
  SECTION("and not where a slice would need the whole batch") {
    hn::ScaleLayer input_scale("scale");
    input_scale.setup({Shape{4, 3, 2}, Shape{3}});
    CHECK_FALSE(input_scale.splits_by_rows());  // the scale's gradient sums over the batch
    hn::ScaleLayer batch_param("scale", make_params(0, 2, false));
    batch_param.setup({Shape{4, 3, 2}});
    CHECK_FALSE(batch_param.splits_by_rows());  // the parameter spans the batch axis
  }
}

TEST_CASE("Scale gradients match finite differences", "[layer][scale]") {
  const DriverConfig config = GENERATE(from_range(hn::test::gradient_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 400;
    for (const ScaleCase& c : cases()) {
      INFO(c.label);
      hn::ScaleLayer layer("scale", c.params);
      std::vector<Shape> shapes{c.x};
      HostValues inputs{random_floats(static_cast<std::size_t>(c.x.count()), ++seed)};
      for (const Shape& s : c.extra_inputs) {
        shapes.push_back(s);
        inputs.push_back(random_floats(static_cast<std::size_t>(s.count()), ++seed));
      }
      layer.setup(shapes);
      for (hn::Tensor& p : layer.params())
        hn::test::set_values(p, random_floats(static_cast<std::size_t>(p.count()), ++seed));
      hn::test::check_layer_gradients(layer, *driver, shapes, inputs);
    }
  }
}

TEST_CASE("Scale rejects a scale that does not fit its input", "[layer][scale]") {
  hn::ScaleLayer layer("scale");
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3, 4}, Shape{4}}),
                    Contains("layer 'scale' (Scale)") && Contains("scale 4") && Contains("2x3x4") &&
                        Contains("axis 1"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3}, Shape{3, 2}}),
                    Contains("layer 'scale' (Scale)") && Contains("3x2") && Contains("2x3"));
  hn::ScaleLayer wide("scale", make_params(1, 3, false));
  CHECK_THROWS_WITH(wide.setup({Shape{2, 3}}), Contains("layer 'scale' (Scale)") &&
                                                   Contains("extends past") && Contains("2x3"));
  hn::ScaleLayer far("scale", make_params(4, 1, false));
  CHECK_THROWS_WITH(far.setup({Shape{2, 3}}),
                    Contains("layer 'scale' (Scale)") && Contains("axis 4"));
  CHECK_THROWS_WITH(layer.setup({Shape{2, 3}, Shape{3}, Shape{3}}),
                    Contains("layer 'scale' (Scale)"));
}

}  // namespace

TEST_CASE("Scale in place equals Scale on separate tensors, gradients included", "[layer][scale]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const Shape shape{3, 4, 5, 2};
    const std::size_t count = static_cast<std::size_t>(shape.count());
    const std::vector<float> x = random_floats(count, 301);
    const std::vector<float> dy = random_floats(count, 302);
    const std::vector<float> scale = random_floats(4, 303, -2.0f, 2.0f);
    const std::vector<float> bias = random_floats(4, 304);
    auto make = [&](bool in_place) {
      auto layer = std::make_unique<hn::ScaleLayer>("scale", make_params(1, 1, true));
      if (in_place) layer->set_in_place({true});
      layer->setup({shape});
      hn::test::set_values(layer->params()[0], scale);
      hn::test::set_values(layer->params()[1], bias);
      return layer;
    };
    // Apart: y = scale(x); then dx and the parameter gradients from dy.
    auto apart = make(false);
    hn::Tensor in(shape), out(shape);
    hn::test::set_values(in, x);
    hn::run_forward(*apart, *driver, {&in}, {&out});
    std::copy(dy.begin(), dy.end(), out.host_diff_mut());
    hn::run_backward(*apart, *driver, {&in}, {&out});
    // In place: one tensor is input and output, values and gradients.
    auto together = make(true);
    hn::Tensor both(shape);
    hn::test::set_values(both, x);
    hn::run_forward(*together, *driver, {&both}, {&both});
    CHECK(max_rel_diff(hn::test::values(out), hn::test::values(both)) <= kTolerance);
    std::copy(dy.begin(), dy.end(), both.host_diff_mut());
    hn::run_backward(*together, *driver, {&both}, {&both});
    const std::vector<float> dx(in.host_diff(), in.host_diff() + count);
    CHECK(max_rel_diff(dx, std::vector<float>(both.host_diff(), both.host_diff() + count)) <=
          kTolerance);
    for (std::size_t p = 0; p < 2; ++p) {
      INFO("parameter " << p);
      hn::Tensor& a = apart->params()[p];
      hn::Tensor& b = together->params()[p];
      CHECK(max_rel_diff(std::vector<float>(a.host_diff(), a.host_diff() + a.count()),
                         std::vector<float>(b.host_diff(), b.host_diff() + b.count())) <=
            kTolerance);
    }
  }
}

TEST_CASE("Scale run in place without being told so is an error naming the remedy",
          "[layer][scale]") {
  auto driver = hn::make_driver(hn::Device::parse("reference"));
  hn::ScaleLayer layer("scale", make_params(1, 1, false));
  const Shape shape{2, 3, 4};
  layer.setup({shape});
  hn::Tensor both(shape);
  CHECK_THROWS_WITH(hn::run_forward(layer, *driver, {&both}, {&both}),
                    Contains("layer 'scale' (Scale)") && Contains("set_in_place"));
}
