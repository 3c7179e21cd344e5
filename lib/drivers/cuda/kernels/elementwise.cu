// Launchers of the element-wise kernels (fill, scale, axpy, axpby, mul, gemm's k == 0,
// add_scalar, powx, copy_strided, scale_channels, max_accumulate, max_select).
#include "lib/drivers/cuda/kernels/elementwise.cuh"
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/launch.cuh"

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

struct AddScalar {
  float alpha;
  float* x;
  __device__ void operator()(index_t i) const { add_scalar_element(i, alpha, x); }
};

struct Powx {
  const float* x;
  float exponent;
  float* y;
  __device__ void operator()(index_t i) const { powx_element(i, x, exponent, y); }
};

struct CopyStrided {
  index_t cols;
  const float* src;
  index_t src_ld;
  float* dst;
  index_t dst_ld;
  __device__ void operator()(index_t i) const {
    copy_strided_element(i, cols, src, src_ld, dst, dst_ld);
  }
};

struct ScaleChannels {
  AxisShape s;
  const float* scale;
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { scale_channels_element(i, s, scale, x, y); }
};

struct MaxAccumulate {
  const float* x;
  std::int32_t index;
  float* y;
  std::int32_t* mask;
  __device__ void operator()(index_t i) const { max_accumulate_element(i, x, index, y, mask); }
};

struct MaxSelect {
  const std::int32_t* mask;
  std::int32_t index;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { max_select_element(i, mask, index, dy, dx); }
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

cudaError_t launch_add_scalar(cudaStream_t stream, index_t n, float alpha, float* x) {
  return launch_for_each(stream, n, AddScalar{alpha, x});
}

cudaError_t launch_powx(cudaStream_t stream, index_t n, const float* x, float exponent, float* y) {
  return launch_for_each(stream, n, Powx{x, exponent, y});
}

cudaError_t launch_copy_strided(cudaStream_t stream, index_t rows, index_t cols, const float* src,
                                index_t src_ld, float* dst, index_t dst_ld) {
  return launch_for_each(stream, rows * cols, CopyStrided{cols, src, src_ld, dst, dst_ld});
}

cudaError_t launch_scale_channels(cudaStream_t stream, const AxisShape& shape, const float* scale,
                                  const float* x, float* y) {
  return launch_for_each(stream, shape.count(), ScaleChannels{shape, scale, x, y});
}

cudaError_t launch_max_accumulate(cudaStream_t stream, index_t n, const float* x,
                                  std::int32_t index, float* y, std::int32_t* mask) {
  return launch_for_each(stream, n, MaxAccumulate{x, index, y, mask});
}

cudaError_t launch_max_select(cudaStream_t stream, index_t n, const std::int32_t* mask,
                              std::int32_t index, const float* dy, float* dx) {
  return launch_for_each(stream, n, MaxSelect{mask, index, dy, dx});
}

}  // namespace hn::detail::cuda
