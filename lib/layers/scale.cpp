// Scale (Caffe): per-channel (or any broadcast) multiply and optional bias, as one
// scale_channels / bias_forward over the input viewed as [outer][scale][inner].
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/registry.h"
#include "lib/layers/scale_layer.h"

#include <algorithm>

#include "lib/core/check.h"
#include "lib/layers/batch_norm_layer.h"
#include "lib/layers/common.h"

namespace hn {

ScaleLayer::ScaleLayer(std::string name, const ScaleParams& params)
    : Layer(std::move(name)), param_(params) {}

namespace {

// Keeps a parameter's values when its shape is unchanged (and it is not new); otherwise a
// new one filled with the constant `value`.
void shape_param(Tensor& param, bool fresh, const Shape& shape, float value) {
  if (!fresh && param.shape() == shape) return;
  param = Tensor(shape);
  std::fill(param.host_data_mut(), param.host_data_mut() + param.count(), value);
}

}  // namespace

std::vector<Shape> ScaleLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 2);
  const Shape& x = inputs[0];
  scale_is_input_ = inputs.size() == 2;
  if (scale_is_input_) {
    scale_shape_ = inputs[1];
  } else {
    const int first = detail::canonical_axis(describe(), "axis", param_.axis, x);
    HN_CHECK(param_.num_axes >= -1, "{}: num_axes must be >= 0, or -1 for every axis, got {}",
             describe(), param_.num_axes);
    const int last = param_.num_axes == -1 ? x.axes() : first + param_.num_axes;
    HN_CHECK(last <= x.axes(),
             "{}: a scale of {} axes from axis {} extends past the input {} ({} axes)", describe(),
             param_.num_axes, first, x.to_string(), x.axes());
    scale_shape_ = Shape(std::vector<index_t>(x.dims().begin() + first, x.dims().begin() + last));
  }
  // A scalar scale acts the same on any axis; Caffe uses axis 0 for it.
  axis_ = scale_shape_.axes() == 0 ? 0 : detail::canonical_axis(describe(), "axis", param_.axis, x);
  HN_CHECK(x.axes() >= axis_ + scale_shape_.axes(),
           "{}: scale {} applied from axis {} extends past the input {}", describe(),
           scale_shape_.to_string(), axis_, x.to_string());
  for (int i = 0; i < scale_shape_.axes(); ++i) {
    HN_CHECK(x[axis_ + i] == scale_shape_[i],
             "{}: scale {} does not match the input {} from axis {} (scale dimension {} is {}, "
             "input dimension {} is {})",
             describe(), scale_shape_.to_string(), x.to_string(), axis_, i, scale_shape_[i],
             axis_ + i, x[axis_ + i]);
  }
  input_shape_ = x;
  // In place, forward overwrites the input that the scale's gradient is formed from.
  if (in_place(0)) {
    detail::reshape_state(state_, x);
  } else {
    state_.clear();
  }

  const std::size_t count = (scale_is_input_ ? 0 : 1) + (param_.bias_term ? 1 : 0);
  const bool fresh = params_.size() != count;
  if (fresh) params_ = std::vector<Tensor>(count);
  if (!scale_is_input_) shape_param(params_[0], fresh, scale_shape_, param_.filler_value);
  if (param_.bias_term) {
    shape_param(params_.back(), fresh, scale_shape_, param_.bias_filler_value);
  }

  const bool scalar = scale_shape_.axes() == 0;
  if (scale_is_input_) {
    // The scale's gradient is an overwritten input diff: it may not sum over slices, so
    // only a scale with its own rows (axis 0) splits, and a bias would span the batch.
    splits_by_rows_ = !scalar && axis_ == 0 && !param_.bias_term;
  } else {
    // Parameter gradients accumulate, so slices add up; a scale over axis 0 spans the batch.
    splits_by_rows_ = scalar || axis_ >= 1;
  }
  if (!can_fuse_norm()) fused_.reset();
  return {x};
}

void ScaleLayer::fuse_norm(std::optional<FusedNorm> fused) {
  HN_CHECK(!fused || can_fuse_norm(),
           "{}: only a learned per-channel scale (axis 1, one axis) running in place can take "
           "in a BatchNorm",
           describe());
  fused_ = std::move(fused);
}

std::string ScaleLayer::algorithm(const Driver&) const {
  if (!fused_) return "";
  return fmt::format("fused: BatchNorm '{}' + Scale{}", fused_->batch_norm,
                     fused_->relu.empty() ? "" : fmt::format(" + ReLU '{}'", fused_->relu));
}

// The input rows [begin, begin + rows) viewed as [outer][scale][inner]. When the scale
// covers axis 0 (split only when it is an input), its rows are sliced along with the input.
AxisShape ScaleLayer::slice_shape(index_t rows) const {
  const Shape& x = input_shape_;
  const index_t row_count = x.axes() > 0 ? x.count(1, x.axes()) : 1;
  const int scale_end = axis_ + scale_shape_.axes();
  if (scale_shape_.axes() == 0) return AxisShape{1, 1, x.axes() > 0 ? rows * row_count : 1};
  const index_t inner = x.count(scale_end, x.axes());
  if (axis_ == 0) return AxisShape{1, rows * scale_shape_.count(1, scale_shape_.axes()), inner};
  return AxisShape{rows * x.count(1, axis_), scale_shape_.count(), inner};
}

std::size_t ScaleLayer::workspace_bytes(const Driver&, index_t rows) const {
  const AxisShape shape = slice_shape(rows);
  // dy * x for the scale; fused, three channel vectors (shift, 1/std, gamma/std).
  return static_cast<std::size_t>(std::max(shape.count(), 3 * shape.channels)) * sizeof(float);
}

void ScaleLayer::forward(const LayerSlice& slice) {
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  if (shape.channels == 0 || shape.inner == 0) return;
  if (fused_) return fused_forward(slice, shape);
  Driver& driver = *slice.driver;
  const float* scale = scale_is_input_ ? slice.inputs[1].x() : slice.params[0].x();
  float* y = slice.outputs[0].mutable_x();
  const float* x = slice.inputs[0].x();
  HN_CHECK(x != y || in_place(0),
           "{}: runs in place (one tensor for input 0 and output 0) without being told: call "
           "set_in_place({{true}}) before setup(), so that it keeps the input for backward",
           describe());
  if (in_place(0)) {
    driver.copy(slice.state[0].mutable_x(), x,
                static_cast<std::size_t>(shape.count()) * sizeof(float));
  }
  driver.scale_channels(shape, scale, x, y);
  if (param_.bias_term) driver.bias_forward(shape, slice.params.back().x(), y);
}

void ScaleLayer::backward(const LayerSlice& slice) {
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  if (shape.channels == 0 || shape.inner == 0) return;  // nothing to scale, no gradient
  if (fused_) return fused_backward(slice, shape);
  Driver& driver = *slice.driver;
  const float* dy = slice.outputs[0].dx();
  auto wants = [&](std::size_t input) {
    return input < slice.propagate_down.size() && slice.propagate_down[input];
  };
  if (param_.bias_term && slice.params.back().diff.address != nullptr) {
    driver.bias_backward(shape, dy, 1.0f, slice.params.back().mutable_dx());
  }
  // The scale's gradient: sum over outer and inner of dy * x. A parameter accumulates
  // (Caffe's +=), an input is overwritten.
  float* dscale = nullptr;
  float beta = 0.0f;
  if (scale_is_input_ && wants(1)) {
    dscale = slice.inputs[1].mutable_dx();
  } else if (!scale_is_input_ && slice.params[0].diff.address != nullptr) {
    dscale = slice.params[0].mutable_dx();
    beta = 1.0f;
  }
  if (dscale != nullptr) {
    float* product = slice.workspace.as<float>();
    const float* x = in_place(0) ? slice.state[0].x() : slice.inputs[0].x();
    driver.mul(shape.count(), dy, x, product);
    driver.bias_backward(shape, product, beta, dscale);
  }
  if (wants(0)) {
    const float* scale = scale_is_input_ ? slice.inputs[1].x() : slice.params[0].x();
    driver.scale_channels(shape, scale, dy, slice.inputs[0].mutable_dx());
  }
}

// Fused: params are the scale, the bias (bias_term) and then the BatchNorm's statistics.
void ScaleLayer::fused_forward(const LayerSlice& slice, const AxisShape& shape) {
  const std::size_t own = param_.bias_term ? 2 : 1;
  HN_CHECK(slice.params.size() == own + 3 && slice.state.size() == 1,
           "{}: fused with a BatchNorm, forward needs its three statistics blobs after the "
           "layer's {} parameter(s), got {} parameters",
           describe(), own, slice.params.size());
  Driver& driver = *slice.driver;
  float* shift = slice.workspace.as<float>();
  float* inv_std = shift + shape.channels;
  batch_norm_stored_statistics(driver, shape.channels, fused_->eps, slice.params[own],
                               slice.params[own + 1], slice.params[own + 2], stored_factor_, shift,
                               inv_std);
  driver.norm_affine_forward(shape, slice.inputs[0].x(), shift, inv_std, slice.params[0].x(),
                             param_.bias_term ? slice.params[1].x() : nullptr,
                             !fused_->relu.empty(), fused_->relu_slope, slice.state[0].mutable_x(),
                             slice.outputs[0].mutable_x());
}

void ScaleLayer::fused_backward(const LayerSlice& slice, const AxisShape& shape) {
  Driver& driver = *slice.driver;
  const std::size_t own = param_.bias_term ? 2 : 1;
  float* dx = !slice.propagate_down.empty() && slice.propagate_down[0]
                  ? slice.inputs[0].mutable_dx()
                  : nullptr;
  float* dx_scale = nullptr;
  if (dx != nullptr) {
    // dx = dz * gamma / std: the BatchNorm's statistics are constants here.
    float* shift = slice.workspace.as<float>();
    float* inv_std = shift + shape.channels;
    dx_scale = inv_std + shape.channels;
    batch_norm_stored_statistics(driver, shape.channels, fused_->eps, slice.params[own],
                                 slice.params[own + 1], slice.params[own + 2], stored_factor_,
                                 shift, inv_std);
    driver.mul(shape.channels, slice.params[0].x(), inv_std, dx_scale);
  }
  float* dgamma = slice.params[0].diff.address != nullptr ? slice.params[0].mutable_dx() : nullptr;
  float* dbeta = param_.bias_term && slice.params[1].diff.address != nullptr
                     ? slice.params[1].mutable_dx()
                     : nullptr;
  driver.norm_affine_backward(shape, slice.outputs[0].dx(), slice.outputs[0].x(),
                              slice.state[0].x(), dx_scale, !fused_->relu.empty(),
                              fused_->relu_slope, dgamma, dbeta, dx);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_scale(const pb::LayerParameter& p) {
  const pb::ScaleParameter& s = p.scale_param();
  ScaleParams params;
  params.axis = s.axis();
  params.num_axes = s.num_axes();
  params.bias_term = s.bias_term();
  // Without a filler Caffe starts the scale at 1 and the bias at 0: the structs' defaults.
  if (s.has_filler()) params.filler_value = constant_filler(p, "filler", s.filler());
  if (s.has_bias_filler()) {
    params.bias_filler_value = constant_filler(p, "bias_filler", s.bias_filler());
  }
  return std::make_unique<ScaleLayer>(p.name(), params);
}

}  // namespace

LayerType scale_layer_type() {
  LayerType type;
  type.name = "Scale";
  type.make = make_scale;
  type.fusion = FusionRole::affine;
  return type;
}

}  // namespace hn
