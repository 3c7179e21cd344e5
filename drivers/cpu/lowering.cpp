// Batched lowering on the CPU: im2col / col2im over a whole batch slice, and swap_axes.
// Both lowering directions work on one (image, channel) plane per task: im2col because the
// plane stays in cache for all kernel_h * kernel_w rows it feeds, col2im because a task
// that owns its output plane needs no atomics or locks.
#include "drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <cstring>

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
  // Task (n, c) owns image plane (n, c). Per pixel, contributions are added in (kh, kw, oh,
  // ow) order, the order of a plain loop over the column matrix.
  par.for_range(s.batch * s.channels, cost, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t n = item / s.channels, c = item % s.channels;
      float* dst = images + item * plane;
      std::fill(dst, dst + plane, 0.0f);
      for (index_t kh = 0; kh < s.kernel_h; ++kh) {
        for (index_t kw = 0; kw < s.kernel_w; ++kw) {
          const index_t row = (c * s.kernel_h + kh) * s.kernel_w + kw;
          const float* src = columns + row * cols + n * per_image;
          const index_t w_offset = kw * s.dilation_w - s.pad_w;
          const OutputRange ow = valid_outputs(w_offset, s.stride_w, s.width, out_w);
          for (index_t oh = 0; oh < out_h; ++oh, src += out_w) {
            const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
            if (ih < 0 || ih >= s.height) continue;
            float* line = dst + ih * s.width;  // input column w_offset + x * stride
            if (s.stride_w == 1) {
              for (index_t x = ow.lo; x < ow.hi; ++x)
                line[w_offset + x] += src[x];
            } else {
              for (index_t x = ow.lo; x < ow.hi; ++x)
                line[w_offset + x * s.stride_w] += src[x];
            }
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

}  // namespace hn::detail::cpu
