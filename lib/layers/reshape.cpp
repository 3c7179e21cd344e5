// Reshape layer: Caffe's ReshapeParameter rules (0 copies a dimension, one -1 is inferred,
// axis/num_axes select the replaced range); the values are copied unchanged.
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {

namespace {

std::string dims_text(const std::vector<index_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace

ReshapeLayer::ReshapeLayer(std::string name, ReshapeParams params)
    : Layer(std::move(name)), param_(std::move(params)) {}

std::vector<Shape> ReshapeLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  const std::string who = describe();
  const std::vector<index_t>& spec = param_.shape;
  const std::string spec_text = dims_text(spec);
  const int in_axes = in.axes();

  // Caffe: a negative axis counts from the end, -1 meaning "after the last axis".
  const int begin = param_.axis >= 0 ? param_.axis : in_axes + param_.axis + 1;
  HN_CHECK(0 <= begin && begin <= in_axes,
           "{}: axis {} is out of range for the {}-axis input {} (shape {})", who, param_.axis,
           in_axes, in.to_string(), spec_text);
  HN_CHECK(param_.num_axes >= -1, "{}: num_axes must be >= 0, or -1 for all, got {}", who,
           param_.num_axes);
  const int end = param_.num_axes == -1 ? in_axes : begin + param_.num_axes;
  HN_CHECK(end <= in_axes, "{}: axis {} + num_axes {} is out of range for the input {}", who, begin,
           param_.num_axes, in.to_string());

  std::vector<index_t> out(in.dims().begin(), in.dims().begin() + begin);
  int inferred = -1;
  index_t known = in.count(0, begin) * in.count(end, in_axes);
  for (std::size_t i = 0; i < spec.size(); ++i) {
    index_t dim = spec[i];
    const int axis = begin + static_cast<int>(i);
    HN_CHECK(dim >= -1, "{}: shape {} has dimension {} < -1 (input {})", who, spec_text, dim,
             in.to_string());
    if (dim == -1) {
      HN_CHECK(inferred < 0, "{}: shape {} has more than one -1 (input {})", who, spec_text,
               in.to_string());
      inferred = axis;
    } else {
      if (dim == 0) {
        HN_CHECK(axis < in_axes,
                 "{}: shape {} copies (0) input axis {}, which the input {} does not have", who,
                 spec_text, axis, in.to_string());
        dim = in[axis];
      }
      // An overflow (a fuzz finding) means a shape far larger than any input.
      HN_CHECK(!__builtin_mul_overflow(known, dim, &known),
               "{}: shape {} has more elements than can be addressed (input {})", who, spec_text,
               in.to_string());
    }
    out.push_back(dim);
  }
  out.insert(out.end(), in.dims().begin() + end, in.dims().end());
  if (inferred >= 0) {
    HN_CHECK(known > 0 && in.count() % known == 0,
             "{}: cannot infer the -1 in shape {}: the input {} has {} elements, not a multiple "
             "of {}",
             who, spec_text, in.to_string(), in.count(), known);
    out[static_cast<std::size_t>(inferred)] = in.count() / known;
  }
  const Shape result(out);
  HN_CHECK(result.count() == in.count(),
           "{}: shape {} gives output {} with {} elements; the input {} has {}", who, spec_text,
           result.to_string(), result.count(), in.to_string(), in.count());
  // Rows stay rows exactly when the first dimension is unchanged.
  by_rows_ = in_axes > 0 && result.axes() > 0 && result[0] == in[0];
  return {result};
}

// Copies; letting the output share the input's memory is a Net-level optimisation for later.
void ReshapeLayer::forward(const LayerSlice& slice) {
  detail::copy_input_to_output(slice);
}

void ReshapeLayer::backward(const LayerSlice& slice) {
  detail::copy_output_diff_to_input(slice);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_reshape(const pb::LayerParameter& p) {
  const pb::ReshapeParameter& r = p.reshape_param();
  // No shape: no dimensions, as in Caffe (axis and num_axes then remove axes).
  ReshapeParams params;
  params.shape = to_indices(r.shape().dim());
  params.axis = r.axis();
  params.num_axes = r.num_axes();
  return std::make_unique<ReshapeLayer>(p.name(), std::move(params));
}

}  // namespace

LayerType reshape_layer_type() {
  LayerType type;
  type.name = "Reshape";
  type.make = make_reshape;
  return type;
}

}  // namespace hn
