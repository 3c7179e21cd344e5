// The lrn layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/lrn.h.
#pragma once

#include <string>
#include <vector>

#include "lib/layers/lrn.h"

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
  // Input and output in one layout: blocked too across channels, with windows of up to 17
  // channels (the driver's calls take up to 2 * block + 1: 17 on nChw8c).
  BlockedLayout blocked_layout() const override {
    return param_.norm_region == LrnRegion::across_channels && param_.local_size <= 17
               ? BlockedLayout::uniform
               : BlockedLayout::none;
  }

 private:
  LrnShape slice_shape(const LayerSlice& slice) const;

  LrnParams param_;
  LrnShape shape_;  // of the whole batch, set by setup
};

}  // namespace hn
