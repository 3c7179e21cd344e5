// LRN layer: checks Caffe's constraints in setup, then one driver call per direction.
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/lrn_layer.h"
#include "lib/layers/registry.h"

#include <cmath>
#include <utility>

#include "lib/core/check.h"
#include "lib/layers/common.h"

namespace hn {

LrnLayer::LrnLayer(std::string name, LrnParams params) : Layer(std::move(name)), param_(params) {}

std::vector<Shape> LrnLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  HN_CHECK(in.axes() == 4, "{}: input must have 4 axes (N x C x H x W), got {}", describe(),
           in.to_string());
  HN_CHECK(in[1] > 0 && in[2] > 0 && in[3] > 0,
           "{}: channels, height and width must be > 0 (input {})", describe(), in.to_string());
  HN_CHECK(param_.local_size > 0 && param_.local_size % 2 == 1,
           "{}: local_size must be odd and positive, got {} (input {})", describe(),
           param_.local_size, in.to_string());
  // The scale k + alpha/size * sum(x^2) is raised to -beta: with alpha < 0 it can reach 0 or
  // below, and with k <= 0 (ACROSS_CHANNELS) it is 0 on every all-zero window (ReLU
  // outputs): NaN or inf where Caffe would silently give them too.
  HN_CHECK(std::isfinite(param_.alpha) && param_.alpha >= 0.0f && std::isfinite(param_.beta),
           "{}: alpha must be >= 0 and alpha, beta finite, got alpha {} beta {} (input {})",
           describe(), param_.alpha, param_.beta, in.to_string());
  HN_CHECK(param_.norm_region != LrnRegion::across_channels ||
               (std::isfinite(param_.k) && param_.k > 0.0f),
           "{}: k must be > 0 (ACROSS_CHANNELS), got {} (input {})", describe(), param_.k,
           in.to_string());
  shape_ = LrnShape{};
  shape_.batch = in[0];
  shape_.channels = in[1];
  shape_.height = in[2];
  shape_.width = in[3];
  shape_.size = param_.local_size;
  shape_.alpha = param_.alpha;
  shape_.beta = param_.beta;
  shape_.k = param_.k;
  shape_.region = param_.norm_region;
  detail::reshape_state(state_, in);  // the scale, per element
  return {in};
}

LrnShape LrnLayer::slice_shape(const LayerSlice& slice) const {
  LrnShape shape = shape_;
  shape.batch = slice.rows();
  shape.layout = slice.inputs[0].layout;
  return shape;
}

void LrnLayer::forward(const LayerSlice& slice) {
  slice.driver->lrn_forward(slice_shape(slice), slice.inputs[0].x(), slice.outputs[0].mutable_x(),
                            slice.state[0].mutable_x());
}

void LrnLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  const Operand& y = slice.outputs[0];
  slice.driver->lrn_backward(slice_shape(slice), x.x(), y.x(), slice.state[0].x(), y.dx(),
                             x.mutable_dx());
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_lrn(const pb::LayerParameter& p) {
  const pb::LRNParameter& l = p.lrn_param();
  LrnParams params;
  params.local_size = l.local_size();
  params.alpha = l.alpha();
  params.beta = l.beta();
  params.k = l.k();
  params.norm_region = l.norm_region() == pb::LRNParameter::WITHIN_CHANNEL
                           ? LrnRegion::within_channel
                           : LrnRegion::across_channels;
  return std::make_unique<LrnLayer>(p.name(), params);
}

}  // namespace

LayerType lrn_layer_type() {
  LayerType type;
  type.name = "LRN";
  type.make = make_lrn;
  return type;
}

}  // namespace hn
