// SigmoidCrossEntropyLoss (Caffe): element-wise logistic loss of logits against targets,
// with ignore_label and Caffe's normalization modes (default BATCH_SIZE).
#include <cmath>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/loss_layer.h"
#include "lib/layers/loss_support.h"
#include "lib/layers/registry.h"

namespace hn {

SigmoidCrossEntropyLossLayer::SigmoidCrossEntropyLossLayer(std::string name,
                                                           SigmoidCrossEntropyLossParams params)
    : Layer(std::move(name)),
      param_(params),
      // Caffe keeps BATCH_SIZE as this layer's default for backward compatibility.
      normalization_(params.loss_param.effective_normalization(LossNormalization::batch_size)) {}

std::vector<Shape> SigmoidCrossEntropyLossLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 2, 2);
  const Shape& x = inputs[0];
  const Shape& t = inputs[1];
  HN_CHECK(x.axes() > 0 && t.axes() > 0, "{}: inputs {} and {} need a batch axis", describe(),
           x.to_string(), t.to_string());
  HN_CHECK(x[0] == t[0], "{}: logits {} and targets {} differ in their first dimension", describe(),
           x.to_string(), t.to_string());
  HN_CHECK(x.count() == t.count(), "{}: logits {} and targets {} must have the same count",
           describe(), x.to_string(), t.to_string());
  input_shape_ = x;
  return {Shape{}};
}

std::size_t SigmoidCrossEntropyLossLayer::workspace_bytes(const Driver&, index_t rows) const {
  static_cast<void>(rows);  // never split: always the whole batch
  return static_cast<std::size_t>(2 * input_shape_.count()) * sizeof(float);
}

// The normalizer of the current labels where counts_on_host(): the non-ignored positions,
// counted into the workspace and read back.
float SigmoidCrossEntropyLossLayer::normalizer(Driver& driver, const LayerSlice& slice) const {
  const index_t count = input_shape_.count();
  float* losses = slice.workspace.as<float>();
  float* valid = losses + count;
  driver.sigmoid_cross_entropy_forward(count, slice.inputs[0].x(), slice.inputs[1].x(), true,
                                       *param_.loss_param.ignore_label, losses, valid);
  const index_t valid_count = std::llround(driver.sum(count, valid));
  return loss_normalizer(normalization_, input_shape_[0],
                         input_shape_.count(1, input_shape_.axes()), valid_count);
}

// As SoftmaxWithLoss: the loss and its gradient stay on the driver, except where VALID
// counts the positions an ignore_label leaves (read back).
bool SigmoidCrossEntropyLossLayer::counts_on_host() const {
  return normalization_ == LossNormalization::valid && param_.loss_param.ignore_label;
}

void SigmoidCrossEntropyLossLayer::forward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const index_t count = input_shape_.count();
  const index_t outer = input_shape_[0];
  const index_t inner = input_shape_.count(1, input_shape_.axes());
  const LossParams& loss = param_.loss_param;
  float* losses = slice.workspace.as<float>();
  float* valid = losses + count;
  driver.sigmoid_cross_entropy_forward(count, slice.inputs[0].x(), slice.inputs[1].x(),
                                       loss.ignore_label.has_value(), loss.ignore_label.value_or(0),
                                       losses, valid);
  float* y = slice.outputs[0].mutable_x();
  if (counts_on_host()) {
    const float total = driver.sum(count, losses);
    const index_t valid_count = std::llround(driver.sum(count, valid));
    const float divisor = loss_normalizer(normalization_, outer, inner, valid_count);
    detail::write_scalar(driver, total / divisor, y);
    return;
  }
  driver.bias_backward(AxisShape{1, 1, count}, losses, 0.0f, y);
  const float divisor = loss_normalizer(normalization_, outer, inner, count);
  if (divisor != 1.0f) driver.scale(1, 1.0f / divisor, y);
}

void SigmoidCrossEntropyLossLayer::backward(const LayerSlice& slice) {
  detail::check_no_label_gradient(describe(), slice);
  if (slice.propagate_down.empty() || !slice.propagate_down[0]) return;
  Driver& driver = *slice.driver;
  const index_t count = input_shape_.count();
  const LossParams& loss = param_.loss_param;
  float* dx = slice.inputs[0].mutable_dx();
  if (counts_on_host()) {
    const float loss_weight = detail::read_scalar(driver, slice.outputs[0].dx());
    const float scale = loss_weight / normalizer(driver, slice);
    driver.sigmoid_cross_entropy_backward(count, slice.inputs[0].x(), slice.inputs[1].x(), true,
                                          *loss.ignore_label, scale, dx);
    return;
  }
  // The gradient for a unit loss weight, then times the loss weight where it is.
  const float divisor = loss_normalizer(normalization_, input_shape_[0],
                                        input_shape_.count(1, input_shape_.axes()), count);
  driver.sigmoid_cross_entropy_backward(count, slice.inputs[0].x(), slice.inputs[1].x(),
                                        loss.ignore_label.has_value(),
                                        loss.ignore_label.value_or(0), 1.0f / divisor, dx);
  driver.scale_channels(AxisShape{1, 1, count}, slice.outputs[0].dx(), dx, dx);
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_sigmoid_cross_entropy_loss(const pb::LayerParameter& p) {
  SigmoidCrossEntropyLossParams params;
  params.loss_param = loss_params(p);
  return std::make_unique<SigmoidCrossEntropyLossLayer>(p.name(), params);
}

}  // namespace

LayerType sigmoid_cross_entropy_loss_layer_type() {
  LayerType type;
  type.name = "SigmoidCrossEntropyLoss";
  type.make = make_sigmoid_cross_entropy_loss;
  return type;
}

}  // namespace hn
