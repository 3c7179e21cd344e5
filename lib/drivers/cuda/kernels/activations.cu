// Launchers of the activation kernels (bias_forward, relu, clip, sigmoid, tanh).
#include "lib/drivers/cuda/kernels/activations.cuh"
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct BiasForward {
  AxisShape shape;
  const float* bias;
  float* y;
  __device__ void operator()(index_t i) const { bias_forward_element(i, shape, bias, y); }
};

struct ReluForward {
  float slope;
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { relu_forward_element(i, slope, x, y); }
};

struct ReluBackward {
  float slope;
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { relu_backward_element(i, slope, x, dy, dx); }
};

struct ClipForward {
  float lo, hi;
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { clip_forward_element(i, lo, hi, x, y); }
};

struct ClipBackward {
  float lo, hi;
  const float* x;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { clip_backward_element(i, lo, hi, x, dy, dx); }
};

struct SigmoidForward {
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { sigmoid_forward_element(i, x, y); }
};

struct SigmoidBackward {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { sigmoid_backward_element(i, y, dy, dx); }
};

struct TanhForward {
  const float* x;
  float* y;
  __device__ void operator()(index_t i) const { tanh_forward_element(i, x, y); }
};

struct TanhBackward {
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(index_t i) const { tanh_backward_element(i, y, dy, dx); }
};

}  // namespace

cudaError_t launch_bias_forward(cudaStream_t stream, const AxisShape& shape, const float* bias,
                                float* y) {
  return launch_for_each(stream, shape.outer * shape.channels * shape.inner,
                         BiasForward{shape, bias, y});
}

cudaError_t launch_relu_forward(cudaStream_t stream, index_t n, float negative_slope,
                                const float* x, float* y) {
  return launch_for_each(stream, n, ReluForward{negative_slope, x, y});
}

cudaError_t launch_relu_backward(cudaStream_t stream, index_t n, float negative_slope,
                                 const float* x, const float* dy, float* dx) {
  return launch_for_each(stream, n, ReluBackward{negative_slope, x, dy, dx});
}

cudaError_t launch_clip_forward(cudaStream_t stream, index_t n, float lo, float hi, const float* x,
                                float* y) {
  return launch_for_each(stream, n, ClipForward{lo, hi, x, y});
}

cudaError_t launch_clip_backward(cudaStream_t stream, index_t n, float lo, float hi, const float* x,
                                 const float* dy, float* dx) {
  return launch_for_each(stream, n, ClipBackward{lo, hi, x, dy, dx});
}

cudaError_t launch_sigmoid_forward(cudaStream_t stream, index_t n, const float* x, float* y) {
  return launch_for_each(stream, n, SigmoidForward{x, y});
}

cudaError_t launch_sigmoid_backward(cudaStream_t stream, index_t n, const float* y, const float* dy,
                                    float* dx) {
  return launch_for_each(stream, n, SigmoidBackward{y, dy, dx});
}

cudaError_t launch_tanh_forward(cudaStream_t stream, index_t n, const float* x, float* y) {
  return launch_for_each(stream, n, TanhForward{x, y});
}

cudaError_t launch_tanh_backward(cudaStream_t stream, index_t n, const float* y, const float* dy,
                                 float* dx) {
  return launch_for_each(stream, n, TanhBackward{y, dy, dx});
}

}  // namespace hn::detail::cuda
