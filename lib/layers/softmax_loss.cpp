// SoftmaxWithLoss (Caffe): softmax over the class axis, then the mean negative
// log-likelihood of the labels under Caffe's normalization modes. Also the loss
// normalization rule shared with SigmoidCrossEntropyLoss.
#include <algorithm>
#include <cmath>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/loss_layer.h"
#include "lib/layers/loss_support.h"
#include "lib/layers/registry.h"

namespace hn {

LossNormalization LossParams::effective_normalization(LossNormalization layer_default) const {
  if (normalization) return *normalization;
  if (normalize) return *normalize ? LossNormalization::valid : LossNormalization::batch_size;
  return layer_default;
}

float loss_normalizer(LossNormalization mode, index_t outer, index_t inner, index_t valid_count) {
  float normalizer = 1.0f;
  switch (mode) {
    case LossNormalization::full:
      normalizer = static_cast<float>(outer * inner);
      break;
    case LossNormalization::valid:
      normalizer = static_cast<float>(valid_count);
      break;
    case LossNormalization::batch_size:
      normalizer = static_cast<float>(outer);
      break;
    case LossNormalization::none:
      normalizer = 1.0f;
      break;
  }
  // Caffe: some examples may carry no labels at all (a loss switched off in multi-task
  // training); the max keeps that from dividing by zero.
  return std::max(1.0f, normalizer);
}

SoftmaxWithLossLayer::SoftmaxWithLossLayer(std::string name, SoftmaxWithLossParams params,
                                           int num_outputs)
    : Layer(std::move(name)),
      param_(params),
      num_outputs_(num_outputs),
      normalization_(params.loss_param.effective_normalization(LossNormalization::valid)) {}

std::vector<Shape> SoftmaxWithLossLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 2, 2);
  HN_CHECK(num_outputs_ == 1 || num_outputs_ == 2,
           "{}: num_outputs must be 1 (the loss) or 2 (the loss and the probabilities), got {}",
           describe(), num_outputs_);
  const Shape& scores = inputs[0];
  const Shape& labels = inputs[1];
  axis_ = detail::canonical_axis(describe(), "axis", param_.axis, scores);
  HN_CHECK(scores[axis_] > 0, "{}: scores {} have no classes on axis {}", describe(),
           scores.to_string(), axis_);
  HN_CHECK(labels.axes() == 0 || scores[0] == labels[0],
           "{}: scores {} and labels {} differ in their first dimension", describe(),
           scores.to_string(), labels.to_string());
  const index_t positions = scores.count(0, axis_) * scores.count(axis_ + 1, scores.axes());
  HN_CHECK(labels.count() == positions,
           "{}: {} labels ({}) for scores {} with class axis {}: needs one label per position, "
           "{}",
           describe(), labels.count(), labels.to_string(), scores.to_string(), axis_, positions);
  input_shape_ = scores;
  if (num_outputs_ == 1) {
    // The probabilities are kept for backward.
    if (state_.size() != 1 || state_[0].shape() != scores) state_.clear();
    if (state_.empty()) state_.emplace_back(scores);
  } else {
    state_.clear();  // output 1 holds them
  }
  std::vector<Shape> outputs{Shape{}};
  if (num_outputs_ == 2) outputs.push_back(scores);
  return outputs;
}

AxisShape SoftmaxWithLossLayer::axis_shape() const {
  return AxisShape{input_shape_.count(0, axis_), input_shape_[axis_],
                   input_shape_.count(axis_ + 1, input_shape_.axes())};
}

std::size_t SoftmaxWithLossLayer::workspace_bytes(const Driver&, index_t rows) const {
  static_cast<void>(rows);  // never split: always the whole batch
  const AxisShape shape = axis_shape();
  return static_cast<std::size_t>(2 * shape.outer * shape.inner) * sizeof(float);
}

// The normalizer of the current labels where counts_on_host(): the non-ignored positions,
// counted into the workspace and read back.
float SoftmaxWithLossLayer::normalizer(Driver& driver, const LayerSlice& slice,
                                       const float* prob) const {
  const AxisShape shape = axis_shape();
  const index_t positions = shape.outer * shape.inner;
  float* losses = slice.workspace.as<float>();
  float* valid = losses + positions;
  driver.softmax_loss_forward(shape, prob, slice.inputs[1].x(), true,
                              *param_.loss_param.ignore_label, losses, valid);
  const index_t valid_count = std::llround(driver.sum(positions, valid));
  return loss_normalizer(normalization_, shape.outer, shape.inner, valid_count);
}

// The loss and its gradient stay on the driver (no value comes back to the host), so that a
// training iteration can be recorded (Net::record_iteration), except where VALID counts the
// positions an ignore_label leaves: that count is read back.
bool SoftmaxWithLossLayer::counts_on_host() const {
  return normalization_ == LossNormalization::valid && param_.loss_param.ignore_label;
}

void SoftmaxWithLossLayer::forward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const AxisShape shape = axis_shape();
  const index_t positions = shape.outer * shape.inner;
  const LossParams& loss = param_.loss_param;
  float* prob = num_outputs_ == 2 ? slice.outputs[1].mutable_x() : slice.state[0].mutable_x();
  driver.softmax_forward(shape, slice.inputs[0].x(), prob);
  float* losses = slice.workspace.as<float>();
  float* valid = losses + positions;
  driver.softmax_loss_forward(shape, prob, slice.inputs[1].x(), loss.ignore_label.has_value(),
                              loss.ignore_label.value_or(0), losses, valid);
  float* y = slice.outputs[0].mutable_x();
  if (counts_on_host()) {
    const float total = driver.sum(positions, losses);
    const index_t valid_count = std::llround(driver.sum(positions, valid));
    const float divisor = loss_normalizer(normalization_, shape.outer, shape.inner, valid_count);
    detail::write_scalar(driver, total / divisor, y);
    return;
  }
  // The sum of the losses into the output, then divided by the normalizer.
  driver.bias_backward(AxisShape{1, 1, positions}, losses, 0.0f, y);
  const float divisor = loss_normalizer(normalization_, shape.outer, shape.inner, positions);
  if (divisor != 1.0f) driver.scale(1, 1.0f / divisor, y);
}

void SoftmaxWithLossLayer::backward(const LayerSlice& slice) {
  detail::check_no_label_gradient(describe(), slice);
  if (slice.propagate_down.empty() || !slice.propagate_down[0]) return;
  Driver& driver = *slice.driver;
  const float* prob = num_outputs_ == 2 ? slice.outputs[1].x() : slice.state[0].x();
  const LossParams& loss = param_.loss_param;
  float* dx = slice.inputs[0].mutable_dx();
  const AxisShape shape = axis_shape();
  if (counts_on_host()) {
    const float loss_weight = detail::read_scalar(driver, slice.outputs[0].dx());
    const float scale = loss_weight / normalizer(driver, slice, prob);
    driver.softmax_loss_backward(shape, prob, slice.inputs[1].x(), true, *loss.ignore_label, scale,
                                 dx);
    return;
  }
  // The gradient for a unit loss weight, then times the loss weight, the output's gradient,
  // where it is on the driver.
  const float divisor =
      loss_normalizer(normalization_, shape.outer, shape.inner, shape.outer * shape.inner);
  driver.softmax_loss_backward(shape, prob, slice.inputs[1].x(), loss.ignore_label.has_value(),
                               loss.ignore_label.value_or(0), 1.0f / divisor, dx);
  driver.scale_channels(AxisShape{1, 1, shape.count()}, slice.outputs[0].dx(), dx, dx);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_softmax_with_loss(const pb::LayerParameter& p) {
  SoftmaxWithLossParams params;
  params.axis = p.softmax_param().axis();
  params.loss_param = loss_params(p);
  return std::make_unique<SoftmaxWithLossLayer>(p.name(), params, outputs_or(p, 1));
}

}  // namespace

LayerType softmax_with_loss_layer_type() {
  LayerType type;
  type.name = "SoftmaxWithLoss";
  type.make = make_softmax_with_loss;
  return type;
}

}  // namespace hn
