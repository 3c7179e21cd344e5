// The eltwise layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/eltwise.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lib/layers/eltwise.h"

namespace hn {

// MAX keeps, per element, the index of the input that won (first wins on ties) in a state
// tensor shaped like the output, for backward.
class EltwiseLayer final : public Layer {
 public:
  explicit EltwiseLayer(std::string name, EltwiseParams params = {});
  const char* type() const override { return "Eltwise"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // Element by element: any layout, the same for input and output.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }

  // A ReLU in place on this layer's output, run as this layer's calls (a Net does so,
  // NetOptions::fuse_layers): the sum and the ReLU in one pass forward
  // (Driver::lincomb_relu), and backward the ReLU's gradient written straight into the
  // inputs' gradients instead of into the output's and copied from there.
  // Whether a ReLU can be taken in: SUM only (the ReLU's slope must be >= 0, so that
  // y > 0 means the sum > 0 for the gradient read from y).
  bool can_fuse_relu() const override { return param_.operation == EltwiseOp::sum; }
  // Called after setup(); std::nullopt undoes it.
  void fuse_relu(std::optional<FusedRelu> fused) override;
  bool is_plain_sum() const override;
  std::string algorithm(const Driver& driver) const override;

 private:
  float coeff(std::size_t input) const;

  EltwiseParams param_;
  std::optional<FusedRelu> fused_;
};

}  // namespace hn
