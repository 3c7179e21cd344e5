// The convolution layer class (internal): its parameters and factory function are the public
// API, lib/layers/convolution.h; its algorithms are lib/layers/conv_algorithm.h.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/layers/convolution.h"

namespace hn {

// The three computations of a convolution, each with its own algorithm.
enum class ConvDirection { forward, backward_data, backward_weights };
const char* direction_name(ConvDirection direction);
inline constexpr std::array<ConvDirection, 3> kConvDirections{
    ConvDirection::forward, ConvDirection::backward_data, ConvDirection::backward_weights};

// A convolution's geometry, resolved by ConvolutionLayer::setup() from its parameters and
// input shape.
struct ConvGeometry {
  index_t channels = 0, height = 0, width = 0;
  index_t kernel_h = 0, kernel_w = 0, stride_h = 1, stride_w = 1;
  index_t pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  index_t out_h = 0, out_w = 0;

  // A 1x1 kernel with stride 1 and no padding: each image already is the lowered matrix.
  bool one_by_one() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 &&
           pad_w == 0;
  }
};

namespace detail {
// The kernel, stride, pad and dilation of `p` into `geo`, with Caffe's checks (`who` names
// the layer in errors); Convolution's and Deconvolution's.
void resolve_window(const std::string& who, const ConvolutionParams& p, ConvGeometry& geo);
}  // namespace detail

// Input N x C x H x W; output N x num_output x H_out x W_out (Caffe's size rule). Params:
// weights [num_output][C / group][kernel_h][kernel_w], then bias [num_output] when
// bias_term. Output channel block g of num_output / group sees input channel block g.
class ConvolutionLayer final : public Layer {
 public:
  ConvolutionLayer(std::string name, ConvolutionParams params);
  const char* type() const override { return "Convolution"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;

  // The GEMM lowering setup() chose (or was told to use).
  Lowering lowering() const { return lowering_; }
  const char* lowering_name() const { return hn::lowering_name(lowering_); }
  // What runs on `driver` in `direction`: the lowering tune() chose for that driver, else
  // with Lowering::automatic the driver's direct convolution when it has one (capability
  // `convolution`: it moves no lowered bytes, so the cost model always prefers it), else
  // lowering().
  Lowering lowering_for(const Driver& driver,
                        ConvDirection direction = ConvDirection::forward) const;
  // What tune() measures on `driver`: every algorithm that applies to this layer there, in
  // the order of detail::conv_algorithms() (one when the parameters force a lowering).
  std::vector<Lowering> candidates(const Driver& driver) const;
  // Runs `direction` with `lowering` (one of candidates()) on drivers named as `driver`.
  void choose(const Driver& driver, ConvDirection direction, Lowering lowering);
  void tune(Driver& driver, index_t rows, Tuner& tuner) override;
  std::string algorithm(const Driver& driver) const override;
  double forward_flops(index_t rows) const override;
  // An in-place ReLU (slope >= 0) or Clip after it (NetOptions::fuse_layers): forward
  // applies it to y, in the driver's call where the algorithm is the driver's convolution
  // (the CPU driver's oneDNN post-op), after the others; backward first turns dy into the
  // activation's input gradient, in place, read from y (as the in-place layer would).
  bool can_fuse_activation() const override { return true; }
  void fuse_activation(std::optional<FusedActivation> fused) override { fused_ = std::move(fused); }
  // The fused activation, or none.
  Activation activation() const { return fused_ ? fused_->activation : Activation{}; }
  // An Eltwise SUM of this layer's output and another blob (NetOptions::fuse_layers): the
  // slice's second input is the other blob, its output the sum's; forward adds it before
  // the fused activation (in the driver's call, conv_forward_residual, where the algorithm
  // is the driver's convolution; in a pass after the others), and backward, after the
  // activation's gradient, copies dy into the second input's gradient (a sum's gradient).
  bool can_fuse_residual() const override { return true; }
  void fuse_residual(std::optional<FusedResidual> fused) override { residual_ = std::move(fused); }
  bool residual() const { return residual_.has_value(); }
  // A BatchNorm and Scale folded into the weights (Layer::fold_norm): the calls' params are
  // the derived weights and a bias.
  bool can_fold_norm() const override { return true; }
  void fold_norm(std::optional<FoldedNorm> folded) override { folded_ = std::move(folded); }
  // Whether the calls take a bias (params[1]): the layer's own, or the folded one.
  bool has_bias() const { return config_.bias_term || folded_.has_value(); }
  // Blocked input and output each on its own: the driver's direct convolution only.
  BlockedLayout blocked_layout() const override { return BlockedLayout::mixed; }
  void use_layouts(const std::vector<Layout>& inputs, const std::vector<Layout>& outputs) override;
  // What use_layouts set (nchw before it).
  Layout input_layout() const { return in_layout_; }
  Layout output_layout() const { return out_layout_; }
  // Images lowered together by forward / backward on a slice of `rows` images (1 for
  // direct_1x1).
  index_t forward_chunk(index_t rows) const;
  index_t backward_chunk(index_t rows) const;

  // The gradients one backward computes.
  struct Wanted {
    bool dx, dw, db;
  };

  // For the algorithms (lib/layers/conv_algorithm.h), valid after setup().
  const ConvolutionParams& config() const { return config_; }
  const ConvGeometry& geometry() const { return geometry_; }
  using Layer::describe;
  LoweringShape lowering_shape(index_t images) const;
  // Images `lowering` lowers together on a slice of `rows` images.
  index_t forward_chunk(Lowering lowering, index_t rows) const;
  index_t backward_chunk(Lowering lowering, index_t rows) const;
  // Adds the bias to output rows [first, first + images) of the slice.
  void add_bias(const LayerSlice& slice, index_t first, index_t images) const;
  // Adds the bias gradient of the whole slice: dbias += sum of dy over images and positions.
  void add_bias_gradient(const LayerSlice& slice) const;

 private:
  // Whether this layer's operands are blocked on `driver` (use_layouts and the driver's
  // blocked_layout capability): then only direct, direct_plain, winograd and pointwise can run it.
  bool blocked_on(const Driver& driver) const;
  // The blocked one of the input's and output's layouts (the output's when both are), else
  // nchw.
  Layout blocked_layout_used() const;
  std::size_t lowered_bytes_per_image(Lowering lowering) const;
  index_t chunk_for(Lowering lowering, index_t rows, std::size_t target) const;
  std::size_t workspace_for(Lowering lowering, index_t rows) const;
  Wanted wanted(const LayerSlice& slice) const;
  // Whether backward writes the fused residual's gradient.
  bool wants_residual_gradient(const LayerSlice& slice) const;
  // What runs `direction` on the slice: lowering_for, or direct where its operands are
  // blocked and the choice was a lowering.
  Lowering for_operands(const LayerSlice& slice, ConvDirection direction) const;
  // Run the algorithm of `lowering` (detail::conv_algorithm), which computes the bias
  // gradient too where `want` asks for it.
  void run_forward(const LayerSlice& slice, Lowering lowering) const;
  void run_backward(const LayerSlice& slice, Lowering lowering, Wanted want) const;
  // The tuner's last step (conv_tune.cpp): both gradients by one algorithm where that is
  // faster than the directions' winners apart; `times`: options' seconds per direction.
  void choose_joint_backward(const LayerSlice& slice, const std::vector<Lowering>& options,
                             const std::vector<std::array<double, 3>>& times,
                             std::array<Lowering, 3>& choice) const;

  // The fused activation's gradient on dy, written to `to` (dy itself: in place).
  void activation_backward(const LayerSlice& slice, float* to) const;
  // The same for a fused ReLU, with the bias gradient added in the same pass.
  void relu_bias_backward(const LayerSlice& slice, float* to) const;
  // The gradients `want` asks for, from the slice's dy.
  void run_gradients(const LayerSlice& slice, Wanted want) const;

  ConvolutionParams config_;
  std::optional<FusedActivation> fused_;
  std::optional<FusedResidual> residual_;
  std::optional<FoldedNorm> folded_;
  Lowering lowering_ = Lowering::automatic;
  // What tune() chose, per driver name, indexed by ConvDirection.
  std::map<std::string, std::array<Lowering, 3>> chosen_;
  // Set by use_layouts: the layouts of the input and the output. Where either is blocked
  // (nChw16c or nChw8c), every direction is direct, direct_plain, winograd or pointwise.
  Layout in_layout_ = Layout::nchw, out_layout_ = Layout::nchw;
  ConvGeometry geometry_;  // set by setup()
};

}  // namespace hn
