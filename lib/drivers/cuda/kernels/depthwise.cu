// Launchers of the depthwise convolution kernels: forward per output, backward-data per input
// (a gather), backward-weights per weight; all without atomics.
#include "lib/drivers/cuda/kernels/depthwise.cuh"
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct DepthwiseForward {
  LoweringDims d;
  index_t out_channels;
  const float* x;
  const float* weights;
  const float* bias;
  float* y;
  __device__ void operator()(index_t i) const {
    depthwise_forward_element(i, d, out_channels, x, weights, bias, y);
  }
};

struct DepthwiseBackwardData {
  LoweringDims d;
  index_t out_channels;
  const float* weights;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const {
    depthwise_backward_data_element(i, d, out_channels, weights, dy, dx);
  }
};

struct DepthwiseBackwardWeights {
  LoweringDims d;
  index_t out_channels;
  const float* x;
  const float* dy;
  float* dweights;
  __device__ void operator()(index_t i) const {
    depthwise_backward_weights_element(i, d, out_channels, x, dy, dweights);
  }
};

}  // namespace

cudaError_t launch_depthwise_forward(cudaStream_t stream, const LoweringDims& d,
                                     index_t out_channels, const float* x, const float* weights,
                                     const float* bias, float* y) {
  return launch_for_each(stream, d.batch * out_channels * d.out_h * d.out_w,
                         DepthwiseForward{d, out_channels, x, weights, bias, y});
}

cudaError_t launch_depthwise_backward_data(cudaStream_t stream, const LoweringDims& d,
                                           index_t out_channels, const float* weights,
                                           const float* dy, float* dx) {
  return launch_for_each(stream, d.batch * d.channels * d.height * d.width,
                         DepthwiseBackwardData{d, out_channels, weights, dy, dx});
}

cudaError_t launch_depthwise_backward_weights(cudaStream_t stream, const LoweringDims& d,
                                              index_t out_channels, const float* x, const float* dy,
                                              float* dweights) {
  return launch_for_each(stream, out_channels * d.kernel_h * d.kernel_w,
                         DepthwiseBackwardWeights{d, out_channels, x, dy, dweights});
}

}  // namespace hn::detail::cuda
