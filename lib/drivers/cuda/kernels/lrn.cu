// Launchers of the LRN kernels, both regions, one thread per element.
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/lrn.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct LrnAcrossScale {
  LrnShape s;
  const float* x;
  float* scale;
  __device__ void operator()(index_t i) const { lrn_across_scale_element(i, s, x, scale); }
};

struct LrnAcrossForward {
  LrnShape s;
  const float* x;
  float* y;
  float* scale;
  __device__ void operator()(index_t i) const { lrn_across_forward_element(i, s, x, y, scale); }
};

struct LrnAcrossBackward {
  LrnShape s;
  const float* x;
  const float* y;
  const float* scale;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const {
    lrn_across_backward_element(i, s, x, y, scale, dy, dx);
  }
};

struct LrnWithinForward {
  LrnShape s;
  const float* x;
  float* y;
  float* scale;
  __device__ void operator()(index_t i) const { lrn_within_forward_element(i, s, x, y, scale); }
};

struct LrnWithinBackward {
  LrnShape s;
  const float* x;
  const float* scale;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const {
    lrn_within_backward_element(i, s, x, scale, dy, dx);
  }
};

index_t count(const LrnShape& s) {
  return s.batch * s.channels * s.height * s.width;
}

}  // namespace

cudaError_t launch_lrn_across_scale(cudaStream_t stream, const LrnShape& shape, const float* x,
                                    float* scale) {
  return launch_for_each(stream, count(shape), LrnAcrossScale{shape, x, scale});
}

cudaError_t launch_lrn_forward(cudaStream_t stream, const LrnShape& shape, const float* x, float* y,
                               float* scale) {
  if (shape.region == LrnRegion::across_channels) {
    return launch_for_each(stream, count(shape), LrnAcrossForward{shape, x, y, scale});
  }
  return launch_for_each(stream, count(shape), LrnWithinForward{shape, x, y, scale});
}

cudaError_t launch_lrn_backward(cudaStream_t stream, const LrnShape& shape, const float* x,
                                const float* y, const float* scale, const float* dy, float* dx) {
  if (shape.region == LrnRegion::across_channels) {
    return launch_for_each(stream, count(shape), LrnAcrossBackward{shape, x, y, scale, dy, dx});
  }
  return launch_for_each(stream, count(shape), LrnWithinBackward{shape, x, scale, dy, dx});
}

}  // namespace hn::detail::cuda
