// The accuracy layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/accuracy.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lib/layers/accuracy.h"

namespace hn {

// Inputs: scores (outer x C x inner around `axis`) and labels (outer * inner). A position
// counts as correct when fewer than top_k classes score >= the true class (Caffe's rule:
// ties count against the label). Output 0: correct / counted (0 when every label is
// ignored). num_outputs (Caffe: the number of tops) 2 adds output 1 (shape C): per class,
// correct / positions with that label (0 for none). No gradient flows through it.
class AccuracyLayer final : public Layer {
 public:
  explicit AccuracyLayer(std::string name, AccuracyParams params = {}, int num_outputs = 1);
  const char* type() const override { return "Accuracy"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  // Does nothing; throws when asked to propagate to an input (Caffe: NOT_IMPLEMENTED).
  void backward(const LayerSlice& slice) override;
  bool splits_by_rows() const override { return false; }
  bool can_propagate_down(int input) const override {
    static_cast<void>(input);
    return false;
  }

 private:
  AccuracyParams param_;
  int num_outputs_;
  Shape input_shape_;
  int axis_ = 1;
};

}  // namespace hn
