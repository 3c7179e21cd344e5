// Softmax and LogSoftmax layers: the input viewed as [outer][channels][inner] around
// Caffe's axis.
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/registry.h"
#include "lib/layers/softmax_layer.h"

#include <utility>

#include "lib/core/check.h"
#include "lib/layers/common.h"

namespace hn {

SoftmaxLayer::SoftmaxLayer(std::string name, SoftmaxParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> SoftmaxLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  axis_ = detail::canonical_axis(describe(), "axis", param_.axis, in);
  HN_CHECK(in[axis_] > 0, "{}: the softmax axis {} is empty (input {})", describe(), axis_,
           in.to_string());
  return {in};
}

AxisShape SoftmaxLayer::slice_shape(const LayerSlice& slice) const {
  const Shape& shape = slice.inputs[0].shape;
  return AxisShape{detail::outer_rows(shape, axis_, slice.rows()), shape[axis_],
                   shape.count(axis_ + 1, shape.axes())};
}

void SoftmaxLayer::forward(const LayerSlice& slice) {
  if (param_.log) {
    slice.driver->log_softmax_forward(slice_shape(slice), slice.inputs[0].x(),
                                      slice.outputs[0].mutable_x());
  } else {
    slice.driver->softmax_forward(slice_shape(slice), slice.inputs[0].x(),
                                  slice.outputs[0].mutable_x());
  }
}

void SoftmaxLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& y = slice.outputs[0];
  if (param_.log) {
    slice.driver->log_softmax_backward(slice_shape(slice), y.x(), y.dx(),
                                       slice.inputs[0].mutable_dx());
  } else {
    slice.driver->softmax_backward(slice_shape(slice), y.x(), y.dx(), slice.inputs[0].mutable_dx());
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_softmax(const pb::LayerParameter& p) {
  SoftmaxParams params;
  params.axis = p.softmax_param().axis();
  return std::make_unique<SoftmaxLayer>(p.name(), params);
}

// LogSoftmax takes Caffe's softmax_param (its axis).
std::unique_ptr<Layer> make_log_softmax(const pb::LayerParameter& p) {
  SoftmaxParams params;
  params.axis = p.softmax_param().axis();
  params.log = true;
  return std::make_unique<SoftmaxLayer>(p.name(), params);
}

}  // namespace

LayerType softmax_layer_type() {
  LayerType type;
  type.name = "Softmax";
  type.make = make_softmax;
  return type;
}

LayerType log_softmax_layer_type() {
  LayerType type;
  type.name = "LogSoftmax";
  type.make = make_log_softmax;
  return type;
}

}  // namespace hn
