// The CPU driver's own direct convolution for layers with very few input channels (a net's
// first layer: LeNet's conv1 has 1 channel, 5x5, stride 1; ShuffleNet v2's 3, 3x3, stride
// 2), forward, data gradient and weight gradient, on NCHW directly with AVX-512.
//
// oneDNN's kernels block output channels by 16 (LeNet conv1: 20 padded to 32), and the
// caller's NCHW tensors are reordered into that layout and back on every call, which cost
// as much as the convolution itself (forward 0.40 ms + 0.30 ms of reorder at batch 64 on
// one thread). Here each output row is a few 16-lane vectors: the taps of one input row
// are loaded once (masked at the borders) and multiplied into 8 output channels at a time.
// With a column stride S > 1 each image is first copied with its rows split into S phases
// (columns p, p + S, p + 2S, ... of a row together), so that the 16 inputs of a tap are
// again 16 consecutive floats: ShuffleNet v2's conv1 (3 -> 24 channels, 224x224, batch 32)
// took 10 ms forward and 10 ms for its weight gradient in oneDNN's kernels, both a fifth
// of the machine's FMA rate.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_small.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hn::detail::cpu {

#if defined(__AVX512F__)

namespace {

constexpr index_t kLanes = 16;
// Output channels per pass of the forward (8 accumulators) and of the weight gradient (4
// channels times up to kMaxKernelW taps: 20 accumulators).
constexpr index_t kForwardBlock = 8;
constexpr index_t kGradientBlock = 4;
constexpr index_t kMaxChannels = 4;
constexpr index_t kMaxKernelW = 5;
constexpr index_t kMaxKernelH = 11;
constexpr index_t kMaxStride = 4;
// Images per partial weight gradient. The partials are summed in a fixed order, so the
// result does not depend on the thread count.
constexpr index_t kImagesPerPart = 8;

// The valid lanes of the 16 outputs starting at column ow0 for kernel column kw: output
// inside the row and input column inside the image.
__mmask16 tap_mask(const LoweringShape& s, index_t out_w, index_t ow0, index_t kw) {
  std::uint32_t bits = 0;
  for (index_t lane = 0; lane < kLanes; ++lane) {
    const index_t ow = ow0 + lane, iw = ow * s.stride_w - s.pad_w + kw;
    if (ow < out_w && iw >= 0 && iw < s.width) bits |= 1u << lane;
  }
  return static_cast<__mmask16>(bits);
}

__mmask16 store_mask(index_t out_w, index_t ow0) {
  const index_t lanes = std::min(kLanes, out_w - ow0);
  return static_cast<__mmask16>((1u << lanes) - 1u);
}

// Floats of one row of an image split into phases: S phases of ceil(width / S) each.
index_t phase_width(const LoweringShape& s) {
  return (s.width + s.stride_w - 1) / s.stride_w;
}
index_t phased_row(const LoweringShape& s) {
  return s.stride_w * phase_width(s);
}

// Where lane 0's input for kernel column kw lies, from output column 0's place in the row
// of phases: input column ow * S - pad + kw is column (ow + off) of phase p, where
// kw - pad = off * S + p with 0 <= p < S.
index_t tap_offset(const LoweringShape& s, index_t kw) {
  const index_t q = kw - s.pad_w, stride = s.stride_w;
  const index_t phase = ((q % stride) + stride) % stride;
  return phase * phase_width(s) + (q - phase) / stride;
}

// image (channels x height x width) -> rows of phases (channels x height x S x
// ceil(width / S)), the columns past the width zero.
void split_phases(const LoweringShape& s, const float* image, float* phased) {
  const index_t stride = s.stride_w, wp = phase_width(s), rows = s.channels * s.height;
  for (index_t r = 0; r < rows; ++r) {
    const float* in = image + r * s.width;
    float* out = phased + r * stride * wp;
    index_t j = 0;
    if (stride == 2) {
      // 16 columns of each phase from 32 of the row.
      const __m512i even =
          _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
      const __m512i odd =
          _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
      for (; 2 * (j + kLanes) <= s.width; j += kLanes) {
        const __m512 lo = _mm512_loadu_ps(in + 2 * j), hi = _mm512_loadu_ps(in + 2 * j + kLanes);
        _mm512_storeu_ps(out + j, _mm512_permutex2var_ps(lo, even, hi));
        _mm512_storeu_ps(out + wp + j, _mm512_permutex2var_ps(lo, odd, hi));
      }
    }
    for (index_t p = 0; p < stride; ++p) {
      for (index_t k = j; k < wp; ++k) {
        const index_t iw = k * stride + p;
        out[p * wp + k] = iw < s.width ? in[iw] : 0.0f;
      }
    }
  }
}

// The image as the kernels read it: itself with stride 1, else split into phases in
// `scratch` (resized as needed).
const float* phased_image(const LoweringShape& s, const float* image, std::vector<float>& scratch) {
  if (s.stride_w == 1) return image;
  scratch.resize(static_cast<std::size_t>(s.channels * s.height * phased_row(s)));
  split_phases(s, image, scratch.data());
  return scratch.data();
}

// The inputs of one 16-wide output vector: per tap inside the image, the input address of
// lane 0, the lane mask, and the tap's index in a weight row [c][kh][kw].
struct Taps {
  explicit Taps(index_t capacity)
      : at(static_cast<std::size_t>(capacity)),
        mask(static_cast<std::size_t>(capacity)),
        weight(static_cast<std::size_t>(capacity)) {}
  void add(const float* address, __mmask16 lanes, index_t weight_index) {
    const auto i = static_cast<std::size_t>(count++);
    at[i] = address;
    mask[i] = lanes;
    weight[i] = weight_index;
  }
  index_t count = 0;
  std::vector<const float*> at;
  std::vector<__mmask16> mask;
  std::vector<index_t> weight;
};

// Output channels [co0, co0 + B) of one output vector: B accumulators that stay in
// registers (B is a constant, so the loop over it unrolls).
// The activation on a vector of outputs, as relu_forward and clip_forward compute it
// (NaN stays NaN).
__m512 activate(__m512 v, const Activation& a) {
  switch (a.kind) {
    case Activation::Kind::relu: {
      const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
      return _mm512_mask_blend_ps(positive, _mm512_mul_ps(v, _mm512_set1_ps(a.slope)), v);
    }
    case Activation::Kind::clip:
      return _mm512_min_ps(_mm512_set1_ps(a.hi), _mm512_max_ps(_mm512_set1_ps(a.lo), v));
    case Activation::Kind::none:
      break;
  }
  return v;
}

template <int B>
void forward_block(const Taps& t, const float* weights, index_t taps, const float* bias,
                   const Activation& activation, float* y, index_t out_plane, __mmask16 out_mask) {
  __m512 acc[B];
#pragma GCC unroll 8
  for (int j = 0; j < B; ++j)
    acc[j] = bias != nullptr ? _mm512_set1_ps(bias[j]) : _mm512_setzero_ps();
  const index_t count = t.count;
  const float* const* at = t.at.data();
  const __mmask16* masks = t.mask.data();
  const index_t* offsets = t.weight.data();
  for (index_t i = 0; i < count; ++i) {
    const __m512 v = _mm512_maskz_loadu_ps(masks[i], at[i]);
    const float* w = weights + offsets[i];
#pragma GCC unroll 8
    for (int j = 0; j < B; ++j)
      acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j * taps]), v, acc[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < B; ++j)
    _mm512_mask_storeu_ps(y + j * out_plane, out_mask, activate(acc[j], activation));
}

using ForwardBlock = void (*)(const Taps&, const float*, index_t, const float*, const Activation&,
                              float*, index_t, __mmask16);

ForwardBlock forward_kernel(index_t block) {
  static constexpr ForwardBlock kernels[] = {
      nullptr,           &forward_block<1>, &forward_block<2>, &forward_block<3>, &forward_block<4>,
      &forward_block<5>, &forward_block<6>, &forward_block<7>, &forward_block<8>};
  return kernels[block];
}

// Masked-off lanes are neither read nor faulted on; the address of lane 0 may lie before
// the row (left padding), so it is formed as an integer.
const float* lane0(const float* row, index_t offset) {
  return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(row) +
                                        static_cast<std::uintptr_t>(offset) * sizeof(float));
}

// x: the image in phases (phased_image).
void forward_image(const LoweringShape& s, index_t out_channels, const float* x,
                   const float* weights, const float* bias, const Activation& activation,
                   float* y) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), out_plane = out_h * out_w;
  const index_t taps = s.channels * s.kernel_h * s.kernel_w, row_floats = phased_row(s);
  index_t offsets[kMaxKernelW];
  for (index_t kw = 0; kw < s.kernel_w; ++kw)
    offsets[kw] = tap_offset(s, kw);
  // Row by row, so that each output channel's row is written in one sweep.
  const index_t chunks = (out_w + kLanes - 1) / kLanes;
  std::vector<__mmask16> masks(static_cast<std::size_t>(chunks * s.kernel_w));
  for (index_t chunk = 0; chunk < chunks; ++chunk) {
    for (index_t kw = 0; kw < s.kernel_w; ++kw)
      masks[static_cast<std::size_t>(chunk * s.kernel_w + kw)] =
          tap_mask(s, out_w, chunk * kLanes, kw);
  }
  Taps t(taps);
  for (index_t oh = 0; oh < out_h; ++oh) {
    for (index_t chunk = 0; chunk < chunks; ++chunk) {
      const index_t ow0 = chunk * kLanes;
      const __mmask16* chunk_masks = masks.data() + chunk * s.kernel_w;
      t.count = 0;
      for (index_t c = 0; c < s.channels; ++c) {
        for (index_t kh = 0; kh < s.kernel_h; ++kh) {
          const index_t ih = oh * s.stride_h - s.pad_h + kh;
          if (ih < 0 || ih >= s.height) continue;
          const float* row = x + (c * s.height + ih) * row_floats;
          for (index_t kw = 0; kw < s.kernel_w; ++kw)
            t.add(lane0(row, ow0 + offsets[kw]), chunk_masks[kw],
                  (c * s.kernel_h + kh) * s.kernel_w + kw);
        }
      }
      const __mmask16 out_mask = store_mask(out_w, ow0);
      for (index_t co0 = 0; co0 < out_channels; co0 += kForwardBlock) {
        const index_t block = std::min(kForwardBlock, out_channels - co0);
        forward_kernel(block)(t, weights + co0 * taps, taps, bias != nullptr ? bias + co0 : nullptr,
                              activation, y + (co0 * out_h + oh) * out_w + ow0, out_plane,
                              out_mask);
      }
    }
  }
}

// The data gradient's outputs [0, B) of one 16-wide vector: for each tap (a kernel row and
// column: dy's row at lane 0 and the mask, the weights' offset), the sum over the output
// channels co of w[co][j][kh][kw] * dy[co][...] (dy's channels `dy_plane` floats apart,
// the weights' `per_co`, the outputs' `kernel`). Four output channels at a time into four
// sets of accumulators (B is at most 4: one set alone would wait on its own sums).
template <int B>
void data_block(const Taps& t, index_t out_channels, index_t dy_plane, const float* weights,
                index_t per_co, index_t kernel, float* y, index_t y_plane, __mmask16 out_mask) {
  constexpr int kSets = 4;
  __m512 acc[kSets][B];
#pragma GCC unroll 4
  for (int k = 0; k < kSets; ++k) {
#pragma GCC unroll 4
    for (int j = 0; j < B; ++j)
      acc[k][j] = _mm512_setzero_ps();
  }
  for (index_t i = 0; i < t.count; ++i) {
    const float* at = t.at[static_cast<std::size_t>(i)];
    const __mmask16 mask = t.mask[static_cast<std::size_t>(i)];
    const float* w = weights + t.weight[static_cast<std::size_t>(i)];
    index_t co = 0;
    for (; co + kSets <= out_channels; co += kSets) {
#pragma GCC unroll 4
      for (int k = 0; k < kSets; ++k) {
        const __m512 v = _mm512_maskz_loadu_ps(mask, lane0(at, (co + k) * dy_plane));
#pragma GCC unroll 4
        for (int j = 0; j < B; ++j)
          acc[k][j] =
              _mm512_fmadd_ps(_mm512_set1_ps(w[(co + k) * per_co + j * kernel]), v, acc[k][j]);
      }
    }
    for (; co < out_channels; ++co) {
      const __m512 v = _mm512_maskz_loadu_ps(mask, lane0(at, co * dy_plane));
#pragma GCC unroll 4
      for (int j = 0; j < B; ++j)
        acc[0][j] = _mm512_fmadd_ps(_mm512_set1_ps(w[co * per_co + j * kernel]), v, acc[0][j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j) {
    const __m512 sum =
        _mm512_add_ps(_mm512_add_ps(acc[0][j], acc[1][j]), _mm512_add_ps(acc[2][j], acc[3][j]));
    _mm512_mask_storeu_ps(y + j * y_plane, out_mask, sum);
  }
}

using DataBlock = void (*)(const Taps&, index_t, index_t, const float*, index_t, index_t, float*,
                           index_t, __mmask16);

DataBlock data_kernel(index_t block) {
  static constexpr DataBlock kernels[] = {nullptr, &data_block<1>, &data_block<2>, &data_block<3>,
                                          &data_block<4>};
  return kernels[block];
}

// The data gradient of one image: dx[c][ih][iw] = sum over (co, kh, kw) of
// w[co][c][kh][kw] * dy[co][oh][ow] where ih = oh * stride_h - pad_h + kh and
// iw = ow * S - pad_w + kw. Computed phase by phase (iw = j * S + p, into `phased`, rows of
// phases as split_phases lays them out): for phase p the kernel columns with
// (p + pad_w - kw) % S == 0 read dy at ow = j + (p + pad_w - kw) / S, so 16 consecutive j
// read 16 consecutive ow, a masked load as in the forward, with the image's channels the
// block of outputs (data_block, B = channels).
void backward_data_image(const LoweringShape& s, index_t out_channels, const float* weights,
                         const float* dy, float* phased) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), out_plane = out_h * out_w;
  const index_t stride = s.stride_w, wp = phase_width(s), row_floats = phased_row(s);
  const index_t kernel = s.kernel_h * s.kernel_w, per_co = s.channels * kernel;
  const index_t chunks = (wp + kLanes - 1) / kLanes;
  // Per phase and chunk: the lanes to write, and per kernel column the lanes that read dy
  // (0: the column reads nothing there) and its column offset d.
  struct Column {
    __mmask16 lanes = 0;
    index_t d = 0;
  };
  std::vector<__mmask16> inside(static_cast<std::size_t>(stride * chunks));
  std::vector<Column> columns(static_cast<std::size_t>(stride * chunks * s.kernel_w));
  for (index_t p = 0; p < stride; ++p) {
    for (index_t chunk = 0; chunk < chunks; ++chunk) {
      const index_t j0 = chunk * kLanes, at = p * chunks + chunk;
      std::uint32_t write = 0;
      for (index_t l = 0; l < kLanes; ++l) {
        const index_t j = j0 + l;
        if (j < wp && j * stride + p < s.width) write |= 1u << l;
      }
      inside[static_cast<std::size_t>(at)] = static_cast<__mmask16>(write);
      for (index_t kw = 0; kw < s.kernel_w; ++kw) {
        const index_t q = p + s.pad_w - kw;
        if (((q % stride) + stride) % stride != 0) continue;
        const index_t d = q / stride;  // exact
        std::uint32_t lanes = 0;
        for (index_t l = 0; l < kLanes; ++l) {
          const index_t ow = j0 + l + d;
          if ((write >> l & 1u) != 0 && ow >= 0 && ow < out_w) lanes |= 1u << l;
        }
        columns[static_cast<std::size_t>(at * s.kernel_w + kw)] =
            Column{static_cast<__mmask16>(lanes), d};
      }
    }
  }
  Taps t(kernel);
  for (index_t ih = 0; ih < s.height; ++ih) {
    for (index_t p = 0; p < stride; ++p) {
      for (index_t chunk = 0; chunk < chunks; ++chunk) {
        const index_t j0 = chunk * kLanes, at = p * chunks + chunk;
        t.count = 0;
        for (index_t kh = 0; kh < s.kernel_h; ++kh) {
          const index_t r = ih + s.pad_h - kh;
          if (r < 0 || r % s.stride_h != 0 || r / s.stride_h >= out_h) continue;
          const float* row = dy + (r / s.stride_h) * out_w;
          for (index_t kw = 0; kw < s.kernel_w; ++kw) {
            const Column& c = columns[static_cast<std::size_t>(at * s.kernel_w + kw)];
            if (c.lanes != 0) t.add(lane0(row, j0 + c.d), c.lanes, kh * s.kernel_w + kw);
          }
        }
        data_kernel(s.channels)(t, out_channels, out_plane, weights, per_co, kernel,
                                phased + ih * row_floats + p * wp + j0, s.height * row_floats,
                                inside[static_cast<std::size_t>(at)]);
      }
    }
  }
}

// The reverse of split_phases: rows of phases back into the image's rows.
void merge_phases(const LoweringShape& s, const float* phased, float* image) {
  const index_t stride = s.stride_w, wp = phase_width(s), rows = s.channels * s.height;
  for (index_t r = 0; r < rows; ++r) {
    const float* in = phased + r * stride * wp;
    float* out = image + r * s.width;
    index_t j = 0;
    if (stride == 2) {
      // 32 columns of the row from 16 of each phase.
      const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i high =
          _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      for (; 2 * (j + kLanes) <= s.width; j += kLanes) {
        const __m512 even = _mm512_loadu_ps(in + j), odd = _mm512_loadu_ps(in + wp + j);
        _mm512_storeu_ps(out + 2 * j, _mm512_permutex2var_ps(even, low, odd));
        _mm512_storeu_ps(out + 2 * j + kLanes, _mm512_permutex2var_ps(even, high, odd));
      }
    }
    for (index_t iw = j * stride; iw < s.width; ++iw)
      out[iw] = in[(iw % stride) * wp + iw / stride];
  }
}

// One output vector of the weight gradient's sums: dy at lane 0 of the block's first
// channel, the input row of phases at lane 0's output column, and the masks.
struct Step {
  const float* dy;  // output channel 0
  const float* x;
  __mmask16 out_mask;
  const __mmask16* masks;  // per kernel column
};

// Output channels [co0, co0 + B), kernel columns 0..KW-1 of one (c, kh): B * KW accumulators
// in registers over every step, then added to partial[j][kw][lane] (j-stride `co_stride`).
// Kernel column kw reads from `offsets[kw]` after a step's x (tap_offset).
template <int B, int KW>
void gradient_block(const Step* steps, index_t count, index_t co0, index_t out_plane,
                    const index_t* offsets, float* partial, index_t co_stride) {
  __m512 acc[B][KW];
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j) {
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw)
      acc[j][kw] = _mm512_setzero_ps();
  }
  for (index_t i = 0; i < count; ++i) {
    const Step& st = steps[i];
    __m512 g[B];
#pragma GCC unroll 4
    for (int j = 0; j < B; ++j)
      g[j] = _mm512_maskz_loadu_ps(st.out_mask, st.dy + (co0 + j) * out_plane);
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw) {
      const __m512 v = _mm512_maskz_loadu_ps(st.masks[kw], lane0(st.x, offsets[kw]));
#pragma GCC unroll 4
      for (int j = 0; j < B; ++j)
        acc[j][kw] = _mm512_fmadd_ps(g[j], v, acc[j][kw]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < B; ++j) {
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw) {
      float* to = partial + j * co_stride + kw * kLanes;
      _mm512_storeu_ps(to, _mm512_add_ps(_mm512_loadu_ps(to), acc[j][kw]));
    }
  }
}

using GradientBlock = void (*)(const Step*, index_t, index_t, index_t, const index_t*, float*,
                               index_t);

template <int KW>
GradientBlock gradient_block_for(index_t block) {
  switch (block) {
    case 1:
      return &gradient_block<1, KW>;
    case 2:
      return &gradient_block<2, KW>;
    case 3:
      return &gradient_block<3, KW>;
    default:
      return &gradient_block<4, KW>;
  }
}

GradientBlock gradient_kernel(index_t block, index_t kernel_w) {
  switch (kernel_w) {
    case 1:
      return gradient_block_for<1>(block);
    case 2:
      return gradient_block_for<2>(block);
    case 3:
      return gradient_block_for<3>(block);
    case 4:
      return gradient_block_for<4>(block);
    default:
      return gradient_block_for<5>(block);
  }
}

// Adds, for images [first, last), the lane-wise partial sums of every weight's gradient
// to partial[co][c][kh][kw][lane] and of every bias's to bias_partial[co][lane].
void gradient_images(const LoweringShape& s, index_t out_channels, const float* x, const float* dy,
                     index_t first, index_t last, float* partial, float* bias_partial) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), out_plane = out_h * out_w;
  const index_t in_image = s.channels * s.height * s.width;
  const index_t chunks = (out_w + kLanes - 1) / kLanes, kernel_w = s.kernel_w;
  std::vector<__mmask16> masks(static_cast<std::size_t>(chunks * kernel_w));
  for (index_t chunk = 0; chunk < chunks; ++chunk) {
    for (index_t kw = 0; kw < kernel_w; ++kw)
      masks[chunk * kernel_w + kw] = tap_mask(s, out_w, chunk * kLanes, kw);
  }
  std::vector<Step> steps(static_cast<std::size_t>(out_h * chunks));
  const index_t co_stride = s.channels * s.kernel_h * kernel_w * kLanes;
  const index_t row_floats = phased_row(s);
  index_t offsets[kMaxKernelW];
  for (index_t kw = 0; kw < kernel_w; ++kw)
    offsets[kw] = tap_offset(s, kw);
  std::vector<float> scratch;
  for (index_t n = first; n < last; ++n) {
    const float* image = phased_image(s, x + n * in_image, scratch);
    const float* grad = dy + n * out_channels * out_plane;
    if (bias_partial != nullptr) {
      for (index_t co = 0; co < out_channels; ++co) {
        __m512 sum = _mm512_setzero_ps();
        for (index_t oh = 0; oh < out_h; ++oh) {
          for (index_t ow0 = 0; ow0 < out_w; ow0 += kLanes) {
            sum =
                _mm512_add_ps(sum, _mm512_maskz_loadu_ps(store_mask(out_w, ow0),
                                                         grad + co * out_plane + oh * out_w + ow0));
          }
        }
        float* to = bias_partial + co * kLanes;
        _mm512_storeu_ps(to, _mm512_add_ps(_mm512_loadu_ps(to), sum));
      }
    }
    for (index_t c = 0; c < s.channels; ++c) {
      for (index_t kh = 0; kh < s.kernel_h; ++kh) {
        index_t count = 0;
        for (index_t oh = 0; oh < out_h; ++oh) {
          const index_t ih = oh * s.stride_h - s.pad_h + kh;
          if (ih < 0 || ih >= s.height) continue;
          const float* row = image + (c * s.height + ih) * row_floats;
          for (index_t chunk = 0; chunk < chunks; ++chunk) {
            const index_t ow0 = chunk * kLanes;
            steps[count++] = Step{grad + oh * out_w + ow0, row + ow0, store_mask(out_w, ow0),
                                  masks.data() + chunk * kernel_w};
          }
        }
        for (index_t co0 = 0; co0 < out_channels; co0 += kGradientBlock) {
          const index_t block = std::min(kGradientBlock, out_channels - co0);
          gradient_kernel(block, kernel_w)(
              steps.data(), count, co0, out_plane, offsets,
              partial + ((co0 * s.channels + c) * s.kernel_h + kh) * kernel_w * kLanes, co_stride);
        }
      }
    }
  }
}

}  // namespace

bool small_conv_supported(const LoweringShape& s) {
  return s.layout == Layout::nchw && s.out_layout == Layout::nchw && !s.plain_kernel &&
         s.groups == 1 && s.channels <= kMaxChannels && s.stride_w <= kMaxStride &&
         s.dilation_h == 1 && s.dilation_w == 1 && s.kernel_w <= kMaxKernelW &&
         s.kernel_h <= kMaxKernelH && s.out_w() >= kLanes / 2;
}

void small_conv_forward(Parallel& par, const LoweringShape& s, index_t out_channels, const float* x,
                        const float* weights, const float* bias, const Activation& activation,
                        float* y) {
  const index_t in_image = s.channels * s.height * s.width;
  const index_t out_image = out_channels * s.out_h() * s.out_w();
  const index_t cost = out_image * s.channels * s.kernel_h * s.kernel_w / 8;
  par.for_range(s.batch, cost, [&](index_t first, index_t last) {
    std::vector<float> scratch;
    for (index_t n = first; n < last; ++n) {
      forward_image(s, out_channels, phased_image(s, x + n * in_image, scratch), weights, bias,
                    activation, y + n * out_image);
    }
  });
}

void small_conv_backward_data(Parallel& par, const LoweringShape& s, index_t out_channels,
                              const float* weights, const float* dy, float* dx) {
  const index_t in_image = s.channels * s.height * s.width;
  const index_t out_image = out_channels * s.out_h() * s.out_w();
  const index_t cost = out_image * s.channels * s.kernel_h * s.kernel_w / 8;
  par.for_range(s.batch, cost, [&](index_t first, index_t last) {
    std::vector<float> scratch;
    if (s.stride_w > 1)
      scratch.resize(static_cast<std::size_t>(s.channels * s.height * phased_row(s)));
    for (index_t n = first; n < last; ++n) {
      float* image = dx + n * in_image;
      backward_data_image(s, out_channels, weights, dy + n * out_image,
                          s.stride_w > 1 ? scratch.data() : image);
      if (s.stride_w > 1) merge_phases(s, scratch.data(), image);
    }
  });
}

void small_conv_backward_weights(Parallel& par, const LoweringShape& s, index_t out_channels,
                                 const float* x, const float* dy, float* dweights, float* dbias) {
  const index_t weights = out_channels * s.channels * s.kernel_h * s.kernel_w;
  const index_t parts = (s.batch + kImagesPerPart - 1) / kImagesPerPart;
  const index_t part_floats = (weights + out_channels) * kLanes;
  std::vector<float> partials(static_cast<std::size_t>(parts * part_floats), 0.0f);
  const index_t cost = kImagesPerPart * out_channels * s.out_h() * s.out_w() * s.channels *
                       s.kernel_h * s.kernel_w / 8;
  par.for_range(parts, cost, [&](index_t first, index_t last) {
    for (index_t p = first; p < last; ++p) {
      float* partial = partials.data() + p * part_floats;
      gradient_images(s, out_channels, x, dy, p * kImagesPerPart,
                      std::min(s.batch, (p + 1) * kImagesPerPart), partial,
                      dbias != nullptr ? partial + weights * kLanes : nullptr);
    }
  });
  // Parts in order, lanes in _mm512_reduce_add_ps's order: the same sums on any thread count.
  auto total = [&](index_t i) {
    float sum = 0.0f;
    for (index_t p = 0; p < parts; ++p)
      sum += _mm512_reduce_add_ps(_mm512_loadu_ps(partials.data() + p * part_floats + i * kLanes));
    return sum;
  };
  for (index_t i = 0; i < weights; ++i)
    dweights[i] += total(i);
  if (dbias != nullptr) {
    for (index_t co = 0; co < out_channels; ++co)
      dbias[co] += total(weights + co);
  }
}

#else  // no AVX-512 at compile time: oneDNN computes these shapes

bool small_conv_supported(const LoweringShape&) {
  return false;
}
void small_conv_forward(Parallel&, const LoweringShape&, index_t, const float*, const float*,
                        const float*, const Activation&, float*) {}
void small_conv_backward_data(Parallel&, const LoweringShape&, index_t, const float*, const float*,
                              float*) {}
void small_conv_backward_weights(Parallel&, const LoweringShape&, index_t, const float*,
                                 const float*, float*, float*) {}

#endif

}  // namespace hn::detail::cpu
