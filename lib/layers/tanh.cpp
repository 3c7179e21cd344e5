// TanH layer: one driver call each way; backward reads the output only.
#include <utility>

#include "lib/layers/activation_layer.h"
#include "lib/layers/common.h"

namespace hn {

TanhLayer::TanhLayer(std::string name) : Layer(std::move(name)) {}

std::vector<Shape> TanhLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  return {inputs[0]};
}

void TanhLayer::forward(const LayerSlice& slice) {
  detail::unary_forward(slice, &Driver::tanh_forward);
}

void TanhLayer::backward(const LayerSlice& slice) {
  detail::unary_backward_from_output(slice, &Driver::tanh_backward);
}

}  // namespace hn
