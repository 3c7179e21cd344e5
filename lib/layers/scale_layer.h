// The scale layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/scale.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lib/layers/batch_norm_layer.h"
#include "lib/layers/scale.h"

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
  // A learned scale per channel of the input (axis 1, one axis): blocked too.
  BlockedLayout blocked_layout() const override {
    return per_channel() ? BlockedLayout::uniform : BlockedLayout::none;
  }

  // A BatchNorm on stored statistics before this layer and, optionally, a ReLU after it,
  // all in place on one blob, run as this layer's calls (a Net does so, NetOptions::
  // fuse_layers): one pass each way (Driver::norm_affine_*) instead of about eight. The
  // calls then get the BatchNorm's three statistics blobs as parameters after the Scale's
  // own (read only), and the input's gradient is the BatchNorm's input's; the state keeps
  // the normalised values, the Scale's input, as it does in place anyway.
  // Whether the layer can take a BatchNorm in: a learned per-channel scale, in place.
  bool can_fuse_norm() const override { return per_channel() && in_place(0); }
  // Called after setup(); std::nullopt undoes it.
  void fuse_norm(std::optional<FusedNorm> fused) override;
  std::string algorithm(const Driver& driver) const override;

 private:
  AxisShape slice_shape(index_t rows) const;
  bool per_channel() const { return !scale_is_input_ && axis_ == 1 && scale_shape_.axes() == 1; }
  void fused_forward(const LayerSlice& slice, const AxisShape& shape);
  void fused_backward(const LayerSlice& slice, const AxisShape& shape);

  ScaleParams param_;
  Shape input_shape_, scale_shape_;
  int axis_ = 1;
  bool scale_is_input_ = false;
  bool splits_by_rows_ = false;
  std::optional<FusedNorm> fused_;
  StoredFactor stored_factor_;  // the fused BatchNorm's
};

}  // namespace hn
