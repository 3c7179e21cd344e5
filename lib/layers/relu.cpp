// ReLU layer (Caffe's negative_slope): one driver call each way.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

namespace hn {

ReluLayer::ReluLayer(std::string name, ReluParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> ReluLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  check_not_in_place_negative(in_place(0));
  return {inputs[0]};
}

// In place, the gradient is read from y, where y > 0 means x > 0 only for a slope >= 0 (a
// negative slope makes y positive on both sides): Caffe computes a wrong gradient there.
void ReluLayer::check_not_in_place_negative(bool in_place_now) const {
  HN_CHECK(!in_place_now || param_.negative_slope >= 0.0f,
           "{}: negative_slope {} cannot run in place (top = bottom): its gradient would be read "
           "from its output, whose sign no longer tells x's; give it a top of its own",
           describe(), param_.negative_slope);
}

void ReluLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->relu_forward(n, param_.negative_slope, x.x(), slice.outputs[0].mutable_x());
}

// In place, inputs[0].data holds y; y > 0 exactly where x > 0 (for slope >= 0), so the
// derivative read from y is Caffe's.
void ReluLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  check_not_in_place_negative(in_place(0) || x.x() == slice.outputs[0].x());
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->relu_backward(n, param_.negative_slope, x.x(), slice.outputs[0].dx(),
                              x.mutable_dx());
}

// The gradient read from y is Caffe's only for slope >= 0.
std::optional<Activation> ReluLayer::fusable_activation() const {
  if (param_.negative_slope < 0.0f) return std::nullopt;
  return Activation::relu(param_.negative_slope);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_relu(const pb::LayerParameter& p) {
  ReluParams params;
  params.negative_slope = p.relu_param().negative_slope();
  return std::make_unique<ReluLayer>(p.name(), params);
}

}  // namespace

LayerType relu_layer_type() {
  LayerType type;
  type.name = "ReLU";
  type.make = make_relu;
  type.element_wise = true;
  type.fusion = FusionRole::rectifier;
  return type;
}

}  // namespace hn
