// The CUDA driver's calls that run cuBLAS's GEMM or our own kernels (kernels/launchers.h)
// directly: lowering, element-wise, reductions, activations, pooling, dropout, losses, solver.
#include "lib/drivers/cuda/cuda_internal.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "lib/drivers/cuda/kernels/launchers.h"

namespace hn::detail {

// ---- GEMM ---------------------------------------------------------------------------

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
void CudaDriver::do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k,
                         float alpha, const float* a, index_t lda, const float* b, index_t ldb,
                         float beta, float* c, index_t ldc) {
  activate();
  if (k == 0) {  // C = beta * C, without asking cuBLAS about an empty product
    launched(cuda::launch_scale_matrix(stream(), m, n, ldc, beta, c), "gemm (k = 0)",
             "m={} n={} ldc={}", m, n, ldc);
    return;
  }
  const cublasOperation_t op_a = trans_a == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (math_mode() == MathMode::fp32) {
    check_blas(
        cublas().sgemm(blas_.get(), op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
        "gemm: cublasSgemm_64", "m={} n={} k={} lda={} ldb={} ldc={} trans_a={} trans_b={}", m, n,
        k, lda, ldb, ldc, trans_a == Transpose::yes, trans_b == Transpose::yes);
    return;
  }
  // FP32 operands and result; the products of TF32- or BF16-rounded inputs on tensor cores.
  const cublasComputeType_t compute =
      math_mode() == MathMode::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_TF32;
  check_blas(
      cublas().gemm_ex(blas_.get(), op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F,
                       lda, &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
      "gemm: cublasGemmEx_64", "{} math, m={} n={} k={} lda={} ldb={} ldc={} trans_a={} trans_b={}",
      math_mode_name(math_mode()), m, n, k, lda, ldb, ldc, trans_a == Transpose::yes,
      trans_b == Transpose::yes);
}

// ---- lowering -----------------------------------------------------------------------

void CudaDriver::do_im2col(const LoweringShape& shape, const float* images, float* columns) {
  activate();
  launched(cuda::launch_im2col(stream(), cuda::lowering_dims(shape), images, columns), "im2col",
           "{}", shape.to_string());
}

void CudaDriver::do_col2im(const LoweringShape& shape, const float* columns, float* images) {
  activate();
  launched(cuda::launch_col2im(stream(), cuda::lowering_dims(shape), columns, images), "col2im",
           "{}", shape.to_string());
}

void CudaDriver::do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) {
  activate();
  launched(cuda::launch_swap_axes(stream(), d0, d1, inner, src, dst), "swap_axes",
           "d0={} d1={} inner={}", d0, d1, inner);
}

void CudaDriver::do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
                         float* y) {
  activate();
  launched(cuda::launch_lift(stream(), cuda::lowering_dims(shape), out_channels, products, y),
           "lift", "{} out_channels={}", shape.to_string(), out_channels);
}

void CudaDriver::do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                                  float* products_diff) {
  activate();
  launched(cuda::launch_lift_backward(stream(), cuda::lowering_dims(shape), out_channels, dy,
                                      products_diff),
           "lift_backward", "{} out_channels={}", shape.to_string(), out_channels);
}

// ---- element-wise -------------------------------------------------------------------

void CudaDriver::do_fill(index_t n, float value, float* x) {
  activate();
  launched(cuda::launch_fill(stream(), n, value, x), "fill", "n={}", n);
}

void CudaDriver::do_scale(index_t n, float alpha, float* x) {
  activate();
  launched(cuda::launch_scale(stream(), n, alpha, x), "scale", "n={}", n);
}

void CudaDriver::do_axpy(index_t n, float alpha, const float* x, float* y) {
  activate();
  launched(cuda::launch_axpy(stream(), n, alpha, x, y), "axpy", "n={}", n);
}

void CudaDriver::do_axpby(index_t n, float alpha, const float* x, float beta, float* y) {
  activate();
  launched(cuda::launch_axpby(stream(), n, alpha, x, beta, y), "axpby", "n={}", n);
}

void CudaDriver::do_mul(index_t n, const float* a, const float* b, float* y) {
  activate();
  launched(cuda::launch_mul(stream(), n, a, b, y), "mul", "n={}", n);
}

void CudaDriver::do_add_scalar(index_t n, float alpha, float* x) {
  activate();
  launched(cuda::launch_add_scalar(stream(), n, alpha, x), "add_scalar", "n={}", n);
}

void CudaDriver::do_powx(index_t n, const float* x, float exponent, float* y) {
  activate();
  launched(cuda::launch_powx(stream(), n, x, exponent, y), "powx", "n={} exponent={}", n, exponent);
}

void CudaDriver::do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld,
                                 float* dst, index_t dst_ld) {
  activate();
  launched(cuda::launch_copy_strided(stream(), rows, cols, src, src_ld, dst, dst_ld),
           "copy_strided", "rows={} cols={} src_ld={} dst_ld={}", rows, cols, src_ld, dst_ld);
}

void CudaDriver::do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                                   float* y) {
  activate();
  launched(cuda::launch_scale_channels(stream(), shape, scale, x, y), "scale_channels", "{}",
           shape.to_string());
}

// BatchNorm (stored statistics), Scale and ReLU in one pass forward (norm_affine.cu); the
// generic sequence made six passes, each finding an element's channel by a 64-bit division.
void CudaDriver::do_norm_affine_forward(const AxisShape& shape, const float* x, const float* shift,
                                        const float* inv_std, const float* gamma, const float* beta,
                                        bool relu, float slope, float* normalised, float* y) {
  activate();
  cuda::NormAffineForward p;
  p.shift = shift;
  p.inv_std = inv_std;
  p.gamma = gamma;
  p.beta = beta;
  p.relu = relu;
  p.slope = slope;
  launched(cuda::launch_norm_affine_forward(stream(), shape, p, x, normalised, y),
           "norm_affine_forward", "{}", shape.to_string());
}

// One pass over the elements (dx, and each channel's sums cut into blocks), one over the
// channels' partials. The generic sequence made five passes with two intermediates, and its
// sums one block per channel (64 blocks for ResNet-50's scale_conv1).
void CudaDriver::do_norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                                         const float* normalised, const float* dx_scale, bool relu,
                                         float slope, float* dgamma, float* dbeta, float* dx) {
  if (dgamma == nullptr && dbeta == nullptr && dx == nullptr) return;
  activate();
  cuda::NormAffineBackward p;
  p.dy = dy;
  p.y = relu ? y : nullptr;
  p.normalised = dgamma != nullptr ? normalised : nullptr;
  p.dx_scale = dx_scale;
  p.relu = relu;
  p.slope = slope;
  p.dx = dx;
  const bool sums = dgamma != nullptr || dbeta != nullptr;
  auto* partials =
      sums ? reinterpret_cast<double*>(scratch(cuda::norm_affine_partials_bytes(shape))) : nullptr;
  launched(cuda::launch_norm_affine_backward(stream(), shape, p, partials, dgamma, dbeta),
           "norm_affine_backward", "{}", shape.to_string());
}

void CudaDriver::do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                                   std::int32_t* mask) {
  activate();
  launched(cuda::launch_max_accumulate(stream(), n, x, index, y, mask), "max_accumulate",
           "n={} index={}", n, index);
}

void CudaDriver::do_max_select(index_t n, const std::int32_t* mask, std::int32_t index,
                               const float* dy, float* dx) {
  activate();
  launched(cuda::launch_max_select(stream(), n, mask, index, dy, dx), "max_select", "n={} index={}",
           n, index);
}

// ---- reductions ---------------------------------------------------------------------

float CudaDriver::do_dot(index_t n, const float* x, const float* y) {
  return reduce(cuda::ReduceOp::dot, "dot", n, x, y);
}

float CudaDriver::do_asum(index_t n, const float* x) {
  return reduce(cuda::ReduceOp::asum, "asum", n, x, x);
}

float CudaDriver::do_sum(index_t n, const float* x) {
  return reduce(cuda::ReduceOp::sum, "sum", n, x, x);
}

float CudaDriver::reduce(cuda::ReduceOp op, const char* call, index_t n, const float* x,
                         const float* y) {
  activate();
  auto* partials = static_cast<double*>(reduce_scratch_.get());
  auto* result = reinterpret_cast<float*>(partials + cuda::kReduceMaxBlocks);
  launched(cuda::launch_reduce(stream(), op, n, x, y, partials, result), call, "n={}", n);
  check(cudaMemcpyAsync(reduce_result_.get(), result, sizeof(float), cudaMemcpyDeviceToHost,
                        stream()),
        "cudaMemcpyAsync", "{} result, n={}", call, n);
  count_wait();
  check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", "{}, n={}", call, n);
  const float value = *static_cast<const float*>(reduce_result_.get());
  report_label_error();
  return value;
}

void CudaDriver::do_bias_backward(const AxisShape& shape, const float* dy, float beta,
                                  float* dbias) {
  activate();
  launched(cuda::launch_bias_backward(stream(), shape, dy, beta, dbias), "bias_backward", "{}",
           shape.to_string());
}

// ---- activations --------------------------------------------------------------------

void CudaDriver::do_bias_forward(const AxisShape& shape, const float* bias, float* y) {
  activate();
  launched(cuda::launch_bias_forward(stream(), shape, bias, y), "bias_forward", "{}",
           shape.to_string());
}

void CudaDriver::do_clip_forward(index_t n, float lo, float hi, const float* x, float* y) {
  activate();
  launched(cuda::launch_clip_forward(stream(), n, lo, hi, x, y), "clip_forward", "n={}", n);
}

void CudaDriver::do_clip_backward(index_t n, float lo, float hi, const float* x, const float* dy,
                                  float* dx) {
  activate();
  launched(cuda::launch_clip_backward(stream(), n, lo, hi, x, dy, dx), "clip_backward", "n={}", n);
}

void CudaDriver::do_relu_forward(index_t n, float negative_slope, const float* x, float* y) {
  activate();
  launched(cuda::launch_relu_forward(stream(), n, negative_slope, x, y), "relu_forward", "n={}", n);
}

void CudaDriver::do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                                  float* dx) {
  activate();
  launched(cuda::launch_relu_backward(stream(), n, negative_slope, x, dy, dx), "relu_backward",
           "n={}", n);
}

void CudaDriver::do_sigmoid_forward(index_t n, const float* x, float* y) {
  activate();
  launched(cuda::launch_sigmoid_forward(stream(), n, x, y), "sigmoid_forward", "n={}", n);
}

void CudaDriver::do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) {
  activate();
  launched(cuda::launch_sigmoid_backward(stream(), n, y, dy, dx), "sigmoid_backward", "n={}", n);
}

void CudaDriver::do_tanh_forward(index_t n, const float* x, float* y) {
  activate();
  launched(cuda::launch_tanh_forward(stream(), n, x, y), "tanh_forward", "n={}", n);
}

void CudaDriver::do_tanh_backward(index_t n, const float* y, const float* dy, float* dx) {
  activate();
  launched(cuda::launch_tanh_backward(stream(), n, y, dy, dx), "tanh_backward", "n={}", n);
}

// ---- pooling ------------------------------------------------------------------------

void CudaDriver::do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                                     std::int32_t* mask) {
  activate();
  launched(cuda::launch_pool_max_forward(stream(), cuda::pool_dims(shape), x, y, mask),
           "pool_max_forward", "{}", shape.to_string());
}

void CudaDriver::do_pool_max_backward(const PoolShape& shape, const float* dy,
                                      const std::int32_t* mask, float* dx) {
  activate();
  launched(cuda::launch_pool_max_backward(stream(), cuda::pool_dims(shape), dy, mask, dx),
           "pool_max_backward", "{}", shape.to_string());
}

void CudaDriver::do_pool_avg_forward(const PoolShape& shape, const float* x, float* y) {
  activate();
  launched(cuda::launch_pool_avg_forward(stream(), cuda::pool_dims(shape), x, y),
           "pool_avg_forward", "{}", shape.to_string());
}

void CudaDriver::do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) {
  activate();
  launched(cuda::launch_pool_avg_backward(stream(), cuda::pool_dims(shape), dy, dx),
           "pool_avg_backward", "{}", shape.to_string());
}

// ---- dropout ------------------------------------------------------------------------

void CudaDriver::do_dropout_forward(index_t n, float ratio, std::uint64_t seed,
                                    std::uint64_t offset, const float* x, float* y, float* mask) {
  activate();
  launched(cuda::launch_dropout_forward(stream(), n, ratio, seed, offset, x, y, mask),
           "dropout_forward", "n={} ratio={}", n, ratio);
}

void CudaDriver::do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                                     float* dx) {
  activate();
  launched(cuda::launch_dropout_backward(stream(), n, ratio, mask, dy, dx), "dropout_backward",
           "n={} ratio={}", n, ratio);
}

// ---- losses -------------------------------------------------------------------------

void CudaDriver::do_softmax_loss_forward(const AxisShape& shape, const float* prob,
                                         const float* label, bool has_ignore_label,
                                         int ignore_label, float* loss, float* valid) {
  activate();
  launched(cuda::launch_softmax_loss_forward(stream(), shape, prob, label, has_ignore_label,
                                             ignore_label, loss, valid, label_error()),
           "softmax_loss_forward", "{}", shape.to_string());
  label_check_pending_ = true;
}

void CudaDriver::do_softmax_loss_backward(const AxisShape& shape, const float* prob,
                                          const float* label, bool has_ignore_label,
                                          int ignore_label, float scale, float* dx) {
  activate();
  launched(cuda::launch_softmax_loss_backward(stream(), shape, prob, label, has_ignore_label,
                                              ignore_label, scale, dx, label_error()),
           "softmax_loss_backward", "{}", shape.to_string());
  label_check_pending_ = true;
}

void CudaDriver::do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                                  bool has_ignore_label, int ignore_label,
                                                  float* loss, float* valid) {
  activate();
  launched(cuda::launch_sigmoid_cross_entropy_forward(stream(), n, x, target, has_ignore_label,
                                                      ignore_label, loss, valid),
           "sigmoid_cross_entropy_forward", "n={}", n);
}

void CudaDriver::do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                                   bool has_ignore_label, int ignore_label,
                                                   float scale, float* dx) {
  activate();
  launched(cuda::launch_sigmoid_cross_entropy_backward(stream(), n, x, target, has_ignore_label,
                                                       ignore_label, scale, dx),
           "sigmoid_cross_entropy_backward", "n={}", n);
}

// ---- solver -------------------------------------------------------------------------

void CudaDriver::do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                                  float* history, float* history2) {
  activate();
  launched(cuda::launch_solver_update(stream(), u, n, param, grad, history, history2),
           "solver_update", "{} n={}", update_type_name(u.type), n);
}

}  // namespace hn::detail
