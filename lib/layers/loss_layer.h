// The loss layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/loss.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lib/layers/loss.h"

namespace hn {

// Inputs: scores (outer x C x inner around `axis`) and labels (outer * inner integer
// values in [0, C), or ignore_label). Output 0: the scalar loss
//   -sum_{p not ignored} log(max(softmax(x)[p][label_p], FLT_MIN)) / normalizer.
// num_outputs (Caffe: the number of tops) 2 adds output 1, the probabilities (shaped like
// input 0); as in Caffe, backward ignores any gradient reaching them.
class SoftmaxWithLossLayer final : public Layer {
 public:
  explicit SoftmaxWithLossLayer(std::string name, SoftmaxWithLossParams params = {},
                                int num_outputs = 1);
  const char* type() const override { return "SoftmaxWithLoss"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;
  bool splits_by_rows() const override { return false; }
  bool can_propagate_down(int input) const override { return input == 0; }
  bool is_loss() const override { return true; }

 private:
  AxisShape axis_shape() const;
  float normalizer(Driver& driver, const LayerSlice& slice, const float* prob) const;
  // VALID normalization with an ignore_label: the count of valid positions is read back to
  // the host (the iteration cannot be recorded).
  bool counts_on_host() const;

  SoftmaxWithLossParams param_;
  int num_outputs_;
  LossNormalization normalization_;
  Shape input_shape_;
  int axis_ = 1;
};

// Caffe's EuclideanLoss: loss = sum((a - b)^2) / (2 * N), N = axis 0 of the inputs. Both
// inputs receive gradients (+-(a - b) * loss_weight / N).
class EuclideanLossLayer final : public Layer {
 public:
  explicit EuclideanLossLayer(std::string name);
  const char* type() const override { return "EuclideanLoss"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;
  bool splits_by_rows() const override { return false; }
  bool is_loss() const override { return true; }

 private:
  Shape input_shape_;
};

// Caffe's SigmoidCrossEntropyLoss: inputs are logits x and targets t in [0, 1] of the same
// count; loss = sum over targets != ignore_label of
//   max(x, 0) - x * t + log(1 + exp(-|x|)), divided by the normalizer
// (outer = axis 0 of x, inner = the rest).
class SigmoidCrossEntropyLossLayer final : public Layer {
 public:
  explicit SigmoidCrossEntropyLossLayer(std::string name,
                                        SigmoidCrossEntropyLossParams params = {});
  const char* type() const override { return "SigmoidCrossEntropyLoss"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;
  bool splits_by_rows() const override { return false; }
  bool can_propagate_down(int input) const override { return input == 0; }
  bool is_loss() const override { return true; }

 private:
  float normalizer(Driver& driver, const LayerSlice& slice) const;
  // VALID normalization with an ignore_label: the count is read back (as SoftmaxWithLoss).
  bool counts_on_host() const;

  SigmoidCrossEntropyLossParams param_;
  LossNormalization normalization_;
  Shape input_shape_;
};

}  // namespace hn
