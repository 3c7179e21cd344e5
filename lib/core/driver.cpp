// The non-virtual front of every Driver call: argument validation, address checks and
// transfer counting, shared by all drivers. The compute calls' checking wrappers are
// generated from driver_calls.def; what each call reads and writes is its *_operands.
#include "lib/core/driver.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
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

// Calls given nChw16c or nChw8c operands need a driver with Capabilities::blocked_layout.
void check_layout_support(const Driver& driver, const char* call, bool blocked,
                          const std::string& shape) {
  HN_CHECK(!blocked || driver.capabilities().blocked_layout,
           "{}: driver {} takes NCHW operands only, got blocked ones ({})", call, driver.name(),
           shape);
}

// Softmax and its loss take NCHW only.
void check_nchw(const char* call, const AxisShape& shape) {
  HN_CHECK(shape.layout == Layout::nchw, "{}: takes NCHW only ({})", call, shape.to_string());
}

// The lowering calls (im2col, col2im, lift) work on NCHW images.
void check_lowering(const char* call, const LoweringShape& shape) {
  shape.validate(call);
  HN_CHECK(shape.layout == Layout::nchw && shape.out_layout == Layout::nchw,
           "{}: lowering takes NCHW images only ({})", call, shape.to_string());
}

// The operands of an element-wise call on n floats per array: `reads`, then `updates`.
DriverOperands per_element(const char* call, index_t n,
                           std::initializer_list<std::pair<const char*, const void*>> reads,
                           std::initializer_list<std::pair<const char*, const void*>> updates) {
  check_count(call, "n", n);
  DriverOperands ops;
  for (const auto& [name, address] : reads)
    ops.read(name, address, floats(n));
  for (const auto& [name, address] : updates)
    ops.update(name, address, floats(n));
  ops.work = n > 0;
  return ops;
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

// ---- memory ------------------------------------------------------------------------

void* Driver::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  ++stats_.allocations;
  return do_allocate(bytes);
}

void Driver::deallocate(void* address) noexcept {
  if (address == nullptr) return;
  ++stats_.frees;
  do_deallocate(address);
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
  ++stats_.waits;
  do_synchronize();
}

std::unique_ptr<Driver::Marks> Driver::make_marks(int) {
  return nullptr;
}

bool Driver::begin_recording(std::string& why) {
  why = fmt::format("{} runs each call as it is made: it records none", name());
  return false;
}

std::unique_ptr<Driver::Recording> Driver::end_recording(std::string& why) {
  why = fmt::format("{} runs each call as it is made: it records none", name());
  return nullptr;
}

std::string Driver::math_note(MathMode mode) const {
  if (mode == MathMode::fp32) return {};
  return fmt::format(
      "{} computes FP32 for {} math: it has no reduced-precision GEMM or "
      "convolution",
      name(), math_mode_name(mode));
}

// ---- GEMM --------------------------------------------------------------------------

DriverOperands Driver::gemm_operands(Transpose trans_a, Transpose trans_b, index_t m, index_t n,
                                     index_t k, float, const float* a, index_t lda, const float* b,
                                     index_t ldb, float, float* c, index_t ldc) const {
  DriverOperands ops;
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
  if (m == 0 || n == 0) return DriverOperands::nothing();
  if (k > 0) {
    ops.read("A", a, matrix_bytes(a_rows, a_cols, lda));
    ops.read("B", b, matrix_bytes(b_rows, b_cols, ldb));
  }
  ops.update("C", c, matrix_bytes(m, n, ldc));
  return ops;
}

// ---- lowering ----------------------------------------------------------------------

DriverOperands Driver::im2col_operands(const LoweringShape& shape, const float* images,
                                       float* columns) const {
  DriverOperands ops;
  check_lowering("im2col", shape);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("images", images, floats(shape.image_count()));
  ops.update("columns", columns, floats(shape.col_count()));
  return ops;
}

DriverOperands Driver::col2im_operands(const LoweringShape& shape, const float* columns,
                                       float* images) const {
  DriverOperands ops;
  check_lowering("col2im", shape);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("columns", columns, floats(shape.col_count()));
  ops.update("images", images, floats(shape.image_count()));
  return ops;
}

DriverOperands Driver::swap_axes_operands(index_t d0, index_t d1, index_t inner, const float* src,
                                          float* dst) const {
  DriverOperands ops;
  HN_CHECK(d0 >= 0 && d1 >= 0 && inner >= 0,
           "swap_axes: sizes must be >= 0, got d0={} d1={} inner={}", d0, d1, inner);
  HN_CHECK(src != dst || d0 * d1 * inner == 0, "swap_axes: src and dst must not be the same");
  const std::size_t bytes = floats(d0 * d1 * inner);
  ops.read("src", src, bytes);
  ops.update("dst", dst, bytes);
  ops.work = bytes > 0;
  return ops;
}

namespace {

void check_lift(const char* call, const LoweringShape& shape, index_t out_channels) {
  check_lowering(call, shape);
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

DriverOperands Driver::lift_operands(const LoweringShape& shape, index_t out_channels,
                                     const float* products, float* y) const {
  DriverOperands ops;
  check_lift("lift", shape, out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("products", products, product_bytes(shape, out_channels));
  ops.update("y", y, conv_output_bytes(shape, out_channels));
  return ops;
}

DriverOperands Driver::lift_backward_operands(const LoweringShape& shape, index_t out_channels,
                                              const float* dy, float* products_diff) const {
  DriverOperands ops;
  check_lift("lift_backward", shape, out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("dy", dy, conv_output_bytes(shape, out_channels));
  ops.update("products_diff", products_diff, product_bytes(shape, out_channels));
  return ops;
}

namespace {

void check_conv(const Driver& driver, const char* call, const LoweringShape& shape,
                index_t out_channels) {
  shape.validate(call);
  HN_CHECK(out_channels > 0 && out_channels % shape.groups == 0,
           "{}: out_channels {} must be > 0 and divisible by groups {} ({})", call, out_channels,
           shape.groups, shape.to_string());
  HN_CHECK(out_channels % layout_block(shape.out_layout) == 0,
           "{}: out_layout {} needs out_channels in multiples of {}, got {} ({})", call,
           layout_name(shape.out_layout), layout_block(shape.out_layout), out_channels,
           shape.to_string());
  check_layout_support(driver, call,
                       shape.layout != Layout::nchw || shape.out_layout != Layout::nchw,
                       shape.to_string());
}

std::size_t conv_weight_bytes(const LoweringShape& shape, index_t out_channels) {
  return floats(out_channels * (shape.channels / shape.groups) * shape.kernel_h * shape.kernel_w);
}

}  // namespace

namespace {

// conv_forward's and conv_forward_activation's operands (`call` names the one in errors).
DriverOperands conv_forward_ops(const Driver& driver, const char* call, const LoweringShape& shape,
                                index_t out_channels, const float* x, const float* weights,
                                const float* bias, float* y) {
  DriverOperands ops;
  check_conv(driver, call, shape, out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("x", x, floats(shape.image_count()));
  ops.read("weights", weights, conv_weight_bytes(shape, out_channels));
  if (bias != nullptr) ops.read("bias", bias, floats(out_channels));
  ops.update("y", y, conv_output_bytes(shape, out_channels));
  return ops;
}

}  // namespace

DriverOperands Driver::conv_forward_operands(const LoweringShape& shape, index_t out_channels,
                                             const float* x, const float* weights,
                                             const float* bias, float* y) const {
  return conv_forward_ops(*this, "conv_forward", shape, out_channels, x, weights, bias, y);
}

DriverOperands Driver::conv_forward_activation_operands(const LoweringShape& shape,
                                                        index_t out_channels, const float* x,
                                                        const float* weights, const float* bias,
                                                        const Activation& activation,
                                                        float* y) const {
  activation.validate("conv_forward_activation");
  return conv_forward_ops(*this, "conv_forward_activation", shape, out_channels, x, weights, bias,
                          y);
}

DriverOperands Driver::conv_forward_residual_operands(
    const LoweringShape& shape, index_t out_channels, const float* x, const float* weights,
    const float* bias, const float* residual, const Activation& activation, float* y) const {
  activation.validate("conv_forward_residual");
  DriverOperands ops =
      conv_forward_ops(*this, "conv_forward_residual", shape, out_channels, x, weights, bias, y);
  if (shape.batch == 0) return ops;
  const std::size_t bytes = conv_output_bytes(shape, out_channels);
  // y is written before the residual is read (the composed form's two calls).
  const auto r = reinterpret_cast<std::uintptr_t>(residual),
             out = reinterpret_cast<std::uintptr_t>(y);
  HN_CHECK(r + bytes <= out || out + bytes <= r,
           "conv_forward_residual: the residual overlaps y ({} out_channels={}, {} bytes each)",
           shape.to_string(), out_channels, bytes);
  ops.read("residual", residual, bytes);
  return ops;
}

DriverOperands Driver::conv_backward_data_operands(const LoweringShape& shape, index_t out_channels,
                                                   const float* weights, const float* dy,
                                                   float* dx) const {
  DriverOperands ops;
  check_conv(*this, "conv_backward_data", shape, out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("weights", weights, conv_weight_bytes(shape, out_channels));
  ops.read("dy", dy, conv_output_bytes(shape, out_channels));
  ops.update("dx", dx, floats(shape.image_count()));
  return ops;
}

DriverOperands Driver::conv_backward_weights_operands(const LoweringShape& shape,
                                                      index_t out_channels, const float* x,
                                                      const float* dy, float* dweights,
                                                      float* dbias) const {
  DriverOperands ops;
  check_conv(*this, "conv_backward_weights", shape, out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("x", x, floats(shape.image_count()));
  ops.read("dy", dy, conv_output_bytes(shape, out_channels));
  ops.update("dweights", dweights, conv_weight_bytes(shape, out_channels));
  if (dbias != nullptr) ops.update("dbias", dbias, floats(out_channels));
  return ops;
}

DriverOperands Driver::conv_backward_operands(const LoweringShape& shape, index_t out_channels,
                                              const float* x, const float* weights, const float* dy,
                                              float* dx, float* dweights, float* dbias) const {
  DriverOperands ops;
  check_conv(*this, "conv_backward", shape, out_channels);
  HN_CHECK(dweights != nullptr || dbias == nullptr,
           "conv_backward: dbias given without dweights ({} out_channels={})", shape.to_string(),
           out_channels);
  if (shape.batch == 0) return DriverOperands::nothing();
  ops.read("dy", dy, conv_output_bytes(shape, out_channels));
  if (dweights != nullptr) {
    ops.read("x", x, floats(shape.image_count()));
    ops.update("dweights", dweights, conv_weight_bytes(shape, out_channels));
    if (dbias != nullptr) ops.update("dbias", dbias, floats(out_channels));
  }
  if (dx != nullptr) {
    ops.read("weights", weights, conv_weight_bytes(shape, out_channels));
    ops.update("dx", dx, floats(shape.image_count()));
  }
  return ops;
}

DriverOperands Driver::conv_backward_relu_operands(const LoweringShape& shape, index_t out_channels,
                                                   const float* x, const float* weights,
                                                   const float* y, float negative_slope, float* dy,
                                                   float* dx, float* dweights, float* dbias) const {
  DriverOperands ops;
  check_conv(*this, "conv_backward_relu", shape, out_channels);
  HN_CHECK(dweights != nullptr || dbias == nullptr,
           "conv_backward_relu: dbias given without dweights ({} out_channels={})",
           shape.to_string(), out_channels);
  HN_CHECK(std::isfinite(negative_slope), "conv_backward_relu: negative_slope {} is not finite",
           negative_slope);
  if (shape.batch == 0) return DriverOperands::nothing();
  const std::size_t bytes = conv_output_bytes(shape, out_channels);
  // dy is written where y is still to be read (the driver's image by image form).
  const auto out = reinterpret_cast<std::uintptr_t>(y), grad = reinterpret_cast<std::uintptr_t>(dy);
  HN_CHECK(out + bytes <= grad || grad + bytes <= out,
           "conv_backward_relu: y overlaps dy ({} out_channels={}, {} bytes each)",
           shape.to_string(), out_channels, bytes);
  ops.read("y", y, bytes);
  ops.update("dy", dy, bytes);
  if (dweights != nullptr) {
    ops.read("x", x, floats(shape.image_count()));
    ops.update("dweights", dweights, conv_weight_bytes(shape, out_channels));
    if (dbias != nullptr) ops.update("dbias", dbias, floats(out_channels));
  }
  if (dx != nullptr) {
    ops.read("weights", weights, conv_weight_bytes(shape, out_channels));
    ops.update("dx", dx, floats(shape.image_count()));
  }
  return ops;
}

// ---- element-wise and reductions ---------------------------------------------------

DriverOperands Driver::fill_operands(index_t n, float, float* x) const {
  return per_element("fill", n, {}, {{"x", x}});
}

DriverOperands Driver::scale_operands(index_t n, float, float* x) const {
  return per_element("scale", n, {}, {{"x", x}});
}

DriverOperands Driver::axpy_operands(index_t n, float, const float* x, float* y) const {
  return per_element("axpy", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::lincomb_operands(index_t n, float, const float* a, float, const float* b,
                                        float* y) const {
  return per_element("lincomb", n, {{"a", a}, {"b", b}}, {{"y", y}});
}

DriverOperands Driver::lincomb_relu_operands(index_t n, float, const float* a, float,
                                             const float* b, float, float* y) const {
  return per_element("lincomb_relu", n, {{"a", a}, {"b", b}}, {{"y", y}});
}

DriverOperands Driver::axpby_operands(index_t n, float, const float* x, float, float* y) const {
  return per_element("axpby", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::mul_operands(index_t n, const float* a, const float* b, float* y) const {
  return per_element("mul", n, {{"a", a}, {"b", b}}, {{"y", y}});
}

DriverOperands Driver::add_scalar_operands(index_t n, float, float* x) const {
  return per_element("add_scalar", n, {}, {{"x", x}});
}

DriverOperands Driver::powx_operands(index_t n, const float* x, float, float* y) const {
  return per_element("powx", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::copy_strided_operands(index_t rows, index_t cols, const float* src,
                                             index_t src_ld, float* dst, index_t dst_ld) const {
  DriverOperands ops;
  HN_CHECK(rows >= 0 && cols >= 0, "copy_strided: sizes must be >= 0, got rows={} cols={}", rows,
           cols);
  HN_CHECK(src_ld >= cols && dst_ld >= cols,
           "copy_strided: leading dimensions src_ld={} dst_ld={} must be >= cols={} (rows={})",
           src_ld, dst_ld, cols, rows);
  ops.read("src", src, matrix_bytes(rows, cols, src_ld));
  ops.update("dst", dst, matrix_bytes(rows, cols, dst_ld));
  ops.work = rows > 0 && cols > 0;
  return ops;
}

DriverOperands Driver::copy_strided_batched_operands(index_t batch, index_t rows, index_t cols,
                                                     const float* src, index_t src_ld,
                                                     index_t src_stride, float* dst, index_t dst_ld,
                                                     index_t dst_stride) const {
  DriverOperands ops;
  HN_CHECK(batch >= 0 && rows >= 0 && cols >= 0,
           "copy_strided_batched: sizes must be >= 0, got batch={} rows={} cols={}", batch, rows,
           cols);
  HN_CHECK(src_ld >= cols && dst_ld >= cols && src_stride >= 0 && dst_stride >= 0,
           "copy_strided_batched: leading dimensions src_ld={} dst_ld={} must be >= cols={} and "
           "strides src_stride={} dst_stride={} >= 0",
           src_ld, dst_ld, cols, src_stride, dst_stride);
  const std::size_t src_image = matrix_bytes(rows, cols, src_ld);
  const std::size_t dst_image = matrix_bytes(rows, cols, dst_ld);
  HN_CHECK(batch <= 1 || dst_image <= floats(dst_stride),
           "copy_strided_batched: the images of dst overlap (rows={} cols={} dst_ld={}, "
           "dst_stride={})",
           rows, cols, dst_ld, dst_stride);
  const bool any = batch > 0 && rows > 0 && cols > 0;
  ops.read("src", src, any ? floats((batch - 1) * src_stride) + src_image : 0);
  ops.update("dst", dst, any ? floats((batch - 1) * dst_stride) + dst_image : 0);
  ops.work = any;
  return ops;
}

DriverOperands Driver::scale_channels_operands(const AxisShape& shape, const float* scale,
                                               const float* x, float* y) const {
  DriverOperands ops;
  shape.validate("scale_channels");
  check_layout_support(*this, "scale_channels", shape.layout != Layout::nchw, shape.to_string());
  ops.read("scale", scale, floats(shape.channels));
  ops.read("x", x, floats(shape.count()));
  ops.update("y", y, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands Driver::max_accumulate_operands(index_t n, const float* x, std::int32_t index,
                                               float* y, std::int32_t* mask) const {
  DriverOperands ops;
  check_count("max_accumulate", "n", n);
  HN_CHECK(index >= 0, "max_accumulate: index must be >= 0, got {}", index);
  ops.read("x", x, floats(n));
  ops.update("y", y, floats(n));
  ops.update("mask", mask, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  ops.work = n > 0;
  return ops;
}

DriverOperands Driver::max_select_operands(index_t n, const std::int32_t* mask, std::int32_t,
                                           const float* dy, float* dx) const {
  DriverOperands ops;
  check_count("max_select", "n", n);
  ops.read("mask", mask, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  ops.read("dy", dy, floats(n));
  ops.update("dx", dx, floats(n));
  ops.work = n > 0;
  return ops;
}

DriverOperands Driver::dot_operands(index_t n, const float* x, const float* y) const {
  return per_element("dot", n, {{"x", x}, {"y", y}}, {});
}

DriverOperands Driver::asum_operands(index_t n, const float* x) const {
  return per_element("asum", n, {{"x", x}}, {});
}

DriverOperands Driver::sum_operands(index_t n, const float* x) const {
  return per_element("sum", n, {{"x", x}}, {});
}

DriverOperands Driver::bias_backward_operands(const AxisShape& shape, const float* dy, float,
                                              float* dbias) const {
  DriverOperands ops;
  shape.validate("bias_backward");
  check_layout_support(*this, "bias_backward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("dy", dy, floats(shape.count()));
  ops.update("dbias", dbias, floats(shape.channels));
  return ops;
}

DriverOperands Driver::relu_backward_bias_operands(const AxisShape& shape, float, const float* y,
                                                   const float* dy, float* dx, float* dbias) const {
  DriverOperands ops;
  shape.validate("relu_backward_bias");
  check_layout_support(*this, "relu_backward_bias", shape.layout != Layout::nchw,
                       shape.to_string());
  ops.read("y", y, floats(shape.count()));
  ops.read("dy", dy, floats(shape.count()));
  ops.write("dx", dx, floats(shape.count()));
  ops.update("dbias", dbias, floats(shape.channels));
  return ops;
}

// ---- per-channel normalisation -------------------------------------------------------

DriverOperands Driver::norm_affine_forward_operands(const AxisShape& shape, const float* x,
                                                    const float* shift, const float* inv_std,
                                                    const float* gamma, const float* beta, bool,
                                                    float, float* normalised, float* y) const {
  DriverOperands ops;
  shape.validate("norm_affine_forward");
  check_layout_support(*this, "norm_affine_forward", shape.layout != Layout::nchw,
                       shape.to_string());
  HN_CHECK(normalised == nullptr || (normalised != x && normalised != y),
           "norm_affine_forward: normalised must be memory of its own, not x or y");
  ops.read("x", x, floats(shape.count()));
  // The channel vectors are one operand each when they matter: an empty call reads none.
  const std::size_t channels = shape.count() > 0 ? floats(shape.channels) : 0;
  ops.read("shift", shift, channels);
  ops.read("inv_std", inv_std, channels);
  ops.read("gamma", gamma, channels);
  if (beta != nullptr) ops.read("beta", beta, channels);
  if (normalised != nullptr) ops.write("normalised", normalised, floats(shape.count()));
  ops.update("y", y, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands Driver::norm_affine_backward_operands(const AxisShape& shape, const float* dy,
                                                     const float* y, const float* normalised,
                                                     const float* dx_scale, bool relu, float,
                                                     float* dgamma, float* dbeta, float* dx) const {
  DriverOperands ops;
  shape.validate("norm_affine_backward");
  check_layout_support(*this, "norm_affine_backward", shape.layout != Layout::nchw,
                       shape.to_string());
  const std::size_t count = floats(shape.count());
  const std::size_t channels = shape.count() > 0 ? floats(shape.channels) : 0;
  ops.read("dy", dy, count);
  if (relu) ops.read("y", y, count);
  if (dgamma != nullptr) {
    ops.read("normalised", normalised, count);
    ops.update("dgamma", dgamma, channels);
  }
  if (dbeta != nullptr) ops.update("dbeta", dbeta, channels);
  if (dx != nullptr) {
    ops.read("dx_scale", dx_scale, channels);
    ops.update("dx", dx, count);
  }
  ops.work = shape.count() > 0;
  return ops;
}

// ---- activations -------------------------------------------------------------------

DriverOperands Driver::bias_forward_operands(const AxisShape& shape, const float* bias,
                                             float* y) const {
  DriverOperands ops;
  shape.validate("bias_forward");
  check_layout_support(*this, "bias_forward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("bias", bias, floats(shape.channels));
  ops.update("y", y, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands Driver::relu_forward_operands(index_t n, float, const float* x, float* y) const {
  return per_element("relu_forward", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::relu_backward_operands(index_t n, float, const float* x, const float* dy,
                                              float* dx) const {
  return per_element("relu_backward", n, {{"x", x}, {"dy", dy}}, {{"dx", dx}});
}

DriverOperands Driver::swish_forward_operands(index_t n, float, const float* x, float* y) const {
  return per_element("swish_forward", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::swish_backward_operands(index_t n, float, const float* x, const float* dy,
                                               float* dx) const {
  return per_element("swish_backward", n, {{"x", x}, {"dy", dy}}, {{"dx", dx}});
}

DriverOperands Driver::clip_forward_operands(index_t n, float lo, float hi, const float* x,
                                             float* y) const {
  HN_CHECK(lo <= hi, "clip_forward: lo {} > hi {}", lo, hi);
  return per_element("clip_forward", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::clip_backward_operands(index_t n, float lo, float hi, const float* x,
                                              const float* dy, float* dx) const {
  HN_CHECK(lo <= hi, "clip_backward: lo {} > hi {}", lo, hi);
  return per_element("clip_backward", n, {{"x", x}, {"dy", dy}}, {{"dx", dx}});
}

DriverOperands Driver::sigmoid_forward_operands(index_t n, const float* x, float* y) const {
  return per_element("sigmoid_forward", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::sigmoid_backward_operands(index_t n, const float* y, const float* dy,
                                                 float* dx) const {
  return per_element("sigmoid_backward", n, {{"y", y}, {"dy", dy}}, {{"dx", dx}});
}

DriverOperands Driver::tanh_forward_operands(index_t n, const float* x, float* y) const {
  return per_element("tanh_forward", n, {{"x", x}}, {{"y", y}});
}

DriverOperands Driver::tanh_backward_operands(index_t n, const float* y, const float* dy,
                                              float* dx) const {
  return per_element("tanh_backward", n, {{"y", y}, {"dy", dy}}, {{"dx", dx}});
}

// ---- pooling -----------------------------------------------------------------------

DriverOperands Driver::pool_max_forward_operands(const PoolShape& shape, const float* x, float* y,
                                                 std::int32_t* mask) const {
  DriverOperands ops;
  shape.validate("pool_max_forward");
  check_layout_support(*this, "pool_max_forward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("x", x, floats(shape.in_count()));
  ops.update("y", y, floats(shape.out_count()));
  ops.update("mask", mask, static_cast<std::size_t>(shape.out_count()) * sizeof(std::int32_t));
  ops.work = shape.batch > 0;
  return ops;
}

DriverOperands Driver::pool_max_backward_operands(const PoolShape& shape, const float* dy,
                                                  const std::int32_t* mask, float* dx) const {
  DriverOperands ops;
  shape.validate("pool_max_backward");
  check_layout_support(*this, "pool_max_backward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("dy", dy, floats(shape.out_count()));
  ops.read("mask", mask, static_cast<std::size_t>(shape.out_count()) * sizeof(std::int32_t));
  ops.update("dx", dx, floats(shape.in_count()));
  ops.work = shape.batch > 0;
  return ops;
}

DriverOperands Driver::pool_avg_forward_operands(const PoolShape& shape, const float* x,
                                                 float* y) const {
  DriverOperands ops;
  shape.validate("pool_avg_forward");
  check_layout_support(*this, "pool_avg_forward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("x", x, floats(shape.in_count()));
  ops.update("y", y, floats(shape.out_count()));
  ops.work = shape.batch > 0;
  return ops;
}

DriverOperands Driver::pool_avg_backward_operands(const PoolShape& shape, const float* dy,
                                                  float* dx) const {
  DriverOperands ops;
  shape.validate("pool_avg_backward");
  check_layout_support(*this, "pool_avg_backward", shape.layout != Layout::nchw, shape.to_string());
  ops.read("dy", dy, floats(shape.out_count()));
  ops.update("dx", dx, floats(shape.in_count()));
  ops.work = shape.batch > 0;
  return ops;
}

// ---- LRN, softmax, dropout ---------------------------------------------------------

DriverOperands Driver::lrn_forward_operands(const LrnShape& shape, const float* x, float* y,
                                            float* scale) const {
  DriverOperands ops;
  shape.validate("lrn_forward");
  check_layout_support(*this, "lrn_forward", shape.layout != Layout::nchw, shape.to_string());
  const std::size_t bytes = floats(shape.count());
  ops.read("x", x, bytes);
  ops.update("y", y, bytes);
  ops.update("scale", scale, bytes);
  ops.work = bytes > 0;
  return ops;
}

DriverOperands Driver::lrn_backward_operands(const LrnShape& shape, const float* x, const float* y,
                                             const float* scale, const float* dy, float* dx) const {
  DriverOperands ops;
  shape.validate("lrn_backward");
  check_layout_support(*this, "lrn_backward", shape.layout != Layout::nchw, shape.to_string());
  const std::size_t bytes = floats(shape.count());
  ops.read("x", x, bytes);
  ops.read("y", y, bytes);
  ops.read("scale", scale, bytes);
  ops.read("dy", dy, bytes);
  ops.update("dx", dx, bytes);
  ops.work = bytes > 0;
  return ops;
}

namespace {

// A softmax-shaped call: x -> y forward, (y, dy) -> dx backward, NCHW.
DriverOperands axis_forward(const char* call, const AxisShape& shape, const float* x, float* y) {
  DriverOperands ops;
  shape.validate(call);
  check_nchw(call, shape);
  ops.read("x", x, floats(shape.count()));
  ops.update("y", y, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands axis_backward(const char* call, const AxisShape& shape, const float* y,
                             const float* dy, float* dx) {
  DriverOperands ops;
  shape.validate(call);
  check_nchw(call, shape);
  ops.read("y", y, floats(shape.count()));
  ops.read("dy", dy, floats(shape.count()));
  ops.update("dx", dx, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

}  // namespace

DriverOperands Driver::softmax_forward_operands(const AxisShape& shape, const float* x,
                                                float* y) const {
  return axis_forward("softmax_forward", shape, x, y);
}

DriverOperands Driver::softmax_backward_operands(const AxisShape& shape, const float* y,
                                                 const float* dy, float* dx) const {
  return axis_backward("softmax_backward", shape, y, dy, dx);
}

DriverOperands Driver::log_softmax_forward_operands(const AxisShape& shape, const float* x,
                                                    float* y) const {
  return axis_forward("log_softmax_forward", shape, x, y);
}

DriverOperands Driver::log_softmax_backward_operands(const AxisShape& shape, const float* y,
                                                     const float* dy, float* dx) const {
  return axis_backward("log_softmax_backward", shape, y, dy, dx);
}

DriverOperands Driver::dropout_forward_operands(index_t n, float ratio, std::uint64_t,
                                                std::uint64_t, const float* x, float* y,
                                                float* mask) const {
  DriverOperands ops;
  check_count("dropout_forward", "n", n);
  HN_CHECK(ratio >= 0.0f && ratio < 1.0f, "dropout_forward: ratio must be in [0, 1), got {}",
           ratio);
  ops.read("x", x, floats(n));
  ops.update("y", y, floats(n));
  ops.update("mask", mask, floats(n));
  ops.work = n > 0;
  return ops;
}

DriverOperands Driver::dropout_forward_layout_operands(const AxisShape& shape, float ratio,
                                                       std::uint64_t, std::uint64_t, const float* x,
                                                       float* y, float* mask) const {
  DriverOperands ops;
  shape.validate("dropout_forward_layout");
  check_layout_support(*this, "dropout_forward_layout", shape.layout != Layout::nchw,
                       shape.to_string());
  HN_CHECK(ratio >= 0.0f && ratio < 1.0f, "dropout_forward_layout: ratio must be in [0, 1), got {}",
           ratio);
  ops.read("x", x, floats(shape.count()));
  ops.update("y", y, floats(shape.count()));
  ops.update("mask", mask, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands Driver::dropout_backward_operands(index_t n, float ratio, const float* mask,
                                                 const float* dy, float* dx) const {
  DriverOperands ops;
  check_count("dropout_backward", "n", n);
  HN_CHECK(ratio >= 0.0f && ratio < 1.0f, "dropout_backward: ratio must be in [0, 1), got {}",
           ratio);
  ops.read("mask", mask, floats(n));
  ops.read("dy", dy, floats(n));
  ops.update("dx", dx, floats(n));
  ops.work = n > 0;
  return ops;
}

// ---- losses ------------------------------------------------------------------------

DriverOperands Driver::softmax_loss_forward_operands(const AxisShape& shape, const float* prob,
                                                     const float* label, bool, int, float* loss,
                                                     float* valid) const {
  DriverOperands ops;
  shape.validate("softmax_loss_forward");
  check_nchw("softmax_loss_forward", shape);
  const std::size_t positions = floats(shape.outer * shape.inner);
  ops.read("prob", prob, floats(shape.count()));
  ops.read("label", label, positions);
  ops.update("loss", loss, positions);
  ops.update("valid", valid, positions);
  ops.work = positions > 0;
  return ops;
}

DriverOperands Driver::softmax_loss_backward_operands(const AxisShape& shape, const float* prob,
                                                      const float* label, bool, int, float,
                                                      float* dx) const {
  DriverOperands ops;
  shape.validate("softmax_loss_backward");
  check_nchw("softmax_loss_backward", shape);
  ops.read("prob", prob, floats(shape.count()));
  ops.read("label", label, floats(shape.outer * shape.inner));
  ops.update("dx", dx, floats(shape.count()));
  ops.work = shape.count() > 0;
  return ops;
}

DriverOperands Driver::sigmoid_cross_entropy_forward_operands(index_t n, const float* x,
                                                              const float* target, bool, int,
                                                              float* loss, float* valid) const {
  return per_element("sigmoid_cross_entropy_forward", n, {{"x", x}, {"target", target}},
                     {{"loss", loss}, {"valid", valid}});
}

DriverOperands Driver::sigmoid_cross_entropy_backward_operands(index_t n, const float* x,
                                                               const float* target, bool, int,
                                                               float, float* dx) const {
  return per_element("sigmoid_cross_entropy_backward", n, {{"x", x}, {"target", target}},
                     {{"dx", dx}});
}

// ---- solver ------------------------------------------------------------------------

DriverOperands Driver::solver_update_operands(const SolverUpdate& u, index_t n, float* param,
                                              const float* grad, float* history,
                                              float* history2) const {
  DriverOperands ops;
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
  if (n == 0) return DriverOperands::nothing();
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
  ops.update("param", param, floats(n));
  ops.read("grad", grad, floats(n));
  if (u.rate != nullptr) ops.read("rate", u.rate, floats(1));
  if (u.gate != nullptr) ops.read("gate", u.gate, floats(1));
  ops.update("history", history, floats(n));
  if (two) ops.update("history2", history2, floats(n));
  return ops;
}

// ---- the checking wrappers, one per call of driver_calls.def -----------------------

DriverOperands& DriverOperands::add(const char* name, const void* address, std::size_t bytes,
                                    DriverOperand::Use use) {
  HN_CHECK(count < kMax, "DriverOperands: more than {} operands (adding {})", kMax, name);
  items[count++] = DriverOperand{name, address, bytes, use};
  return *this;
}

class Driver::CallScope {
 public:
  explicit CallScope(Driver& driver) : driver_(driver) { driver_.enter_call(); }
  ~CallScope() { driver_.leave_call(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Driver& driver_;
};

#define HN_CORE(RET, NAME, PARAMS, ARGS)                                \
  RET Driver::NAME PARAMS {                                             \
    const DriverOperands operands = NAME##_operands ARGS;               \
    for (const DriverOperand& operand : operands)                       \
      check_range(#NAME, operand.name, operand.address, operand.bytes); \
    if (!operands.work) return RET();                                   \
    const CallScope scope(*this);                                       \
    return do_##NAME ARGS;                                              \
  }
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

}  // namespace hn
