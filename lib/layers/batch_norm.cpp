// BatchNorm (Caffe): per-channel normalisation composed of driver calls on the input viewed
// as [N][C][spatial]; per-channel sums are bias_backward, broadcasts are bias_forward and
// scale_channels. Training forward also updates Caffe's three statistics blobs.
#include "hybridnn.pb.h"
#include "lib/layers/batch_norm_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/registry.h"

#include <cmath>

#include "lib/core/check.h"
#include "lib/layers/common.h"
#include "lib/layers/loss_support.h"

namespace hn {

BatchNormLayer::BatchNormLayer(std::string name, BatchNormParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> BatchNormLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& x = inputs[0];
  HN_CHECK(x.axes() >= 1, "{}: input {} needs at least a batch axis", describe(), x.to_string());
  channels_ = x.axes() == 1 ? 1 : x[1];
  HN_CHECK(channels_ > 0, "{}: input {} has no channels", describe(), x.to_string());
  // Negative eps makes 1 / sqrt(variance + eps) NaN wherever a channel's variance is below it.
  HN_CHECK(std::isfinite(param_.eps) && param_.eps >= 0.0f,
           "{}: eps must be >= 0 and finite, got {}", describe(), param_.eps);
  HN_CHECK(std::isfinite(param_.moving_average_fraction),
           "{}: moving_average_fraction must be finite, got {}", describe(),
           param_.moving_average_fraction);
  input_shape_ = x;

  // The statistics blobs start at zero and keep their values while the channels stay.
  const Shape vector_shape{channels_};
  if (params_.size() != 3 || params_[0].shape() != vector_shape) {
    params_.clear();
    params_.emplace_back(vector_shape);
    params_.emplace_back(vector_shape);
    params_.emplace_back(Shape{1});
  }
  // Batch statistics keep the normalised output and 1 / sqrt(variance + eps) for backward
  // (the output itself may be overwritten by in-place layers that follow).
  if (param_.use_global_stats.value_or(false)) {
    state_.clear();
  } else if (state_.size() != 2 || state_[0].shape() != x || state_[1].shape() != vector_shape) {
    state_.clear();
    state_.emplace_back(x);
    state_.emplace_back(vector_shape);
  }
  return {x};
}

bool BatchNormLayer::global_stats(Phase phase) const {
  return param_.use_global_stats.value_or(phase == Phase::test);
}

AxisShape BatchNormLayer::slice_shape(index_t rows) const {
  const index_t spatial = input_shape_.axes() > 2 ? input_shape_.count(2, input_shape_.axes()) : 1;
  return AxisShape{rows, channels_, spatial};
}

std::size_t BatchNormLayer::workspace_bytes(const Driver&, index_t rows) const {
  // Batch statistics: one input-sized temporary and three channel vectors; global ones:
  // two channel vectors.
  const bool may_use_batch = !param_.use_global_stats.value_or(false);
  const index_t floats = (may_use_batch ? slice_shape(rows).count() : 0) + 3 * channels_;
  return static_cast<std::size_t>(floats) * sizeof(float);
}

void batch_norm_stored_statistics(Driver& driver, index_t channels, float eps,
                                  const Operand& mean_sum, const Operand& variance_sum,
                                  const Operand& weight, float* neg_mean, float* inv_std) {
  const float factor = detail::read_scalar(driver, weight.x());
  const float scale = factor == 0.0f ? 0.0f : 1.0f / factor;
  driver.axpby(channels, -scale, mean_sum.x(), 0.0f, neg_mean);
  driver.axpby(channels, scale, variance_sum.x(), 0.0f, inv_std);
  driver.add_scalar(channels, eps, inv_std);
  driver.powx(channels, inv_std, -0.5f, inv_std);
}

void BatchNormLayer::forward(const LayerSlice& slice) {
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  const index_t count = shape.count();
  if (count == 0) return;  // no rows: no statistics to take or apply
  Driver& driver = *slice.driver;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();

  if (global_stats(slice.phase)) {
    float* neg_mean = slice.workspace.as<float>();
    float* inv_std = neg_mean + channels_;
    batch_norm_stored_statistics(driver, channels_, param_.eps, slice.params[0], slice.params[1],
                                 slice.params[2], neg_mean, inv_std);
    detail::copy_floats(driver, count, x, y);
    driver.bias_forward(shape, neg_mean, y);
    driver.scale_channels(shape, inv_std, y, y);
    return;
  }

  HN_CHECK(!slice.state.empty(), "{}: batch statistics need the state that setup allocates",
           describe());
  float* squares = slice.workspace.as<float>();
  float* mean = squares + count;
  float* neg_mean = mean + channels_;
  float* variance = neg_mean + channels_;
  const index_t m = count / channels_;  // values per channel
  const float inv_m = 1.0f / static_cast<float>(m);
  driver.bias_backward(shape, x, 0.0f, mean);
  driver.scale(channels_, inv_m, mean);
  driver.axpby(channels_, -1.0f, mean, 0.0f, neg_mean);
  detail::copy_floats(driver, count, x, y);
  driver.bias_forward(shape, neg_mean, y);  // y = x - mean
  driver.mul(count, y, y, squares);
  driver.bias_backward(shape, squares, 0.0f, variance);
  driver.scale(channels_, inv_m, variance);  // E((x - mean)^2)

  // Caffe's moving averages; the variance blob gets the unbiased estimate.
  const float fraction = param_.moving_average_fraction;
  float* factor = slice.params[2].mutable_x();
  driver.scale(1, fraction, factor);
  driver.add_scalar(1, 1.0f, factor);
  driver.axpby(channels_, 1.0f, mean, fraction, slice.params[0].mutable_x());
  const float bias_correction = m > 1 ? static_cast<float>(m) / static_cast<float>(m - 1) : 1.0f;
  driver.axpby(channels_, bias_correction, variance, fraction, slice.params[1].mutable_x());

  float* inv_std = slice.state[1].mutable_x();
  driver.add_scalar(channels_, param_.eps, variance);
  driver.powx(channels_, variance, -0.5f, inv_std);
  driver.scale_channels(shape, inv_std, y, y);
  detail::copy_floats(driver, count, y, slice.state[0].mutable_x());
}

void BatchNormLayer::backward(const LayerSlice& slice) {
  if (slice.propagate_down.empty() || !slice.propagate_down[0]) return;
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  const index_t count = shape.count();
  if (count == 0) return;
  Driver& driver = *slice.driver;
  const float* dy = slice.outputs[0].dx();
  float* dx = slice.inputs[0].mutable_dx();

  if (global_stats(slice.phase)) {
    // The statistics are constants here: dx = dy / sqrt(variance + eps).
    float* neg_mean = slice.workspace.as<float>();
    float* inv_std = neg_mean + channels_;
    batch_norm_stored_statistics(driver, channels_, param_.eps, slice.params[0], slice.params[1],
                                 slice.params[2], neg_mean, inv_std);
    driver.scale_channels(shape, inv_std, dy, dx);
    return;
  }

  // Caffe's formula with y the normalised output and means over N and spatial:
  //   dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(variance + eps).
  // dy and dx may be the same memory (in place), so every read of dy comes first.
  const float* y = slice.state[0].x();
  const float* inv_std = slice.state[1].x();
  float* temp = slice.workspace.as<float>();
  float* sum_dy_y = temp + count;
  float* sum_dy = sum_dy_y + channels_;
  const float inv_m = 1.0f / static_cast<float>(count / channels_);
  driver.mul(count, dy, y, temp);
  driver.bias_backward(shape, temp, 0.0f, sum_dy_y);
  driver.bias_backward(shape, dy, 0.0f, sum_dy);
  driver.scale_channels(shape, sum_dy_y, y, temp);  // sum(dy * y) * y
  detail::copy_floats(driver, count, dy, dx);
  driver.axpy(count, -inv_m, temp, dx);
  driver.scale(channels_, -inv_m, sum_dy);
  driver.bias_forward(shape, sum_dy, dx);
  driver.scale_channels(shape, inv_std, dx, dx);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_batch_norm(const pb::LayerParameter& p) {
  const pb::BatchNormParameter& b = p.batch_norm_param();
  BatchNormParams params;
  if (b.has_use_global_stats()) params.use_global_stats = b.use_global_stats();
  params.moving_average_fraction = b.moving_average_fraction();
  params.eps = b.eps();
  return std::make_unique<BatchNormLayer>(p.name(), params);
}

}  // namespace

LayerType batch_norm_layer_type() {
  LayerType type;
  type.name = "BatchNorm";
  type.make = make_batch_norm;
  type.statistics = true;
  type.fusion = FusionRole::norm;
  return type;
}

}  // namespace hn
