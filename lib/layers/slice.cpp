// Slice layer: each output is a block of columns of the input viewed as
// [count(0, axis)][count(axis)], moved with one strided copy per output (lib/layers/common.h).
#include <string>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

namespace detail {

std::vector<index_t> cut_sizes(const std::string& who, index_t dim,
                               const std::vector<index_t>& points, int pieces,
                               const std::string& along, const Shape& input) {
  std::vector<index_t> sizes;
  if (points.empty()) {
    HN_CHECK(pieces > 0 && dim % pieces == 0,
             "{}: {} outputs do not evenly divide {} of size {} (input {})", who, pieces, along,
             dim, input.to_string());
    sizes.assign(static_cast<std::size_t>(pieces), dim / pieces);
    return sizes;
  }
  HN_CHECK(static_cast<int>(points.size()) == pieces - 1,
           "{}: {} slice points for {} outputs (input {}); need one fewer points than outputs", who,
           points.size(), pieces, input.to_string());
  index_t previous = 0;
  for (const index_t point : points) {
    HN_CHECK(previous < point && point < dim,
             "{}: slice points must increase strictly inside (0, {}) along {}; got {} after {} "
             "(input {})",
             who, dim, along, point, previous, input.to_string());
    sizes.push_back(point - previous);
    previous = point;
  }
  sizes.push_back(dim - previous);
  return sizes;
}

}  // namespace detail

SliceLayer::SliceLayer(std::string name, SliceParams params, int num_outputs)
    : Layer(std::move(name)),
      param_(std::move(params)),
      num_outputs_(num_outputs > 0 ? num_outputs
                                   : static_cast<int>(param_.slice_point.size()) + 1) {}

std::vector<Shape> SliceLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  if (param_.slice_dim >= 0) {
    HN_CHECK(param_.axis == 1, "{}: set axis ({}) or the legacy slice_dim ({}), not both",
             describe(), param_.axis, param_.slice_dim);
    axis_ = detail::canonical_axis(describe(), "slice_dim", param_.slice_dim, in);
  } else {
    axis_ = detail::canonical_axis(describe(), "axis", param_.axis, in);
  }
  const std::vector<index_t> sizes = detail::cut_sizes(
      describe(), in[axis_], param_.slice_point, num_outputs_, "axis " + std::to_string(axis_), in);
  std::vector<Shape> outputs;
  for (const index_t size : sizes) {
    std::vector<index_t> dims = in.dims();
    dims[static_cast<std::size_t>(axis_)] = size;
    outputs.emplace_back(dims);
  }
  return outputs;
}

void SliceLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  std::vector<float*> parts;
  for (const Operand& y : slice.outputs)
    parts.push_back(y.mutable_x());
  detail::scatter_parts(
      *slice.driver, detail::axis_parts(x.shape, slice.outputs, axis_, slice.rows()), x.x(), parts);
}

// The outputs tile the input, so their diffs overwrite every element of dx.
void SliceLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  std::vector<const float*> parts;
  for (const Operand& y : slice.outputs)
    parts.push_back(y.dx());
  detail::gather_parts(*slice.driver,
                       detail::axis_parts(x.shape, slice.outputs, axis_, slice.rows()), parts,
                       x.mutable_dx());
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_slice(const pb::LayerParameter& p) {
  const pb::SliceParameter& s = p.slice_param();
  HN_CHECK(!(s.has_axis() && s.has_slice_dim()),
           "{}: give either axis or slice_dim, not both (axis {}, slice_dim {})", who(p), s.axis(),
           s.slice_dim());
  SliceParams params;
  params.axis = s.axis();
  if (s.has_slice_dim()) params.slice_dim = to_int(p, "slice_dim", s.slice_dim());
  params.slice_point = to_indices(s.slice_point());
  return std::make_unique<SliceLayer>(p.name(), std::move(params), p.top_size());
}

}  // namespace

LayerType slice_layer_type() {
  LayerType type;
  type.name = "Slice";
  type.make = make_slice;
  return type;
}

}  // namespace hn
