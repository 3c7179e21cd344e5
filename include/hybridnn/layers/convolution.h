// Convolution layer with Caffe's parameters and semantics, computed by lowering to GEMM on
// any driver. The lowering (CcT's type 1 or type 3, or none for 1x1 kernels) is chosen per
// layer by a cost model or forced through ConvolutionParams::lowering.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "hybridnn/layer.h"

namespace hn {

// How a convolution becomes GEMMs (docs/layers.md explains each and the cost model).
enum class Lowering {
  automatic,   // the cheapest applicable one by the cost model (flops and bytes moved)
  type1,       // im2col over a chunk of images, one GEMM per group (CcT lowering type 1)
  type3,       // GEMM on the NHWC input with the kernel, then lift (CcT type 3; group 1)
  direct_1x1,  // 1x1 kernel, stride 1, no padding: the input already is the lowered matrix
  direct,      // the driver's own convolution (oneDNN on the CPU, cuDNN on CUDA): no lowering
};
const char* lowering_name(Lowering lowering);

// Caffe's ConvolutionParameter. The repeated fields (kernel_size, stride, pad, dilation)
// hold one value for both spatial axes or two (height, width); kernel_h/kernel_w,
// stride_h/stride_w and pad_h/pad_w are Caffe's 2-D alternatives and come in pairs.
// Unset: stride 1, pad 0, dilation 1; the kernel size must be given.
struct ConvolutionParams {
  index_t num_output = 0;
  bool bias_term = true;
  std::vector<index_t> kernel_size;
  std::vector<index_t> stride;
  std::vector<index_t> pad;
  std::vector<index_t> dilation;
  std::optional<index_t> kernel_h, kernel_w;
  std::optional<index_t> stride_h, stride_w;
  std::optional<index_t> pad_h, pad_w;
  index_t group = 1;
  // Not Caffe's: how to lower, and the bound on the lowered data of one chunk of images in
  // bytes (0: the library's measured default; at least one image is always lowered).
  Lowering lowering = Lowering::automatic;
  std::size_t chunk_bytes = 0;
};

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
  // What runs on `driver`: with Lowering::automatic, the driver's direct convolution when it
  // has one (capability `convolution`: it moves no lowered bytes, so the cost model always
  // prefers it), else lowering().
  Lowering lowering_for(const Driver& driver) const;
  // Images lowered together by forward / backward on a slice of `rows` images (1 for
  // direct_1x1).
  index_t forward_chunk(index_t rows) const;
  index_t backward_chunk(index_t rows) const;

 private:
  LoweringShape lowering_shape(index_t images) const;
  std::size_t lowered_bytes_per_image() const;
  index_t chunk_for(index_t rows, std::size_t target) const;
  void add_bias(const LayerSlice& slice, index_t first, index_t images) const;
  void add_bias_gradient(const LayerSlice& slice) const;
  void forward_type1(const LayerSlice& slice) const;
  void forward_type3(const LayerSlice& slice) const;
  void forward_direct(const LayerSlice& slice) const;
  void backward_type1(const LayerSlice& slice) const;
  void backward_type3(const LayerSlice& slice) const;
  void backward_direct(const LayerSlice& slice) const;
  void forward_driver_conv(const LayerSlice& slice) const;
  void backward_driver_conv(const LayerSlice& slice) const;

  ConvolutionParams config_;
  Lowering lowering_ = Lowering::automatic;
  // Resolved geometry (set by setup()).
  index_t channels_ = 0, height_ = 0, width_ = 0;
  index_t kernel_h_ = 0, kernel_w_ = 0, stride_h_ = 1, stride_w_ = 1;
  index_t pad_h_ = 0, pad_w_ = 0, dilation_h_ = 1, dilation_w_ = 1;
  index_t out_h_ = 0, out_w_ = 0;
};

}  // namespace hn
