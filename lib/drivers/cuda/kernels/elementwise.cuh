// Per-element bodies of the CUDA element-wise kernels (fill, scale, axpy, axpby, mul, the
// k == 0 case of gemm, add_scalar, powx, copy_strided, scale_channels and Eltwise MAX's
// max_accumulate / max_select). Plain C++ with HN_HOST_DEVICE, tested on the host.
#pragma once

#include <math.h>

#include <cstdint>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

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

HN_HOST_DEVICE inline void add_scalar_element(index_t i, float alpha, float* x) {
  x[i] += alpha;
}

// powf: Caffe's powx for every base, negative ones with integer exponents included.
HN_HOST_DEVICE inline void powx_element(index_t i, const float* x, float exponent, float* y) {
  y[i] = powf(x[i], exponent);
}

// i in [0, rows * cols): element (i / cols, i % cols) of the block.
HN_HOST_DEVICE inline void copy_strided_element(index_t i, index_t cols, const float* src,
                                                index_t src_ld, float* dst, index_t dst_ld) {
  const index_t r = i / cols, c = i % cols;
  dst[r * dst_ld + c] = src[r * src_ld + c];
}

// y[o][c][i] = x[o][c][i] * scale[c]; in place (x == y) is safe.
HN_HOST_DEVICE inline void scale_channels_element(index_t i, const AxisShape& s, const float* scale,
                                                  const float* x, float* y) {
  y[i] = x[i] * scale[(i / s.inner) % s.channels];
}

// Eltwise MAX as Caffe's: index 0 starts the running maximum (y and mask not read); index 1
// replaces it unless input 0 is greater (ties go to input 1: Caffe's `a > b ? 0 : 1`); a
// later input only where strictly greater.
HN_HOST_DEVICE inline void max_accumulate_element(index_t i, const float* x, std::int32_t index,
                                                  float* y, std::int32_t* mask) {
  if (index == 0 || (index == 1 ? !(y[i] > x[i]) : x[i] > y[i])) {
    y[i] = x[i];
    mask[i] = index;
  }
}

HN_HOST_DEVICE inline void max_select_element(index_t i, const std::int32_t* mask,
                                              std::int32_t index, const float* dy, float* dx) {
  dx[i] = mask[i] == index ? dy[i] : 0.0f;
}

}  // namespace hn::detail::cuda
