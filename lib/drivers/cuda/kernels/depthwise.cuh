// Per-element bodies of the CUDA depthwise convolution kernels: groups == channels, output
// channel o reads input channel o / multiplier (multiplier = out_channels / channels), weights
// [out_channels][1][kernel_h][kernel_w], Caffe's zero padding and dilation. Every body is a
// gather with a fixed summation order: no atomics, deterministic. The bias gradient is
// bias_backward (reductions.cuh) with beta = 1.
#pragma once

#include "lib/core/philox.h"
#include "lib/core/shapes.h"
#include "lib/drivers/cuda/kernels/lowering.cuh"

namespace hn::detail::cuda {

// The shapes these kernels run. groups == 1 with one channel is an ordinary convolution.
inline bool is_depthwise(const LoweringShape& s, index_t out_channels) {
  return s.groups > 1 && s.groups == s.channels && out_channels % s.groups == 0;
}

// One output, i in [0, batch * out_channels * out_h * out_w): the bias, then the in-image
// taps in (kh, kw) order.
HN_HOST_DEVICE inline void depthwise_forward_element(index_t i, const LoweringDims& d,
                                                     index_t out_channels, const float* x,
                                                     const float* weights, const float* bias,
                                                     float* y) {
  const index_t ow = i % d.out_w;
  const index_t oh = (i / d.out_w) % d.out_h;
  const index_t o = (i / (d.out_w * d.out_h)) % out_channels;
  const index_t n = i / (d.out_w * d.out_h * out_channels);
  const index_t c = o / (out_channels / d.channels);
  const float* src = x + (n * d.channels + c) * d.height * d.width;
  const float* w = weights + o * d.kernel_h * d.kernel_w;
  float sum = bias != nullptr ? bias[o] : 0.0f;
  for (index_t kh = 0; kh < d.kernel_h; ++kh) {
    const index_t ih = oh * d.stride_h - d.pad_h + kh * d.dilation_h;
    if (ih < 0 || ih >= d.height) continue;
    for (index_t kw = 0; kw < d.kernel_w; ++kw) {
      const index_t iw = ow * d.stride_w - d.pad_w + kw * d.dilation_w;
      if (iw < 0 || iw >= d.width) continue;
      sum += src[ih * d.width + iw] * w[kh * d.kernel_w + kw];
    }
  }
  y[i] = sum;
}

// One input gradient, i in [0, batch * channels * height * width): overwrites dx with the sum,
// over the output channels of c's block and then the taps in (kh, kw) order, of the dy that
// read this input times the tap's weight.
HN_HOST_DEVICE inline void depthwise_backward_data_element(index_t i, const LoweringDims& d,
                                                           index_t out_channels,
                                                           const float* weights, const float* dy,
                                                           float* dx) {
  const index_t w = i % d.width;
  const index_t h = (i / d.width) % d.height;
  const index_t c = (i / (d.width * d.height)) % d.channels;
  const index_t n = i / (d.width * d.height * d.channels);
  const index_t multiplier = out_channels / d.channels;
  float sum = 0.0f;
  for (index_t o = c * multiplier; o < (c + 1) * multiplier; ++o) {
    const float* grad = dy + (n * out_channels + o) * d.out_h * d.out_w;
    const float* tap = weights + o * d.kernel_h * d.kernel_w;
    for_each_covering_tap(h, w, d, [&](index_t kh, index_t kw, index_t oh, index_t ow) {
      sum += grad[oh * d.out_w + ow] * tap[kh * d.kernel_w + kw];
    });
  }
  dx[i] = sum;
}

// One weight gradient, i in [0, out_channels * kernel_h * kernel_w): ADDS the sum over
// (n, oh, ow), in that order and in double, of x * dy. One thread walks batch * out_h * out_w
// terms, so few threads do long sums: slow for large planes and few weights, but free of
// atomics and bitwise reproducible. A block per weight with a fixed tree (as bias_backward)
// would spread the sum if this shows in profiles.
HN_HOST_DEVICE inline void depthwise_backward_weights_element(index_t i, const LoweringDims& d,
                                                              index_t out_channels, const float* x,
                                                              const float* dy, float* dweights) {
  const index_t kw = i % d.kernel_w;
  const index_t kh = (i / d.kernel_w) % d.kernel_h;
  const index_t o = i / (d.kernel_w * d.kernel_h);
  const index_t c = o / (out_channels / d.channels);
  double sum = 0.0;
  for (index_t n = 0; n < d.batch; ++n) {
    const float* src = x + (n * d.channels + c) * d.height * d.width;
    const float* grad = dy + (n * out_channels + o) * d.out_h * d.out_w;
    for (index_t oh = 0; oh < d.out_h; ++oh) {
      const index_t ih = oh * d.stride_h - d.pad_h + kh * d.dilation_h;
      if (ih < 0 || ih >= d.height) continue;
      for (index_t ow = 0; ow < d.out_w; ++ow) {
        const index_t iw = ow * d.stride_w - d.pad_w + kw * d.dilation_w;
        if (iw < 0 || iw >= d.width) continue;
        sum += static_cast<double>(src[ih * d.width + iw]) * grad[oh * d.out_w + ow];
      }
    }
  }
  dweights[i] = static_cast<float>(dweights[i] + sum);
}

}  // namespace hn::detail::cuda
