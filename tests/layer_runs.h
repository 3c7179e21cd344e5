// Layer test support on host vectors: run a layer forward (and backward) on one driver,
// whole or as consecutive row slices, and check that a split run equals the whole-batch run.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/layers/layer.h"
#include "tests/layer_support.h"
#include "tests/support.h"

namespace hn::test {

using HostValues = std::vector<std::vector<float>>;

struct LayerRun {
  HostValues outputs;      // forward values, one vector per output
  HostValues input_diffs;  // backward's input gradients (when output diffs were given)
};

struct RunSpec {
  // Row boundaries of the calls: {0, 2, N} runs rows [0, 2) then [2, N). Empty: {0, N}.
  std::vector<index_t> cuts;
  Phase phase = Phase::train;
  std::uint64_t seed = 1;
};

// Sets `layer` up for the inputs' shapes, fills the inputs, and runs forward on `driver`
// once per row range of spec.cuts; then, when `output_diffs` is not empty, fills the output
// diffs and runs backward over the same ranges (every input the layer propagates to). The
// layer must have been created after `driver` (its state tensors use the driver's memory).
inline LayerRun run_layer(Layer& layer, Driver& driver, const std::vector<Shape>& shapes,
                          const HostValues& inputs, const HostValues& output_diffs = {},
                          const RunSpec& spec = {}) {
  REQUIRE(shapes.size() == inputs.size());
  const std::vector<Shape> out_shapes = layer.setup(shapes);
  std::deque<Tensor> in_tensors, out_tensors;  // deque: stable addresses
  std::vector<Tensor*> in_ptrs, out_ptrs;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    in_tensors.emplace_back(shapes[i]);
    set_values(in_tensors.back(), inputs[i]);
    in_ptrs.push_back(&in_tensors.back());
  }
  for (const Shape& shape : out_shapes) {
    out_tensors.emplace_back(shape);
    out_ptrs.push_back(&out_tensors.back());
  }
  const index_t batch = !shapes.empty() && shapes[0].axes() > 0 ? shapes[0][0] : 1;
  std::vector<index_t> cuts = spec.cuts.empty() ? std::vector<index_t>{0, batch} : spec.cuts;
  RunOptions options;
  options.phase = spec.phase;
  options.seed = spec.seed;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    options.begin = cuts[c];
    options.end = cuts[c + 1];
    run_forward(layer, driver, in_ptrs, out_ptrs, options);
  }
  LayerRun run;
  for (Tensor* out : out_ptrs)
    run.outputs.push_back(values(*out));
  if (output_diffs.empty()) return run;
  REQUIRE(output_diffs.size() == out_ptrs.size());
  for (std::size_t o = 0; o < out_ptrs.size(); ++o) {
    REQUIRE(static_cast<index_t>(output_diffs[o].size()) == out_ptrs[o]->count());
    std::copy(output_diffs[o].begin(), output_diffs[o].end(), out_ptrs[o]->host_diff_mut());
  }
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    options.begin = cuts[c];
    options.end = cuts[c + 1];
    run_backward(layer, driver, in_ptrs, out_ptrs, {}, options);
  }
  for (std::size_t i = 0; i < in_ptrs.size(); ++i) {
    run.input_diffs.push_back(layer.can_propagate_down(static_cast<int>(i)) ? diffs(*in_ptrs[i])
                                                                            : std::vector<float>{});
  }
  return run;
}

// A one-input layer with parameters (Convolution, InnerProduct): its output, input gradient
// and parameter gradients.
struct ParamLayerRun {
  std::vector<float> y, dx;
  HostValues param_diffs;  // one per parameter
};

// Sets `layer` up for `in`, sets its parameters to `params` (one vector per parameter the
// layer has; an empty vector leaves that parameter alone) with cleared gradients, then runs
// run_layer over `cuts`: forward and, when dy is not empty, backward.
inline ParamLayerRun run_with_params(Layer& layer, Driver& driver, const Shape& in,
                                     const std::vector<float>& x, const HostValues& params,
                                     const std::vector<float>& dy,
                                     const std::vector<index_t>& cuts = {}) {
  layer.setup({in});  // shapes the parameters; run_layer's setup keeps their values
  for (std::size_t p = 0; p < layer.params().size(); ++p) {
    Tensor& param = layer.params()[p];
    if (p < params.size() && !params[p].empty()) set_values(param, params[p]);
    std::fill(param.host_diff_mut(), param.host_diff_mut() + param.count(), 0.0f);
  }
  RunSpec spec;
  spec.cuts = cuts;
  LayerRun run =
      run_layer(layer, driver, {in}, {x}, dy.empty() ? HostValues{} : HostValues{dy}, spec);
  ParamLayerRun result;
  result.y = std::move(run.outputs.at(0));
  if (dy.empty()) return result;
  result.dx = std::move(run.input_diffs.at(0));
  for (Tensor& param : layer.params())
    result.param_diffs.push_back(diffs(param));
  return result;
}

// Random output diffs for `layer`'s outputs given its input shapes.
inline HostValues random_output_diffs(Layer& layer, const std::vector<Shape>& shapes,
                                      std::uint32_t seed) {
  HostValues result;
  for (const Shape& shape : layer.setup(shapes)) {
    result.push_back(random_floats(static_cast<std::size_t>(shape.count()), seed++));
  }
  return result;
}

// Checks that running `layer` as the row slices spec.cuts gives the whole-batch run's
// outputs and input gradients (a slice computes exactly its rows).
inline void check_split_equals_whole(Layer& layer, Driver& driver, const std::vector<Shape>& shapes,
                                     const HostValues& inputs, const RunSpec& spec,
                                     double tolerance = 1e-6) {
  REQUIRE(layer.splits_by_rows());
  const HostValues output_diffs = random_output_diffs(layer, shapes, 4242);
  RunSpec whole_spec = spec;
  whole_spec.cuts.clear();
  const LayerRun whole = run_layer(layer, driver, shapes, inputs, output_diffs, whole_spec);
  const LayerRun split = run_layer(layer, driver, shapes, inputs, output_diffs, spec);
  for (std::size_t o = 0; o < whole.outputs.size(); ++o) {
    INFO("output " << o);
    CHECK(max_rel_diff(split.outputs[o], whole.outputs[o]) <= tolerance);
  }
  for (std::size_t i = 0; i < whole.input_diffs.size(); ++i) {
    INFO("input diff " << i);
    CHECK(max_rel_diff(split.input_diffs[i], whole.input_diffs[i]) <= tolerance);
  }
}

// check_gradients on tensors made from host inputs (the layer is set up for their shapes).
inline void check_layer_gradients(Layer& layer, Driver& driver, const std::vector<Shape>& shapes,
                                  const HostValues& inputs, const GradientCheck& options = {}) {
  REQUIRE(shapes.size() == inputs.size());
  std::deque<Tensor> in_tensors, out_tensors;
  std::vector<Tensor*> in_ptrs, out_ptrs;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    in_tensors.emplace_back(shapes[i]);
    set_values(in_tensors.back(), inputs[i]);
    in_ptrs.push_back(&in_tensors.back());
  }
  for (const Shape& shape : layer.setup(shapes)) {
    out_tensors.emplace_back(shape);
    out_ptrs.push_back(&out_tensors.back());
  }
  check_gradients(layer, driver, in_ptrs, out_ptrs, options);
}

// The configurations gradient checks run on (they are slow elsewhere): the reference driver
// and the CPU driver with one thread.
inline std::vector<DriverConfig> gradient_configs() {
  std::vector<DriverConfig> configs;
  bool have_cpu = false;
  for (const DriverConfig& config : driver_configs()) {
    if (config.label == "reference") configs.push_back(config);
    if (!have_cpu && config.label.find("1 thread") != std::string::npos) {
      configs.push_back(config);
      have_cpu = true;
    }
  }
  return configs;
}

}  // namespace hn::test
