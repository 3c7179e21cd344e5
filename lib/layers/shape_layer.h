// The shape layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/shape.h.
#pragma once

#include <string>
#include <vector>

#include "lib/layers/shape.h"

namespace hn {

// Joins its inputs along `axis`; every other dimension must match. Along axis 0 (the batch
// axis) the inputs' batches differ, so the layer then runs on the whole batch only
// (splits_by_rows() false).
class ConcatLayer final : public Layer {
 public:
  explicit ConcatLayer(std::string name, ConcatParams params = {});
  const char* type() const override { return "Concat"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return axis_ != 0; }
  // Along the batch or the channels, blocked inputs of whole channel blocks join as
  // NCHW ones do: per image, each input is one contiguous run.
  BlockedLayout blocked_layout() const override {
    return axis_ <= 1 ? BlockedLayout::uniform : BlockedLayout::none;
  }

 private:
  ConcatParams param_;
  int axis_ = 1;  // canonical, set by setup
};

// Cuts its input along `axis` into `num_outputs` outputs (Caffe takes that number from the
// tops in the prototxt; 0 here means slice_point.size() + 1). Along axis 0 it runs on the
// whole batch only (splits_by_rows() false).
class SliceLayer final : public Layer {
 public:
  explicit SliceLayer(std::string name, SliceParams params = {}, int num_outputs = 0);
  const char* type() const override { return "Slice"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return axis_ != 0; }

 private:
  SliceParams param_;
  int num_outputs_;
  int axis_ = 1;  // canonical, set by setup
};

// One input to `num_outputs` identical outputs (what a Net inserts where one blob feeds
// several layers); backward sums the outputs' gradients. Caffe shares the data; this layer
// copies it (sharing is a Net-level optimisation for later).
class SplitLayer final : public Layer {
 public:
  explicit SplitLayer(std::string name, int num_outputs = 2);
  const char* type() const override { return "Split"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // Copies and sums: any layout.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }

 private:
  int num_outputs_;
};

// Merges axes [axis, end_axis] into one. The output holds the same values in the same
// order; forward and backward copy them (sharing the memory is a Net-level optimisation
// for later). Flattening the batch axis runs on the whole batch only.
class FlattenLayer final : public Layer {
 public:
  explicit FlattenLayer(std::string name, FlattenParams params = {});
  const char* type() const override { return "Flatten"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return by_rows_; }

 private:
  FlattenParams param_;
  bool by_rows_ = true;  // set by setup
};

// The output holds the input's values in the same order, copied (sharing the memory is a
// Net-level optimisation for later). When the output's first dimension is not the input's
// batch, the layer runs on the whole batch only.
class ReshapeLayer final : public Layer {
 public:
  explicit ReshapeLayer(std::string name, ReshapeParams params);
  const char* type() const override { return "Reshape"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return by_rows_; }

 private:
  ReshapeParams param_;
  bool by_rows_ = true;  // set by setup
};

// Permutes the input's axes (PermuteParams): one strided copy per block of the output
// (lib/layers/permute.cpp).
class PermuteLayer final : public Layer {
 public:
  PermuteLayer(std::string name, PermuteParams params);
  const char* type() const override { return "Permute"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return order_.empty() || order_[0] == 0; }

 private:
  PermuteParams param_;
  std::vector<int> order_;  // complete, set by setup
};

// Joins its inputs along the channels, shuffles them and cuts them into its outputs
// (ShuffleChannelParams): one strided copy of the batch per input, group and output
// (lib/layers/shuffle_channel.cpp).
class ShuffleChannelLayer final : public Layer {
 public:
  // num_outputs 0: one per slice point and one more.
  ShuffleChannelLayer(std::string name, ShuffleChannelParams params, int num_outputs = 0);
  const char* type() const override { return "ShuffleChannel"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;

 private:
  ShuffleChannelParams param_;
  int num_outputs_;
};

// Pads with a constant (PadParams): a fill and one strided copy per block of the output
// (lib/layers/pad.cpp).
class PadLayer final : public Layer {
 public:
  PadLayer(std::string name, PadParams params);
  const char* type() const override { return "Pad"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // reflect and edge: backward gathers the borders' gradients in a copy of the output's.
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;

 private:
  PadParams param_;
  Shape output_;                         // set by setup
  std::vector<index_t> before_, after_;  // per axis of the input, set by setup
};

// Consumes its inputs; backward zeroes their gradients.
class SilenceLayer final : public Layer {
 public:
  explicit SilenceLayer(std::string name);
  const char* type() const override { return "Silence"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // Its inputs may hold batches of different sizes (a label, a piece): one whole call.
  bool splits_by_rows() const override { return false; }
};

}  // namespace hn
