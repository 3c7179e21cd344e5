// Host entry points of the CUDA kernels, one group per primitive family (*.cu beside this
// file). Each queues its kernels on `stream` and returns the launch status; the driver turns
// a failure into hn::Error. Arguments are already validated by the Driver front.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/core/shapes.h"
#include "lib/core/solver_update.h"
#include "lib/drivers/cuda/kernels/depthwise.cuh"
#include "lib/drivers/cuda/kernels/losses.cuh"
#include "lib/drivers/cuda/kernels/lowering.cuh"
#include "lib/drivers/cuda/kernels/norm_affine.cuh"
#include "lib/drivers/cuda/kernels/pooling.cuh"
#include "lib/drivers/cuda/kernels/reductions.cuh"

namespace hn::detail::cuda {

// lowering.cu
cudaError_t launch_im2col(cudaStream_t stream, const LoweringDims& d, const float* images,
                          float* columns);
cudaError_t launch_col2im(cudaStream_t stream, const LoweringDims& d, const float* columns,
                          float* images);
cudaError_t launch_swap_axes(cudaStream_t stream, index_t d0, index_t d1, index_t inner,
                             const float* src, float* dst);
cudaError_t launch_lift(cudaStream_t stream, const LoweringDims& d, index_t out_channels,
                        const float* products, float* y);
cudaError_t launch_lift_backward(cudaStream_t stream, const LoweringDims& d, index_t out_channels,
                                 const float* dy, float* products_diff);

// depthwise.cu. Shapes with cuda::is_depthwise; d from lowering_dims.
cudaError_t launch_depthwise_forward(cudaStream_t stream, const LoweringDims& d,
                                     index_t out_channels, const float* x, const float* weights,
                                     const float* bias, float* y);
cudaError_t launch_depthwise_backward_data(cudaStream_t stream, const LoweringDims& d,
                                           index_t out_channels, const float* weights,
                                           const float* dy, float* dx);
cudaError_t launch_depthwise_backward_weights(cudaStream_t stream, const LoweringDims& d,
                                              index_t out_channels, const float* x, const float* dy,
                                              float* dweights);

// elementwise.cu
cudaError_t launch_fill(cudaStream_t stream, index_t n, float value, float* x);
cudaError_t launch_scale(cudaStream_t stream, index_t n, float alpha, float* x);
cudaError_t launch_axpy(cudaStream_t stream, index_t n, float alpha, const float* x, float* y);
cudaError_t launch_axpby(cudaStream_t stream, index_t n, float alpha, const float* x, float beta,
                         float* y);
cudaError_t launch_mul(cudaStream_t stream, index_t n, const float* a, const float* b, float* y);
cudaError_t launch_scale_matrix(cudaStream_t stream, index_t m, index_t n, index_t ldc, float beta,
                                float* c);
cudaError_t launch_add_scalar(cudaStream_t stream, index_t n, float alpha, float* x);
cudaError_t launch_powx(cudaStream_t stream, index_t n, const float* x, float exponent, float* y);
cudaError_t launch_copy_strided(cudaStream_t stream, index_t rows, index_t cols, const float* src,
                                index_t src_ld, float* dst, index_t dst_ld);
cudaError_t launch_scale_channels(cudaStream_t stream, const AxisShape& shape, const float* scale,
                                  const float* x, float* y);
cudaError_t launch_max_accumulate(cudaStream_t stream, index_t n, const float* x,
                                  std::int32_t index, float* y, std::int32_t* mask);
cudaError_t launch_max_select(cudaStream_t stream, index_t n, const std::int32_t* mask,
                              std::int32_t index, const float* dy, float* dx);

// reductions.cu. `partials` holds kReduceMaxBlocks doubles of device scratch; the float
// result lands in device memory at `result`.
cudaError_t launch_reduce(cudaStream_t stream, ReduceOp op, index_t n, const float* x,
                          const float* y, double* partials, float* result);
cudaError_t launch_bias_backward(cudaStream_t stream, const AxisShape& shape, const float* dy,
                                 float beta, float* dbias);

// norm_affine.cu. The backward's `partials` hold norm_affine_partials_bytes(shape) of device
// scratch; dgamma and dbeta accumulate (either may be null), dx (in p) is overwritten.
cudaError_t launch_norm_affine_forward(cudaStream_t stream, const AxisShape& shape,
                                       const NormAffineForward& p, const float* x,
                                       float* normalised, float* y);
std::size_t norm_affine_partials_bytes(const AxisShape& shape);
cudaError_t launch_norm_affine_backward(cudaStream_t stream, const AxisShape& shape,
                                        const NormAffineBackward& p, double* partials,
                                        float* dgamma, float* dbeta);

// activations.cu
cudaError_t launch_bias_forward(cudaStream_t stream, const AxisShape& shape, const float* bias,
                                float* y);
cudaError_t launch_relu_forward(cudaStream_t stream, index_t n, float negative_slope,
                                const float* x, float* y);
cudaError_t launch_relu_backward(cudaStream_t stream, index_t n, float negative_slope,
                                 const float* x, const float* dy, float* dx);
cudaError_t launch_clip_forward(cudaStream_t stream, index_t n, float lo, float hi, const float* x,
                                float* y);
cudaError_t launch_clip_backward(cudaStream_t stream, index_t n, float lo, float hi, const float* x,
                                 const float* dy, float* dx);
cudaError_t launch_sigmoid_forward(cudaStream_t stream, index_t n, const float* x, float* y);
cudaError_t launch_sigmoid_backward(cudaStream_t stream, index_t n, const float* y, const float* dy,
                                    float* dx);
cudaError_t launch_tanh_forward(cudaStream_t stream, index_t n, const float* x, float* y);
cudaError_t launch_tanh_backward(cudaStream_t stream, index_t n, const float* y, const float* dy,
                                 float* dx);

// pooling.cu
cudaError_t launch_pool_max_forward(cudaStream_t stream, const PoolDims& d, const float* x,
                                    float* y, std::int32_t* mask);
cudaError_t launch_pool_max_backward(cudaStream_t stream, const PoolDims& d, const float* dy,
                                     const std::int32_t* mask, float* dx);
cudaError_t launch_pool_avg_forward(cudaStream_t stream, const PoolDims& d, const float* x,
                                    float* y);
cudaError_t launch_pool_avg_backward(cudaStream_t stream, const PoolDims& d, const float* dy,
                                     float* dx);

// lrn.cu. launch_lrn_across_scale fills only `scale` (the cuDNN path computes y itself).
cudaError_t launch_lrn_across_scale(cudaStream_t stream, const LrnShape& shape, const float* x,
                                    float* scale);
cudaError_t launch_lrn_forward(cudaStream_t stream, const LrnShape& shape, const float* x, float* y,
                               float* scale);
cudaError_t launch_lrn_backward(cudaStream_t stream, const LrnShape& shape, const float* x,
                                const float* y, const float* scale, const float* dy, float* dx);

// softmax.cu
cudaError_t launch_softmax_forward(cudaStream_t stream, const AxisShape& shape, const float* x,
                                   float* y);
cudaError_t launch_softmax_backward(cudaStream_t stream, const AxisShape& shape, const float* y,
                                    const float* dy, float* dx);

// dropout.cu
cudaError_t launch_dropout_forward(cudaStream_t stream, index_t n, float ratio, std::uint64_t seed,
                                   std::uint64_t offset, const float* x, float* y, float* mask);
cudaError_t launch_dropout_backward(cudaStream_t stream, index_t n, float ratio, const float* mask,
                                    const float* dy, float* dx);

// losses.cu. softmax_loss launches record an invalid label in `error` (see losses.cuh);
// launch_reset_label_error clears the record.
cudaError_t launch_reset_label_error(cudaStream_t stream, LabelError* error);
cudaError_t launch_softmax_loss_forward(cudaStream_t stream, const AxisShape& shape,
                                        const float* prob, const float* label,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid, LabelError* error);
cudaError_t launch_softmax_loss_backward(cudaStream_t stream, const AxisShape& shape,
                                         const float* prob, const float* label,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx, LabelError* error);
cudaError_t launch_sigmoid_cross_entropy_forward(cudaStream_t stream, index_t n, const float* x,
                                                 const float* target, bool has_ignore_label,
                                                 int ignore_label, float* loss, float* valid);
cudaError_t launch_sigmoid_cross_entropy_backward(cudaStream_t stream, index_t n, const float* x,
                                                  const float* target, bool has_ignore_label,
                                                  int ignore_label, float scale, float* dx);

// solver_update.cu
cudaError_t launch_solver_update(cudaStream_t stream, const SolverUpdate& u, index_t n,
                                 float* param, const float* grad, float* history, float* history2);

}  // namespace hn::detail::cuda
