// Launchers of the deterministic reductions: a first pass of reduce_blocks(n) blocks, each
// writing one double partial, then one block that combines the partials; bias_backward
// runs one block per channel. Fixed grids and fixed trees make every run add in the same
// order, so results are bitwise reproducible.
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/reductions.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

__global__ void __launch_bounds__(kReduceThreads)
    reduce_partials_kernel(ReduceOp op, index_t n, const float* x, const float* y,
                           double* partials) {
  __shared__ double values[kReduceThreads];
  const index_t threads = static_cast<index_t>(gridDim.x) * kReduceThreads;
  const index_t thread = static_cast<index_t>(blockIdx.x) * kReduceThreads + threadIdx.x;
  values[threadIdx.x] = reduce_thread_partial(op, thread, threads, n, x, y);
  block_tree(values);
  if (threadIdx.x == 0) partials[blockIdx.x] = values[0];
}

__global__ void __launch_bounds__(kReduceThreads)
    reduce_final_kernel(int count, const double* partials, float* result) {
  __shared__ double values[kReduceThreads];
  values[threadIdx.x] = partials_thread_sum(static_cast<int>(threadIdx.x), count, partials);
  block_tree(values);
  if (threadIdx.x == 0) *result = static_cast<float>(values[0]);
}

__global__ void __launch_bounds__(kReduceThreads)
    bias_backward_kernel(AxisShape shape, const float* dy, float beta, float* dbias) {
  __shared__ double values[kReduceThreads];
  // Every thread of a block walks the same channels, so the barriers stay uniform.
  for (index_t c = blockIdx.x; c < shape.channels; c += gridDim.x) {
    values[threadIdx.x] = bias_backward_partial(c, static_cast<int>(threadIdx.x), shape, dy);
    block_tree(values);
    if (threadIdx.x == 0) bias_backward_finish(c, values[0], beta, dbias);
    __syncthreads();  // values[0] is read before the next channel overwrites it
  }
}

}  // namespace

cudaError_t launch_reduce(cudaStream_t stream, ReduceOp op, index_t n, const float* x,
                          const float* y, double* partials, float* result) {
  const int blocks = reduce_blocks(n);
  reduce_partials_kernel<<<blocks, kReduceThreads, 0, stream>>>(op, n, x, y, partials);
  reduce_final_kernel<<<1, kReduceThreads, 0, stream>>>(blocks, partials, result);
  return cudaGetLastError();
}

cudaError_t launch_bias_backward(cudaStream_t stream, const AxisShape& shape, const float* dy,
                                 float beta, float* dbias) {
  const index_t blocks = shape.channels < 65535 ? shape.channels : 65535;
  bias_backward_kernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, stream>>>(shape, dy,
                                                                                     beta, dbias);
  return cudaGetLastError();
}

}  // namespace hn::detail::cuda
