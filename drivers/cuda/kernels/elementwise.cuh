// Per-element bodies of the CUDA element-wise kernels (fill, scale, axpy, axpby, mul, and the
// k == 0 case of gemm). Plain C++ with HN_HOST_DEVICE, tested on the host.
#pragma once

#include "drivers/common/philox.h"
#include "hybridnn/shapes.h"

namespace hn::detail::cuda {

HN_HOST_DEVICE inline void fill_element(index_t i, float value, float* x) {
  x[i] = value;
}

HN_HOST_DEVICE inline void scale_element(index_t i, float alpha, float* x) {
  x[i] *= alpha;
}

HN_HOST_DEVICE inline void axpy_element(index_t i, float alpha, const float* x, float* y) {
  y[i] += alpha * x[i];
}

// beta == 0 must not read y, so NaN or garbage there does not propagate.
HN_HOST_DEVICE inline void axpby_element(index_t i, float alpha, const float* x, float beta,
                                         float* y) {
  y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
}

HN_HOST_DEVICE inline void mul_element(index_t i, const float* a, const float* b, float* y) {
  y[i] = a[i] * b[i];
}

// gemm with k == 0 is C = beta * C (not read when beta == 0); i in [0, m * n) over a
// row-major m x n matrix with leading dimension ldc. cuBLAS is not asked to handle k == 0.
HN_HOST_DEVICE inline void scale_matrix_element(index_t i, index_t n, index_t ldc, float beta,
                                                float* c) {
  float& value = c[(i / n) * ldc + i % n];
  value = beta == 0.0f ? 0.0f : beta * value;
}

}  // namespace hn::detail::cuda
