// Max and average pooling on the CPU with Caffe's window rules; one task per run of
// (image, channel) planes, so every task owns its outputs and the backward scatters.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <cfloat>

namespace hn::detail::cpu {

namespace {

// Window bounds of one output coordinate, following Caffe.
struct Window {
  index_t start, end;
};

Window max_window(index_t out, index_t stride, index_t pad, index_t kernel, index_t in) {
  const index_t start = out * stride - pad;
  return {std::max<index_t>(start, 0), std::min(start + kernel, in)};
}

// Average pooling also needs the divisor, counted over the window clipped to the padded
// input (Caffe's), or to the input without `include_pad`.
Window avg_window(index_t out, index_t stride, index_t pad, index_t kernel, index_t in,
                  bool include_pad, index_t* size) {
  const index_t start = out * stride - pad;
  const index_t end = std::min(start + kernel, in + pad);
  const Window clipped{std::max<index_t>(start, 0), std::min(end, in)};
  *size = include_pad ? end - start : clipped.end - clipped.start;
  return clipped;
}

// Outputs whose whole window lies inside the input: there every window has the same shape,
// so one output row is a few vector passes.
OutputRange full_windows(index_t stride, index_t pad, index_t kernel, index_t in, index_t out) {
  const OutputRange first = valid_outputs(-pad, stride, in, out);
  const OutputRange last = valid_outputs(kernel - 1 - pad, stride, in, out);
  return {std::min(first.lo, last.hi), last.hi};
}

// One (input row, kernel column) pass over outputs [lo, hi) of a max-pooling row. Passes
// run in the window's scan order, so the first maximum still wins.
// Output o reads plane[offset + o * stride].
void max_pass(const float* __restrict__ plane, index_t offset, index_t stride,
              float* __restrict__ best, std::int32_t* __restrict__ arg, index_t lo, index_t hi) {
  for (index_t o = lo; o < hi; ++o) {
    const index_t index = offset + o * stride;
    const float v = plane[index];
    const bool greater = v > best[o];
    best[o] = greater ? v : best[o];
    arg[o] = greater ? static_cast<std::int32_t>(index) : arg[o];
  }
}

void sum_pass(const float* __restrict__ plane, index_t offset, index_t stride,
              float* __restrict__ total, index_t lo, index_t hi) {
  for (index_t o = lo; o < hi; ++o)
    total[o] += plane[offset + o * stride];
}

// Outputs [lo, hi) of one max-pooling row whose windows lie wholly inside the plane: rows
// top .. top + KH - 1, columns ow * SW + left .. + KW - 1. With the window fixed at
// compile time the loop over outputs vectorises (strided loads), about 5x faster than the
// pass-per-tap loop on LeNet's 12-wide rows. Same scan order and strict >, so the same
// maximum and index as Caffe's loop.
template <int KH, int KW, int SW>
void max_row_full(const float* __restrict__ plane, std::int32_t width, std::int32_t top,
                  std::int32_t left, std::int32_t lo, std::int32_t hi, float* __restrict__ row,
                  std::int32_t* __restrict__ arg) {
  for (std::int32_t ow = lo; ow < hi; ++ow) {
    float best = -FLT_MAX;
    std::int32_t where = -1;
    for (int kh = 0; kh < KH; ++kh) {
      for (int kw = 0; kw < KW; ++kw) {
        const std::int32_t index = (top + kh) * width + ow * SW + left + kw;
        const float v = plane[index];
        const bool greater = v > best;
        best = greater ? v : best;
        where = greater ? index : where;
      }
    }
    row[ow] = best;
    arg[ow] = where;
  }
}

using MaxRowFull = void (*)(const float*, std::int32_t, std::int32_t, std::int32_t, std::int32_t,
                            std::int32_t, float*, std::int32_t*);

// The compiled windows: LeNet's 2x2 stride 2, CaffeNet's 3x3 stride 2, and 3x3 stride 1
// (GoogLeNet-style); other windows take the generic loop.
MaxRowFull max_row_kernel(const PoolShape& s) {
  if (s.kernel_h == 2 && s.kernel_w == 2 && s.stride_w == 2) return &max_row_full<2, 2, 2>;
  if (s.kernel_h == 3 && s.kernel_w == 3 && s.stride_w == 2) return &max_row_full<3, 3, 2>;
  if (s.kernel_h == 3 && s.kernel_w == 3 && s.stride_w == 1) return &max_row_full<3, 3, 1>;
  return nullptr;
}

template <class PlaneBody>
void for_planes(Parallel& par, const PoolShape& s, index_t cost, const PlaneBody& body) {
  par.for_range(s.batch * s.channels, cost, [&](index_t first, index_t last) {
    for (index_t p = first; p < last; ++p)
      body(p);
  });
}

index_t window_cost(const PoolShape& s) {
  return s.out_h() * s.out_w() * s.kernel_h * s.kernel_w + s.height * s.width;
}

}  // namespace

void avg_pool_plane_forward(const PoolShape& s, const float* x, float* y) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  if (out_h == 1 && out_w == 1 && s.pad_h == 0 && s.pad_w == 0 && s.kernel_h == s.height &&
      s.kernel_w == s.width) {
    // Global pooling (one window over the whole plane): one vector sum instead of a pass per
    // input pixel (SqueezeNet's pool10, 1000 planes of 13x13 per image: 11 ms -> 1 at batch 32).
    constexpr index_t kLanes = 16;
    const index_t count = s.height * s.width;
    float lanes[kLanes] = {};
    index_t i = 0;
    for (; i + kLanes <= count; i += kLanes) {
      for (index_t k = 0; k < kLanes; ++k)
        lanes[k] += x[i + k];
    }
    for (index_t k = 0; i < count; ++i, ++k)
      lanes[k] += x[i];
    for (index_t width = kLanes / 2; width > 0; width /= 2) {
      for (index_t k = 0; k < width; ++k)
        lanes[k] += lanes[k + width];
    }
    y[0] = lanes[0] / static_cast<float>(count);
    return;
  }
  const OutputRange inner = full_windows(s.stride_w, s.pad_w, s.kernel_w, s.width, out_w);
  for (index_t oh = 0; oh < out_h; ++oh) {
    index_t size_h;
    const Window h =
        avg_window(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, s.count_include_pad, &size_h);
    float* row = y + oh * out_w;
    auto one = [&](index_t ow) {
      index_t size_w;
      const Window w =
          avg_window(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, s.count_include_pad, &size_w);
      float total = 0.0f;
      for (index_t ih = h.start; ih < h.end; ++ih) {
        const float* line = x + ih * s.width;
        for (index_t iw = w.start; iw < w.end; ++iw)
          total += line[iw];
      }
      row[ow] = total / static_cast<float>(size_h * size_w);
    };
    for (index_t ow = 0; ow < inner.lo; ++ow)
      one(ow);
    for (index_t ow = inner.hi; ow < out_w; ++ow)
      one(ow);
    std::fill(row + inner.lo, row + inner.hi, 0.0f);
    for (index_t ih = h.start; ih < h.end; ++ih) {
      for (index_t kw = 0; kw < s.kernel_w; ++kw) {
        sum_pass(x, ih * s.width + kw - s.pad_w, s.stride_w, row, inner.lo, inner.hi);
      }
    }
    const float size = static_cast<float>(size_h * s.kernel_w);
    for (index_t ow = inner.lo; ow < inner.hi; ++ow)
      row[ow] /= size;
  }
}

void avg_pool_plane_backward(const PoolShape& s, const float* dy, float* dx) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  std::fill(dx, dx + s.height * s.width, 0.0f);
  for (index_t oh = 0; oh < out_h; ++oh) {
    index_t size_h;
    const Window h =
        avg_window(oh, s.stride_h, s.pad_h, s.kernel_h, s.height, s.count_include_pad, &size_h);
    for (index_t ow = 0; ow < out_w; ++ow) {
      index_t size_w;
      const Window w =
          avg_window(ow, s.stride_w, s.pad_w, s.kernel_w, s.width, s.count_include_pad, &size_w);
      const float share = dy[oh * out_w + ow] / static_cast<float>(size_h * size_w);
      for (index_t ih = h.start; ih < h.end; ++ih) {
        float* line = dx + ih * s.width;
        for (index_t iw = w.start; iw < w.end; ++iw)
          line[iw] += share;
      }
    }
  }
}

void pool_max_forward(Parallel& par, const PoolShape& s, const float* x, float* y,
                      std::int32_t* mask) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  const OutputRange inner = full_windows(s.stride_w, s.pad_w, s.kernel_w, s.width, out_w);
  const MaxRowFull kernel = max_row_kernel(s);
  for_planes(par, s, window_cost(s), [&](index_t p) {
    const float* in = x + p * in_plane;
    for (index_t oh = 0; oh < out_h; ++oh) {
      const Window h = max_window(oh, s.stride_h, s.pad_h, s.kernel_h, s.height);
      float* row = y + p * out_plane + oh * out_w;
      std::int32_t* arg = mask + p * out_plane + oh * out_w;
      const bool full_rows = kernel != nullptr && h.end - h.start == s.kernel_h;
      // Caffe: start below every float, the first strict maximum wins. (The compiled
      // kernel starts each of its outputs itself.)
      auto start = [&](index_t lo, index_t hi) {
        std::fill(row + lo, row + hi, -FLT_MAX);
        std::fill(arg + lo, arg + hi, -1);
      };
      if (full_rows) {
        start(0, inner.lo);
        start(inner.hi, out_w);
      } else {
        start(0, out_w);
      }
      auto one = [&](index_t ow) {
        const Window w = max_window(ow, s.stride_w, s.pad_w, s.kernel_w, s.width);
        for (index_t ih = h.start; ih < h.end; ++ih) {
          for (index_t iw = w.start; iw < w.end; ++iw) {
            const index_t index = ih * s.width + iw;
            if (in[index] > row[ow]) {
              row[ow] = in[index];
              arg[ow] = static_cast<std::int32_t>(index);
            }
          }
        }
      };
      for (index_t ow = 0; ow < inner.lo; ++ow)
        one(ow);
      for (index_t ow = inner.hi; ow < out_w; ++ow)
        one(ow);
      if (full_rows) {
        kernel(in, static_cast<std::int32_t>(s.width), static_cast<std::int32_t>(h.start),
               static_cast<std::int32_t>(-s.pad_w), static_cast<std::int32_t>(inner.lo),
               static_cast<std::int32_t>(inner.hi), row, arg);
        continue;
      }
      for (index_t ih = h.start; ih < h.end; ++ih) {
        for (index_t kw = 0; kw < s.kernel_w; ++kw) {
          max_pass(in, ih * s.width + kw - s.pad_w, s.stride_w, row, arg, inner.lo, inner.hi);
        }
      }
    }
  });
}

void pool_max_backward(Parallel& par, const PoolShape& s, const float* dy, const std::int32_t* mask,
                       float* dx) {
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  for_planes(par, s, in_plane + out_plane, [&](index_t p) {
    float* grad = dx + p * in_plane;
    const float* out_grad = dy + p * out_plane;
    const std::int32_t* arg = mask + p * out_plane;
    std::fill(grad, grad + in_plane, 0.0f);
    for (index_t i = 0; i < out_plane; ++i) {
      // A window with no input above -FLT_MAX has no argmax (-1) and passes nothing back.
      if (arg[i] >= 0 && arg[i] < in_plane) grad[arg[i]] += out_grad[i];
    }
  });
}

void pool_avg_forward(Parallel& par, const PoolShape& s, const float* x, float* y) {
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  for_planes(par, s, window_cost(s),
             [&](index_t p) { avg_pool_plane_forward(s, x + p * in_plane, y + p * out_plane); });
}

void pool_avg_backward(Parallel& par, const PoolShape& s, const float* dy, float* dx) {
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  for_planes(par, s, window_cost(s),
             [&](index_t p) { avg_pool_plane_backward(s, dy + p * out_plane, dx + p * in_plane); });
}

}  // namespace hn::detail::cpu
