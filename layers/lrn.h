// The lrn layer classes (internal): their parameters and factory functions are the
// public API, include/hybridnn/layers/lrn.h.
#pragma once

#include <string>
#include <vector>

#include "hybridnn/layers/lrn.h"

namespace hn {

// Input and output N x C x H x W. The per-element scale computed by forward is a state
// tensor shaped like the input, read again by backward.
class LrnLayer final : public Layer {
 public:
  explicit LrnLayer(std::string name, LrnParams params = {});
  const char* type() const override { return "LRN"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;

 private:
  LrnShape slice_shape(const LayerSlice& slice) const;

  LrnParams param_;
  LrnShape shape_;  // of the whole batch, set by setup
};

}  // namespace hn
