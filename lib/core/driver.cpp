// The non-virtual front of every Driver call: argument validation, address checks,
// capability checks and transfer counting, shared by all drivers.
#include "hybridnn/driver.h"

#include <cmath>
#include <utility>

#include "lib/core/check.h"

namespace hn {

namespace {

constexpr std::size_t kFloat = sizeof(float);

void check_count(const char* call, const char* name, index_t n) {
  HN_CHECK(n >= 0, "{}: {} must be >= 0, got {}", call, name, n);
}

// Floats spanned by a row-major rows x cols matrix with leading dimension ld.
std::size_t matrix_bytes(index_t rows, index_t cols, index_t ld) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<std::size_t>((rows - 1) * ld + cols) * kFloat;
}

std::size_t floats(index_t n) {
  return static_cast<std::size_t>(n) * kFloat;
}

}  // namespace

void Driver::check_range(const char* call, const char* argument, const void* address,
                         std::size_t bytes) const {
  if (bytes == 0) return;
  HN_CHECK(address != nullptr, "{} on {}: {} is null ({} bytes expected)", call, name(), argument,
           bytes);
  HN_CHECK(owns(address, bytes),
           "{} on {}: {} = {} ({} bytes) is not memory of device {}; dereference the Pointer "
           "for this driver (Runtime::view) first",
           call, name(), argument, address, bytes, name());
}

void Driver::require(bool supported, const char* call) const {
  HN_CHECK(supported, "driver {} does not support {} (see its Capabilities)", name(), call);
}

// ---- memory ------------------------------------------------------------------------

void* Driver::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  return do_allocate(bytes);
}

void Driver::deallocate(void* address) noexcept {
  if (address != nullptr) do_deallocate(address);
}

void Driver::copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  check_range("copy_from_host", "dst", dst, bytes);
  HN_CHECK(host_src != nullptr, "copy_from_host on {}: source is null ({} bytes)", name(), bytes);
  do_copy_from_host(dst, host_src, bytes);
  ++stats_.to_device;
  stats_.to_device_bytes += bytes;
}

void Driver::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_range("copy_to_host", "src", src, bytes);
  HN_CHECK(host_dst != nullptr, "copy_to_host on {}: destination is null ({} bytes)", name(),
           bytes);
  do_copy_to_host(host_dst, src, bytes);
  ++stats_.to_host;
  stats_.to_host_bytes += bytes;
}

void Driver::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check_range("copy", "dst", dst, bytes);
  check_range("copy", "src", src, bytes);
  do_copy(dst, src, bytes);
  ++stats_.within;
  stats_.within_bytes += bytes;
}

void Driver::synchronize() {
  do_synchronize();
}

// ---- GEMM --------------------------------------------------------------------------

void Driver::gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k,
                  float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
                  float* c, index_t ldc) {
  require(capabilities().gemm, "gemm");
  HN_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: sizes must be >= 0, got m={} n={} k={}", m, n, k);
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  // Stored shapes (row-major): A is m x k or k x m, B is k x n or n x k.
  const index_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const index_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  HN_CHECK(lda >= std::max<index_t>(1, a_cols),
           "gemm: lda={} is smaller than the {} columns of A as stored (m={} n={} k={}, A{})", lda,
           a_cols, m, n, k, ta ? " transposed" : "");
  HN_CHECK(ldb >= std::max<index_t>(1, b_cols),
           "gemm: ldb={} is smaller than the {} columns of B as stored (m={} n={} k={}, B{})", ldb,
           b_cols, m, n, k, tb ? " transposed" : "");
  HN_CHECK(ldc >= std::max<index_t>(1, n), "gemm: ldc={} is smaller than n={} (m={} n={} k={})",
           ldc, n, m, n, k);
  if (m == 0 || n == 0) return;
  if (k > 0) {
    check_range("gemm", "A", a, matrix_bytes(a_rows, a_cols, lda));
    check_range("gemm", "B", b, matrix_bytes(b_rows, b_cols, ldb));
  }
  check_range("gemm", "C", c, matrix_bytes(m, n, ldc));
  do_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ---- lowering ----------------------------------------------------------------------

void Driver::im2col(const LoweringShape& shape, const float* images, float* columns) {
  require(capabilities().lowering, "im2col");
  shape.validate("im2col");
  if (shape.batch == 0) return;
  check_range("im2col", "images", images, floats(shape.image_count()));
  check_range("im2col", "columns", columns, floats(shape.col_count()));
  do_im2col(shape, images, columns);
}

void Driver::col2im(const LoweringShape& shape, const float* columns, float* images) {
  require(capabilities().lowering, "col2im");
  shape.validate("col2im");
  if (shape.batch == 0) return;
  check_range("col2im", "columns", columns, floats(shape.col_count()));
  check_range("col2im", "images", images, floats(shape.image_count()));
  do_col2im(shape, columns, images);
}

void Driver::swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) {
  require(capabilities().lowering, "swap_axes");
  HN_CHECK(d0 >= 0 && d1 >= 0 && inner >= 0,
           "swap_axes: sizes must be >= 0, got d0={} d1={} inner={}", d0, d1, inner);
  HN_CHECK(src != dst || d0 * d1 * inner == 0, "swap_axes: src and dst must not be the same");
  const std::size_t bytes = floats(d0 * d1 * inner);
  check_range("swap_axes", "src", src, bytes);
  check_range("swap_axes", "dst", dst, bytes);
  if (bytes > 0) do_swap_axes(d0, d1, inner, src, dst);
}

namespace {

void check_lift(const char* call, const LoweringShape& shape, index_t out_channels) {
  shape.validate(call);
  HN_CHECK(shape.groups == 1, "{}: groups must be 1, got {} ({})", call, shape.groups,
           shape.to_string());
  HN_CHECK(out_channels > 0, "{}: out_channels must be > 0, got {}", call, out_channels);
}

// Floats of the type-3 products: rows (n, ih, iw), columns (co, kh, kw).
std::size_t product_bytes(const LoweringShape& shape, index_t out_channels) {
  return floats(shape.batch * shape.height * shape.width * out_channels * shape.kernel_h *
                shape.kernel_w);
}

std::size_t conv_output_bytes(const LoweringShape& shape, index_t out_channels) {
  return floats(shape.batch * out_channels * shape.out_h() * shape.out_w());
}

}  // namespace

void Driver::lift(const LoweringShape& shape, index_t out_channels, const float* products,
                  float* y) {
  require(capabilities().lowering, "lift");
  check_lift("lift", shape, out_channels);
  if (shape.batch == 0) return;
  check_range("lift", "products", products, product_bytes(shape, out_channels));
  check_range("lift", "y", y, conv_output_bytes(shape, out_channels));
  do_lift(shape, out_channels, products, y);
}

void Driver::lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                           float* products_diff) {
  require(capabilities().lowering, "lift_backward");
  check_lift("lift_backward", shape, out_channels);
  if (shape.batch == 0) return;
  check_range("lift_backward", "dy", dy, conv_output_bytes(shape, out_channels));
  check_range("lift_backward", "products_diff", products_diff, product_bytes(shape, out_channels));
  do_lift_backward(shape, out_channels, dy, products_diff);
}

namespace {

void check_conv(const char* call, const LoweringShape& shape, index_t out_channels) {
  shape.validate(call);
  HN_CHECK(out_channels > 0 && out_channels % shape.groups == 0,
           "{}: out_channels {} must be > 0 and divisible by groups {} ({})", call, out_channels,
           shape.groups, shape.to_string());
}

std::size_t conv_weight_bytes(const LoweringShape& shape, index_t out_channels) {
  return floats(out_channels * (shape.channels / shape.groups) * shape.kernel_h * shape.kernel_w);
}

}  // namespace

void Driver::conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                          const float* weights, const float* bias, float* y) {
  require(capabilities().convolution, "conv_forward");
  check_conv("conv_forward", shape, out_channels);
  if (shape.batch == 0) return;
  check_range("conv_forward", "x", x, floats(shape.image_count()));
  check_range("conv_forward", "weights", weights, conv_weight_bytes(shape, out_channels));
  if (bias != nullptr) check_range("conv_forward", "bias", bias, floats(out_channels));
  check_range("conv_forward", "y", y, conv_output_bytes(shape, out_channels));
  do_conv_forward(shape, out_channels, x, weights, bias, y);
}

void Driver::conv_backward_data(const LoweringShape& shape, index_t out_channels,
                                const float* weights, const float* dy, float* dx) {
  require(capabilities().convolution, "conv_backward_data");
  check_conv("conv_backward_data", shape, out_channels);
  if (shape.batch == 0) return;
  check_range("conv_backward_data", "weights", weights, conv_weight_bytes(shape, out_channels));
  check_range("conv_backward_data", "dy", dy, conv_output_bytes(shape, out_channels));
  check_range("conv_backward_data", "dx", dx, floats(shape.image_count()));
  do_conv_backward_data(shape, out_channels, weights, dy, dx);
}

void Driver::conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                                   const float* dy, float* dweights, float* dbias) {
  require(capabilities().convolution, "conv_backward_weights");
  check_conv("conv_backward_weights", shape, out_channels);
  if (shape.batch == 0) return;
  check_range("conv_backward_weights", "x", x, floats(shape.image_count()));
  check_range("conv_backward_weights", "dy", dy, conv_output_bytes(shape, out_channels));
  check_range("conv_backward_weights", "dweights", dweights,
              conv_weight_bytes(shape, out_channels));
  if (dbias != nullptr) check_range("conv_backward_weights", "dbias", dbias, floats(out_channels));
  do_conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
}

// ---- element-wise and reductions ---------------------------------------------------

void Driver::fill(index_t n, float value, float* x) {
  require(capabilities().elementwise, "fill");
  check_count("fill", "n", n);
  check_range("fill", "x", x, floats(n));
  if (n > 0) do_fill(n, value, x);
}

void Driver::scale(index_t n, float alpha, float* x) {
  require(capabilities().elementwise, "scale");
  check_count("scale", "n", n);
  check_range("scale", "x", x, floats(n));
  if (n > 0) do_scale(n, alpha, x);
}

void Driver::axpy(index_t n, float alpha, const float* x, float* y) {
  require(capabilities().elementwise, "axpy");
  check_count("axpy", "n", n);
  check_range("axpy", "x", x, floats(n));
  check_range("axpy", "y", y, floats(n));
  if (n > 0) do_axpy(n, alpha, x, y);
}

void Driver::axpby(index_t n, float alpha, const float* x, float beta, float* y) {
  require(capabilities().elementwise, "axpby");
  check_count("axpby", "n", n);
  check_range("axpby", "x", x, floats(n));
  check_range("axpby", "y", y, floats(n));
  if (n > 0) do_axpby(n, alpha, x, beta, y);
}

void Driver::mul(index_t n, const float* a, const float* b, float* y) {
  require(capabilities().elementwise, "mul");
  check_count("mul", "n", n);
  check_range("mul", "a", a, floats(n));
  check_range("mul", "b", b, floats(n));
  check_range("mul", "y", y, floats(n));
  if (n > 0) do_mul(n, a, b, y);
}

void Driver::add_scalar(index_t n, float alpha, float* x) {
  require(capabilities().elementwise, "add_scalar");
  check_count("add_scalar", "n", n);
  check_range("add_scalar", "x", x, floats(n));
  if (n > 0) do_add_scalar(n, alpha, x);
}

void Driver::powx(index_t n, const float* x, float exponent, float* y) {
  require(capabilities().elementwise, "powx");
  check_count("powx", "n", n);
  check_range("powx", "x", x, floats(n));
  check_range("powx", "y", y, floats(n));
  if (n > 0) do_powx(n, x, exponent, y);
}

void Driver::copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                          index_t dst_ld) {
  require(capabilities().elementwise, "copy_strided");
  HN_CHECK(rows >= 0 && cols >= 0, "copy_strided: sizes must be >= 0, got rows={} cols={}", rows,
           cols);
  HN_CHECK(src_ld >= cols && dst_ld >= cols,
           "copy_strided: leading dimensions src_ld={} dst_ld={} must be >= cols={} (rows={})",
           src_ld, dst_ld, cols, rows);
  check_range("copy_strided", "src", src, matrix_bytes(rows, cols, src_ld));
  check_range("copy_strided", "dst", dst, matrix_bytes(rows, cols, dst_ld));
  if (rows > 0 && cols > 0) do_copy_strided(rows, cols, src, src_ld, dst, dst_ld);
}

void Driver::scale_channels(const AxisShape& shape, const float* scale, const float* x, float* y) {
  require(capabilities().elementwise, "scale_channels");
  shape.validate("scale_channels");
  check_range("scale_channels", "scale", scale, floats(shape.channels));
  check_range("scale_channels", "x", x, floats(shape.count()));
  check_range("scale_channels", "y", y, floats(shape.count()));
  if (shape.count() > 0) do_scale_channels(shape, scale, x, y);
}

void Driver::max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                            std::int32_t* mask) {
  require(capabilities().elementwise, "max_accumulate");
  check_count("max_accumulate", "n", n);
  HN_CHECK(index >= 0, "max_accumulate: index must be >= 0, got {}", index);
  check_range("max_accumulate", "x", x, floats(n));
  check_range("max_accumulate", "y", y, floats(n));
  check_range("max_accumulate", "mask", mask, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  if (n > 0) do_max_accumulate(n, x, index, y, mask);
}

void Driver::max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                        float* dx) {
  require(capabilities().elementwise, "max_select");
  check_count("max_select", "n", n);
  check_range("max_select", "mask", mask, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  check_range("max_select", "dy", dy, floats(n));
  check_range("max_select", "dx", dx, floats(n));
  if (n > 0) do_max_select(n, mask, index, dy, dx);
}

float Driver::dot(index_t n, const float* x, const float* y) {
  require(capabilities().reductions, "dot");
  check_count("dot", "n", n);
  check_range("dot", "x", x, floats(n));
  check_range("dot", "y", y, floats(n));
  return n > 0 ? do_dot(n, x, y) : 0.0f;
}

float Driver::asum(index_t n, const float* x) {
  require(capabilities().reductions, "asum");
  check_count("asum", "n", n);
  check_range("asum", "x", x, floats(n));
  return n > 0 ? do_asum(n, x) : 0.0f;
}

float Driver::sum(index_t n, const float* x) {
  require(capabilities().reductions, "sum");
  check_count("sum", "n", n);
  check_range("sum", "x", x, floats(n));
  return n > 0 ? do_sum(n, x) : 0.0f;
}

void Driver::bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias) {
  require(capabilities().reductions, "bias_backward");
  shape.validate("bias_backward");
  check_range("bias_backward", "dy", dy, floats(shape.count()));
  check_range("bias_backward", "dbias", dbias, floats(shape.channels));
  do_bias_backward(shape, dy, beta, dbias);
}

// ---- activations -------------------------------------------------------------------

void Driver::bias_forward(const AxisShape& shape, const float* bias, float* y) {
  require(capabilities().activations, "bias_forward");
  shape.validate("bias_forward");
  check_range("bias_forward", "bias", bias, floats(shape.channels));
  check_range("bias_forward", "y", y, floats(shape.count()));
  if (shape.count() > 0) do_bias_forward(shape, bias, y);
}

void Driver::relu_forward(index_t n, float negative_slope, const float* x, float* y) {
  require(capabilities().activations, "relu_forward");
  check_count("relu_forward", "n", n);
  check_range("relu_forward", "x", x, floats(n));
  check_range("relu_forward", "y", y, floats(n));
  if (n > 0) do_relu_forward(n, negative_slope, x, y);
}

void Driver::relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                           float* dx) {
  require(capabilities().activations, "relu_backward");
  check_count("relu_backward", "n", n);
  check_range("relu_backward", "x", x, floats(n));
  check_range("relu_backward", "dy", dy, floats(n));
  check_range("relu_backward", "dx", dx, floats(n));
  if (n > 0) do_relu_backward(n, negative_slope, x, dy, dx);
}

void Driver::sigmoid_forward(index_t n, const float* x, float* y) {
  require(capabilities().activations, "sigmoid_forward");
  check_count("sigmoid_forward", "n", n);
  check_range("sigmoid_forward", "x", x, floats(n));
  check_range("sigmoid_forward", "y", y, floats(n));
  if (n > 0) do_sigmoid_forward(n, x, y);
}

void Driver::sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) {
  require(capabilities().activations, "sigmoid_backward");
  check_count("sigmoid_backward", "n", n);
  check_range("sigmoid_backward", "y", y, floats(n));
  check_range("sigmoid_backward", "dy", dy, floats(n));
  check_range("sigmoid_backward", "dx", dx, floats(n));
  if (n > 0) do_sigmoid_backward(n, y, dy, dx);
}

void Driver::tanh_forward(index_t n, const float* x, float* y) {
  require(capabilities().activations, "tanh_forward");
  check_count("tanh_forward", "n", n);
  check_range("tanh_forward", "x", x, floats(n));
  check_range("tanh_forward", "y", y, floats(n));
  if (n > 0) do_tanh_forward(n, x, y);
}

void Driver::tanh_backward(index_t n, const float* y, const float* dy, float* dx) {
  require(capabilities().activations, "tanh_backward");
  check_count("tanh_backward", "n", n);
  check_range("tanh_backward", "y", y, floats(n));
  check_range("tanh_backward", "dy", dy, floats(n));
  check_range("tanh_backward", "dx", dx, floats(n));
  if (n > 0) do_tanh_backward(n, y, dy, dx);
}

// ---- pooling -----------------------------------------------------------------------

void Driver::pool_max_forward(const PoolShape& shape, const float* x, float* y,
                              std::int32_t* mask) {
  require(capabilities().pooling, "pool_max_forward");
  shape.validate("pool_max_forward");
  check_range("pool_max_forward", "x", x, floats(shape.in_count()));
  check_range("pool_max_forward", "y", y, floats(shape.out_count()));
  check_range("pool_max_forward", "mask", mask,
              static_cast<std::size_t>(shape.out_count()) * sizeof(std::int32_t));
  if (shape.batch > 0) do_pool_max_forward(shape, x, y, mask);
}

void Driver::pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                               float* dx) {
  require(capabilities().pooling, "pool_max_backward");
  shape.validate("pool_max_backward");
  check_range("pool_max_backward", "dy", dy, floats(shape.out_count()));
  check_range("pool_max_backward", "mask", mask,
              static_cast<std::size_t>(shape.out_count()) * sizeof(std::int32_t));
  check_range("pool_max_backward", "dx", dx, floats(shape.in_count()));
  if (shape.batch > 0) do_pool_max_backward(shape, dy, mask, dx);
}

void Driver::pool_avg_forward(const PoolShape& shape, const float* x, float* y) {
  require(capabilities().pooling, "pool_avg_forward");
  shape.validate("pool_avg_forward");
  check_range("pool_avg_forward", "x", x, floats(shape.in_count()));
  check_range("pool_avg_forward", "y", y, floats(shape.out_count()));
  if (shape.batch > 0) do_pool_avg_forward(shape, x, y);
}

void Driver::pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) {
  require(capabilities().pooling, "pool_avg_backward");
  shape.validate("pool_avg_backward");
  check_range("pool_avg_backward", "dy", dy, floats(shape.out_count()));
  check_range("pool_avg_backward", "dx", dx, floats(shape.in_count()));
  if (shape.batch > 0) do_pool_avg_backward(shape, dy, dx);
}

// ---- LRN, softmax, dropout ---------------------------------------------------------

void Driver::lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) {
  require(capabilities().lrn, "lrn_forward");
  shape.validate("lrn_forward");
  const std::size_t bytes = floats(shape.count());
  check_range("lrn_forward", "x", x, bytes);
  check_range("lrn_forward", "y", y, bytes);
  check_range("lrn_forward", "scale", scale, bytes);
  if (bytes > 0) do_lrn_forward(shape, x, y, scale);
}

void Driver::lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                          const float* dy, float* dx) {
  require(capabilities().lrn, "lrn_backward");
  shape.validate("lrn_backward");
  const std::size_t bytes = floats(shape.count());
  check_range("lrn_backward", "x", x, bytes);
  check_range("lrn_backward", "y", y, bytes);
  check_range("lrn_backward", "scale", scale, bytes);
  check_range("lrn_backward", "dy", dy, bytes);
  check_range("lrn_backward", "dx", dx, bytes);
  if (bytes > 0) do_lrn_backward(shape, x, y, scale, dy, dx);
}

void Driver::softmax_forward(const AxisShape& shape, const float* x, float* y) {
  require(capabilities().softmax, "softmax_forward");
  shape.validate("softmax_forward");
  check_range("softmax_forward", "x", x, floats(shape.count()));
  check_range("softmax_forward", "y", y, floats(shape.count()));
  if (shape.count() > 0) do_softmax_forward(shape, x, y);
}

void Driver::softmax_backward(const AxisShape& shape, const float* y, const float* dy, float* dx) {
  require(capabilities().softmax, "softmax_backward");
  shape.validate("softmax_backward");
  check_range("softmax_backward", "y", y, floats(shape.count()));
  check_range("softmax_backward", "dy", dy, floats(shape.count()));
  check_range("softmax_backward", "dx", dx, floats(shape.count()));
  if (shape.count() > 0) do_softmax_backward(shape, y, dy, dx);
}

void Driver::dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                             const float* x, float* y, float* mask) {
  require(capabilities().dropout, "dropout_forward");
  check_count("dropout_forward", "n", n);
  HN_CHECK(ratio >= 0.0f && ratio < 1.0f, "dropout_forward: ratio must be in [0, 1), got {}",
           ratio);
  check_range("dropout_forward", "x", x, floats(n));
  check_range("dropout_forward", "y", y, floats(n));
  check_range("dropout_forward", "mask", mask, floats(n));
  if (n > 0) do_dropout_forward(n, ratio, seed, offset, x, y, mask);
}

void Driver::dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                              float* dx) {
  require(capabilities().dropout, "dropout_backward");
  check_count("dropout_backward", "n", n);
  HN_CHECK(ratio >= 0.0f && ratio < 1.0f, "dropout_backward: ratio must be in [0, 1), got {}",
           ratio);
  check_range("dropout_backward", "mask", mask, floats(n));
  check_range("dropout_backward", "dy", dy, floats(n));
  check_range("dropout_backward", "dx", dx, floats(n));
  if (n > 0) do_dropout_backward(n, ratio, mask, dy, dx);
}

// ---- losses ------------------------------------------------------------------------

void Driver::softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                                  bool has_ignore_label, int ignore_label, float* loss,
                                  float* valid) {
  require(capabilities().losses, "softmax_loss_forward");
  shape.validate("softmax_loss_forward");
  const std::size_t positions = floats(shape.outer * shape.inner);
  check_range("softmax_loss_forward", "prob", prob, floats(shape.count()));
  check_range("softmax_loss_forward", "label", label, positions);
  check_range("softmax_loss_forward", "loss", loss, positions);
  check_range("softmax_loss_forward", "valid", valid, positions);
  if (positions > 0) {
    do_softmax_loss_forward(shape, prob, label, has_ignore_label, ignore_label, loss, valid);
  }
}

void Driver::softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                                   bool has_ignore_label, int ignore_label, float scale,
                                   float* dx) {
  require(capabilities().losses, "softmax_loss_backward");
  shape.validate("softmax_loss_backward");
  check_range("softmax_loss_backward", "prob", prob, floats(shape.count()));
  check_range("softmax_loss_backward", "label", label, floats(shape.outer * shape.inner));
  check_range("softmax_loss_backward", "dx", dx, floats(shape.count()));
  if (shape.count() > 0) {
    do_softmax_loss_backward(shape, prob, label, has_ignore_label, ignore_label, scale, dx);
  }
}

void Driver::sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                           bool has_ignore_label, int ignore_label, float* loss,
                                           float* valid) {
  require(capabilities().losses, "sigmoid_cross_entropy_forward");
  check_count("sigmoid_cross_entropy_forward", "n", n);
  check_range("sigmoid_cross_entropy_forward", "x", x, floats(n));
  check_range("sigmoid_cross_entropy_forward", "target", target, floats(n));
  check_range("sigmoid_cross_entropy_forward", "loss", loss, floats(n));
  check_range("sigmoid_cross_entropy_forward", "valid", valid, floats(n));
  if (n > 0) {
    do_sigmoid_cross_entropy_forward(n, x, target, has_ignore_label, ignore_label, loss, valid);
  }
}

void Driver::sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                            bool has_ignore_label, int ignore_label, float scale,
                                            float* dx) {
  require(capabilities().losses, "sigmoid_cross_entropy_backward");
  check_count("sigmoid_cross_entropy_backward", "n", n);
  check_range("sigmoid_cross_entropy_backward", "x", x, floats(n));
  check_range("sigmoid_cross_entropy_backward", "target", target, floats(n));
  check_range("sigmoid_cross_entropy_backward", "dx", dx, floats(n));
  if (n > 0) {
    do_sigmoid_cross_entropy_backward(n, x, target, has_ignore_label, ignore_label, scale, dx);
  }
}

// ---- solver ------------------------------------------------------------------------

void Driver::solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                           float* history, float* history2) {
  require(capabilities().solver_update, "solver_update");
  const int type_index = static_cast<int>(u.type);
  HN_CHECK(type_index >= 0 && type_index <= static_cast<int>(UpdateType::adam),
           "solver_update: unknown update type {} (n={})", type_index, n);
  const char* type = update_type_name(u.type);
  HN_CHECK(n >= 0, "solver_update ({}): n must be >= 0, got {}", type, n);
  const std::pair<const char*, float> settings[] = {{"lr", u.lr},
                                                    {"momentum", u.momentum},
                                                    {"momentum2", u.momentum2},
                                                    {"delta", u.delta},
                                                    {"rms_decay", u.rms_decay},
                                                    {"decay", u.decay},
                                                    {"grad_scale", u.grad_scale}};
  for (const auto& [setting, value] : settings) {
    HN_CHECK(std::isfinite(value), "solver_update ({}): {} must be finite, got {} (n={})", type,
             setting, value, n);
  }
  if (n == 0) return;
  const bool two = u.needs_history2();
  HN_CHECK(param != nullptr && grad != nullptr && history != nullptr,
           "solver_update ({}): param, grad and history must not be null (param={}, grad={}, "
           "history={}, n={})",
           type, static_cast<const void*>(param), static_cast<const void*>(grad),
           static_cast<const void*>(history), n);
  HN_CHECK(!two || history2 != nullptr,
           "solver_update ({}): {} keeps two histories, history2 must not be null (n={})", type,
           type, n);
  const void* arrays[] = {param, grad, history, two ? history2 : nullptr};
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) {
      HN_CHECK(arrays[i] == nullptr || arrays[i] != arrays[j],
               "solver_update ({}): param, grad, history{} must be distinct arrays, got the "
               "same address {} twice (n={})",
               type, two ? " and history2" : "", arrays[i], n);
    }
  }
  check_range("solver_update", "param", param, floats(n));
  check_range("solver_update", "grad", grad, floats(n));
  check_range("solver_update", "history", history, floats(n));
  if (two) check_range("solver_update", "history2", history2, floats(n));
  do_solver_update(u, n, param, grad, history, two ? history2 : nullptr);
}

// ---- defaults of the optional calls: unsupported -----------------------------------

#define HN_UNSUPPORTED(call) detail::fail("driver {} does not support {}", name(), call)

void Driver::do_gemm(Transpose, Transpose, index_t, index_t, index_t, float, const float*, index_t,
                     const float*, index_t, float, float*, index_t) {
  HN_UNSUPPORTED("gemm");
}
void Driver::do_im2col(const LoweringShape&, const float*, float*) {
  HN_UNSUPPORTED("im2col");
}
void Driver::do_col2im(const LoweringShape&, const float*, float*) {
  HN_UNSUPPORTED("col2im");
}
void Driver::do_swap_axes(index_t, index_t, index_t, const float*, float*) {
  HN_UNSUPPORTED("swap_axes");
}
void Driver::do_fill(index_t, float, float*) {
  HN_UNSUPPORTED("fill");
}
void Driver::do_scale(index_t, float, float*) {
  HN_UNSUPPORTED("scale");
}
void Driver::do_axpy(index_t, float, const float*, float*) {
  HN_UNSUPPORTED("axpy");
}
void Driver::do_axpby(index_t, float, const float*, float, float*) {
  HN_UNSUPPORTED("axpby");
}
void Driver::do_mul(index_t, const float*, const float*, float*) {
  HN_UNSUPPORTED("mul");
}
float Driver::do_dot(index_t, const float*, const float*) {
  HN_UNSUPPORTED("dot");
}
float Driver::do_asum(index_t, const float*) {
  HN_UNSUPPORTED("asum");
}
float Driver::do_sum(index_t, const float*) {
  HN_UNSUPPORTED("sum");
}
void Driver::do_bias_backward(const AxisShape&, const float*, float, float*) {
  HN_UNSUPPORTED("bias_backward");
}
void Driver::do_bias_forward(const AxisShape&, const float*, float*) {
  HN_UNSUPPORTED("bias_forward");
}
void Driver::do_relu_forward(index_t, float, const float*, float*) {
  HN_UNSUPPORTED("relu_forward");
}
void Driver::do_relu_backward(index_t, float, const float*, const float*, float*) {
  HN_UNSUPPORTED("relu_backward");
}
void Driver::do_sigmoid_forward(index_t, const float*, float*) {
  HN_UNSUPPORTED("sigmoid_forward");
}
void Driver::do_sigmoid_backward(index_t, const float*, const float*, float*) {
  HN_UNSUPPORTED("sigmoid_backward");
}
void Driver::do_tanh_forward(index_t, const float*, float*) {
  HN_UNSUPPORTED("tanh_forward");
}
void Driver::do_tanh_backward(index_t, const float*, const float*, float*) {
  HN_UNSUPPORTED("tanh_backward");
}
void Driver::do_pool_max_forward(const PoolShape&, const float*, float*, std::int32_t*) {
  HN_UNSUPPORTED("pool_max_forward");
}
void Driver::do_pool_max_backward(const PoolShape&, const float*, const std::int32_t*, float*) {
  HN_UNSUPPORTED("pool_max_backward");
}
void Driver::do_pool_avg_forward(const PoolShape&, const float*, float*) {
  HN_UNSUPPORTED("pool_avg_forward");
}
void Driver::do_pool_avg_backward(const PoolShape&, const float*, float*) {
  HN_UNSUPPORTED("pool_avg_backward");
}
void Driver::do_lrn_forward(const LrnShape&, const float*, float*, float*) {
  HN_UNSUPPORTED("lrn_forward");
}
void Driver::do_lrn_backward(const LrnShape&, const float*, const float*, const float*,
                             const float*, float*) {
  HN_UNSUPPORTED("lrn_backward");
}
void Driver::do_softmax_forward(const AxisShape&, const float*, float*) {
  HN_UNSUPPORTED("softmax_forward");
}
void Driver::do_softmax_backward(const AxisShape&, const float*, const float*, float*) {
  HN_UNSUPPORTED("softmax_backward");
}
void Driver::do_dropout_forward(index_t, float, std::uint64_t, std::uint64_t, const float*, float*,
                                float*) {
  HN_UNSUPPORTED("dropout_forward");
}
void Driver::do_dropout_backward(index_t, float, const float*, const float*, float*) {
  HN_UNSUPPORTED("dropout_backward");
}

void Driver::do_lift(const LoweringShape&, index_t, const float*, float*) {
  HN_UNSUPPORTED("lift");
}
void Driver::do_lift_backward(const LoweringShape&, index_t, const float*, float*) {
  HN_UNSUPPORTED("lift_backward");
}
void Driver::do_add_scalar(index_t, float, float*) {
  HN_UNSUPPORTED("add_scalar");
}
void Driver::do_powx(index_t, const float*, float, float*) {
  HN_UNSUPPORTED("powx");
}
void Driver::do_copy_strided(index_t, index_t, const float*, index_t, float*, index_t) {
  HN_UNSUPPORTED("copy_strided");
}
void Driver::do_scale_channels(const AxisShape&, const float*, const float*, float*) {
  HN_UNSUPPORTED("scale_channels");
}
void Driver::do_max_accumulate(index_t, const float*, std::int32_t, float*, std::int32_t*) {
  HN_UNSUPPORTED("max_accumulate");
}
void Driver::do_max_select(index_t, const std::int32_t*, std::int32_t, const float*, float*) {
  HN_UNSUPPORTED("max_select");
}
void Driver::do_softmax_loss_forward(const AxisShape&, const float*, const float*, bool, int,
                                     float*, float*) {
  HN_UNSUPPORTED("softmax_loss_forward");
}
void Driver::do_softmax_loss_backward(const AxisShape&, const float*, const float*, bool, int,
                                      float, float*) {
  HN_UNSUPPORTED("softmax_loss_backward");
}
void Driver::do_sigmoid_cross_entropy_forward(index_t, const float*, const float*, bool, int,
                                              float*, float*) {
  HN_UNSUPPORTED("sigmoid_cross_entropy_forward");
}
void Driver::do_sigmoid_cross_entropy_backward(index_t, const float*, const float*, bool, int,
                                               float, float*) {
  HN_UNSUPPORTED("sigmoid_cross_entropy_backward");
}

void Driver::do_conv_forward(const LoweringShape&, index_t, const float*, const float*,
                             const float*, float*) {
  HN_UNSUPPORTED("conv_forward");
}
void Driver::do_conv_backward_data(const LoweringShape&, index_t, const float*, const float*,
                                   float*) {
  HN_UNSUPPORTED("conv_backward_data");
}
void Driver::do_conv_backward_weights(const LoweringShape&, index_t, const float*, const float*,
                                      float*, float*) {
  HN_UNSUPPORTED("conv_backward_weights");
}

void Driver::do_solver_update(const SolverUpdate&, index_t, float*, const float*, float*, float*) {
  HN_UNSUPPORTED("solver_update");
}

#undef HN_UNSUPPORTED

}  // namespace hn
