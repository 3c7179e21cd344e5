// Small parameter structs for driver calls. All counts are int64; tensors are dense,
// row-major (NCHW for images). Each struct validates itself and derives output sizes by
// Caffe's rules, so every driver and every layer agree on them.
#pragma once

#include <cstdint>
#include <string>

namespace hn {

using index_t = std::int64_t;

enum class Transpose { no, yes };

// How a driver's GEMMs and convolutions may round inside a call (Driver::set_math_mode);
// tensors stay FP32 whatever the mode. fp32: full FP32 products and sums, the default.
// tf32: products of TF32-rounded inputs (10-bit mantissa) summed in FP32, on tensor cores
// (cuBLAS's and cuDNN's tensor-op math). bf16: products of BF16-rounded inputs summed in
// FP32 (cuBLAS's FP32-storage BF16-compute GEMM; convolutions in TF32 where cuDNN has no
// BF16 path from FP32 data; oneDNN's fpmath_mode bf16 on CPUs with AVX512_BF16 or AMX).
// A driver without such hardware computes FP32 and says so (Driver::math_note).
enum class MathMode { fp32, tf32, bf16 };
const char* math_mode_name(MathMode mode);  // "FP32", "TF32", "BF16"
// FP32, TF32 or BF16 in any case; an hn::Error naming the choices otherwise.
MathMode parse_math_mode(const std::string& text);

// How an image tensor [batch][channels][height][width] lies in memory. `nchw` is the
// dense row-major order. `nchw16c` (oneDNN's nChw16c) groups channels by 16 and keeps each
// group's 16 values of a pixel together: element (n, c, h, w) is at
//   ((n * channels / 16 + c / 16) * height * width + h * width + w) * 16 + c % 16,
// for channel counts that are multiples of 16 only (no padding: the same size as nchw,
// and a batch slice is the same rows). `nchw8c` (nChw8c) is the same with groups of 8.
// Vector kernels read them without reordering (16 floats are one AVX-512 vector, 8 one
// AVX2 vector); a net keeps its activations in its driver's preferred one between layers
// that take it (NetOptions::blocked_layout, Capabilities::preferred_blocked_layout).
// Tensors with height * width == 1 lie the same way in all three.
enum class Layout { nchw, nchw16c, nchw8c };
const char* layout_name(Layout layout);
// Channels per block: 16, 8, or 1 for nchw.
constexpr index_t layout_block(Layout layout) {
  return layout == Layout::nchw16c ? 16 : layout == Layout::nchw8c ? 8 : 1;
}
// Offset of element (n, c, h, w) of a [batch][channels][height][width] tensor in `layout`.
inline index_t layout_offset(Layout layout, index_t channels, index_t height, index_t width,
                             index_t n, index_t c, index_t h, index_t w) {
  if (layout == Layout::nchw) return ((n * channels + c) * height + h) * width + w;
  const index_t block = layout_block(layout);
  return ((n * (channels / block) + c / block) * height * width + h * width + w) * block +
         c % block;
}

// An element-wise activation a call applies to its own result in the same pass
// (Driver::conv_forward_activation): y = y > 0 ? y : slope * y (relu), or
// y = min(max(y, lo), hi) (clip; NaN stays NaN), or nothing (none).
struct Activation {
  enum class Kind { none, relu, clip };
  Kind kind = Kind::none;
  float slope = 0.0f;          // relu
  float lo = 0.0f, hi = 0.0f;  // clip, lo <= hi

  static Activation relu(float negative_slope) { return {Kind::relu, negative_slope, 0.0f, 0.0f}; }
  static Activation clip(float min, float max) { return {Kind::clip, 0.0f, min, max}; }
  // Throws hn::Error naming `call` for a clip with lo > hi (or a NaN bound).
  void validate(const char* call) const;
  // "relu slope 0", "clip [0, 6]" or "none".
  std::string to_string() const;
};

// Geometry of an im2col / col2im over a slice of `batch` images.
//
// Lowered layout (CcT lowering type 1, batched): a row-major matrix of
//   rows = channels * kernel_h * kernel_w          (ordered c, kh, kw)
//   cols = batch * out_h * out_w                   (ordered n, oh, ow)
// Group g of `groups` owns the contiguous row block
//   [g * rows / groups, (g + 1) * rows / groups),
// so a grouped convolution runs one GEMM per group on a row block with no extra copy.
struct LoweringShape {
  index_t batch = 0, channels = 0, height = 0, width = 0;
  index_t kernel_h = 1, kernel_w = 1;
  index_t pad_h = 0, pad_w = 0;
  index_t stride_h = 1, stride_w = 1;
  index_t dilation_h = 1, dilation_w = 1;
  index_t groups = 1;
  // Of x and dx (`layout`) and of y and dy (`out_layout`) in the direct convolution calls;
  // the lowering calls take nchw only.
  Layout layout = Layout::nchw, out_layout = Layout::nchw;
  // Direct convolution calls: compute on NCHW even where x or y are blocked (the driver
  // reorders them in and out), so the tuner can measure a plain-layout kernel against the
  // blocked one (Lowering::direct_plain). A driver with one layout of its own ignores it.
  bool plain_kernel = false;
  // Direct convolution calls: compute in FP32 though the driver's math mode would let them
  // round (Lowering::direct_fp32, where Capabilities::fp32_convolution). Others ignore it.
  bool fp32_kernel = false;
  // Direct convolution calls: compute with the driver's Winograd convolution (a 3x3 kernel,
  // stride 1; Lowering::winograd), where the driver has one (Capabilities::winograd).
  bool winograd = false;
  // Direct convolution calls: compute with the driver's own 1x1 kernels (Lowering::pointwise),
  // where the driver has them (Capabilities::pointwise).
  bool pointwise = false;
  // conv_forward(_activation): when not 0, names the weights' contents (Tensor versions,
  // lib/core/tensor.h): every call with the same weights address and version has the same
  // weights, so a driver may keep them in its own layout between calls. 0: unknown.
  std::uint64_t weights_version = 0;

  index_t out_h() const;
  index_t out_w() const;
  index_t rows() const { return channels * kernel_h * kernel_w; }
  index_t cols() const { return batch * out_h() * out_w(); }
  index_t image_count() const { return batch * channels * height * width; }
  index_t col_count() const { return rows() * cols(); }
  // Throws hn::Error naming `call` and the offending fields.
  void validate(const char* call) const;
  std::string to_string() const;
};

// Pooling geometry; out_h/out_w follow Caffe: ceil((in + 2*pad - kernel) / stride) + 1,
// minus one when the last window would start inside the bottom/right padding.
struct PoolShape {
  index_t batch = 0, channels = 0, height = 0, width = 0;
  index_t kernel_h = 1, kernel_w = 1;
  index_t stride_h = 1, stride_w = 1;
  index_t pad_h = 0, pad_w = 0;
  bool ceil_mode = true;  // Caffe's round_mode: CEIL (true) or FLOOR
  // AVE's divisor: the window clipped to the padded input (Caffe's, true), or to the input
  // (false: the padding left out, PyTorch's and ONNX's count_include_pad 0).
  bool count_include_pad = true;
  Layout layout = Layout::nchw;  // of x, y and their gradients

  index_t out_h() const;
  index_t out_w() const;
  index_t in_count() const { return batch * channels * height * width; }
  index_t out_count() const { return batch * channels * out_h() * out_w(); }
  void validate(const char* call) const;
  std::string to_string() const;
};

enum class LrnRegion { across_channels, within_channel };

// Local response normalisation with Caffe's parameters.
//   across_channels: scale = k + alpha/size * sum_{c' in window(c)} x^2;  y = x * scale^-beta
//   within_channel : scale = 1 + alpha * avgpool_{size x size, pad (size-1)/2}(x^2)
//                    (Caffe's AVE pooling divisor);                      y = x * scale^-beta
struct LrnShape {
  index_t batch = 0, channels = 0, height = 0, width = 0;
  index_t size = 5;
  float alpha = 1.0f, beta = 0.75f, k = 1.0f;
  LrnRegion region = LrnRegion::across_channels;
  // Of x, y, scale and the gradients; blocked across channels only, with windows of up to
  // 2 * block + 1 channels (33 on nChw16c, 17 on nChw8c).
  Layout layout = Layout::nchw;

  index_t count() const { return batch * channels * height * width; }
  void validate(const char* call) const;
  std::string to_string() const;
};

// A tensor viewed as [outer][channels][inner]: softmax runs over `channels`, bias adds a
// per-channel value.
struct AxisShape {
  index_t outer = 0, channels = 0, inner = 1;
  // scale_channels, bias_forward and bias_backward also take the blocked layouts, the tensor read
  // as [outer][channels][inner pixels] images; the other calls NCHW only.
  Layout layout = Layout::nchw;

  index_t count() const { return outer * channels * inner; }
  void validate(const char* call) const;
  std::string to_string() const;
};

}  // namespace hn
