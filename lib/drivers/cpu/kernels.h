// The CPU driver's arithmetic, one function per driver call, grouped by family (one .cpp
// per family). Every function receives the driver's Parallel and runs on its threads.
#pragma once

#include "lib/drivers/cpu/eigen.h"  // first: see eigen.h

#include <algorithm>
#include <cstdint>

#include "lib/core/shapes.h"
#include "lib/core/solver_update.h"
#include "lib/drivers/cpu/parallel.h"

namespace hn::detail::cpu {

// Outputs [lo, hi) along one axis whose input coordinate o * stride + offset lies inside
// [0, size): the part of a row that lowering and pooling handle without bounds checks.
struct OutputRange {
  index_t lo, hi;
};

inline OutputRange valid_outputs(index_t offset, index_t stride, index_t size, index_t outputs) {
  const index_t hi =
      size - 1 - offset < 0 ? 0 : std::min(outputs, (size - 1 - offset) / stride + 1);
  const index_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  return {std::min(lo, hi), hi};
}

// ---- lowering.cpp -------------------------------------------------------------------
void im2col(Parallel& par, const LoweringShape& shape, const float* images, float* columns);
void col2im(Parallel& par, const LoweringShape& shape, const float* columns, float* images);
void swap_axes(Parallel& par, index_t d0, index_t d1, index_t inner, const float* src, float* dst);
void lift(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* products,
          float* y);
void lift_backward(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* dy,
                   float* products_diff);

// ---- elementwise.cpp: element-wise, reductions, activations, bias, dropout, copies ----
void copy_bytes(Parallel& par, void* dst, const void* src, std::size_t bytes);
void fill(Parallel& par, index_t n, float value, float* x);
void scale(Parallel& par, index_t n, float alpha, float* x);
void axpy(Parallel& par, index_t n, float alpha, const float* x, float* y);
void axpby(Parallel& par, index_t n, float alpha, const float* x, float beta, float* y);
void lincomb(Parallel& par, index_t n, float alpha, const float* a, float beta, const float* b,
             float* y);
void mul(Parallel& par, index_t n, const float* a, const float* b, float* y);
void add_scalar(Parallel& par, index_t n, float alpha, float* x);
void powx(Parallel& par, index_t n, const float* x, float exponent, float* y);
void copy_strided(Parallel& par, index_t rows, index_t cols, const float* src, index_t src_ld,
                  float* dst, index_t dst_ld);
void copy_strided_batched(Parallel& par, index_t batch, index_t rows, index_t cols,
                          const float* src, index_t src_ld, index_t src_stride, float* dst,
                          index_t dst_ld, index_t dst_stride);
void scale_channels(Parallel& par, const AxisShape& shape, const float* scale, const float* x,
                    float* y);
void max_accumulate(Parallel& par, index_t n, const float* x, std::int32_t index, float* y,
                    std::int32_t* mask);
void max_select(Parallel& par, index_t n, const std::int32_t* mask, std::int32_t index,
                const float* dy, float* dx);
float dot(Parallel& par, index_t n, const float* x, const float* y);
float asum(Parallel& par, index_t n, const float* x);
float sum(Parallel& par, index_t n, const float* x);
void bias_forward(Parallel& par, const AxisShape& shape, const float* bias, float* y);
void bias_backward(Parallel& par, const AxisShape& shape, const float* dy, float beta,
                   float* dbias);
void relu_forward(Parallel& par, index_t n, float slope, const float* x, float* y);
void swish_forward(Parallel& par, index_t n, float beta, const float* x, float* y);
void swish_backward(Parallel& par, index_t n, float beta, const float* x, const float* dy,
                    float* dx);
void clip_forward(Parallel& par, index_t n, float lo, float hi, const float* x, float* y);
void clip_backward(Parallel& par, index_t n, float lo, float hi, const float* x, const float* dy,
                   float* dx);
void lincomb_relu(Parallel& par, index_t n, float alpha, const float* a, float beta, const float* b,
                  float slope, float* y);
// relu_backward, then bias_backward (beta 1) of its result, each run of a channel masked
// and summed while in cache: the same bits as the two calls (elementwise.cpp; blocked:
// layout.cpp).
void relu_backward_bias(Parallel& par, const AxisShape& shape, float slope, const float* y,
                        const float* dy, float* dx, float* dbias);
void relu_backward_bias_blocked(Parallel& par, const AxisShape& shape, float slope, const float* y,
                                const float* dy, float* dx, float* dbias);
void relu_backward(Parallel& par, index_t n, float slope, const float* x, const float* dy,
                   float* dx);
// relu_backward's loop on the calling thread, for kernels that mask inside their own
// parallel work (conv_pointwise_plain.cpp): the same expression, so the same bits.
void relu_backward_run(index_t n, float slope, const float* x, const float* dy, float* dx);
void sigmoid_forward(Parallel& par, index_t n, const float* x, float* y);
void sigmoid_backward(Parallel& par, index_t n, const float* y, const float* dy, float* dx);
void tanh_forward(Parallel& par, index_t n, const float* x, float* y);
void tanh_backward(Parallel& par, index_t n, const float* y, const float* dy, float* dx);
void dropout_forward(Parallel& par, index_t n, float ratio, std::uint64_t seed,
                     std::uint64_t offset, const float* x, float* y, float* mask);
void dropout_forward_layout(Parallel& par, const AxisShape& shape, float ratio, std::uint64_t seed,
                            std::uint64_t offset, const float* x, float* y, float* mask);
void dropout_backward(Parallel& par, index_t n, float ratio, const float* mask, const float* dy,
                      float* dx);

// ---- pooling.cpp --------------------------------------------------------------------
void pool_max_forward(Parallel& par, const PoolShape& shape, const float* x, float* y,
                      std::int32_t* mask);
void pool_max_backward(Parallel& par, const PoolShape& shape, const float* dy,
                       const std::int32_t* mask, float* dx);
void pool_avg_forward(Parallel& par, const PoolShape& shape, const float* x, float* y);
void pool_avg_backward(Parallel& par, const PoolShape& shape, const float* dy, float* dx);

// One channel plane of average pooling (Caffe's divisor), shared by pooling and LRN.
void avg_pool_plane_forward(const PoolShape& shape, const float* x, float* y);
// Overwrites dx with the sum over outputs i of dy[i] / pool_size(i) on i's clipped window.
void avg_pool_plane_backward(const PoolShape& shape, const float* dy, float* dx);

// ---- layout.cpp: nChw16c and nChw8c (channels in whole blocks) -----------------------
// The pooling calls above on blocked x, y, dx, dy and mask (mask entries: the argmax's
// pixel in its plane, as on NCHW), bit for bit the same values.
void pool_max_forward_blocked(Parallel& par, const PoolShape& shape, const float* x, float* y,
                              std::int32_t* mask);
void pool_max_backward_blocked(Parallel& par, const PoolShape& shape, const float* dy,
                               const std::int32_t* mask, float* dx);
void pool_avg_forward_blocked(Parallel& par, const PoolShape& shape, const float* x, float* y);
void pool_avg_backward_blocked(Parallel& par, const PoolShape& shape, const float* dy, float* dx);
// scale_channels, bias_forward and bias_backward (elementwise.cpp) on nChw16c and nChw8c.
void scale_channels_blocked(Parallel& par, const AxisShape& shape, const float* scale,
                            const float* x, float* y);
void bias_forward_blocked(Parallel& par, const AxisShape& shape, const float* bias, float* y);
void bias_backward_blocked(Parallel& par, const AxisShape& shape, const float* dy, float beta,
                           float* dbias);

// ---- norm.cpp: BatchNorm on stored statistics + Scale + ReLU, NCHW and blocked -----
void norm_affine_forward(Parallel& par, const AxisShape& shape, const float* x, const float* shift,
                         const float* inv_std, const float* gamma, const float* beta, bool relu,
                         float slope, float* normalised, float* y);
void norm_affine_backward(Parallel& par, const AxisShape& shape, const float* dy, const float* y,
                          const float* normalised, const float* dx_scale, bool relu, float slope,
                          float* dgamma, float* dbeta, float* dx);

// ---- lrn.cpp, softmax.cpp -----------------------------------------------------------
void lrn_forward(Parallel& par, const LrnShape& shape, const float* x, float* y, float* scale);
void lrn_backward(Parallel& par, const LrnShape& shape, const float* x, const float* y,
                  const float* scale, const float* dy, float* dx);
void softmax_forward(Parallel& par, const AxisShape& shape, const float* x, float* y);
void softmax_backward(Parallel& par, const AxisShape& shape, const float* y, const float* dy,
                      float* dx);

// ---- losses.cpp ---------------------------------------------------------------------
void softmax_loss_forward(Parallel& par, const AxisShape& shape, const float* prob,
                          const float* label, bool has_ignore_label, int ignore_label, float* loss,
                          float* valid);
void softmax_loss_backward(Parallel& par, const AxisShape& shape, const float* prob,
                           const float* label, bool has_ignore_label, int ignore_label, float scale,
                           float* dx);
void sigmoid_cross_entropy_forward(Parallel& par, index_t n, const float* x, const float* target,
                                   bool has_ignore_label, int ignore_label, float* loss,
                                   float* valid);
void sigmoid_cross_entropy_backward(Parallel& par, index_t n, const float* x, const float* target,
                                    bool has_ignore_label, int ignore_label, float scale,
                                    float* dx);

// ---- solver_update.cpp --------------------------------------------------------------
void solver_update(Parallel& par, const SolverUpdate& u, index_t n, float* param, const float* grad,
                   float* history, float* history2);

}  // namespace hn::detail::cpu
