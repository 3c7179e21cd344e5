// TanH layer: one driver call each way; backward reads the output only.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

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

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_tanh(const pb::LayerParameter& p) {
  return std::make_unique<TanhLayer>(p.name());
}

}  // namespace

LayerType tanh_layer_type() {
  LayerType type;
  type.name = "TanH";
  type.make = make_tanh;
  return type;
}

}  // namespace hn
