// Flatten layer: merges axes [axis, end_axis] into one; the values are copied unchanged.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

FlattenLayer::FlattenLayer(std::string name, FlattenParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> FlattenLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  const int begin = detail::canonical_axis(describe(), "axis", param_.axis, in);
  const int end = detail::canonical_axis(describe(), "end_axis", param_.end_axis, in);
  // end_axis == axis - 1 inserts an axis of 1 (Caffe's count(axis, end_axis + 1)).
  HN_CHECK(begin <= end + 1, "{}: axis {} comes after end_axis {} + 1 (input {})", describe(),
           begin, end, in.to_string());
  const auto& dims = in.dims();
  std::vector<index_t> out(dims.begin(), dims.begin() + begin);
  out.push_back(in.count(begin, end + 1));
  out.insert(out.end(), dims.begin() + end + 1, dims.end());
  // Rows stay rows exactly when the first dimension is unchanged.
  by_rows_ = out[0] == in[0];
  return {Shape(out)};
}

// Copies; letting the output share the input's memory is a Net-level optimisation for later.
void FlattenLayer::forward(const LayerSlice& slice) {
  detail::copy_input_to_output(slice);
}

void FlattenLayer::backward(const LayerSlice& slice) {
  detail::copy_output_diff_to_input(slice);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_flatten(const pb::LayerParameter& p) {
  FlattenParams params;
  params.axis = p.flatten_param().axis();
  params.end_axis = p.flatten_param().end_axis();
  return std::make_unique<FlattenLayer>(p.name(), params);
}

}  // namespace

LayerType flatten_layer_type() {
  LayerType type;
  type.name = "Flatten";
  type.make = make_flatten;
  return type;
}

}  // namespace hn
