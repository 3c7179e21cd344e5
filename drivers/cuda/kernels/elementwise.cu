// Launchers of the element-wise kernels (fill, scale, axpy, axpby, mul, and gemm's k == 0).
#include "drivers/cuda/kernels/elementwise.cuh"
#include "drivers/cuda/kernels/launchers.h"
#include "drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct Fill {
  float value;
  float* x;
  __device__ void operator()(index_t i) const { fill_element(i, value, x); }
};

struct Scale {
  float alpha;
  float* x;
  __device__ void operator()(index_t i) const { scale_element(i, alpha, x); }
};

struct Axpy {
  float alpha;
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { axpy_element(i, alpha, x, y); }
};

struct Axpby {
  float alpha;
  const float* x;
  float beta;
  float* y;
  __device__ void operator()(index_t i) const { axpby_element(i, alpha, x, beta, y); }
};

struct Mul {
  const float* a;
  const float* b;
  float* y;
  __device__ void operator()(index_t i) const { mul_element(i, a, b, y); }
};

struct ScaleMatrix {
  index_t n, ldc;
  float beta;
  float* c;
  __device__ void operator()(index_t i) const { scale_matrix_element(i, n, ldc, beta, c); }
};

}  // namespace

cudaError_t launch_fill(cudaStream_t stream, index_t n, float value, float* x) {
  return launch_for_each(stream, n, Fill{value, x});
}

cudaError_t launch_scale(cudaStream_t stream, index_t n, float alpha, float* x) {
  return launch_for_each(stream, n, Scale{alpha, x});
}

cudaError_t launch_axpy(cudaStream_t stream, index_t n, float alpha, const float* x, float* y) {
  return launch_for_each(stream, n, Axpy{alpha, x, y});
}

cudaError_t launch_axpby(cudaStream_t stream, index_t n, float alpha, const float* x, float beta,
                         float* y) {
  return launch_for_each(stream, n, Axpby{alpha, x, beta, y});
}

cudaError_t launch_mul(cudaStream_t stream, index_t n, const float* a, const float* b, float* y) {
  return launch_for_each(stream, n, Mul{a, b, y});
}

cudaError_t launch_scale_matrix(cudaStream_t stream, index_t m, index_t n, index_t ldc, float beta,
                                float* c) {
  return launch_for_each(stream, m * n, ScaleMatrix{n, ldc, beta, c});
}

}  // namespace hn::detail::cuda
