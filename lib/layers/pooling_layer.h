// The pooling layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/pooling.h.
#pragma once

#include <string>
#include <vector>

#include "lib/layers/pooling.h"

namespace hn {

// Input N x C x H x W -> output N x C x out_h x out_w. MAX keeps, per output, the index
// h * W + w of the chosen input within its channel plane (first maximum wins) in a state
// tensor shaped like the output, for backward.
class PoolingLayer final : public Layer {
 public:
  PoolingLayer(std::string name, PoolingParams params);
  const char* type() const override { return "Pooling"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // Input and output in one layout: blocked too (the driver's calls take it).
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }

 private:
  PoolShape slice_shape(const LayerSlice& slice) const;

  PoolingParams param_;
  PoolShape shape_;  // of the whole batch, set by setup
};

}  // namespace hn
