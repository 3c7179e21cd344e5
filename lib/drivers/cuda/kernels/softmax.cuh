// Per-column bodies of the CUDA softmax kernels: one thread owns one (outer, inner) column
// and walks its channels, so there is no cross-thread reduction to order.
#pragma once

#include <math.h>
#include <cfloat>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

// col in [0, outer * inner). In place (x == y) is safe: each channel is read before the
// column is rewritten.
HN_HOST_DEVICE inline void softmax_forward_column(index_t col, const AxisShape& s, const float* x,
                                                  float* y) {
  const index_t base = (col / s.inner) * s.channels * s.inner + col % s.inner;
  float max_value = -FLT_MAX;
  for (index_t c = 0; c < s.channels; ++c) {
    const float v = x[base + c * s.inner];
    if (v > max_value) max_value = v;
  }
  float sum = 0.0f;
  for (index_t c = 0; c < s.channels; ++c) {
    const float e = expf(x[base + c * s.inner] - max_value);
    y[base + c * s.inner] = e;
    sum += e;
  }
  for (index_t c = 0; c < s.channels; ++c)
    y[base + c * s.inner] /= sum;
}

// dx = y * (dy - sum_c dy * y); in place (dy == dx) is safe.
HN_HOST_DEVICE inline void softmax_backward_column(index_t col, const AxisShape& s, const float* y,
                                                   const float* dy, float* dx) {
  const index_t base = (col / s.inner) * s.channels * s.inner + col % s.inner;
  float dot = 0.0f;
  for (index_t c = 0; c < s.channels; ++c) {
    const index_t j = base + c * s.inner;
    dot += dy[j] * y[j];
  }
  for (index_t c = 0; c < s.channels; ++c) {
    const index_t j = base + c * s.inner;
    dx[j] = y[j] * (dy[j] - dot);
  }
}

}  // namespace hn::detail::cuda
