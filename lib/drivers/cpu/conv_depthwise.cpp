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
//
// The forward and the data gradient on NCHW operands (depthwise_plain) run the same way: a
// task takes one image and 16 channels, transposes their planes of x (or dy) into a
// pixel-major buffer in cache (pixel_major.h), computes the output with one 16-lane
// multiply-add per tap (any stride, dilation or row length; four output pixels at a time
// where their windows lie inside the row; the data gradient gathers per input pixel the
// taps that read it), and transposes the result back into the caller's NCHW planes. Where
// oneDNN's depthwise kernel runs on blocked copies, the copies go through memory: stage 2 of
// ShuffleNet v2 (58 channels, 56x56, stride 2, batch 32) spent 6.2 ms of the 9 of its
// backward in reorders.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_depthwise.h"
#include "lib/drivers/cpu/pixel_major.h"

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

constexpr index_t kLanes = kPixelMajorLanes;

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
      // Four partial sums (output columns ow mod 4), added at the end: one chain of
      // multiply-adds would wait on its own latency at every pixel.
      constexpr index_t kChains = 4;
      float acc[kChains][L] = {};
      for (index_t oh = rows.lo; oh < rows.hi; ++oh) {
        const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
        const float* grow = gb + oh * out_w * L;
        const float* xrow = xb + ih * s.width * L;
        index_t ow = cols.lo;
        for (; ow + kChains <= cols.hi; ow += kChains) {
          for (index_t c = 0; c < kChains; ++c) {
            const index_t iw = (ow + c) * s.stride_w - s.pad_w + kw * s.dilation_w;
            const float* g = grow + (ow + c) * L;
            const float* v = xrow + iw * L;
            for (index_t l = 0; l < L; ++l)
              acc[c][l] += g[l] * v[l];
          }
        }
        for (; ow < cols.hi; ++ow) {
          const index_t iw = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
          const float* g = grow + ow * L;
          const float* v = xrow + iw * L;
          for (index_t l = 0; l < L; ++l)
            acc[(ow - cols.lo) % kChains][l] += g[l] * v[l];
        }
      }
      float* t = total + (kh * s.kernel_w + kw) * L;
      for (index_t l = 0; l < L; ++l)
        t[l] += (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
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
      if constexpr (L == kLanes) {
        to_pixel_major(data + (n * s.channels + block * L) * plane, plane, lanes, buffer.data());
        return static_cast<const float*>(buffer.data());
      }
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

bool depthwise_plain(const LoweringShape& s, index_t out_channels) {
  return s.plain_kernel && s.layout == Layout::nchw && s.out_layout == Layout::nchw &&
         depthwise_own(s, out_channels);
}

namespace {

// The taps [lo, hi) along one axis that read inside the input, per output coordinate.
std::vector<Range> taps_inside(index_t size, index_t out, index_t kernel, index_t stride,
                               index_t pad, index_t dilation) {
  std::vector<Range> taps(static_cast<std::size_t>(out));
  for (index_t o = 0; o < out; ++o) {
    index_t lo = kernel, hi = 0;
    for (index_t k = 0; k < kernel; ++k) {
      const index_t i = o * stride - pad + k * dilation;
      if (i < 0 || i >= size) continue;
      lo = std::min(lo, k);
      hi = k + 1;
    }
    taps[static_cast<std::size_t>(o)] = lo < hi ? Range{lo, hi} : Range{0, 0};
  }
  return taps;
}

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

// Output pixels computed together where their windows lie inside the row: one accumulator
// each, so a tap's multiply-adds overlap instead of waiting on each other (one accumulator
// per pixel ran at the latency of the chain, 4 cycles a tap).
constexpr index_t kBlockPixels = 4;

// Whether the taps `range` of a window are all of the kernel's.
struct FullRange {
  index_t kernel;
  bool operator()(const Range& r) const { return r.lo == 0 && r.hi == kernel; }
};

// Outputs ow .. ow + P - 1 of row oh (P accumulators), their taps kh_range x kw_range.
template <index_t P>
void forward_pixels(const LoweringShape& s, const float* in, const float* w, const float* b,
                    Range kh_range, Range kw_range, index_t oh, index_t ow, float* out) {
  float acc[P][kLanes];
  for (index_t p = 0; p < P; ++p)
    for (index_t l = 0; l < kLanes; ++l)
      acc[p][l] = b[l];
  for (index_t kh = kh_range.lo; kh < kh_range.hi; ++kh) {
    const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
    const float* row = in + ih * s.width * kLanes;
    for (index_t kw = kw_range.lo; kw < kw_range.hi; ++kw) {
      const float* k = w + (kh * s.kernel_w + kw) * kLanes;
      for (index_t p = 0; p < P; ++p) {
        const float* v = row + ((ow + p) * s.stride_w - s.pad_w + kw * s.dilation_w) * kLanes;
        for (index_t l = 0; l < kLanes; ++l)
          acc[p][l] += k[l] * v[l];
      }
    }
  }
  for (index_t p = 0; p < P; ++p)
    for (index_t l = 0; l < kLanes; ++l)
      out[p * kLanes + l] = acc[p][l];
}

// Per input row (column) of a data gradient: a (tap, output row (column)) pair that reads it.
struct Reader {
  index_t tap, out;
};

// Inputs iw .. iw + P - 1 of one row (P accumulators): each one's sum over the pairs that
// read it, by_row x by_col (for P > 1 the inputs after iw read the same taps, each at the
// output one further on: stride 1 inside the row), in (kh, kw) order.
template <index_t P>
void gather_pixels(const LoweringShape& s, const float* grad, index_t out_w, const float* w,
                   const std::vector<Reader>& by_row, const std::vector<Reader>& by_col,
                   float* out) {
  float acc[P][kLanes] = {};
  for (const Reader& r : by_row) {
    for (const Reader& c : by_col) {
      const float* g = grad + (r.out * out_w + c.out) * kLanes;
      const float* k = w + (r.tap * s.kernel_w + c.tap) * kLanes;
      for (index_t p = 0; p < P; ++p)
        for (index_t l = 0; l < kLanes; ++l)
          acc[p][l] += k[l] * g[p * kLanes + l];
    }
  }
  for (index_t p = 0; p < P; ++p)
    for (index_t l = 0; l < kLanes; ++l)
      out[p * kLanes + l] = acc[p][l];
}

}  // namespace

void depthwise_forward(Parallel& par, const LoweringShape& s, const float* x, const float* weights,
                       const float* bias, float* y) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  const std::vector<Range> rows =
      taps_inside(s.height, out_h, s.kernel_h, s.stride_h, s.pad_h, s.dilation_h);
  const std::vector<Range> cols =
      taps_inside(s.width, out_w, s.kernel_w, s.stride_w, s.pad_w, s.dilation_w);
  const FullRange full{s.kernel_w};
  const index_t cost = in_plane + out_plane * (taps + 1);
  for_channel_groups(
      par, s, weights, cost, [&](index_t n, index_t c0, index_t lanes, const float* w) {
        thread_local std::vector<float> in, out;
        in.resize(static_cast<std::size_t>(in_plane * kLanes));
        out.resize(static_cast<std::size_t>(out_plane * kLanes));
        to_pixel_major(x + (n * s.channels + c0) * in_plane, in_plane, lanes, in.data());
        float b[kLanes] = {};
        for (index_t l = 0; l < lanes && bias != nullptr; ++l)
          b[l] = bias[c0 + l];
        for (index_t oh = 0; oh < out_h; ++oh) {
          const Range kh_range = rows[static_cast<std::size_t>(oh)];
          for (index_t ow = 0; ow < out_w;) {
            const Range kw_range = cols[static_cast<std::size_t>(ow)];
            float* o = out.data() + (oh * out_w + ow) * kLanes;
            if (ow + kBlockPixels <= out_w && full(kw_range) &&
                full(cols[static_cast<std::size_t>(ow + kBlockPixels - 1)])) {
              forward_pixels<kBlockPixels>(s, in.data(), w, b, kh_range, kw_range, oh, ow, o);
              ow += kBlockPixels;
            } else {
              forward_pixels<1>(s, in.data(), w, b, kh_range, kw_range, oh, ow, o);
              ++ow;
            }
          }
        }
        from_pixel_major(out.data(), out_plane, lanes, y + (n * s.channels + c0) * out_plane);
      });
}

void depthwise_backward_data(Parallel& par, const LoweringShape& s, const float* weights,
                             const float* dy, float* dx) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  // Per input row (column): the (tap, output row (column)) pairs that read it, taps in
  // ascending order.
  const auto readers = [](index_t size, index_t out, index_t kernel, index_t stride, index_t pad,
                          index_t dilation) {
    std::vector<std::vector<Reader>> by_input(static_cast<std::size_t>(size));
    for (index_t k = 0; k < kernel; ++k) {
      for (index_t o = 0; o < out; ++o) {
        const index_t i = o * stride - pad + k * dilation;
        if (i >= 0 && i < size) by_input[static_cast<std::size_t>(i)].push_back({k, o});
      }
    }
    return by_input;
  };
  const auto rows = readers(s.height, out_h, s.kernel_h, s.stride_h, s.pad_h, s.dilation_h);
  const auto cols = readers(s.width, out_w, s.kernel_w, s.stride_w, s.pad_w, s.dilation_w);
  // A column read by every tap of the kernel's row.
  const auto full_row = [&](const std::vector<Reader>& by_col) {
    return static_cast<index_t>(by_col.size()) == s.kernel_w;
  };
  const index_t cost = 2 * in_plane * (1 + taps) + out_plane;
  for_channel_groups(
      par, s, weights, cost, [&](index_t n, index_t c0, index_t lanes, const float* w) {
        thread_local std::vector<float> grad, sums;
        grad.resize(static_cast<std::size_t>(out_plane * kLanes));
        sums.resize(static_cast<std::size_t>(in_plane * kLanes));
        to_pixel_major(dy + (n * s.channels + c0) * out_plane, out_plane, lanes, grad.data());
        // Each input pixel's sum over the (output pixel, tap) pairs that read it, in (kh, kw)
        // order; 0 where none does.
        for (index_t ih = 0; ih < s.height; ++ih) {
          const std::vector<Reader>& by_row = rows[static_cast<std::size_t>(ih)];
          for (index_t iw = 0; iw < s.width;) {
            const std::vector<Reader>& by_col = cols[static_cast<std::size_t>(iw)];
            float* o = sums.data() + (ih * s.width + iw) * kLanes;
            if (s.stride_w == 1 && iw + kBlockPixels <= s.width && full_row(by_col) &&
                full_row(cols[static_cast<std::size_t>(iw + kBlockPixels - 1)])) {
              gather_pixels<kBlockPixels>(s, grad.data(), out_w, w, by_row, by_col, o);
              iw += kBlockPixels;
            } else {
              gather_pixels<1>(s, grad.data(), out_w, w, by_row, by_col, o);
              ++iw;
            }
          }
        }
        from_pixel_major(sums.data(), in_plane, lanes, dx + (n * s.channels + c0) * in_plane);
      });
}

}  // namespace hn::detail::cpu
