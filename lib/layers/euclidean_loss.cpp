// EuclideanLoss (Caffe): sum of squared differences over 2N.
#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/loss_layer.h"
#include "lib/layers/loss_support.h"
#include "lib/layers/registry.h"

namespace hn {

EuclideanLossLayer::EuclideanLossLayer(std::string name) : Layer(std::move(name)) {}

std::vector<Shape> EuclideanLossLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 2, 2);
  const Shape& a = inputs[0];
  const Shape& b = inputs[1];
  HN_CHECK(a.axes() > 0 && b.axes() > 0, "{}: inputs {} and {} need a batch axis", describe(),
           a.to_string(), b.to_string());
  HN_CHECK(a[0] == b[0], "{}: inputs {} and {} differ in their first dimension", describe(),
           a.to_string(), b.to_string());
  HN_CHECK(a.count(1, a.axes()) == b.count(1, b.axes()),
           "{}: inputs {} and {} must have the same dimension per item", describe(), a.to_string(),
           b.to_string());
  input_shape_ = a;
  return {Shape{}};
}

std::size_t EuclideanLossLayer::workspace_bytes(const Driver&, index_t rows) const {
  static_cast<void>(rows);  // never split: always the whole batch
  return static_cast<std::size_t>(input_shape_.count()) * sizeof(float);
}

// The loss and its gradient stay on the driver (no value read back), so that a training
// iteration can be recorded (Net::record_iteration).
void EuclideanLossLayer::forward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const index_t count = input_shape_.count();
  float* y = slice.outputs[0].mutable_x();
  // Caffe divides by num even when it is 0 (an empty batch gives NaN there); guard it.
  if (count == 0) {
    driver.fill(1, 0.0f, y);
    return;
  }
  float* squares = slice.workspace.as<float>();
  driver.axpby(count, 1.0f, slice.inputs[0].x(), 0.0f, squares);
  driver.axpy(count, -1.0f, slice.inputs[1].x(), squares);
  driver.mul(count, squares, squares, squares);
  driver.bias_backward(AxisShape{1, 1, count}, squares, 0.0f, y);
  driver.scale(1, 0.5f / static_cast<float>(input_shape_[0]), y);
}

void EuclideanLossLayer::backward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const index_t count = input_shape_.count();
  if (input_shape_[0] == 0) return;
  const float num = static_cast<float>(input_shape_[0]);
  for (int i = 0; i < 2; ++i) {
    if (static_cast<std::size_t>(i) >= slice.propagate_down.size() || !slice.propagate_down[i]) {
      continue;
    }
    // d/da = (a - b) * w / N, d/db = -(a - b) * w / N: for a unit loss weight, then times
    // the loss weight where it is.
    const float alpha = (i == 0 ? 1.0f : -1.0f) / num;
    float* dx = slice.inputs[i].mutable_dx();
    driver.axpby(count, alpha, slice.inputs[0].x(), 0.0f, dx);
    driver.axpy(count, -alpha, slice.inputs[1].x(), dx);
    driver.scale_channels(AxisShape{1, 1, count}, slice.outputs[0].dx(), dx, dx);
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_euclidean_loss(const pb::LayerParameter& p) {
  return std::make_unique<EuclideanLossLayer>(p.name());
}

}  // namespace

LayerType euclidean_loss_layer_type() {
  LayerType type;
  type.name = "EuclideanLoss";
  type.make = make_euclidean_loss;
  return type;
}

}  // namespace hn
