// Split layer: copies its input to every output; backward sums the outputs' gradients
// (in output order, as Caffe does).
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

SplitLayer::SplitLayer(std::string name, int num_outputs)
    : Layer(std::move(name)), num_outputs_(num_outputs) {}

std::vector<Shape> SplitLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  HN_CHECK(num_outputs_ >= 1, "{}: needs at least one output, got {} (input {})", describe(),
           num_outputs_, inputs[0].to_string());
  return std::vector<Shape>(static_cast<std::size_t>(num_outputs_), inputs[0]);
}

// Caffe shares the input's memory with every output; copying keeps each output a tensor of
// its own (sharing is a Net-level optimisation for later).
void SplitLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  for (const Operand& y : slice.outputs) {
    detail::copy_floats(*slice.driver, n, x.x(), y.mutable_x());
  }
}

void SplitLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  detail::copy_floats(*slice.driver, n, slice.outputs[0].dx(), x.mutable_dx());
  for (std::size_t i = 1; i < slice.outputs.size(); ++i) {
    slice.driver->axpy(n, 1.0f, slice.outputs[i].dx(), x.mutable_dx());
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_split(const pb::LayerParameter& p) {
  return std::make_unique<SplitLayer>(p.name(), p.top_size());
}

}  // namespace

LayerType split_layer_type() {
  LayerType type;
  type.name = kSplitLayerType;
  type.make = make_split;
  return type;
}

}  // namespace hn
