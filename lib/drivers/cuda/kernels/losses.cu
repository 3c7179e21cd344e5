// Launchers of the loss kernels: softmax_loss forward per position and backward per element,
// each followed by the one-thread settle kernel that records an invalid label (losses.cuh);
// sigmoid cross-entropy per element.
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/losses.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct SoftmaxLossForward {
  AxisShape s;
  const float* prob;
  const float* label;
  bool has_ignore_label;
  int ignore_label;
  float* loss;
  float* valid;
  LabelError* error;
  __device__ void operator()(index_t p) const {
    if (!softmax_loss_forward_position(p, s, prob, label, has_ignore_label, ignore_label, loss,
                                       valid)) {
      atomicMin(&error->current, static_cast<unsigned long long>(p));
    }
  }
};

struct SoftmaxLossBackward {
  AxisShape s;
  const float* prob;
  const float* label;
  bool has_ignore_label;
  int ignore_label;
  float scale;
  float* dx;
  LabelError* error;
  __device__ void operator()(index_t j) const {
    index_t position = 0;
    if (!softmax_loss_backward_element(j, s, prob, label, has_ignore_label, ignore_label, scale, dx,
                                       &position)) {
      atomicMin(&error->current, static_cast<unsigned long long>(position));
    }
  }
};

struct SettleLabelError {
  LabelError* error;
  const float* label;
  LossCall call;
  AxisShape s;
  __device__ void operator()(index_t) const { settle_label_error(error, label, call, s); }
};

struct ResetLabelError {
  LabelError* error;
  __device__ void operator()(index_t) const { reset_label_error(error); }
};

struct SigmoidCrossEntropyForward {
  const float* x;
  const float* target;
  bool has_ignore_label;
  int ignore_label;
  float* loss;
  float* valid;
  __device__ void operator()(index_t i) const {
    sigmoid_cross_entropy_forward_element(i, x, target, has_ignore_label, ignore_label, loss,
                                          valid);
  }
};

struct SigmoidCrossEntropyBackward {
  const float* x;
  const float* target;
  bool has_ignore_label;
  int ignore_label;
  float scale;
  float* dx;
  __device__ void operator()(index_t i) const {
    sigmoid_cross_entropy_backward_element(i, x, target, has_ignore_label, ignore_label, scale, dx);
  }
};

cudaError_t settle(cudaStream_t stream, LabelError* error, const float* label, LossCall call,
                   const AxisShape& shape) {
  return launch_for_each(stream, 1, SettleLabelError{error, label, call, shape});
}

}  // namespace

cudaError_t launch_reset_label_error(cudaStream_t stream, LabelError* error) {
  return launch_for_each(stream, 1, ResetLabelError{error});
}

cudaError_t launch_softmax_loss_forward(cudaStream_t stream, const AxisShape& shape,
                                        const float* prob, const float* label,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid, LabelError* error) {
  const cudaError_t status = launch_for_each(
      stream, shape.outer * shape.inner,
      SoftmaxLossForward{shape, prob, label, has_ignore_label, ignore_label, loss, valid, error});
  if (status != cudaSuccess) return status;
  return settle(stream, error, label, LossCall::softmax_loss_forward, shape);
}

cudaError_t launch_softmax_loss_backward(cudaStream_t stream, const AxisShape& shape,
                                         const float* prob, const float* label,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx, LabelError* error) {
  const cudaError_t status = launch_for_each(
      stream, shape.count(),
      SoftmaxLossBackward{shape, prob, label, has_ignore_label, ignore_label, scale, dx, error});
  if (status != cudaSuccess) return status;
  return settle(stream, error, label, LossCall::softmax_loss_backward, shape);
}

cudaError_t launch_sigmoid_cross_entropy_forward(cudaStream_t stream, index_t n, const float* x,
                                                 const float* target, bool has_ignore_label,
                                                 int ignore_label, float* loss, float* valid) {
  return launch_for_each(
      stream, n,
      SigmoidCrossEntropyForward{x, target, has_ignore_label, ignore_label, loss, valid});
}

cudaError_t launch_sigmoid_cross_entropy_backward(cudaStream_t stream, index_t n, const float* x,
                                                  const float* target, bool has_ignore_label,
                                                  int ignore_label, float scale, float* dx) {
  return launch_for_each(
      stream, n, SigmoidCrossEntropyBackward{x, target, has_ignore_label, ignore_label, scale, dx});
}

}  // namespace hn::detail::cuda
