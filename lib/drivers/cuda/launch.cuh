// CUDA-only launch helpers shared by the kernel launchers (kernels/*.cu): one grid-stride
// kernel that runs a per-index body, and the grid size for n indices. Only nvcc sees this
// file; the bodies live in the g++-compilable kernels/*.cuh headers.
#pragma once

#include <cuda_runtime.h>

#include "lib/core/shapes.h"

namespace hn::detail::cuda {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; larger n loops in the grid.
constexpr index_t kMaxBlocks = 8192;

inline unsigned grid_size(index_t n) {
  const index_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Runs body(i) for every i in [0, n); Body is a small struct with a __device__ operator().
template <class Body>
__global__ void for_each_index_kernel(index_t n, Body body) {
  const index_t step = static_cast<index_t>(blockDim.x) * gridDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    body(i);
  }
}

template <class Body>
cudaError_t launch_for_each(cudaStream_t stream, index_t n, const Body& body) {
  if (n <= 0) return cudaSuccess;
  for_each_index_kernel<<<grid_size(n), kThreads, 0, stream>>>(n, body);
  return cudaGetLastError();
}

}  // namespace hn::detail::cuda
