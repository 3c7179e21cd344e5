// The softmax layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/softmax.h.
#pragma once

#include <string>
#include <vector>

#include "lib/layers/softmax.h"

namespace hn {

// The input is viewed as [count(0, axis)][shape[axis]][count(axis + 1)]; the output has the
// input's shape. Splits by rows unless the axis is the batch axis.
class SoftmaxLayer final : public Layer {
 public:
  explicit SoftmaxLayer(std::string name, SoftmaxParams params = {});
  const char* type() const override { return param_.log ? "LogSoftmax" : "Softmax"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return axis_ != 0; }

 private:
  AxisShape slice_shape(const LayerSlice& slice) const;

  SoftmaxParams param_;
  int axis_ = 1;  // canonical, set by setup
};

}  // namespace hn
