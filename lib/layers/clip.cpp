// Clip layer (Caffe's, BVLC's ClipLayer: clip_param { min max }): one driver call each way.
// Backward reads the input where it has one (Caffe's gradient, passed at the bounds too), the
// output in place (PyTorch's ReLU6 gradient, 0 at the bounds).
#include <cmath>
#include <limits>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

namespace hn {

ClipLayer::ClipLayer(std::string name, ClipParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> ClipLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  HN_CHECK(!std::isnan(param_.min) && !std::isnan(param_.max) && param_.min <= param_.max,
           "{}: clip_param min {} must be <= max {} (input {})", describe(), param_.min, param_.max,
           inputs[0].to_string());
  return {inputs[0]};
}

void ClipLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->clip_forward(n, param_.min, param_.max, x.x(), slice.outputs[0].mutable_x());
}

void ClipLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  const Operand& y = slice.outputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  if (in_place(0) || x.x() == y.x()) {  // told by set_in_place, or called so
    detail::clip_backward_from_output(*slice.driver, n, param_.min, param_.max, y.x(), y.dx(),
                                      x.mutable_dx());
    return;
  }
  slice.driver->clip_backward(n, param_.min, param_.max, x.x(), y.dx(), x.mutable_dx());
}

std::optional<Activation> ClipLayer::fusable_activation() const {
  if (!in_place(0)) return std::nullopt;
  return Activation::clip(param_.min, param_.max);
}

namespace detail {

// lo < y < hi as the inclusive test of clip_backward, on the next floats inside the bounds.
void clip_backward_from_output(Driver& driver, index_t n, float lo, float hi, const float* y,
                               const float* dy, float* dx) {
  const float above_lo = std::nextafter(lo, std::numeric_limits<float>::infinity());
  const float below_hi = std::nextafter(hi, -std::numeric_limits<float>::infinity());
  if (above_lo > below_hi) {
    driver.fill(n, 0.0f, dx);  // no float strictly between the bounds
    return;
  }
  driver.clip_backward(n, above_lo, below_hi, y, dy, dx);
}

}  // namespace detail

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_clip(const pb::LayerParameter& p) {
  HN_CHECK(p.has_clip_param() && p.clip_param().has_min() && p.clip_param().has_max(),
           "layer '{}' (Clip): clip_param {{ min: .. max: .. }} is required", p.name());
  ClipParams params;
  params.min = p.clip_param().min();
  params.max = p.clip_param().max();
  return std::make_unique<ClipLayer>(p.name(), params);
}

}  // namespace

LayerType clip_layer_type() {
  LayerType type;
  type.name = "Clip";
  type.make = make_clip;
  type.fusion = FusionRole::rectifier;
  return type;
}

}  // namespace hn
