// Convolution layer with Caffe's parameters and semantics, computed by lowering to GEMM on
// any driver. The lowering (CcT's type 1 or type 3, or none for 1x1 kernels) is chosen per
// layer by a cost model or forced through ConvolutionParams::lowering.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

// How a convolution becomes GEMMs (docs/layers.md explains each and the cost model).
enum class Lowering {
  automatic,   // the cheapest applicable one by the cost model (flops and bytes moved)
  type1,       // im2col over a chunk of images, one GEMM per group (CcT lowering type 1)
  type3,       // GEMM on the NHWC input with the kernel, then lift (CcT type 3; group 1)
  direct_1x1,  // 1x1 kernel, stride 1, no padding: the input already is the lowered matrix
  direct,      // the driver's own convolution (oneDNN on the CPU, cuDNN on CUDA): no lowering
  // The driver's own convolution computed on NCHW: where the Net keeps the activations
  // blocked, the driver reorders them in and out (oneDNN's GEMM-based kernels on the CPU).
  // The same as direct on drivers with one layout.
  direct_plain,
  // The driver's own Winograd convolution F(4x4, 3x3) (the CPU driver's; 3x3 kernels,
  // stride 1, one group, padding at most 2): on blocked or NCHW operands alike.
  winograd,
  // The driver's own 1x1 convolution on blocked operands (the CPU driver's; a 1x1 kernel, no
  // padding, any stride, one group, input and output in one blocked layout with channel
  // counts that are multiples of its block).
  pointwise,
  // The driver's own convolution in FP32 where its math mode would let it round (BF16 on a
  // CPU with BF16 kernels, Capabilities::fp32_convolution): a candidate of the measured
  // choice there, so that a call runs in BF16 only where that is faster. On blocked or NCHW
  // operands, as direct.
  direct_fp32,
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
  // Deconvolution only (ONNX's output_padding; not Caffe's): rows and columns added at the
  // bottom and right of the output, one value for both axes or two (height, width).
  std::vector<index_t> output_pad;
  // Not Caffe's: how to lower, and the bound on the lowered data of one chunk of images in
  // bytes (0: the library's measured default; at least one image is always lowered).
  Lowering lowering = Lowering::automatic;
  std::size_t chunk_bytes = 0;
};

// Input N x C x H x W; output N x num_output x H_out x W_out (Caffe's size rule). Params:
// weights [num_output][C / group][kernel_h][kernel_w], then bias [num_output] when
// bias_term. Output channel block g of num_output / group sees input channel block g.
std::unique_ptr<Layer> make_convolution_layer(std::string name, ConvolutionParams params);

// Caffe's Deconvolution (ONNX's ConvTranspose, PyTorch's conv_transpose2d): the gradient of
// a convolution with respect to its input, run forward. Input N x C x H x W; output N x
// num_output x H_out x W_out, H_out = stride * (H - 1) + dilation * (kernel - 1) + 1 -
// 2 * pad + output_pad. Params: weights [C][num_output / group][kernel_h][kernel_w] (a
// convolution's from the output back to the input), then bias [num_output]. Computed by the
// driver's direct convolution calls on NCHW (forward: conv_backward_data).
std::unique_ptr<Layer> make_deconvolution_layer(std::string name, ConvolutionParams params);

// How convolution layer `layer` (made by make_convolution_layer) computes on `driver`: the
// GEMM lowering its setup chose, or direct where the driver has its own convolution.
// Throws hn::Error when `layer` is not a convolution layer.
Lowering convolution_lowering(const Layer& layer, const Driver& driver);

}  // namespace hn
