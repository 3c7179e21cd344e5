// Per-element bodies of the CUDA lowering kernels (im2col, col2im, swap_axes, lift,
// lift_backward). Plain C++ with HN_HOST_DEVICE, so tests/test_cuda_kernel_bodies.cpp runs
// them on the host.
#pragma once

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

// LoweringShape with its derived sizes resolved on the host (shapes.cpp is host code).
struct LoweringDims {
  index_t batch, channels, height, width;
  index_t kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  index_t out_h, out_w;

  HN_HOST_DEVICE index_t rows() const { return channels * kernel_h * kernel_w; }
  HN_HOST_DEVICE index_t cols() const { return batch * out_h * out_w; }
};

inline LoweringDims lowering_dims(const LoweringShape& s) {
  return {s.batch, s.channels, s.height,   s.width,      s.kernel_h,   s.kernel_w, s.pad_h,
          s.pad_w, s.stride_h, s.stride_w, s.dilation_h, s.dilation_w, s.out_h(),  s.out_w()};
}

// One element of the lowered matrix, i in [0, rows * cols): consecutive threads write
// consecutive columns, so the stores coalesce.
HN_HOST_DEVICE inline void im2col_element(index_t i, const LoweringDims& d, const float* images,
                                          float* columns) {
  const index_t cols = d.cols();
  const index_t row = i / cols, col = i % cols;
  const index_t kw = row % d.kernel_w;
  const index_t kh = (row / d.kernel_w) % d.kernel_h;
  const index_t c = row / (d.kernel_w * d.kernel_h);
  const index_t ow = col % d.out_w;
  const index_t oh = (col / d.out_w) % d.out_h;
  const index_t n = col / (d.out_w * d.out_h);
  const index_t ih = oh * d.stride_h - d.pad_h + kh * d.dilation_h;
  const index_t iw = ow * d.stride_w - d.pad_w + kw * d.dilation_w;
  const bool inside = ih >= 0 && ih < d.height && iw >= 0 && iw < d.width;
  columns[i] = inside ? images[((n * d.channels + c) * d.height + ih) * d.width + iw] : 0.0f;
}

// Calls tap(kh, kw, oh, ow) for every kernel tap (kh, kw) and output (oh, ow) whose window
// reads input pixel (h, w), in (kh, kw) order: the gather that replaces a scatter over the
// outputs (col2im, depthwise data gradients).
template <class Tap>
HN_HOST_DEVICE inline void for_each_covering_tap(index_t h, index_t w, const LoweringDims& d,
                                                 const Tap& tap) {
  for (index_t kh = 0; kh < d.kernel_h; ++kh) {
    const index_t h_span = h + d.pad_h - kh * d.dilation_h;  // = oh * stride_h
    if (h_span < 0) break;                                   // only shrinks with kh
    if (h_span % d.stride_h != 0) continue;
    const index_t oh = h_span / d.stride_h;
    if (oh >= d.out_h) continue;
    for (index_t kw = 0; kw < d.kernel_w; ++kw) {
      const index_t w_span = w + d.pad_w - kw * d.dilation_w;
      if (w_span < 0) break;
      if (w_span % d.stride_w != 0) continue;
      const index_t ow = w_span / d.stride_w;
      if (ow >= d.out_w) continue;
      tap(kh, kw, oh, ow);
    }
  }
}

// One image pixel, i in [0, batch * channels * height * width): gathers every column entry
// that maps to it, in (kh, kw) order, the order in which a scatter over the rows adds
// them; no atomics, so the result is deterministic.
HN_HOST_DEVICE inline void col2im_element(index_t i, const LoweringDims& d, const float* columns,
                                          float* images) {
  const index_t w = i % d.width;
  const index_t h = (i / d.width) % d.height;
  const index_t c = (i / (d.width * d.height)) % d.channels;
  const index_t n = i / (d.width * d.height * d.channels);
  const index_t cols = d.cols();
  float sum = 0.0f;
  for_each_covering_tap(h, w, d, [&](index_t kh, index_t kw, index_t oh, index_t ow) {
    const index_t row = (c * d.kernel_h + kh) * d.kernel_w + kw;
    const index_t col = (n * d.out_h + oh) * d.out_w + ow;
    sum += columns[row * cols + col];
  });
  images[i] = sum;
}

// dst[j][i][r] = src[i][j][r]; k indexes dst, so the stores coalesce.
HN_HOST_DEVICE inline void swap_axes_element(index_t k, index_t d0, index_t d1, index_t inner,
                                             const float* src, float* dst) {
  const index_t r = k % inner;
  const index_t i = (k / inner) % d0;
  const index_t j = k / (inner * d0);
  dst[k] = src[(i * d1 + j) * inner + r];
}

// One output of lift (CcT lowering type 3), i in [0, batch * out_channels * out_h * out_w):
// the sum of the product entries of its in-image taps, in (kh, kw) order as the reference
// adds them. A gather, so no atomics and a deterministic result.
HN_HOST_DEVICE inline void lift_element(index_t i, const LoweringDims& d, index_t out_channels,
                                        const float* products, float* y) {
  const index_t ow = i % d.out_w;
  const index_t oh = (i / d.out_w) % d.out_h;
  const index_t co = (i / (d.out_w * d.out_h)) % out_channels;
  const index_t n = i / (d.out_w * d.out_h * out_channels);
  const index_t taps = d.kernel_h * d.kernel_w, product_cols = out_channels * taps;
  float sum = 0.0f;
  for (index_t kh = 0; kh < d.kernel_h; ++kh) {
    const index_t ih = oh * d.stride_h - d.pad_h + kh * d.dilation_h;
    if (ih < 0 || ih >= d.height) continue;
    for (index_t kw = 0; kw < d.kernel_w; ++kw) {
      const index_t iw = ow * d.stride_w - d.pad_w + kw * d.dilation_w;
      if (iw < 0 || iw >= d.width) continue;
      const index_t row = (n * d.height + ih) * d.width + iw;
      sum += products[row * product_cols + co * taps + kh * d.kernel_w + kw];
    }
  }
  y[i] = sum;
}

// One entry of the products' gradient, i in [0, batch * height * width * out_channels *
// kernel_h * kernel_w): the dy of the single output its tap feeds, or 0. Consecutive
// threads write consecutive entries, so the stores coalesce.
HN_HOST_DEVICE inline void lift_backward_element(index_t i, const LoweringDims& d,
                                                 index_t out_channels, const float* dy,
                                                 float* products_diff) {
  const index_t taps = d.kernel_h * d.kernel_w, product_cols = out_channels * taps;
  const index_t col = i % product_cols, row = i / product_cols;
  const index_t kw = col % d.kernel_w;
  const index_t kh = (col / d.kernel_w) % d.kernel_h;
  const index_t co = col / taps;
  const index_t iw = row % d.width;
  const index_t ih = (row / d.width) % d.height;
  const index_t n = row / (d.width * d.height);
  const index_t h_span = ih + d.pad_h - kh * d.dilation_h;  // = oh * stride_h
  const index_t w_span = iw + d.pad_w - kw * d.dilation_w;  // = ow * stride_w
  float value = 0.0f;
  if (h_span >= 0 && w_span >= 0 && h_span % d.stride_h == 0 && w_span % d.stride_w == 0) {
    const index_t oh = h_span / d.stride_h, ow = w_span / d.stride_w;
    if (oh < d.out_h && ow < d.out_w)
      value = dy[((n * out_channels + co) * d.out_h + oh) * d.out_w + ow];
  }
  products_diff[i] = value;
}

}  // namespace hn::detail::cuda
