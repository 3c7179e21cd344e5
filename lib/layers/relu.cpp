// ReLU layer (Caffe's negative_slope): one driver call each way.
#include <utility>

#include "lib/layers/activation_layer.h"
#include "lib/layers/common.h"

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

}  // namespace hn
