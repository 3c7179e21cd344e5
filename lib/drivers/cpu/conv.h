// The CPU driver's direct convolution: oneDNN's convolution primitives on NCHW tensors and
// plain [out][in/groups][kh][kw] weights, with primitives cached per shape (creating one
// costs far more than running a small one).
#pragma once

#include <memory>

#include "lib/core/shapes.h"
#include "lib/drivers/cpu/blas.h"

namespace hn::detail::cpu {

class Parallel;  // parallel.h (kept out: kernels.h must include Eigen before TBB)

class DirectConvolution {
 public:
  // True when this build has oneDNN; without it every call below throws hn::Error.
  static bool available();
  // The blocked activation layout oneDNN's kernels compute on here: nChw16c with AVX-512,
  // nChw8c with AVX2 or less (any other takes a reorder each way per call).
  static Layout preferred_layout();
  // Whether oneDNN's call applies `activation` itself: a ReLU, or a clip from 0 (ReLU6,
  // HardSigmoid's 0..1). A NaN result may come out as -infinity then (conv_primitives.cpp).
  static bool fuses(const Activation& activation);
  // True when oneDNN has BF16 convolution kernels on this CPU (AVX512_BF16, or AMX).
  static bool bf16_available();
  // Which of the two oneDNN's BF16 kernels use here: "AMX" or "AVX512_BF16" (ONEDNN_MAX_CPU_ISA
  // may hold it below the CPU's); empty where bf16_available() is false.
  static const char* bf16_isa();
  // The vector extension oneDNN's FP32 kernels use here: avx512_core, avx2, avx or sse41
  // (ONEDNN_MAX_CPU_ISA may hold it below the CPU's); "none" without oneDNN.
  static const char* isa();

  DirectConvolution();
  ~DirectConvolution();
  DirectConvolution(const DirectConvolution&) = delete;
  DirectConvolution& operator=(const DirectConvolution&) = delete;

  // BF16 products for the calls after it, where bf16_available() (the driver's math mode
  // BF16): each call's inputs rounded to BF16 (x and the weights forward; the weights and
  // dy for the data gradient; x and dy for the weight gradient), sums and results in FP32.
  // The calls oneDNN has no fast BF16 kernel for (it would pick a reference or GEMM-based
  // one), those whose FP32 choice is a plain-layout kernel or Winograd per group, the
  // lowered data gradient and conv_small.h's stay FP32.
  void set_bf16(bool on) { bf16_ = on && bf16_available(); }

  // Layers with very few input channels (LeNet's conv1) run on conv_small.h's kernels.
  // `residual` (when not null, laid out as y) is added to y, then `activation` applied: in
  // oneDNN's call where it runs the same kernel with them (its binary and eltwise post-ops;
  // the activation where fuses()), else by the driver's kernels after it.
  void forward(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* x,
               const float* weights, const float* bias, float* y, const Activation& activation = {},
               const float* residual = nullptr);
  // Shapes whose input channels oneDNN would pad heavily (3 channels blocked by 16), or
  // whose few input channels it would compute with its GEMM-based kernel (3 with AVX2), are
  // lowered instead: a GEMM per image and col2im, on `par` and `blas`.
  void backward_data(Parallel& par, Blas blas, const LoweringShape& shape, index_t out_channels,
                     const float* weights, const float* dy, float* dx);
  // Adds to dweights and, when not null, to dbias.
  void backward_weights(Parallel& par, const LoweringShape& shape, index_t out_channels,
                        const float* x, const float* dy, float* dweights, float* dbias);
  // Both gradients (either may be null), with dy brought into the primitives' layout once
  // when they share it.
  void backward(Parallel& par, Blas blas, const LoweringShape& shape, index_t out_channels,
                const float* x, const float* weights, const float* dy, float* dx, float* dweights,
                float* dbias);

 private:
  struct Impl;
  const struct Entry* fused_entry(const LoweringShape& shape, index_t out_channels, bool has_bias,
                                  const Activation& activation, bool sum);
  // BF16 for this call: the mode's, unless the shape asks for FP32 (LoweringShape::fp32_kernel,
  // the measured choice's direct_fp32).
  bool bf16_for(const LoweringShape& shape) const { return bf16_ && !shape.fp32_kernel; }
  std::unique_ptr<Impl> impl_;
  bool bf16_ = false;
};

}  // namespace hn::detail::cpu
