// The weight gradient of a depthwise convolution on NCHW or blocked operands (nChw8c,
// nChw16c), for the shapes oneDNN 2.6 computes with its GEMM-based kernel (its depthwise
// weight-gradient kernel takes 3x3 windows only): EfficientNet's 5x5 depthwise layers at
// batch 32 took 47-72 ms each there on NCHW, 20x their forward, and 50-210 ms on nChw8c
// (reordered to NCHW for it) on an AVX2-only EPYC.
//
// dW[c][kh][kw] = sum over images and output pixels of dy[n][c][oh][ow] *
// x[n][c][oh * stride - pad + kh * dilation][ow * stride - pad + kw * dilation]. The output
// rows of these layers are short (7 to 28 columns), so the vectors run across channels: a
// task takes 16 channels (or a blocked operand's 8 or 16), copies each image's planes of x
// and of dy that are NCHW into pixel-major buffers ([pixel][lanes]; a blocked operand's
// planes are pixel-major already), and for each tap adds dy * x over the output pixels into
// one sum per lane (a fixed-size loop the compiler vectorises: 16 lanes are one AVX-512
// register, two AVX2 ones). Each image's sum is added to the tap's total in image order, so
// the result depends on the shape only, not on the thread count.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_depthwise.h"

#include <algorithm>
#include <vector>

namespace hn::detail::cpu {

namespace {

// Outputs [lo, hi) along one axis whose tap k reads inside the input: 0 <= o * stride -
// pad + k * dilation < size.
struct Range {
  index_t lo, hi;
};

Range valid(index_t size, index_t out, index_t stride, index_t pad, index_t offset) {
  // o * stride >= pad - offset, and o * stride <= size - 1 + pad - offset.
  const index_t first = pad - offset;
  index_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const index_t last = size - 1 + pad - offset;
  index_t hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

}  // namespace

bool depthwise_own(const LoweringShape& s, index_t out_channels) {
  const index_t in_block = layout_block(s.layout), out_block = layout_block(s.out_layout);
  return s.groups > 1 && s.groups == s.channels && out_channels == s.channels &&
         (in_block == 1 || out_block == 1 || in_block == out_block);
}

namespace {

// Adds, for every tap and (dbias) the bias, the sum over one image's output pixels of dy * x
// into total[tap][L], on pixel-major planes ([pixel][L]: L channels side by side).
template <index_t L>
void image_sums(const LoweringShape& s, const float* xb, const float* gb, bool bias, float* total) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  for (index_t kh = 0; kh < s.kernel_h; ++kh) {
    const Range rows = valid(s.height, out_h, s.stride_h, s.pad_h, kh * s.dilation_h);
    for (index_t kw = 0; kw < s.kernel_w; ++kw) {
      const Range cols = valid(s.width, out_w, s.stride_w, s.pad_w, kw * s.dilation_w);
      float acc[L] = {};
      for (index_t oh = rows.lo; oh < rows.hi; ++oh) {
        const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
        const float* grow = gb + oh * out_w * L;
        const float* xrow = xb + ih * s.width * L;
        for (index_t ow = cols.lo; ow < cols.hi; ++ow) {
          const index_t iw = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
          const float* g = grow + ow * L;
          const float* v = xrow + iw * L;
          for (index_t l = 0; l < L; ++l)
            acc[l] += g[l] * v[l];
        }
      }
      float* t = total + (kh * s.kernel_w + kw) * L;
      for (index_t l = 0; l < L; ++l)
        t[l] += acc[l];
    }
  }
  if (bias) {
    float acc[L] = {};
    for (index_t p = 0; p < out_h * out_w; ++p)
      for (index_t l = 0; l < L; ++l)
        acc[l] += gb[p * L + l];
    float* t = total + s.kernel_h * s.kernel_w * L;
    for (index_t l = 0; l < L; ++l)
      t[l] += acc[l];
  }
}

// Adds the channels [c0, c0 + lanes) of total ([tap + bias][L]) into dweights and dbias.
template <index_t L>
void add_totals(const LoweringShape& s, const std::vector<float>& total, index_t c0, index_t lanes,
                float* dweights, float* dbias) {
  const index_t taps = s.kernel_h * s.kernel_w;
  for (index_t l = 0; l < lanes; ++l) {
    for (index_t k = 0; k < taps; ++k)
      dweights[(c0 + l) * taps + k] += total[static_cast<std::size_t>(k * L + l)];
    if (dbias != nullptr) dbias[c0 + l] += total[static_cast<std::size_t>(taps * L + l)];
  }
}

// L channels at a time: each image's planes of x and dy read in place where their layout has
// blocks of L channels (pixel-major already), else copied from NCHW into pixel-major buffers.
template <index_t L>
void backward_weights_in_blocks(Parallel& par, const LoweringShape& s, const float* x,
                                const float* dy, float* dweights, float* dbias) {
  const index_t taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  const index_t blocks = (s.channels + L - 1) / L;
  const bool x_blocked = layout_block(s.layout) == L, dy_blocked = layout_block(s.out_layout) == L;
  // Per block: the copies, and every tap over every output pixel of every image.
  const index_t cost =
      s.batch * L *
      ((x_blocked ? 0 : in_plane) + (dy_blocked ? 0 : out_plane) + out_plane * (taps + 1));
  par.for_range(blocks, cost, [&](index_t first, index_t last) {
    std::vector<float> xb(x_blocked ? 0 : static_cast<std::size_t>(in_plane * L));
    std::vector<float> gb(dy_blocked ? 0 : static_cast<std::size_t>(out_plane * L));
    std::vector<float> total(static_cast<std::size_t>((taps + 1) * L));
    // Image n's pixel-major planes of `block`'s channels (`lanes` of them): in place, or copied.
    const auto planes = [&](const float* data, bool blocked, index_t plane, index_t n,
                            index_t block, index_t lanes, std::vector<float>& buffer) {
      if (blocked) return data + (n * blocks + block) * plane * L;
      for (index_t l = 0; l < lanes; ++l) {
        const float* from = data + (n * s.channels + block * L + l) * plane;
        for (index_t p = 0; p < plane; ++p)
          buffer[static_cast<std::size_t>(p * L + l)] = from[p];
      }
      return static_cast<const float*>(buffer.data());
    };
    for (index_t block = first; block < last; ++block) {
      const index_t lanes = std::min(L, s.channels - block * L);
      std::fill(total.begin(), total.end(), 0.0f);
      if (lanes < L) {  // (NCHW only) the missing channels stay 0 and add nothing
        std::fill(xb.begin(), xb.end(), 0.0f);
        std::fill(gb.begin(), gb.end(), 0.0f);
      }
      for (index_t n = 0; n < s.batch; ++n) {
        const float* xp = planes(x, x_blocked, in_plane, n, block, lanes, xb);
        const float* gp = planes(dy, dy_blocked, out_plane, n, block, lanes, gb);
        image_sums<L>(s, xp, gp, dbias != nullptr, total.data());
      }
      add_totals<L>(s, total, block * L, lanes, dweights, dbias);
    }
  });
}

}  // namespace

void depthwise_backward_weights(Parallel& par, const LoweringShape& s, const float* x,
                                const float* dy, float* dweights, float* dbias) {
  const index_t block = std::max(layout_block(s.layout), layout_block(s.out_layout));
  if (block == 8) return backward_weights_in_blocks<8>(par, s, x, dy, dweights, dbias);
  backward_weights_in_blocks<16>(par, s, x, dy, dweights, dbias);
}

}  // namespace hn::detail::cpu
