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
  return {inputs[0]};
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
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->relu_backward(n, param_.negative_slope, x.x(), slice.outputs[0].dx(),
                              x.mutable_dx());
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
