// Per-element bodies of the CUDA LRN kernels (Caffe's semantics, see shapes.h). Every body
// computes one element directly from its window: no sliding sums, so no state between
// threads.
#pragma once

#include <math.h>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

// ---- across channels: window of size channels centred on c, clipped to [0, channels) -----

struct ChannelWindow {
  index_t begin, end;
};

HN_HOST_DEVICE inline ChannelWindow lrn_channel_window(index_t c, const LrnShape& s) {
  const index_t pre = (s.size - 1) / 2;
  const index_t begin = c - pre, end = c + pre + 1;
  return {begin < 0 ? 0 : begin, end > s.channels ? s.channels : end};
}

// scale[i] = k + alpha / size * sum_{c' in window(c)} x[n][c'][h][w]^2
HN_HOST_DEVICE inline float lrn_across_scale(index_t i, const LrnShape& s, const float* x) {
  const index_t plane = s.height * s.width;
  const index_t c = (i / plane) % s.channels;
  const ChannelWindow window = lrn_channel_window(c, s);
  const float* column = x + (i - c * plane);  // element (n, 0, h, w)
  float sum = 0.0f;
  for (index_t cc = window.begin; cc < window.end; ++cc) {
    const float v = column[cc * plane];
    sum += v * v;
  }
  return s.k + s.alpha / static_cast<float>(s.size) * sum;
}

HN_HOST_DEVICE inline void lrn_across_scale_element(index_t i, const LrnShape& s, const float* x,
                                                    float* scale) {
  scale[i] = lrn_across_scale(i, s, x);
}

HN_HOST_DEVICE inline void lrn_across_forward_element(index_t i, const LrnShape& s, const float* x,
                                                      float* y, float* scale) {
  const float value = lrn_across_scale(i, s, x);
  scale[i] = value;
  y[i] = x[i] * powf(value, -s.beta);
}

// dx = dy * scale^-beta - (2 alpha beta / size) * x * sum_{c' in window(c)} dy y / scale
HN_HOST_DEVICE inline void lrn_across_backward_element(index_t i, const LrnShape& s, const float* x,
                                                       const float* y, const float* scale,
                                                       const float* dy, float* dx) {
  const index_t plane = s.height * s.width;
  const index_t c = (i / plane) % s.channels;
  const ChannelWindow window = lrn_channel_window(c, s);
  const index_t base = i - c * plane;
  float sum = 0.0f;
  for (index_t cc = window.begin; cc < window.end; ++cc) {
    const index_t j = base + cc * plane;
    sum += dy[j] * y[j] / scale[j];
  }
  const float factor = 2.0f * s.alpha * s.beta / static_cast<float>(s.size);
  dx[i] = dy[i] * powf(scale[i], -s.beta) - factor * x[i] * sum;
}

// ---- within channel: Caffe's AVE pooling of x^2, kernel size x size, stride 1, pad --------
// (size - 1) / 2, so the output has the input's height and width.

struct SpatialWindow {
  index_t h_begin, h_end, w_begin, w_end;  // clipped to the image
  index_t pool_size;                       // Caffe's divisor (clipped to the padded image)
};

HN_HOST_DEVICE inline SpatialWindow lrn_spatial_window(index_t h, index_t w, const LrnShape& s) {
  const index_t pad = (s.size - 1) / 2;
  index_t h_begin = h - pad, w_begin = w - pad;
  index_t h_end = h_begin + s.size, w_end = w_begin + s.size;
  if (h_end > s.height + pad) h_end = s.height + pad;
  if (w_end > s.width + pad) w_end = s.width + pad;
  const index_t pool_size = (h_end - h_begin) * (w_end - w_begin);
  if (h_begin < 0) h_begin = 0;
  if (w_begin < 0) w_begin = 0;
  if (h_end > s.height) h_end = s.height;
  if (w_end > s.width) w_end = s.width;
  return {h_begin, h_end, w_begin, w_end, pool_size};
}

// scale[i] = 1 + alpha * avgpool(x^2)[i]
HN_HOST_DEVICE inline float lrn_within_scale(index_t i, const LrnShape& s, const float* x) {
  const index_t w = i % s.width;
  const index_t h = (i / s.width) % s.height;
  const SpatialWindow window = lrn_spatial_window(h, w, s);
  const float* plane = x + (i - (h * s.width + w));
  float sum = 0.0f;
  for (index_t hh = window.h_begin; hh < window.h_end; ++hh) {
    for (index_t ww = window.w_begin; ww < window.w_end; ++ww) {
      const float v = plane[hh * s.width + ww];
      sum += v * v;
    }
  }
  return 1.0f + s.alpha * (sum / static_cast<float>(window.pool_size));
}

HN_HOST_DEVICE inline void lrn_within_forward_element(index_t i, const LrnShape& s, const float* x,
                                                      float* y, float* scale) {
  const float value = lrn_within_scale(i, s, x);
  scale[i] = value;
  y[i] = x[i] * powf(value, -s.beta);
}

// Exact derivative: dx_j = dy_j scale_j^-beta + 2 x_j sum_{i: j in window(i)}
// dy_i x_i (-beta) scale_i^(-beta-1) alpha / pool_size_i. The windows are symmetric
// (size = 2 pad + 1), so the i whose window holds j are those within pad of j.
HN_HOST_DEVICE inline void lrn_within_backward_element(index_t j, const LrnShape& s, const float* x,
                                                       const float* scale, const float* dy,
                                                       float* dx) {
  const index_t w = j % s.width;
  const index_t h = (j / s.width) % s.height;
  const index_t base = j - (h * s.width + w);
  const SpatialWindow around = lrn_spatial_window(h, w, s);
  float sum = 0.0f;
  for (index_t hh = around.h_begin; hh < around.h_end; ++hh) {
    for (index_t ww = around.w_begin; ww < around.w_end; ++ww) {
      const index_t i = base + hh * s.width + ww;
      const float pool_size = static_cast<float>(lrn_spatial_window(hh, ww, s).pool_size);
      sum += dy[i] * x[i] * (-s.beta) * powf(scale[i], -s.beta - 1.0f) * s.alpha / pool_size;
    }
  }
  dx[j] = dy[j] * powf(scale[j], -s.beta) + 2.0f * x[j] * sum;
}

}  // namespace hn::detail::cuda
