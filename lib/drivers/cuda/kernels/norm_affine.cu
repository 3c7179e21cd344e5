// Launchers of the fused per-channel normalisation (norm_affine.cuh): the forward in one
// pass (four elements per thread where a channel's planes and the operands allow float4),
// the backward in one pass over the elements and a second over the channels' partials.
#include <cstdint>

#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/norm_affine.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

// V consecutive elements per thread (V = 4: float4 loads and stores), indexed by I (32 bits
// when the tensor allows: a channel from a 32-bit division per vector).
template <class I, int V>
__global__ void __launch_bounds__(kThreads)
    norm_affine_forward_kernel(I vectors, I inner_vectors, I channels, NormAffineForward p,
                               const float* x, float* normalised, float* y) {
  const I step = static_cast<I>(blockDim.x) * gridDim.x;
  for (I j = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; j < vectors; j += step) {
    const I c = (j / inner_vectors) % channels;
    if constexpr (V == 4) {
      const float4 in = reinterpret_cast<const float4*>(x)[j];
      float4 n, out;
      out.x = norm_affine_value(p, c, in.x, &n.x);
      out.y = norm_affine_value(p, c, in.y, &n.y);
      out.z = norm_affine_value(p, c, in.z, &n.z);
      out.w = norm_affine_value(p, c, in.w, &n.w);
      if (normalised != nullptr) reinterpret_cast<float4*>(normalised)[j] = n;
      reinterpret_cast<float4*>(y)[j] = out;
    } else {
      float n = 0.0f;
      const float out = norm_affine_value(p, c, x[j], &n);
      if (normalised != nullptr) normalised[j] = n;
      y[j] = out;
    }
  }
}

template <class I, int V>
cudaError_t launch_forward(cudaStream_t stream, const AxisShape& s, const NormAffineForward& p,
                           const float* x, float* normalised, float* y) {
  const index_t vectors = s.count() / V;
  norm_affine_forward_kernel<I, V><<<grid_size(vectors), kThreads, 0, stream>>>(
      static_cast<I>(vectors), static_cast<I>(s.inner / V), static_cast<I>(s.channels), p, x,
      normalised, y);
  return cudaGetLastError();
}

bool aligned16(const void* address) {
  return reinterpret_cast<std::uintptr_t>(address) % 16 == 0;
}

// Grid (blocks per channel, channels up to 65535; more loop): partials[2 * (c * blocks + b)]
// and the next are block b's sums of dz and dz * normalised for channel c.
__global__ void __launch_bounds__(kReduceThreads)
    norm_affine_backward_kernel(AxisShape s, NormAffineBackward p, bool sums, double* partials) {
  __shared__ double dz[kReduceThreads];
  __shared__ double dz_normalised[kReduceThreads];
  const index_t b = blockIdx.x, blocks = gridDim.x;
  // Every thread of a block walks the same channels, so the barriers stay uniform.
  for (index_t c = blockIdx.y; c < s.channels; c += gridDim.y) {
    const NormSums mine = norm_affine_backward_partial(s, p, c, b, static_cast<int>(threadIdx.x));
    if (!sums) continue;
    dz[threadIdx.x] = mine.dz;
    dz_normalised[threadIdx.x] = mine.dz_normalised;
    block_tree(dz);
    block_tree(dz_normalised);
    if (threadIdx.x == 0) {
      partials[2 * (c * blocks + b)] = dz[0];
      partials[2 * (c * blocks + b) + 1] = dz_normalised[0];
    }
    __syncthreads();  // [0] is read before the next channel overwrites it
  }
}

__global__ void norm_affine_finish_kernel(index_t channels, index_t blocks, const double* partials,
                                          float* dgamma, float* dbeta) {
  const index_t c = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < channels) norm_affine_backward_finish(c, blocks, partials, dgamma, dbeta);
}

}  // namespace

cudaError_t launch_norm_affine_forward(cudaStream_t stream, const AxisShape& shape,
                                       const NormAffineForward& p, const float* x,
                                       float* normalised, float* y) {
  if (shape.count() <= 0) return cudaSuccess;
  const bool small = shape.count() < (index_t{1} << 31);
  const bool vectors = shape.inner % 4 == 0 && aligned16(x) && aligned16(y) &&
                       (normalised == nullptr || aligned16(normalised));
  if (small && vectors) return launch_forward<std::uint32_t, 4>(stream, shape, p, x, normalised, y);
  if (small) return launch_forward<std::uint32_t, 1>(stream, shape, p, x, normalised, y);
  if (vectors) return launch_forward<index_t, 4>(stream, shape, p, x, normalised, y);
  return launch_forward<index_t, 1>(stream, shape, p, x, normalised, y);
}

std::size_t norm_affine_partials_bytes(const AxisShape& shape) {
  return static_cast<std::size_t>(2 * shape.channels * norm_blocks_per_channel(shape)) *
         sizeof(double);
}

cudaError_t launch_norm_affine_backward(cudaStream_t stream, const AxisShape& shape,
                                        const NormAffineBackward& p, double* partials,
                                        float* dgamma, float* dbeta) {
  if (shape.count() <= 0) return cudaSuccess;
  const index_t blocks = norm_blocks_per_channel(shape);
  const bool sums = dgamma != nullptr || dbeta != nullptr;
  const index_t rows = shape.channels < 65535 ? shape.channels : 65535;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(rows));
  norm_affine_backward_kernel<<<grid, kReduceThreads, 0, stream>>>(shape, p, sums, partials);
  if (!sums) return cudaGetLastError();
  const index_t finish_blocks = (shape.channels + kThreads - 1) / kThreads;
  norm_affine_finish_kernel<<<static_cast<unsigned>(finish_blocks), kThreads, 0, stream>>>(
      shape.channels, blocks, partials, dgamma, dbeta);
  return cudaGetLastError();
}

}  // namespace hn::detail::cuda
