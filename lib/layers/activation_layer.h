// The activation layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/activation.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/layers/activation.h"

namespace hn {

// y = x > 0 ? x : negative_slope * x.
class ReluLayer final : public Layer {
 public:
  explicit ReluLayer(std::string name, ReluParams params = {});
  const char* type() const override { return "ReLU"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
  // Element by element: any layout, the same for input and output.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }
  float negative_slope() const { return param_.negative_slope; }
  std::optional<float> rectifier_slope() const override { return param_.negative_slope; }
  std::optional<Activation> fusable_activation() const override;

 private:
  void check_not_in_place_negative(bool in_place_now) const;

  ReluParams param_;
};

// y = 1 / (1 + exp(-x)); backward reads y only, so in place is allowed.
class SigmoidLayer final : public Layer {
 public:
  explicit SigmoidLayer(std::string name);
  const char* type() const override { return "Sigmoid"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
};

// y = tanh(x); backward reads y only, so in place is allowed.
class TanhLayer final : public Layer {
 public:
  explicit TanhLayer(std::string name);
  const char* type() const override { return "TanH"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
};

// y = x * sigmoid(beta * x); backward reads x, so not in place.
class SwishLayer final : public Layer {
 public:
  SwishLayer(std::string name, SwishParams params);
  const char* type() const override { return "Swish"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // Element by element: any layout, the same for input and output.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }

 private:
  SwishParams param_;
};

// y = min(max(x, min), max); backward reads x, so not in place.
class ClipLayer final : public Layer {
 public:
  ClipLayer(std::string name, ClipParams params);
  const char* type() const override { return "Clip"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  // In place, the gradient is read from y: PyTorch's hardtanh convention, 0 where x is
  // exactly min or max (detail::clip_backward_from_output).
  void backward(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
  // Element by element: any layout, the same for input and output.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }
  std::optional<Activation> fusable_activation() const override;

 private:
  ClipParams param_;
};

namespace detail {
// The gradient of y = min(max(x, lo), hi) read from y, for a Clip whose x is gone (in
// place, or run by the convolution before it): dx = lo < y < hi ? dy : 0, which is
// PyTorch's hardtanh (ReLU6) gradient; a Clip apart from its output passes the gradient at
// x == lo and x == hi too, as Caffe's does. dx may be dy.
void clip_backward_from_output(Driver& driver, index_t n, float lo, float hi, const float* y,
                               const float* dy, float* dx);
}  // namespace detail

// Train phase: each element is kept with probability 1 - dropout_ratio and scaled by
// 1 / (1 - dropout_ratio); test phase: the identity. The keep mask (a state tensor shaped
// like the input) comes from the driver's counter-based generator, keyed by the slice's
// seed mixed with a hash of the layer name (so two dropout layers draw differently) and
// counted from the slice's first element (so any batch split draws the whole-batch mask).
// On blocked activations each element draws the counter of its NCHW position, so the mask
// is the NCHW one, relaid.
class DropoutLayer final : public Layer {
 public:
  explicit DropoutLayer(std::string name, DropoutParams params = {});
  const char* type() const override { return "Dropout"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
  // Element by element (Driver::dropout_forward_layout): any layout, the same for input,
  // output and mask.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }
  // The generator key of this layer for a slice seed (exposed for tests and tools).
  std::uint64_t mask_seed(std::uint64_t slice_seed) const;

 private:
  DropoutParams param_;
  std::uint64_t name_hash_;
};

}  // namespace hn
