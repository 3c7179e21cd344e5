// Sigmoid layer: one driver call each way; backward reads the output only.
#include <utility>

#include "lib/layers/activation_layer.h"
#include "lib/layers/common.h"

namespace hn {

SigmoidLayer::SigmoidLayer(std::string name) : Layer(std::move(name)) {}

std::vector<Shape> SigmoidLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  return {inputs[0]};
}

void SigmoidLayer::forward(const LayerSlice& slice) {
  detail::unary_forward(slice, &Driver::sigmoid_forward);
}

void SigmoidLayer::backward(const LayerSlice& slice) {
  detail::unary_backward_from_output(slice, &Driver::sigmoid_backward);
}

}  // namespace hn
