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
  } else if (state_.size() != 2 || state_[0].shape() != x ||
             state_[1].shape() != Shape{x[0], channels_}) {
    // 1 / sqrt(variance + eps) once per row, so that every state tensor is cut by rows.
    state_.clear();
    state_.emplace_back(x);
    state_.emplace_back(Shape{x[0], channels_});
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
  // Batch statistics: a stage's input-sized temporary and three channel vectors, then the
  // whole pass's per-row sums (two quantities) and totals (two); global ones: two channel
  // vectors.
  const bool may_use_batch = !param_.use_global_stats.value_or(false);
  const index_t floats =
      (may_use_batch ? slice_shape(rows).count() + 2 * rows * channels_ + 2 * channels_ : 0) +
      3 * channels_;
  return static_cast<std::size_t>(floats) * sizeof(float);
}

Layer::BatchSums BatchNormLayer::batch_sums(Phase phase, bool backward) const {
  if (global_stats(phase)) return {};
  return backward ? BatchSums{2, 2, channels_} : BatchSums{3, 1, channels_};
}

AxisShape BatchNormLayer::row_planes(const LayerSlice& slice) const {
  const AxisShape shape = slice_shape(slice.rows());
  // Blocked layouts keep each row's channel blocks together, so [rows * channels] blocked
  // is the same memory as [rows][channels] blocked.
  return AxisShape{1, shape.outer * shape.channels, shape.inner, slice.inputs[0].layout};
}

float StoredFactor::read(Driver& driver, const Operand& weight) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (weight.version != 0 && weight.version == version_ && weight.data.address == at_)
    return value_;
  value_ = detail::read_scalar(driver, weight.x());
  at_ = weight.data.address;
  version_ = weight.version;
  return value_;
}

void batch_norm_stored_statistics(Driver& driver, index_t channels, float eps,
                                  const Operand& mean_sum, const Operand& variance_sum,
                                  const Operand& weight, StoredFactor& stored, float* neg_mean,
                                  float* inv_std) {
  const float factor = stored.read(driver, weight);
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
                                 slice.params[2], stored_factor_, neg_mean, inv_std);
    detail::copy_floats(driver, count, x, y);
    driver.bias_forward(shape, neg_mean, y);
    driver.scale_channels(shape, inv_std, y, y);
    return;
  }
  HN_CHECK(slice.state.size() == 2, "{}: batch statistics need the state that setup allocates",
           describe());
  if (slice.stage < 0) return whole_pass(slice, false);
  forward_stage(slice, slice.stage);
}

void BatchNormLayer::forward_stage(const LayerSlice& slice, int stage) {
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  const index_t count = shape.count();
  if (count == 0) return;
  Driver& driver = *slice.driver;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  float* scratch = slice.workspace.as<float>();
  // Values per channel in the batch: the whole tensor's, or the rows' in a whole pass.
  const index_t m = (slice.stage < 0 ? count : slice.inputs[0].shape.count()) / channels_;
  const float inv_m = 1.0f / static_cast<float>(m);
  const float* totals = slice.batch_sums.as<const float>();
  switch (stage) {
    case 0:  // each row's sums of x
      driver.bias_backward(row_planes(slice), x, 0.0f, slice.row_sums[0].as<float>());
      return;
    case 1: {  // y = x - mean, and each row's sums of its squares
      float* squares = scratch;
      float* neg_mean = squares + count;
      driver.axpby(channels_, -inv_m, totals, 0.0f, neg_mean);
      detail::copy_floats(driver, count, x, y);
      driver.bias_forward(shape, neg_mean, y);
      driver.mul(count, y, y, squares);
      driver.bias_backward(row_planes(slice), squares, 0.0f, slice.row_sums[0].as<float>());
      return;
    }
    default: {  // y /= sqrt(E((x - mean)^2) + eps), kept for backward with its factor per row
      float* inv_std = scratch;
      driver.axpby(channels_, inv_m, totals + channels_, 0.0f, inv_std);
      driver.add_scalar(channels_, param_.eps, inv_std);
      driver.powx(channels_, inv_std, -0.5f, inv_std);
      driver.scale_channels(shape, inv_std, y, y);
      detail::copy_floats(driver, count, y, slice.state[0].mutable_x());
      const AxisShape per_row{slice.rows(), channels_, 1};
      float* kept = slice.state[1].mutable_x();
      driver.fill(per_row.count(), 0.0f, kept);
      driver.bias_forward(per_row, inv_std, kept);
      return;
    }
  }
}

void BatchNormLayer::finish_batch_sums(const LayerSlice& slice) {
  if (global_stats(slice.phase)) return;
  Driver& driver = *slice.driver;
  // Values per channel: the whole batch's, or the rows' of a whole pass.
  const index_t rows = slice.stage < 0 ? slice.rows() : slice.inputs[0].shape[0];
  const index_t m = slice_shape(rows).count() / channels_;
  if (m == 0) return;
  const float inv_m = 1.0f / static_cast<float>(m);
  const float* totals = slice.batch_sums.as<const float>();
  float* mean = slice.workspace.as<float>();
  float* variance = mean + channels_;
  driver.axpby(channels_, inv_m, totals, 0.0f, mean);
  driver.axpby(channels_, inv_m, totals + channels_, 0.0f, variance);  // E((x - mean)^2)
  // Caffe's moving averages; the variance blob gets the unbiased estimate.
  const float fraction = param_.moving_average_fraction;
  float* factor = slice.params[2].mutable_x();
  driver.scale(1, fraction, factor);
  driver.add_scalar(1, 1.0f, factor);
  driver.axpby(channels_, 1.0f, mean, fraction, slice.params[0].mutable_x());
  const float bias_correction = m > 1 ? static_cast<float>(m) / static_cast<float>(m - 1) : 1.0f;
  driver.axpby(channels_, bias_correction, variance, fraction, slice.params[1].mutable_x());
}

void BatchNormLayer::whole_pass(const LayerSlice& slice, bool backward) {
  Driver& driver = *slice.driver;
  const index_t rows = slice.rows();
  const index_t count = slice_shape(rows).count();
  const std::size_t vector_bytes = static_cast<std::size_t>(rows * channels_) * sizeof(float);
  float* row_sums = slice.workspace.as<float>() + count + 3 * channels_;
  float* totals = row_sums + 2 * rows * channels_;
  LayerSlice staged = slice;
  staged.row_sums = {Pointer{driver.device(), row_sums, vector_bytes},
                     Pointer{driver.device(), row_sums + rows * channels_, vector_bytes}};
  staged.batch_sums =
      Pointer{driver.device(), totals, static_cast<std::size_t>(2 * channels_) * sizeof(float)};
  const BatchSums sums = batch_sums(slice.phase, backward);
  for (int stage = 0; stage < sums.stages; ++stage) {
    if (backward) {
      backward_stage(staged, stage);
    } else {
      forward_stage(staged, stage);
    }
    if (stage + 1 == sums.stages) break;
    for (int q = 0; q < sums.quantities; ++q)
      sum_rows(driver, rows, channels_, row_sums + q * rows * channels_,
               totals + (stage * sums.quantities + q) * channels_);
  }
  if (!backward) {
    staged.workspace = slice.workspace;  // finish's two channel vectors come first
    finish_batch_sums(staged);
  }
}

void BatchNormLayer::backward(const LayerSlice& slice) {
  if (slice.propagate_down.empty() || !slice.propagate_down[0]) return;
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  const index_t count = shape.count();
  if (count == 0) return;
  Driver& driver = *slice.driver;

  if (global_stats(slice.phase)) {
    // The statistics are constants here: dx = dy / sqrt(variance + eps).
    float* neg_mean = slice.workspace.as<float>();
    float* inv_std = neg_mean + channels_;
    batch_norm_stored_statistics(driver, channels_, param_.eps, slice.params[0], slice.params[1],
                                 slice.params[2], stored_factor_, neg_mean, inv_std);
    driver.scale_channels(shape, inv_std, slice.outputs[0].dx(), slice.inputs[0].mutable_dx());
    return;
  }
  if (slice.stage < 0) return whole_pass(slice, true);
  backward_stage(slice, slice.stage);
}

void BatchNormLayer::backward_stage(const LayerSlice& slice, int stage) {
  if (slice.propagate_down.empty() || !slice.propagate_down[0]) return;
  AxisShape shape = slice_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  const index_t count = shape.count();
  if (count == 0) return;
  Driver& driver = *slice.driver;
  // Caffe's formula with y the normalised output and means over N and spatial:
  //   dx = (dy - mean(dy) - mean(dy * y) * y) / sqrt(variance + eps).
  // dy and dx may be the same memory (in place), so every read of dy comes first.
  const float* dy = slice.outputs[0].dx();
  const float* y = slice.state[0].x();
  float* temp = slice.workspace.as<float>();
  if (stage == 0) {  // each row's sums of dy * y and of dy
    driver.mul(count, dy, y, temp);
    driver.bias_backward(row_planes(slice), temp, 0.0f, slice.row_sums[0].as<float>());
    driver.bias_backward(row_planes(slice), dy, 0.0f, slice.row_sums[1].as<float>());
    return;
  }
  const index_t m = (slice.stage < 0 ? count : slice.inputs[0].shape.count()) / channels_;
  const float inv_m = 1.0f / static_cast<float>(m);
  const float* sum_dy_y = slice.batch_sums.as<const float>();
  const float* sum_dy = sum_dy_y + channels_;
  const float* inv_std = slice.state[1].x();  // the first row's: every row holds the same
  float* neg_mean_dy = temp + count;
  float* dx = slice.inputs[0].mutable_dx();
  driver.scale_channels(shape, sum_dy_y, y, temp);  // sum(dy * y) * y
  detail::copy_floats(driver, count, dy, dx);
  driver.axpy(count, -inv_m, temp, dx);
  driver.axpby(channels_, -inv_m, sum_dy, 0.0f, neg_mean_dy);
  driver.bias_forward(shape, neg_mean_dy, dx);
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
