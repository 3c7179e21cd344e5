// Per-element bodies of the CUDA activation kernels (bias_forward, relu, clip, sigmoid, tanh).
// Plain C++ with HN_HOST_DEVICE, tested on the host. Every body reads its inputs before it
// writes, so in-place calls (x == y, dy == dx) are safe.
#pragma once

#include <math.h>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

HN_HOST_DEVICE inline void bias_forward_element(index_t i, const AxisShape& shape,
                                                const float* bias, float* y) {
  y[i] += bias[(i / shape.inner) % shape.channels];
}

HN_HOST_DEVICE inline void relu_forward_element(index_t i, float negative_slope, const float* x,
                                                float* y) {
  const float v = x[i];
  y[i] = v > 0.0f ? v : negative_slope * v;
}

HN_HOST_DEVICE inline void relu_backward_element(index_t i, float negative_slope, const float* x,
                                                 const float* dy, float* dx) {
  dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : negative_slope);
}

HN_HOST_DEVICE inline void clip_forward_element(index_t i, float lo, float hi, const float* x,
                                                float* y) {
  const float v = x[i];
  y[i] = v < lo ? lo : (v > hi ? hi : v);
}

HN_HOST_DEVICE inline void clip_backward_element(index_t i, float lo, float hi, const float* x,
                                                 const float* dy, float* dx) {
  const float v = x[i];
  dx[i] = v >= lo && v <= hi ? dy[i] : 0.0f;
}

HN_HOST_DEVICE inline void sigmoid_forward_element(index_t i, const float* x, float* y) {
  y[i] = 1.0f / (1.0f + expf(-x[i]));
}

HN_HOST_DEVICE inline void sigmoid_backward_element(index_t i, const float* y, const float* dy,
                                                    float* dx) {
  const float v = y[i];
  dx[i] = dy[i] * v * (1.0f - v);
}

HN_HOST_DEVICE inline void tanh_forward_element(index_t i, const float* x, float* y) {
  y[i] = tanhf(x[i]);
}

HN_HOST_DEVICE inline void tanh_backward_element(index_t i, const float* y, const float* dy,
                                                 float* dx) {
  const float v = y[i];
  dx[i] = dy[i] * (1.0f - v * v);
}

}  // namespace hn::detail::cuda
