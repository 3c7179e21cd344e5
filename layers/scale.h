// The scale layer classes (internal): their parameters and factory functions are the
// public API, include/hybridnn/layers/scale.h.
#pragma once

#include <string>
#include <vector>

#include "hybridnn/layers/scale.h"

namespace hn {

// One input: the scale is parameter 0 (shape = the input's dims [axis, axis + num_axes)).
// Two inputs: the scale is input 1 and receives a gradient like any input. With bias_term,
// the bias is the last parameter, shaped like the scale. In place (set_in_place before
// setup), it keeps a copy of the input as its state, which backward needs for the scale's
// gradient (as Caffe's temp_).
class ScaleLayer final : public Layer {
 public:
  explicit ScaleLayer(std::string name, const ScaleParams& params = {});
  const char* type() const override { return "Scale"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;
  // Rows are independent unless the scale (or bias) spans the batch axis or is an input
  // whose gradient sums over the batch.
  bool splits_by_rows() const override { return splits_by_rows_; }
  bool allows_in_place() const override { return true; }
  // A learned scale per channel of the input (axis 1, one axis): nChw16c too.
  BlockedLayout blocked_layout() const override {
    return !scale_is_input_ && axis_ == 1 && scale_shape_.axes() == 1 ? BlockedLayout::uniform
                                                                      : BlockedLayout::none;
  }

 private:
  AxisShape slice_shape(index_t rows) const;

  ScaleParams param_;
  Shape input_shape_, scale_shape_;
  int axis_ = 1;
  bool scale_is_input_ = false;
  bool splits_by_rows_ = false;
};

}  // namespace hn
