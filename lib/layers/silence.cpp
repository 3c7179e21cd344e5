// Silence layer (BVLC Caffe's): takes its inputs out of the net's outputs; backward writes
// zeros into their gradients.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

SilenceLayer::SilenceLayer(std::string name) : Layer(std::move(name)) {}

std::vector<Shape> SilenceLayer::setup(const std::vector<Shape>& inputs) {
  HN_CHECK(!inputs.empty(), "{}: needs at least one bottom", describe());
  return {};
}

void SilenceLayer::forward(const LayerSlice&) {}

void SilenceLayer::backward(const LayerSlice& slice) {
  for (std::size_t i = 0; i < slice.inputs.size(); ++i) {
    if (!slice.propagate_down[i]) continue;
    const Operand& x = slice.inputs[i];
    slice.driver->fill(x.shape.count(), 0.0f, x.mutable_dx());  // whole: inputs may differ in batch
  }
}

namespace {

std::unique_ptr<Layer> make_silence(const hybridnn::proto::LayerParameter& p) {
  return std::make_unique<SilenceLayer>(p.name());
}

}  // namespace

LayerType silence_layer_type() {
  LayerType type;
  type.name = "Silence";
  type.make = make_silence;
  return type;
}

}  // namespace hn
