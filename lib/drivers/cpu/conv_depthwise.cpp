// The CPU driver's own depthwise convolutions: the weight gradient on NCHW or blocked operands
// (nChw8c, nChw16c), for the shapes oneDNN 2.6 computes with its GEMM-based kernel (its
// depthwise weight-gradient kernel takes 3x3 windows only: EfficientNet's 5x5 depthwise layers
// at batch 32 took 47-72 ms each there on NCHW, 20x their forward, and 50-210 ms on nChw8c,
// reordered to NCHW for it, on an AVX2-only EPYC); and the forward and data gradient on NCHW
// operands (depthwise_plain), where oneDNN's depthwise kernel runs on blocked copies that go
// through memory (stage 2 of ShuffleNet v2, 58 channels, 56x56, stride 2, batch 32, spent
// 6.2 ms of the 9 of its backward in reorders).
//
// The output rows of these layers are short (7 to 112 columns), so the vectors run across
// channels: a task takes 16 channels (or a blocked operand's 8 or 16) of one image, or of
// every image for the weight gradient, and reads them as pixel-major images ([pixel][lanes]:
// the lanes side by side). NCHW planes are transposed into such buffers (pixel_major.h); a
// blocked operand's planes are pixel-major already.
//
// x goes into a buffer with zero margins as wide as the padding and as far as the last window
// reaches, so that every tap of every window reads inside it: the loops over the output pixels
// test nothing. (They had tested each tap's range, and the weight gradient had run tap by tap
// over whole planes, which outgrow the first-level cache at 28x28: ShuffleNet v2's 58-channel
// layers at batch 32 spent 1.1 ms in it, against 0.8 ms for the forward.)
// - Forward: a block of 8 output pixels of a row (4 without AVX-512), one accumulator each,
//   takes every tap in turn; a row's last block overlaps the one before it instead of running
//   pixel by pixel (it writes the same values again).
// - Data gradient at stride 1 (padding at most the window's reach): the same loop over dy in
//   a zero-margined buffer, with the window turned around. At other strides each output
//   pixel adds its dy times each tap's weights at the pixel the tap reads, into a zeroed
//   buffer padded like x's. (Each input pixel had gathered the pairs that read it: the
//   stride-2 layer above took 5.3 ms for its backward that way, 3.5 this way.)
// - Weight gradient: per output pixel, dy times the pixel's window of x into one accumulator
//   per tap (up to 12 taps at a time, 6 without AVX-512 on 16 lanes), and the bias's sum beside;
//   each image's sums are added to the totals in image order, so the result depends on the
//   shape only, not on the thread count.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_depthwise.h"
#include "lib/drivers/cpu/pixel_major.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace hn::detail::cpu {

namespace {

constexpr index_t kLanes = kPixelMajorLanes;

#if defined(__AVX512F__)
constexpr bool kWideVectors = true;
#else
constexpr bool kWideVectors = false;
#endif

// A window's size and how it moves and reads.
struct Window {
  index_t kernel_h, kernel_w, stride_h, stride_w, dilation_h, dilation_w;
  index_t taps() const { return kernel_h * kernel_w; }
};

Window window_of(const LoweringShape& s) {
  return {s.kernel_h, s.kernel_w, s.stride_h, s.stride_w, s.dilation_h, s.dilation_w};
}

// A pixel-major image with zero margins: pixel (h, w) of the image at row h + top, column
// w + left of `rows` x `cols` pixels.
struct Padded {
  index_t top, left, rows, cols;
  std::size_t floats(index_t lanes) const { return static_cast<std::size_t>(rows * cols * lanes); }
};

// x with its padding around it, and zeros past that as far as the last window reaches: every
// window of the forward (and of the weight gradient) reads inside.
Padded x_padding(const LoweringShape& s) {
  const index_t reach_h = (s.out_h() - 1) * s.stride_h + (s.kernel_h - 1) * s.dilation_h + 1;
  const index_t reach_w = (s.out_w() - 1) * s.stride_w + (s.kernel_w - 1) * s.dilation_w + 1;
  return {s.pad_h, s.pad_w, std::max(reach_h, s.pad_h + s.height),
          std::max(reach_w, s.pad_w + s.width)};
}

// Zeros the margins around the height x width pixels (16 lanes each) of a padded image.
void zero_margins(const Padded& p, index_t height, index_t width, float* image) {
  const auto zero = [&](index_t row, index_t col, index_t count) {
    std::fill_n(image + (row * p.cols + col) * kLanes, count * kLanes, 0.0f);
  };
  for (index_t r = 0; r < p.rows; ++r) {
    if (r < p.top || r >= p.top + height) {
      zero(r, 0, p.cols);
    } else {
      zero(r, 0, p.left);
      zero(r, p.left + width, p.cols - p.left - width);
    }
  }
}

// `lanes` NCHW planes (height x width) into the padded image `image` (16 lanes), margins
// zeroed.
void fill_padded(const float* planes, index_t height, index_t width, index_t lanes, const Padded& p,
                 float* image) {
  zero_margins(p, height, width, image);
  to_pixel_major_padded(planes, height, width, lanes, image, p.top, p.left, p.cols);
}

// out[p] for p < P (pixels ow .. ow + P - 1 of output row oh): b + the sum over the taps of
// w[tap] * the tap's pixel of the padded image `in` (`cols` columns; every tap inside).
template <index_t P>
void correlate_pixels(const Window& k, const float* in, index_t cols, const float* w,
                      const float* b, index_t oh, index_t ow, float* out) {
  float acc[P][kLanes];
  for (index_t p = 0; p < P; ++p)
    for (index_t l = 0; l < kLanes; ++l)
      acc[p][l] = b[l];
  const index_t step = k.stride_w * kLanes;
  for (index_t kh = 0; kh < k.kernel_h; ++kh) {
    const float* row =
        in + ((oh * k.stride_h + kh * k.dilation_h) * cols + ow * k.stride_w) * kLanes;
    for (index_t kw = 0; kw < k.kernel_w; ++kw) {
      const float* t = w + (kh * k.kernel_w + kw) * kLanes;
      const float* v = row + kw * k.dilation_w * kLanes;
      for (index_t p = 0; p < P; ++p)
        for (index_t l = 0; l < kLanes; ++l)
          acc[p][l] += t[l] * v[p * step + l];
    }
  }
  for (index_t p = 0; p < P; ++p)
    for (index_t l = 0; l < kLanes; ++l)
      out[p * kLanes + l] = acc[p][l];
}

// Output pixels computed together: one accumulator each, so that a tap's multiply-adds
// overlap instead of waiting on each other (one accumulator per pixel ran at the latency of
// the chain, 4 cycles a tap).
constexpr index_t kBlockPixels = kWideVectors ? 8 : 4;

// Output row oh (out_w pixels, pixel-major at out) in blocks of P pixels; the last block ends
// at the row's end, overlapping the one before it; rows shorter than P in smaller blocks.
template <index_t P>
void correlate_row(const Window& k, const float* in, index_t cols, const float* w, const float* b,
                   index_t oh, index_t out_w, float* out) {
  if constexpr (P > 1) {
    if (out_w < P) return correlate_row<P / 2>(k, in, cols, w, b, oh, out_w, out);
  }
  index_t ow = 0;
  for (; ow + P <= out_w; ow += P)
    correlate_pixels<P>(k, in, cols, w, b, oh, ow, out + ow * kLanes);
  if (ow < out_w) correlate_pixels<P>(k, in, cols, w, b, oh, out_w - P, out + (out_w - P) * kLanes);
}

// Every pixel of an out_h x out_w pixel-major output.
void correlate(const Window& k, const float* in, index_t cols, const float* w, const float* b,
               index_t out_h, index_t out_w, float* out) {
  for (index_t oh = 0; oh < out_h; ++oh)
    correlate_row<kBlockPixels>(k, in, cols, w, b, oh, out_w, out + oh * out_w * kLanes);
}

// Taps whose accumulators fit in registers beside the operands.
template <index_t L>
constexpr index_t kMaxTaps = kWideVectors || L == 8 ? 12 : 6;

// Adds to total[tap][L], for the taps of the R kernel rows from kh0 (KW taps each), the sum
// over the output pixels of dy * the tap's pixel of x (padded, `cols` columns): one
// accumulator per tap in a register, the pixels in order.
template <index_t L, index_t R, index_t KW>
void tap_rows(const Window& k, const float* x, index_t cols, const float* dy, index_t out_h,
              index_t out_w, index_t kh0, float* total) {
  float acc[R][KW][L] = {};
  const index_t row_step = k.dilation_h * cols * L, col_step = k.dilation_w * L;
  for (index_t oh = 0; oh < out_h; ++oh) {
    const float* g = dy + oh * out_w * L;
    const float* v = x + (oh * k.stride_h + kh0 * k.dilation_h) * cols * L;
    for (index_t ow = 0; ow < out_w; ++ow, g += L, v += k.stride_w * L) {
#pragma GCC unroll 4
      for (index_t r = 0; r < R; ++r) {
        const float* row = v + r * row_step;
#pragma GCC unroll 12
        for (index_t kw = 0; kw < KW; ++kw)
          for (index_t l = 0; l < L; ++l)
            acc[r][kw][l] += g[l] * row[kw * col_step + l];
      }
    }
  }
  for (index_t r = 0; r < R; ++r)
    for (index_t kw = 0; kw < KW; ++kw)
      for (index_t l = 0; l < L; ++l)
        total[((kh0 + r) * KW + kw) * L + l] += acc[r][kw][l];
}

// tap_rows for `rows` (1 to R) kernel rows from kh0.
template <index_t L, index_t KW, index_t R = std::max<index_t>(1, kMaxTaps<L> / KW)>
void tap_rows_of(index_t rows, const Window& k, const float* x, index_t cols, const float* dy,
                 index_t out_h, index_t out_w, index_t kh0, float* total) {
  if constexpr (R > 1) {
    if (rows < R) return tap_rows_of<L, KW, R - 1>(rows, k, x, cols, dy, out_h, out_w, kh0, total);
  }
  tap_rows<L, R, KW>(k, x, cols, dy, out_h, out_w, kh0, total);
}

// Every tap's sum for kernels KW wide: the kernel's rows in as few runs as fit in registers,
// of sizes within one of each other.
template <index_t L, index_t KW>
void tap_sums(const Window& k, const float* x, index_t cols, const float* dy, index_t out_h,
              index_t out_w, float* total) {
  constexpr index_t most = std::max<index_t>(1, kMaxTaps<L> / KW);
  const index_t runs = (k.kernel_h + most - 1) / most;
  for (index_t r = 0, kh0 = 0; r < runs; ++r) {
    const index_t rows = k.kernel_h * (r + 1) / runs - kh0;
    tap_rows_of<L, KW>(rows, k, x, cols, dy, out_h, out_w, kh0, total);
    kh0 += rows;
  }
}

// The same for any width: tap by tap, four partial sums over each row (added at the end).
template <index_t L>
void tap_sums_any(const Window& k, const float* x, index_t cols, const float* dy, index_t out_h,
                  index_t out_w, float* total) {
  for (index_t t = 0; t < k.taps(); ++t) {
    const index_t kh = t / k.kernel_w, kw = t % k.kernel_w;
    constexpr index_t kChains = 4;
    float acc[kChains][L] = {};
    for (index_t oh = 0; oh < out_h; ++oh) {
      const float* g = dy + oh * out_w * L;
      const float* v = x + ((oh * k.stride_h + kh * k.dilation_h) * cols + kw * k.dilation_w) * L;
      index_t ow = 0;
      for (; ow + kChains <= out_w; ow += kChains)
        for (index_t c = 0; c < kChains; ++c)
          for (index_t l = 0; l < L; ++l)
            acc[c][l] += g[(ow + c) * L + l] * v[(ow + c) * k.stride_w * L + l];
      for (; ow < out_w; ++ow)
        for (index_t l = 0; l < L; ++l)
          acc[0][l] += g[ow * L + l] * v[ow * k.stride_w * L + l];
    }
    for (index_t l = 0; l < L; ++l)
      total[t * L + l] += (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
  }
}

// Adds, for every tap and (dbias) the bias, one image's sums over its output pixels into
// total[tap][L] (the bias's after the taps'): x padded (`cols` columns), dy pixel-major.
template <index_t L>
void image_sums(const LoweringShape& s, const float* x, index_t cols, const float* dy, bool bias,
                float* total) {
  const Window k = window_of(s);
  const index_t out_h = s.out_h(), out_w = s.out_w(), taps = k.taps();
  switch (k.kernel_w) {
    case 3:
      tap_sums<L, 3>(k, x, cols, dy, out_h, out_w, total);
      break;
    case 5:
      tap_sums<L, 5>(k, x, cols, dy, out_h, out_w, total);
      break;
    case 7:
      tap_sums<L, 7>(k, x, cols, dy, out_h, out_w, total);
      break;
    default:
      tap_sums_any<L>(k, x, cols, dy, out_h, out_w, total);
  }
  if (bias) {
    // Four partial sums, added at the end: one chain of adds would wait on its own latency.
    constexpr index_t kChains = 4;
    float acc[kChains][L] = {};
    const index_t pixels = out_h * out_w;
    index_t p = 0;
    for (; p + kChains <= pixels; p += kChains)
      for (index_t c = 0; c < kChains; ++c)
        for (index_t l = 0; l < L; ++l)
          acc[c][l] += dy[(p + c) * L + l];
    for (; p < pixels; ++p)
      for (index_t l = 0; l < L; ++l)
        acc[p % kChains][l] += dy[p * L + l];
    float* t = total + taps * L;
    for (index_t l = 0; l < L; ++l)
      t[l] += (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
  }
}

}  // namespace

bool depthwise_own(const LoweringShape& s, index_t out_channels) {
  const index_t in_block = layout_block(s.layout), out_block = layout_block(s.out_layout);
  return s.groups > 1 && s.groups == s.channels && out_channels == s.channels &&
         (in_block == 1 || out_block == 1 || in_block == out_block);
}

namespace {

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

// L channels at a time, every image: each image's planes of x copied into a padded
// pixel-major buffer, and of dy read in place where their layout has blocks of L channels
// (pixel-major already), else copied from NCHW into a pixel-major buffer.
template <index_t L>
void backward_weights_in_blocks(Parallel& par, const LoweringShape& s, const float* x,
                                const float* dy, float* dweights, float* dbias) {
  const index_t taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  const index_t blocks = (s.channels + L - 1) / L;
  const bool x_blocked = layout_block(s.layout) == L, dy_blocked = layout_block(s.out_layout) == L;
  const Padded pad = x_padding(s);
  // Per block: the copies, and every tap over every output pixel of every image.
  const index_t cost =
      s.batch * L * (in_plane + (dy_blocked ? 0 : out_plane) + out_plane * (taps + 1));
  par.for_range(blocks, cost, [&](index_t first, index_t last) {
    std::vector<float> xb(pad.floats(L));  // margins zero, and never written
    std::vector<float> gb(dy_blocked ? 0 : static_cast<std::size_t>(out_plane * L));
    std::vector<float> total(static_cast<std::size_t>((taps + 1) * L));
    // Image n's channels of `block` (`lanes` of them), pixel-major: NCHW planes copied into
    // `buffer` (at `to`, rows of `cols` pixels); a blocked one's in place, or copied when
    // `copy`.
    const auto pixel_major = [&](const float* data, bool blocked, bool copy, index_t height,
                                 index_t width, index_t n, index_t block, index_t lanes, float* to,
                                 index_t cols) -> const float* {
      const index_t plane = height * width;
      if (blocked) {
        const float* from = data + (n * blocks + block) * plane * L;
        if (!copy) return from;
        for (index_t h = 0; h < height; ++h)
          std::memcpy(to + h * cols * L, from + h * width * L,
                      static_cast<std::size_t>(width * L) * sizeof(float));
        return to;
      }
      const float* planes = data + (n * s.channels + block * L) * plane;
      if constexpr (L == kLanes) {
        to_pixel_major_padded(planes, height, width, lanes, to, 0, 0, cols);
        return to;
      }
      for (index_t h = 0; h < height; ++h)
        for (index_t w = 0; w < width; ++w)
          for (index_t l = 0; l < L; ++l)
            to[(h * cols + w) * L + l] = l < lanes ? planes[l * plane + h * width + w] : 0.0f;
      return to;
    };
    for (index_t block = first; block < last; ++block) {
      const index_t lanes = std::min(L, s.channels - block * L);
      std::fill(total.begin(), total.end(), 0.0f);
      float* x_at = xb.data() + (pad.top * pad.cols + pad.left) * L;
      for (index_t n = 0; n < s.batch; ++n) {
        pixel_major(x, x_blocked, true, s.height, s.width, n, block, lanes, x_at, pad.cols);
        const float* gp = pixel_major(dy, dy_blocked, false, s.out_h(), s.out_w(), n, block, lanes,
                                      gb.data(), s.out_w());
        image_sums<L>(s, xb.data(), pad.cols, gp, dbias != nullptr, total.data());
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

bool depthwise_plain(const LoweringShape& s, index_t out_channels) {
  return s.plain_kernel && s.layout == Layout::nchw && s.out_layout == Layout::nchw &&
         depthwise_own(s, out_channels);
}

namespace {

// body(n, c0, lanes, weights) for every image n and group of kLanes channels from c0
// (`lanes` of them), with their weights pixel-major ([tap][kLanes], zero past `lanes`).
template <class Body>
void for_channel_groups(Parallel& par, const LoweringShape& s, const float* weights, index_t cost,
                        const Body& body) {
  const index_t taps = s.kernel_h * s.kernel_w;
  const index_t groups = (s.channels + kLanes - 1) / kLanes;
  par.for_range(s.batch * groups, cost * kLanes, [&](index_t first, index_t last) {
    std::vector<float> w(static_cast<std::size_t>(taps * kLanes));
    for (index_t item = first; item < last; ++item) {
      const index_t n = item / groups, c0 = item % groups * kLanes;
      const index_t lanes = std::min(kLanes, s.channels - c0);
      to_pixel_major(weights + c0 * taps, taps, lanes, w.data());
      body(n, c0, lanes, w.data());
    }
  });
}

// Whether the data gradient is a correlation of dy with the window turned around: stride 1,
// and padding within the window's reach (dy, padded by the rest of the reach, covers every
// input pixel's window).
bool gathers_by_correlation(const LoweringShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= (s.kernel_h - 1) * s.dilation_h &&
         s.pad_w <= (s.kernel_w - 1) * s.dilation_w;
}

// Adds w[tap] * g at every tap's pixel of `at` (the window's first pixel).
void scatter_pixel(const Window& k, index_t cols, const float* __restrict g,
                   const float* __restrict w, float* __restrict at) {
  for (index_t kh = 0; kh < k.kernel_h; ++kh) {
    float* row = at + kh * k.dilation_h * cols * kLanes;
    for (index_t kw = 0; kw < k.kernel_w; ++kw) {
      const float* t = w + (kh * k.kernel_w + kw) * kLanes;
      float* v = row + kw * k.dilation_w * kLanes;
      for (index_t l = 0; l < kLanes; ++l)
        v[l] += t[l] * g[l];
    }
  }
}

// The data gradient at any stride into dx padded like x (x_padding, `cols` columns, zeroed
// first): each output pixel's dy, times each tap's weights, added at the pixel the tap reads
// (in the order of the output pixels, then of the taps).
void scatter(const Window& k, const float* grad, index_t out_h, index_t out_w, const float* w,
             index_t cols, float* sums) {
  for (index_t oh = 0; oh < out_h; ++oh)
    for (index_t ow = 0; ow < out_w; ++ow)
      scatter_pixel(k, cols, grad + (oh * out_w + ow) * kLanes, w,
                    sums + (oh * k.stride_h * cols + ow * k.stride_w) * kLanes);
}

}  // namespace

void depthwise_forward(Parallel& par, const LoweringShape& s, const float* x, const float* weights,
                       const float* bias, float* y) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  const Padded pad = x_padding(s);
  const Window k = window_of(s);
  const index_t cost = in_plane + out_plane * (taps + 1);
  for_channel_groups(
      par, s, weights, cost, [&](index_t n, index_t c0, index_t lanes, const float* w) {
        thread_local std::vector<float> in, out;
        in.resize(pad.floats(kLanes));
        out.resize(static_cast<std::size_t>(out_plane * kLanes));
        fill_padded(x + (n * s.channels + c0) * in_plane, s.height, s.width, lanes, pad, in.data());
        float b[kLanes] = {};
        for (index_t l = 0; l < lanes && bias != nullptr; ++l)
          b[l] = bias[c0 + l];
        correlate(k, in.data(), pad.cols, w, b, out_h, out_w, out.data());
        from_pixel_major(out.data(), out_plane, lanes, y + (n * s.channels + c0) * out_plane);
      });
}

void depthwise_backward_data(Parallel& par, const LoweringShape& s, const float* weights,
                             const float* dy, float* dx) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  const Window k = window_of(s);
  const index_t cost = 2 * in_plane + out_plane * (1 + taps);
  if (!gathers_by_correlation(s)) {
    const Padded pad = x_padding(s);
    for_channel_groups(
        par, s, weights, cost, [&](index_t n, index_t c0, index_t lanes, const float* w) {
          thread_local std::vector<float> grad, sums;
          grad.resize(static_cast<std::size_t>(out_plane * kLanes));
          sums.assign(pad.floats(kLanes), 0.0f);
          to_pixel_major(dy + (n * s.channels + c0) * out_plane, out_plane, lanes, grad.data());
          scatter(k, grad.data(), out_h, out_w, w, pad.cols, sums.data());
          from_pixel_major_padded(sums.data(), s.height, s.width, lanes,
                                  dx + (n * s.channels + c0) * in_plane, pad.top, pad.left,
                                  pad.cols);
        });
    return;
  }
  // dy padded by the window's reach less the padding, before and after: dx[i][j] is the sum
  // over the taps of w[kh][kw] * padded dy[i + (kernel_h - 1 - kh) * dilation_h][...].
  const index_t reach_h = (s.kernel_h - 1) * s.dilation_h,
                reach_w = (s.kernel_w - 1) * s.dilation_w;
  const Padded pad{reach_h - s.pad_h, reach_w - s.pad_w, s.height + reach_h, s.width + reach_w};
  const Window turned{s.kernel_h, s.kernel_w, 1, 1, s.dilation_h, s.dilation_w};
  for_channel_groups(
      par, s, weights, cost, [&](index_t n, index_t c0, index_t lanes, const float* w) {
        thread_local std::vector<float> grad, sums, flipped;
        grad.resize(pad.floats(kLanes));
        sums.resize(static_cast<std::size_t>(in_plane * kLanes));
        flipped.resize(static_cast<std::size_t>(taps * kLanes));
        fill_padded(dy + (n * s.channels + c0) * out_plane, out_h, out_w, lanes, pad, grad.data());
        for (index_t t = 0; t < taps; ++t)
          std::copy_n(w + (taps - 1 - t) * kLanes, kLanes, flipped.data() + t * kLanes);
        const float zero[kLanes] = {};
        correlate(turned, grad.data(), pad.cols, flipped.data(), zero, s.height, s.width,
                  sums.data());
        from_pixel_major(sums.data(), in_plane, lanes, dx + (n * s.channels + c0) * in_plane);
      });
}

}  // namespace hn::detail::cpu
