// InnerProduct layer: one GEMM each way (two in backward), bias through the driver's
// per-channel calls. The GEMM orientation follows Caffe's weight layout (transpose).
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/inner_product_layer.h"
#include "lib/layers/registry.h"

#include <algorithm>
#include <utility>

#include "lib/core/check.h"
#include "lib/layers/common.h"

namespace hn {

InnerProductLayer::InnerProductLayer(std::string name, InnerProductParams params)
    : Layer(std::move(name)), config_(params) {}

std::vector<Shape> InnerProductLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const std::string who = describe();
  const Shape& in = inputs[0];
  HN_CHECK(config_.num_output > 0, "{}: num_output must be > 0, got {}", who, config_.num_output);
  HN_CHECK(in.axes() > 0, "{}: input must have at least one axis, got a scalar", who);
  axis_ = detail::canonical_axis(who, "axis", config_.axis, in);
  inputs_per_row_ = in.count(axis_, in.axes());
  gemm_rows_ = in.count(0, axis_);
  input_rows_ = std::max<index_t>(in[0], 1);
  HN_CHECK(inputs_per_row_ > 0, "{}: input {} has no elements from axis {} on", who, in.to_string(),
           axis_);
  const index_t n = config_.num_output, k = inputs_per_row_;
  const Shape weight_shape = config_.transpose ? Shape{k, n} : Shape{n, k};
  const std::size_t param_count = config_.bias_term ? 2 : 1;
  if (params_.size() != param_count || params_[0].shape() != weight_shape) {
    params_.clear();
    params_.emplace_back(weight_shape);
    if (config_.bias_term) params_.emplace_back(Shape{n});
  }
  std::vector<index_t> out(in.dims().begin(), in.dims().begin() + axis_);
  out.push_back(n);
  return {Shape(std::move(out))};
}

double InnerProductLayer::forward_flops(index_t rows) const {
  // M scales with the rows of axis 0 (all of them when axis is 0: the layer is never cut).
  const double m = axis_ == 0 ? 1.0 : static_cast<double>(gemm_rows_) * rows / input_rows_;
  return 2.0 * m * static_cast<double>(inputs_per_row_) * static_cast<double>(config_.num_output);
}

void InnerProductLayer::forward(const LayerSlice& slice) {
  Driver& d = *slice.driver;
  const index_t m = detail::outer_rows(slice.inputs[0].shape, axis_, slice.rows());
  const index_t n = config_.num_output, k = inputs_per_row_;
  if (m == 0) return;
  float* y = slice.outputs[0].mutable_x();
  // y [M x N] = x [M x K] * op(W), op(W) = W^T for W [N][K], W for W [K][N].
  d.gemm(Transpose::no, config_.transpose ? Transpose::no : Transpose::yes, m, n, k, 1.0f,
         slice.inputs[0].x(), k, slice.params[0].x(), config_.transpose ? n : k, 0.0f, y, n);
  if (config_.bias_term) d.bias_forward(AxisShape{m, n, 1}, slice.params[1].x(), y);
}

void InnerProductLayer::backward(const LayerSlice& slice) {
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const index_t m = detail::outer_rows(in.shape, axis_, slice.rows());
  const index_t n = config_.num_output, k = inputs_per_row_;
  if (m == 0) return;
  const float* dy = slice.outputs[0].dx();
  if (weights.diff.address != nullptr) {
    if (config_.transpose) {  // dW [K x N] += x^T dy
      d.gemm(Transpose::yes, Transpose::no, k, n, m, 1.0f, in.x(), k, dy, n, 1.0f,
             weights.mutable_dx(), n);
    } else {  // dW [N x K] += dy^T x
      d.gemm(Transpose::yes, Transpose::no, n, k, m, 1.0f, dy, n, in.x(), k, 1.0f,
             weights.mutable_dx(), k);
    }
  }
  if (config_.bias_term && slice.params[1].diff.address != nullptr) {
    d.bias_backward(AxisShape{m, n, 1}, dy, 1.0f, slice.params[1].mutable_dx());
  }
  const bool want_dx =
      !slice.propagate_down.empty() && slice.propagate_down[0] && in.diff.address != nullptr;
  if (want_dx) {  // dx [M x K] = dy [M x N] * W [N][K], or dy * W^T for W [K][N]
    d.gemm(Transpose::no, config_.transpose ? Transpose::yes : Transpose::no, m, k, n, 1.0f, dy, n,
           weights.x(), config_.transpose ? n : k, 0.0f, in.mutable_dx(), k);
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_inner_product(const pb::LayerParameter& p) {
  const pb::InnerProductParameter& ip = p.inner_product_param();
  InnerProductParams params;
  params.num_output = ip.num_output();
  params.bias_term = ip.bias_term();
  params.axis = ip.axis();
  params.transpose = ip.transpose();
  return std::make_unique<InnerProductLayer>(p.name(), params);
}

}  // namespace

LayerType inner_product_layer_type() {
  LayerType type;
  type.name = "InnerProduct";
  type.make = make_inner_product;
  type.filler = [](const pb::LayerParameter& p, int index) {
    return index == 0 ? &p.inner_product_param().weight_filler()
                      : &p.inner_product_param().bias_filler();
  };
  // Outputs are columns of the top; the weights are [num_output][K] ([K][num_output]
  // transposed) and the bias [num_output].
  OutputCut cut;
  cut.outputs = [](const pb::LayerParameter& p) {
    return static_cast<index_t>(p.inner_product_param().num_output());
  };
  cut.set_outputs = [](pb::LayerParameter& p, index_t count) {
    p.mutable_inner_product_param()->set_num_output(static_cast<std::uint32_t>(count));
  };
  cut.param_axis = [](const pb::LayerParameter& p, int index) {
    return index == 0 && p.inner_product_param().transpose() ? 1 : 0;
  };
  cut.input_axis = [](const pb::LayerParameter& p) { return p.inner_product_param().axis(); };
  cut.by_default = true;
  type.cut = std::move(cut);
  return type;
}

}  // namespace hn
