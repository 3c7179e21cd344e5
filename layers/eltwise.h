// The eltwise layer classes (internal): their parameters and factory functions are the
// public API, lib/include/hybridnn/layers/eltwise.h.
#pragma once

#include <string>
#include <vector>

#include "hybridnn/layers/eltwise.h"

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

 private:
  float coeff(std::size_t input) const;

  EltwiseParams param_;
};

}  // namespace hn
