// Launchers of the pooling kernels: forward per output, backward per input (gather).
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/pooling.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct PoolMaxForward {
  PoolDims d;
  const float* x;
  float* y;
  std::int32_t* mask;
  __device__ void operator()(index_t i) const { pool_max_forward_element(i, d, x, y, mask); }
};

struct PoolMaxBackward {
  PoolDims d;
  const float* dy;
  const std::int32_t* mask;
  float* dx;
  __device__ void operator()(index_t i) const { pool_max_backward_element(i, d, dy, mask, dx); }
};

struct PoolAvgForward {
  PoolDims d;
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { pool_avg_forward_element(i, d, x, y); }
};

struct PoolAvgBackward {
  PoolDims d;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { pool_avg_backward_element(i, d, dy, dx); }
};

index_t in_count(const PoolDims& d) {
  return d.batch * d.channels * d.height * d.width;
}
index_t out_count(const PoolDims& d) {
  return d.batch * d.channels * d.out_h * d.out_w;
}

}  // namespace

cudaError_t launch_pool_max_forward(cudaStream_t stream, const PoolDims& d, const float* x,
                                    float* y, std::int32_t* mask) {
  return launch_for_each(stream, out_count(d), PoolMaxForward{d, x, y, mask});
}

cudaError_t launch_pool_max_backward(cudaStream_t stream, const PoolDims& d, const float* dy,
                                     const std::int32_t* mask, float* dx) {
  return launch_for_each(stream, in_count(d), PoolMaxBackward{d, dy, mask, dx});
}

cudaError_t launch_pool_avg_forward(cudaStream_t stream, const PoolDims& d, const float* x,
                                    float* y) {
  return launch_for_each(stream, out_count(d), PoolAvgForward{d, x, y});
}

cudaError_t launch_pool_avg_backward(cudaStream_t stream, const PoolDims& d, const float* dy,
                                     float* dx) {
  return launch_for_each(stream, in_count(d), PoolAvgBackward{d, dy, dx});
}

}  // namespace hn::detail::cuda
