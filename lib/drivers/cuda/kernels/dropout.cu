// Launchers of the dropout kernels. The scale 1.0f / (1.0f - ratio) is computed once on the
// host, by the same expression every driver uses.
#include "lib/drivers/cuda/kernels/dropout.cuh"
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct DropoutForward {
  float ratio, scale;
  std::uint64_t seed, offset;
  const float* x;
  float* y;
  float* mask;
  __device__ void operator()(index_t i) const {
    dropout_forward_element(i, ratio, scale, seed, offset, x, y, mask);
  }
};

struct DropoutBackward {
  float scale;
  const float* mask;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { dropout_backward_element(i, scale, mask, dy, dx); }
};

}  // namespace

cudaError_t launch_dropout_forward(cudaStream_t stream, index_t n, float ratio, std::uint64_t seed,
                                   std::uint64_t offset, const float* x, float* y, float* mask) {
  return launch_for_each(stream, n,
                         DropoutForward{ratio, dropout_scale(ratio), seed, offset, x, y, mask});
}

cudaError_t launch_dropout_backward(cudaStream_t stream, index_t n, float ratio, const float* mask,
                                    const float* dy, float* dx) {
  return launch_for_each(stream, n, DropoutBackward{dropout_scale(ratio), mask, dy, dx});
}

}  // namespace hn::detail::cuda
