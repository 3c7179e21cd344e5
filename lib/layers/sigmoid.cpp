// Sigmoid layer: one driver call each way; backward reads the output only.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

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

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_sigmoid(const pb::LayerParameter& p) {
  return std::make_unique<SigmoidLayer>(p.name());
}

}  // namespace

LayerType sigmoid_layer_type() {
  LayerType type;
  type.name = "Sigmoid";
  type.make = make_sigmoid;
  return type;
}

}  // namespace hn
