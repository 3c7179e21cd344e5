// Per-output (forward) and per-input (backward) bodies of the CUDA pooling kernels, with
// Caffe's window rules. Backward gathers over the outputs whose window covers an input, in
// output order, like Caffe's GPU kernels: no atomics, deterministic, and the same additions
// in the same order as a scatter over the outputs.
#pragma once

#include <cfloat>
#include <cstdint>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

// PoolShape with the output size resolved on the host.
struct PoolDims {
  index_t batch, channels, height, width;
  index_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  index_t out_h, out_w;
  bool count_include_pad;
};

inline PoolDims pool_dims(const PoolShape& s) {
  return {s.batch,    s.channels, s.height, s.width,   s.kernel_h, s.kernel_w,         s.stride_h,
          s.stride_w, s.pad_h,    s.pad_w,  s.out_h(), s.out_w(),  s.count_include_pad};
}

// Outputs [begin, end) along one axis whose (unclipped) window covers input position x:
// begin * stride - pad <= x < begin * stride - pad + kernel.
struct OutputRange {
  index_t begin, end;
};

HN_HOST_DEVICE inline OutputRange covering_outputs(index_t x, index_t kernel, index_t stride,
                                                   index_t pad, index_t out) {
  const index_t begin = x + pad < kernel ? 0 : (x + pad - kernel) / stride + 1;
  const index_t last = (x + pad) / stride + 1;
  return {begin, last < out ? last : out};
}

HN_HOST_DEVICE inline index_t min_index(index_t a, index_t b) {
  return a < b ? a : b;
}
HN_HOST_DEVICE inline index_t max_index(index_t a, index_t b) {
  return a > b ? a : b;
}

// One output, i in [0, batch * channels * out_h * out_w).
HN_HOST_DEVICE inline void pool_max_forward_element(index_t i, const PoolDims& d, const float* x,
                                                    float* y, std::int32_t* mask) {
  const index_t ow = i % d.out_w;
  const index_t oh = (i / d.out_w) % d.out_h;
  const index_t plane = i / (d.out_w * d.out_h);
  const index_t h_begin = oh * d.stride_h - d.pad_h, w_begin = ow * d.stride_w - d.pad_w;
  const index_t h_end = min_index(h_begin + d.kernel_h, d.height);
  const index_t w_end = min_index(w_begin + d.kernel_w, d.width);
  const float* src = x + plane * d.height * d.width;
  float best = -FLT_MAX;
  index_t best_index = -1;
  for (index_t h = max_index(h_begin, 0); h < h_end; ++h) {
    for (index_t w = max_index(w_begin, 0); w < w_end; ++w) {
      const float v = src[h * d.width + w];
      if (v > best) {
        best = v;
        best_index = h * d.width + w;
      }
    }
  }
  y[i] = best;
  mask[i] = static_cast<std::int32_t>(best_index);
}

// One input, i in [0, batch * channels * height * width): dx = sum of dy over the outputs
// whose mask names this input.
HN_HOST_DEVICE inline void pool_max_backward_element(index_t i, const PoolDims& d, const float* dy,
                                                     const std::int32_t* mask, float* dx) {
  const index_t w = i % d.width;
  const index_t h = (i / d.width) % d.height;
  const index_t plane = i / (d.width * d.height);
  const OutputRange rows = covering_outputs(h, d.kernel_h, d.stride_h, d.pad_h, d.out_h);
  const OutputRange cols = covering_outputs(w, d.kernel_w, d.stride_w, d.pad_w, d.out_w);
  const index_t offset = plane * d.out_h * d.out_w;
  const std::int32_t self = static_cast<std::int32_t>(h * d.width + w);
  float sum = 0.0f;
  for (index_t oh = rows.begin; oh < rows.end; ++oh) {
    for (index_t ow = cols.begin; ow < cols.end; ++ow) {
      const index_t o = offset + oh * d.out_w + ow;
      if (mask[o] == self) sum += dy[o];
    }
  }
  dx[i] = sum;
}

// Caffe's AVE divisor: the window clipped to the padded input, before clipping to the input;
// without count_include_pad, clipped to the input.
HN_HOST_DEVICE inline index_t avg_pool_size(const PoolDims& d, index_t oh, index_t ow) {
  const index_t h_begin = oh * d.stride_h - d.pad_h, w_begin = ow * d.stride_w - d.pad_w;
  const index_t h_end = min_index(h_begin + d.kernel_h, d.height + d.pad_h);
  const index_t w_end = min_index(w_begin + d.kernel_w, d.width + d.pad_w);
  if (d.count_include_pad) return (h_end - h_begin) * (w_end - w_begin);
  return (min_index(h_end, d.height) - max_index(h_begin, 0)) *
         (min_index(w_end, d.width) - max_index(w_begin, 0));
}

// One output, i in [0, batch * channels * out_h * out_w).
HN_HOST_DEVICE inline void pool_avg_forward_element(index_t i, const PoolDims& d, const float* x,
                                                    float* y) {
  const index_t ow = i % d.out_w;
  const index_t oh = (i / d.out_w) % d.out_h;
  const index_t plane = i / (d.out_w * d.out_h);
  const index_t h_begin = oh * d.stride_h - d.pad_h, w_begin = ow * d.stride_w - d.pad_w;
  const index_t h_end = min_index(h_begin + d.kernel_h, d.height);
  const index_t w_end = min_index(w_begin + d.kernel_w, d.width);
  const float* src = x + plane * d.height * d.width;
  float sum = 0.0f;
  for (index_t h = max_index(h_begin, 0); h < h_end; ++h) {
    for (index_t w = max_index(w_begin, 0); w < w_end; ++w)
      sum += src[h * d.width + w];
  }
  y[i] = sum / static_cast<float>(avg_pool_size(d, oh, ow));
}

// One input, i in [0, batch * channels * height * width): each covering output adds
// dy / pool_size. An input lies in an output's clipped window exactly when it lies in the
// unclipped one, so covering_outputs gives the same set as Caffe's scatter.
HN_HOST_DEVICE inline void pool_avg_backward_element(index_t i, const PoolDims& d, const float* dy,
                                                     float* dx) {
  const index_t w = i % d.width;
  const index_t h = (i / d.width) % d.height;
  const index_t plane = i / (d.width * d.height);
  const OutputRange rows = covering_outputs(h, d.kernel_h, d.stride_h, d.pad_h, d.out_h);
  const OutputRange cols = covering_outputs(w, d.kernel_w, d.stride_w, d.pad_w, d.out_w);
  const index_t offset = plane * d.out_h * d.out_w;
  float sum = 0.0f;
  for (index_t oh = rows.begin; oh < rows.end; ++oh) {
    for (index_t ow = cols.begin; ow < cols.end; ++ow) {
      sum += dy[offset + oh * d.out_w + ow] / static_cast<float>(avg_pool_size(d, oh, ow));
    }
  }
  dx[i] = sum;
}

}  // namespace hn::detail::cuda
