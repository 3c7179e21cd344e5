// Eltwise layer: SUM (lincomb/axpy with the coefficients), PROD (mul) and MAX (a running
// maximum with the winner's index kept for backward).
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/eltwise_layer.h"
#include "lib/layers/registry.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "lib/layers/common.h"

namespace hn {

static_assert(sizeof(float) == sizeof(std::int32_t), "MAX keeps int32 indices in a float tensor");

EltwiseLayer::EltwiseLayer(std::string name, EltwiseParams params)
    : Layer(std::move(name)), param_(std::move(params)) {}

bool EltwiseLayer::is_plain_sum() const {
  if (param_.operation != EltwiseOp::sum) return false;
  for (float c : param_.coeff) {
    if (c != 1.0f) return false;
  }
  return true;
}

void EltwiseLayer::fuse_relu(std::optional<FusedRelu> fused) {
  HN_CHECK(!fused || (can_fuse_relu() && fused->slope >= 0.0f),
           "{}: only a SUM can take in a ReLU, and only one with a negative_slope >= 0 (got "
           "{})",
           describe(), fused ? fused->slope : 0.0f);
  fused_ = std::move(fused);
}

std::string EltwiseLayer::algorithm(const Driver&) const {
  return fused_ ? fmt::format("fused: Eltwise + ReLU '{}'", fused_->relu) : "";
}

float EltwiseLayer::coeff(std::size_t input) const {
  return param_.coeff.empty() ? 1.0f : param_.coeff[input];
}

std::vector<Shape> EltwiseLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 2, std::numeric_limits<int>::max());
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    HN_CHECK(inputs[i] == inputs[0],
             "{}: inputs must have the same shape; input 0 is {}, input {} is {}", describe(),
             inputs[0].to_string(), i, inputs[i].to_string());
  }
  // Caffe rejects coefficients for PROD only; MAX ignores them.
  HN_CHECK(param_.coeff.empty() || param_.operation != EltwiseOp::prod,
           "{}: coeff is for SUM (and ignored by MAX), not PROD (input {})", describe(),
           inputs[0].to_string());
  HN_CHECK(param_.coeff.empty() || param_.coeff.size() == inputs.size(),
           "{}: {} coefficients for {} inputs (input 0 is {})", describe(), param_.coeff.size(),
           inputs.size(), inputs[0].to_string());
  if (param_.operation == EltwiseOp::max) {
    // The winning input per element: int32 stored bitwise in a float tensor.
    detail::reshape_state(state_, inputs[0]);
  } else {
    state_.clear();
  }
  return {inputs[0]};
}

void EltwiseLayer::forward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const auto& in = slice.inputs;
  const index_t n = detail::slice_count(in[0].shape, slice.rows());
  float* y = slice.outputs[0].mutable_x();
  switch (param_.operation) {
    case EltwiseOp::sum: {
      // The first two inputs in one pass, any others added to that; a fused ReLU runs in
      // the pass that adds the last input.
      const auto relu_at = [&](std::size_t i) { return fused_ && i + 1 == in.size(); };
      if (in.size() == 1) {
        driver.axpby(n, coeff(0), in[0].x(), 0.0f, y);
        if (fused_) driver.relu_forward(n, fused_->slope, y, y);
      } else if (relu_at(1)) {
        driver.lincomb_relu(n, coeff(0), in[0].x(), coeff(1), in[1].x(), fused_->slope, y);
      } else {
        driver.lincomb(n, coeff(0), in[0].x(), coeff(1), in[1].x(), y);
      }
      for (std::size_t i = 2; i < in.size(); ++i) {
        if (relu_at(i)) {
          driver.lincomb_relu(n, 1.0f, y, coeff(i), in[i].x(), fused_->slope, y);
        } else {
          driver.axpy(n, coeff(i), in[i].x(), y);
        }
      }
      break;
    }
    case EltwiseOp::prod:
      driver.mul(n, in[0].x(), in[1].x(), y);
      for (std::size_t i = 2; i < in.size(); ++i) {
        driver.mul(n, y, in[i].x(), y);
      }
      break;
    case EltwiseOp::max: {
      // The state tensor holds int32 indices bitwise (sizeof(float) == sizeof(int32_t)).
      auto* mask = slice.state[0].data.as<std::int32_t>();
      for (std::size_t i = 0; i < in.size(); ++i) {
        driver.max_accumulate(n, in[i].x(), static_cast<std::int32_t>(i), y, mask);
      }
      break;
    }
  }
}

void EltwiseLayer::backward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const auto& in = slice.inputs;
  const Operand& out = slice.outputs[0];
  const index_t n = detail::slice_count(in[0].shape, slice.rows());
  if (fused_) {
    // The ReLU's gradient dz = dy * (y > 0 ? 1 : slope), computed once into the first input
    // that takes a gradient; input i's is coeff(i) * dz, the others' taken from it first.
    std::size_t first = 0;
    while (first < in.size() && !slice.propagate_down[first])
      ++first;
    if (first == in.size()) return;
    float* dz = in[first].mutable_dx();
    driver.relu_backward(n, fused_->slope, out.x(), out.dx(), dz);
    for (std::size_t i = first + 1; i < in.size(); ++i) {
      if (!slice.propagate_down[i]) continue;
      if (coeff(i) == 1.0f) {
        detail::copy_floats(driver, n, dz, in[i].mutable_dx());
      } else {
        driver.axpby(n, coeff(i), dz, 0.0f, in[i].mutable_dx());
      }
    }
    if (coeff(first) != 1.0f) driver.scale(n, coeff(first), dz);
    return;
  }
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!slice.propagate_down[i]) continue;
    float* dx = in[i].mutable_dx();
    switch (param_.operation) {
      case EltwiseOp::sum:
        if (coeff(i) == 1.0f) {
          detail::copy_floats(driver, n, out.dx(), dx);
        } else {
          driver.axpby(n, coeff(i), out.dx(), 0.0f, dx);
        }
        break;
      case EltwiseOp::prod:
        if (param_.stable_prod_grad) {
          // dx_i = dy * prod_{j != i} x_j, never dividing by x_i.
          const float* factor = out.dx();
          for (std::size_t j = 0; j < in.size(); ++j) {
            if (j == i) continue;
            driver.mul(n, factor, in[j].x(), dx);
            factor = dx;
          }
        } else {
          // Caffe's fast form dx_i = dy * y / x_i, as y * x_i^-1.
          driver.powx(n, in[i].x(), -1.0f, dx);
          driver.mul(n, dx, out.x(), dx);
          driver.mul(n, dx, out.dx(), dx);
        }
        break;
      case EltwiseOp::max: {
        const auto* mask = slice.state[0].data.as<const std::int32_t>();
        driver.max_select(n, mask, static_cast<std::int32_t>(i), out.dx(), dx);
        break;
      }
    }
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_eltwise(const pb::LayerParameter& p) {
  const pb::EltwiseParameter& e = p.eltwise_param();
  EltwiseParams params;
  switch (e.operation()) {
    case pb::EltwiseParameter::PROD:
      params.operation = EltwiseOp::prod;
      break;
    case pb::EltwiseParameter::SUM:
      params.operation = EltwiseOp::sum;
      break;
    case pb::EltwiseParameter::MAX:
      params.operation = EltwiseOp::max;
      break;
  }
  params.coeff.assign(e.coeff().begin(), e.coeff().end());
  params.stable_prod_grad = e.stable_prod_grad();
  return std::make_unique<EltwiseLayer>(p.name(), std::move(params));
}

}  // namespace

LayerType eltwise_layer_type() {
  LayerType type;
  type.name = "Eltwise";
  type.make = make_eltwise;
  type.fusion = FusionRole::sum;
  return type;
}

}  // namespace hn
