// Batched lowering on the CPU: im2col / col2im over a whole batch slice, swap_axes, and the
// lifting of CcT lowering type 3. Both lowering directions work on one (image, channel)
// plane per task: im2col because the plane stays in cache for all kernel_h * kernel_w rows
// it feeds, col2im because a task that owns its output plane needs no atomics or locks.
// Lifting works on one output row (image, oh) per task for the same reason.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <cstring>
#include <vector>

namespace hn::detail::cpu {

void im2col(Parallel& par, const LoweringShape& s, const float* images, float* columns) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), plane = s.height * s.width;
  const index_t cols = s.cols(), per_image = out_h * out_w;
  const index_t cost = s.kernel_h * s.kernel_w * per_image;
  // Task (c, n) writes the n-th segment of the kernel_h * kernel_w rows of channel c.
  par.for_range(s.channels * s.batch, cost, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t c = item / s.batch, n = item % s.batch;
      const float* src = images + (n * s.channels + c) * plane;
      for (index_t kh = 0; kh < s.kernel_h; ++kh) {
        for (index_t kw = 0; kw < s.kernel_w; ++kw) {
          const index_t row = (c * s.kernel_h + kh) * s.kernel_w + kw;
          float* dst = columns + row * cols + n * per_image;
          const index_t w_offset = kw * s.dilation_w - s.pad_w;
          const OutputRange ow = valid_outputs(w_offset, s.stride_w, s.width, out_w);
          for (index_t oh = 0; oh < out_h; ++oh, dst += out_w) {
            const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
            if (ih < 0 || ih >= s.height) {
              std::fill(dst, dst + out_w, 0.0f);
              continue;
            }
            const float* line = src + ih * s.width;  // input column w_offset + x * stride
            std::fill(dst, dst + ow.lo, 0.0f);
            if (s.stride_w == 1) {
              std::memcpy(dst + ow.lo, line + w_offset + ow.lo, sizeof(float) * (ow.hi - ow.lo));
            } else {
              for (index_t x = ow.lo; x < ow.hi; ++x)
                dst[x] = line[w_offset + x * s.stride_w];
            }
            std::fill(dst + ow.hi, dst + out_w, 0.0f);
          }
        }
      }
    }
  });
}

void col2im(Parallel& par, const LoweringShape& s, const float* columns, float* images) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), plane = s.height * s.width;
  const index_t cols = s.cols(), per_image = out_h * out_w;
  const index_t cost = s.kernel_h * s.kernel_w * per_image + plane;
  const index_t stride = s.stride_w;
  // With stride > 1 a row is summed de-interleaved: input column stride * j + r is kept at
  // acc[r * phase_len + j], so every tap adds a contiguous run (CaffeNet conv1, stride 4:
  // the strided scatter ran at ~0.6 ns per column entry).
  const index_t phase_len = (s.width + stride - 1) / stride + 1;
  // Per kernel column: where its taps land (phase r, shift q) and which outputs stay inside.
  struct Tap {
    index_t offset, r, q;
    OutputRange ow;
  };
  std::vector<Tap> taps(static_cast<std::size_t>(s.kernel_w));
  for (index_t kw = 0; kw < s.kernel_w; ++kw) {
    Tap& t = taps[kw];
    t.offset = kw * s.dilation_w - s.pad_w;
    t.r = ((t.offset % stride) + stride) % stride;
    t.q = (t.offset - t.r) / stride;
    t.ow = valid_outputs(t.offset, stride, s.width, out_w);
  }
  // Task (n, c) owns image plane (n, c), row by row. Per pixel, contributions are added in
  // (kh, kw) order, the order of a plain loop over the column matrix.
  par.for_range(s.batch * s.channels, cost, [&](index_t first, index_t last) {
    std::vector<float> acc(static_cast<std::size_t>(stride > 1 ? stride * phase_len : 0));
    for (index_t item = first; item < last; ++item) {
      const index_t n = item / s.channels, c = item % s.channels;
      float* dst = images + item * plane;
      for (index_t ih = 0; ih < s.height; ++ih) {
        float* line = dst + ih * s.width;
        float* sum = stride > 1 ? acc.data() : line;
        std::fill(sum, sum + (stride > 1 ? stride * phase_len : s.width), 0.0f);
        for (index_t kh = 0; kh < s.kernel_h; ++kh) {
          const index_t top = ih + s.pad_h - kh * s.dilation_h;  // oh * stride_h
          if (top < 0 || top % s.stride_h != 0 || top / s.stride_h >= out_h) continue;
          const index_t oh = top / s.stride_h;
          const float* src =
              columns + (c * s.kernel_h + kh) * s.kernel_w * cols + n * per_image + oh * out_w;
          for (index_t kw = 0; kw < s.kernel_w; ++kw, src += cols) {
            const Tap& t = taps[kw];
            if (stride == 1) {
              float* to = line + t.offset;
              for (index_t x = t.ow.lo; x < t.ow.hi; ++x)
                to[x] += src[x];
            } else {
              // input column offset + x * stride = stride * (x + q) + r
              float* phase = acc.data() + t.r * phase_len + t.q;
              for (index_t x = t.ow.lo; x < t.ow.hi; ++x)
                phase[x] += src[x];
            }
          }
        }
        if (stride > 1) {
          for (index_t r = 0; r < stride && r < s.width; ++r) {
            const float* phase = sum + r * phase_len;
            const index_t count = (s.width - 1 - r) / stride + 1;
            for (index_t j = 0; j < count; ++j)
              line[j * stride + r] = phase[j];
          }
        }
      }
    }
  });
}

void swap_axes(Parallel& par, index_t d0, index_t d1, index_t inner, const float* src, float* dst) {
  const std::size_t run = sizeof(float) * inner;
  if (inner >= 16) {
    // Long runs: one memcpy per (j, i), tasks in destination order.
    par.for_range(d1 * d0, inner, [&](index_t first, index_t last) {
      for (index_t item = first; item < last; ++item) {
        const index_t j = item / d0, i = item % d0;
        std::memcpy(dst + item * inner, src + (i * d1 + j) * inner, run);
      }
    });
    return;
  }
  // Short runs: a blocked transpose, so both sides stay within a few cache lines per tile.
  constexpr index_t kTile = 32;
  const index_t j_tiles = (d1 + kTile - 1) / kTile;
  par.for_range(j_tiles, kTile * d0 * inner, [&](index_t first, index_t last) {
    for (index_t jt = first; jt < last; ++jt) {
      const index_t j_end = std::min(d1, (jt + 1) * kTile);
      for (index_t i0 = 0; i0 < d0; i0 += kTile) {
        const index_t i_end = std::min(d0, i0 + kTile);
        for (index_t j = jt * kTile; j < j_end; ++j) {
          for (index_t i = i0; i < i_end; ++i) {
            const float* from = src + (i * d1 + j) * inner;
            float* to = dst + (j * d0 + i) * inner;
            for (index_t r = 0; r < inner; ++r)
              to[r] = from[r];
          }
        }
      }
    }
  });
}

namespace {

// Work units (see parallel.h) per product entry, measured on 1 thread (AlexNet conv2-like,
// 32 output channels): lift gathers at ~0.6 ns, lift_backward scatters at ~1 ns.
constexpr index_t kCostLiftEntry = 7;
constexpr index_t kCostLiftBackwardEntry = 12;

}  // namespace

void lift(Parallel& par, const LoweringShape& s, index_t out_channels, const float* products,
          float* y) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  const index_t taps = s.kernel_h * s.kernel_w, product_cols = out_channels * taps;
  // Task (n, oh) sums output row oh of every channel. It gathers from whole product rows
  // (all channels of one tap are in one row of P) into acc[ow][co], then transposes: the
  // reads stay within the rows of the image row pairs the output row touches.
  par.for_range(
      s.batch * out_h, out_w * product_cols * kCostLiftEntry, [&](index_t first, index_t last) {
        std::vector<float> acc(static_cast<std::size_t>(out_w * out_channels));
        for (index_t item = first; item < last; ++item) {
          const index_t n = item / out_h, oh = item % out_h;
          std::fill(acc.begin(), acc.end(), 0.0f);
          // Taps in (kh, kw) order, as the reference sums them.
          for (index_t kh = 0; kh < s.kernel_h; ++kh) {
            const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
            if (ih < 0 || ih >= s.height) continue;
            for (index_t kw = 0; kw < s.kernel_w; ++kw) {
              const index_t w_offset = kw * s.dilation_w - s.pad_w;
              const OutputRange ow = valid_outputs(w_offset, s.stride_w, s.width, out_w);
              const float* tap =
                  products + (n * s.height + ih) * s.width * product_cols + kh * s.kernel_w + kw;
              for (index_t x = ow.lo; x < ow.hi; ++x) {
                const float* src = tap + (w_offset + x * s.stride_w) * product_cols;
                float* dst = acc.data() + x * out_channels;
                for (index_t co = 0; co < out_channels; ++co)
                  dst[co] += src[co * taps];
              }
            }
          }
          for (index_t co = 0; co < out_channels; ++co) {
            float* dst = y + ((n * out_channels + co) * out_h + oh) * out_w;
            for (index_t x = 0; x < out_w; ++x)
              dst[x] = acc[x * out_channels + co];
          }
        }
      });
}

void lift_backward(Parallel& par, const LoweringShape& s, index_t out_channels, const float* dy,
                   float* products_diff) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), out_plane = out_h * out_w;
  const index_t taps = s.kernel_h * s.kernel_w, product_cols = out_channels * taps;
  // Task (n, ih) owns the product rows of image row ih: each entry is the dy of the one
  // output its tap feeds (oh * stride + kh * dilation == ih + pad), or 0.
  par.for_range(s.batch * s.height, s.width * product_cols * kCostLiftBackwardEntry,
                [&](index_t first, index_t last) {
                  for (index_t item = first; item < last; ++item) {
                    const index_t n = item / s.height, ih = item % s.height;
                    float* rows = products_diff + item * s.width * product_cols;
                    std::fill(rows, rows + s.width * product_cols, 0.0f);
                    const float* dy_image = dy + n * out_channels * out_plane;
                    for (index_t kh = 0; kh < s.kernel_h; ++kh) {
                      const index_t h_span = ih + s.pad_h - kh * s.dilation_h;
                      if (h_span < 0 || h_span % s.stride_h != 0 || h_span / s.stride_h >= out_h)
                        continue;
                      const index_t oh = h_span / s.stride_h;
                      for (index_t kw = 0; kw < s.kernel_w; ++kw) {
                        // Outputs x whose tap kw lands in the image: iw = w_offset + x * stride.
                        const index_t w_offset = kw * s.dilation_w - s.pad_w;
                        const OutputRange ow = valid_outputs(w_offset, s.stride_w, s.width, out_w);
                        for (index_t x = ow.lo; x < ow.hi; ++x) {
                          float* dst = rows + (w_offset + x * s.stride_w) * product_cols +
                                       kh * s.kernel_w + kw;
                          const float* src = dy_image + oh * out_w + x;
                          for (index_t co = 0; co < out_channels; ++co)
                            dst[co * taps] = src[co * out_plane];
                        }
                      }
                    }
                  }
                });
}

}  // namespace hn::detail::cpu
