// Launchers of the softmax kernels: one thread per (outer, inner) column.
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/softmax.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct SoftmaxForward {
  AxisShape s;
  const float* x;
  float* y;
  __device__ void operator()(index_t col) const { softmax_forward_column(col, s, x, y); }
};

struct SoftmaxBackward {
  AxisShape s;
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t col) const { softmax_backward_column(col, s, y, dy, dx); }
};

}  // namespace

cudaError_t launch_softmax_forward(cudaStream_t stream, const AxisShape& shape, const float* x,
                                   float* y) {
  return launch_for_each(stream, shape.outer * shape.inner, SoftmaxForward{shape, x, y});
}

cudaError_t launch_softmax_backward(cudaStream_t stream, const AxisShape& shape, const float* y,
                                    const float* dy, float* dx) {
  return launch_for_each(stream, shape.outer * shape.inner, SoftmaxBackward{shape, y, dy, dx});
}

}  // namespace hn::detail::cuda
