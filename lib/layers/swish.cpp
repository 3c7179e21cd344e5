// Swish layer (Caffe's SwishLayer: swish_param { beta }; PyTorch's SiLU at beta 1): one driver
// call each way; backward reads the input, so the layer does not run in place. The ONNX
// importer writes one for a Sigmoid whose only reader multiplies it by its input (how
// PyTorch exports SiLU): one pass each way instead of a Split, a Sigmoid and a product.
#include <cmath>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

namespace hn {

SwishLayer::SwishLayer(std::string name, SwishParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> SwishLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  HN_CHECK(std::isfinite(param_.beta), "{}: swish_param beta {} is not finite (input {})",
           describe(), param_.beta, inputs[0].to_string());
  return {inputs[0]};
}

void SwishLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->swish_forward(n, param_.beta, x.x(), slice.outputs[0].mutable_x());
}

void SwishLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  slice.driver->swish_backward(n, param_.beta, x.x(), slice.outputs[0].dx(), x.mutable_dx());
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_swish(const pb::LayerParameter& p) {
  SwishParams params;
  params.beta = p.swish_param().beta();
  return std::make_unique<SwishLayer>(p.name(), params);
}

}  // namespace

LayerType swish_layer_type() {
  LayerType type;
  type.name = "Swish";
  type.make = make_swish;
  return type;
}

}  // namespace hn
