// Concat layer: each input is a block of columns of the output viewed as
// [count(0, axis)][count(axis)], moved with one strided copy per input (lib/layers/common.h).
#include <limits>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

ConcatLayer::ConcatLayer(std::string name, ConcatParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> ConcatLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, std::numeric_limits<int>::max());
  const Shape& first = inputs[0];
  if (param_.concat_dim >= 0) {
    HN_CHECK(param_.axis == 1, "{}: set axis ({}) or the legacy concat_dim ({}), not both",
             describe(), param_.axis, param_.concat_dim);
    axis_ = detail::canonical_axis(describe(), "concat_dim", param_.concat_dim, first);
  } else {
    axis_ = detail::canonical_axis(describe(), "axis", param_.axis, first);
  }
  std::vector<index_t> dims = first.dims();
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const Shape& in = inputs[i];
    bool match = in.axes() == first.axes();
    for (int a = 0; match && a < first.axes(); ++a) {
      match = a == axis_ || in[a] == first[a];
    }
    HN_CHECK(match,
             "{}: inputs must have the same shape except along axis {}; input 0 is {}, input {} "
             "is {}",
             describe(), axis_, first.to_string(), i, in.to_string());
    dims[static_cast<std::size_t>(axis_)] += in[axis_];
  }
  return {Shape(dims)};
}

void ConcatLayer::forward(const LayerSlice& slice) {
  const Operand& y = slice.outputs[0];
  std::vector<const float*> parts;
  for (const Operand& x : slice.inputs)
    parts.push_back(x.x());
  detail::gather_parts(*slice.driver,
                       detail::axis_parts(y.shape, slice.inputs, axis_, slice.rows()), parts,
                       y.mutable_x());
}

void ConcatLayer::backward(const LayerSlice& slice) {
  const Operand& y = slice.outputs[0];
  std::vector<float*> parts;
  for (std::size_t i = 0; i < slice.inputs.size(); ++i)
    parts.push_back(slice.propagate_down[i] ? slice.inputs[i].mutable_dx() : nullptr);
  detail::scatter_parts(
      *slice.driver, detail::axis_parts(y.shape, slice.inputs, axis_, slice.rows()), y.dx(), parts);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_concat(const pb::LayerParameter& p) {
  const pb::ConcatParameter& c = p.concat_param();
  HN_CHECK(!(c.has_axis() && c.has_concat_dim()),
           "{}: give either axis or concat_dim, not both (axis {}, concat_dim {})", who(p),
           c.axis(), c.concat_dim());
  ConcatParams params;
  params.axis = c.axis();
  if (c.has_concat_dim()) params.concat_dim = to_int(p, "concat_dim", c.concat_dim());
  return std::make_unique<ConcatLayer>(p.name(), params);
}

}  // namespace

LayerType concat_layer_type() {
  LayerType type;
  type.name = "Concat";
  type.make = make_concat;
  return type;
}

}  // namespace hn
