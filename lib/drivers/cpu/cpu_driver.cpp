// The fast CPU driver: host memory (64-byte aligned), GEMM through the selected BLAS, every
// other call through the Eigen and OpenMP kernels in kernels.h, all on the driver's thread count.
#include "lib/drivers/cpu/cpu_driver.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "lib/core/affinity.h"
#include "lib/core/check.h"
#include "lib/core/memory.h"
#include "lib/drivers/cpu/binding.h"
#include "lib/drivers/cpu/blas.h"
#include "lib/drivers/cpu/conv.h"
#include "lib/drivers/cpu/conv_pointwise.h"
#include "lib/drivers/cpu/conv_winograd.h"
#include "lib/drivers/cpu/denormals.h"
#include "lib/drivers/cpu/kernels.h"

namespace hn::detail {

namespace {

// A cache line, and the widest vector (AVX-512) the kernels may load.
constexpr std::size_t kAlignment = 64;

// The vector extension the driver's own kernels were compiled for (simd.h's lanes).
#if defined(__AVX512F__)
constexpr const char* kBuildVectors = "avx512";
#elif defined(__AVX2__)
constexpr const char* kBuildVectors = "avx2";
#else
constexpr const char* kBuildVectors = "sse";
#endif

class CpuDriver final : public Driver {
 public:
  CpuDriver(const Device& device, int threads, cpu::Blas blas, bool flush_denormals,
            std::vector<int> cores)
      : Driver(device),
        blas_(blas),
        parallel_(threads),
        flush_denormals_(flush_denormals),
        cores_(std::move(cores)) {}

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_addressable = true;
    caps.convolution = cpu::DirectConvolution::available();
    // Blocked convolutions are oneDNN's (the other calls have their own paths), and so is
    // the choice of block.
    caps.blocked_layout = caps.convolution;
    if (caps.blocked_layout)
      caps.preferred_blocked_layout = cpu::DirectConvolution::preferred_layout();
    caps.winograd = true;   // conv_winograd.h: the driver's own, with or without oneDNN
    caps.pointwise = true;  // conv_pointwise.h: the same
    // BF16 calls are faster than FP32 ones only for some shapes and directions (on AMX the
    // data gradient of ResNet-50's 256 -> 64 1x1 layer took 24 ms against 14): the measured
    // choice times both.
    caps.fp32_convolution =
        math_mode() == MathMode::bf16 && cpu::DirectConvolution::bf16_available();
    return caps;
  }
  MemorySpace memory_space() const override { return host_space(); }
  bool owns(const void*, std::size_t) const override { return true; }
  std::string description() const override { return describe(false); }
  // The choices measured depend on the kernels too: a build for AVX2 on an AVX-512 machine,
  // or oneDNN held below the CPU (ONEDNN_MAX_CPU_ISA), runs others than the native build
  // that may share its cache file.
  std::string tuning_identity() const override {
    return fmt::format("{}, kernels {}, oneDNN {}", describe(true), kBuildVectors,
                       cpu::DirectConvolution::isa());
  }
  // CPUs have no TF32. BF16 products exist on CPUs with AVX512_BF16 (and AMX), where
  // oneDNN's BF16 convolutions run about twice as fast as FP32 ones (a 3x3 64-channel layer
  // at batch 32 on a 2-core EPYC, 16.6 ms against 32.7); elsewhere BF16 would be emulated,
  // slower than FP32, so the driver computes FP32 and says so.
  std::string math_note(MathMode mode) const override {
    switch (mode) {
      case MathMode::fp32:
        return {};
      case MathMode::tf32:
        return fmt::format("{} computes FP32 for TF32 math: CPUs have no TF32", name());
      case MathMode::bf16:
        break;
    }
    if (cpu::DirectConvolution::bf16_available()) {
      return fmt::format(
          "{} computes BF16 products in its oneDNN convolutions ({}): where measured faster "
          "than FP32 when tuned, everywhere with tune off; its GEMMs "
          "(InnerProduct, lowered convolutions) and the convolutions oneDNN has no BF16 kernel "
          "for stay FP32",
          name(), cpu::DirectConvolution::bf16_isa());
    }
    return fmt::format("{} computes FP32 for BF16 math: {}", name(),
                       !cpu::DirectConvolution::available() ? "this build has no oneDNN"
                       : __builtin_cpu_supports("avx512bf16")
                           ? "oneDNN finds no BF16 kernels on this CPU"
                           : "this CPU has no AVX512_BF16");
  }

 protected:
  void* do_allocate(std::size_t bytes) override {
    check_host_bytes(bytes, [&] { return fmt::format("allocate on {}", name()); });
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* address = std::aligned_alloc(kAlignment, rounded);
    HN_CHECK(address != nullptr, "allocate on {}: out of host memory ({} bytes)", name(), bytes);
    return address;
  }
  void do_deallocate(void* address) noexcept override { std::free(address); }
  void do_copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    cpu::copy_bytes(parallel_, dst, src, bytes);
  }
  void do_copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    cpu::copy_bytes(parallel_, dst, src, bytes);
  }
  void do_copy(void* dst, const void* src, std::size_t bytes) override {
    cpu::copy_bytes(parallel_, dst, src, bytes);
  }
  void do_synchronize() override {}  // every call has finished when it returns

  void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
               const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
               index_t ldc) override {
    cpu::sgemm(blas_, parallel_.threads(), trans_a == Transpose::yes, trans_b == Transpose::yes, m,
               n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void do_im2col(const LoweringShape& shape, const float* images, float* columns) override {
    cpu::im2col(parallel_, shape, images, columns);
  }
  void do_col2im(const LoweringShape& shape, const float* columns, float* images) override {
    cpu::col2im(parallel_, shape, columns, images);
  }
  void do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) override {
    cpu::swap_axes(parallel_, d0, d1, inner, src, dst);
  }
  void do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
               float* y) override {
    cpu::lift(parallel_, shape, out_channels, products, y);
  }
  void do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                        float* products_diff) override {
    cpu::lift_backward(parallel_, shape, out_channels, dy, products_diff);
  }

  void do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                       const float* weights, const float* bias, float* y) override {
    if (shape.winograd) {
      return winograd_.forward(parallel_, shape, out_channels, x, weights, bias, y, {});
    }
    if (shape.pointwise) {
      return pointwise_.forward(parallel_, shape, out_channels, x, weights, bias, y, {});
    }
    if (!cpu::DirectConvolution::available())
      return Driver::do_conv_forward(shape, out_channels, x, weights, bias, y);
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.forward(parallel_, shape, out_channels, x, weights, bias, y);
  }
  void do_conv_forward_activation(const LoweringShape& shape, index_t out_channels, const float* x,
                                  const float* weights, const float* bias,
                                  const Activation& activation, float* y) override {
    if (shape.winograd) {
      return winograd_.forward(parallel_, shape, out_channels, x, weights, bias, y, activation);
    }
    if (shape.pointwise) {
      return pointwise_.forward(parallel_, shape, out_channels, x, weights, bias, y, activation);
    }
    if (!cpu::DirectConvolution::available()) {
      return Driver::do_conv_forward_activation(shape, out_channels, x, weights, bias, activation,
                                                y);
    }
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.forward(parallel_, shape, out_channels, x, weights, bias, y, activation);
  }
  void do_conv_forward_residual(const LoweringShape& shape, index_t out_channels, const float* x,
                                const float* weights, const float* bias, const float* residual,
                                const Activation& activation, float* y) override {
    if (shape.pointwise) {
      return pointwise_.forward(parallel_, shape, out_channels, x, weights, bias, y, activation,
                                residual);
    }
    if (shape.winograd || !cpu::DirectConvolution::available()) {
      return Driver::do_conv_forward_residual(shape, out_channels, x, weights, bias, residual,
                                              activation, y);
    }
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.forward(parallel_, shape, out_channels, x, weights, bias, y, activation, residual);
  }
  void do_conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                             const float* dy, float* dx) override {
    if (shape.winograd)
      return winograd_.backward_data(parallel_, shape, out_channels, weights, dy, dx);
    if (shape.pointwise)
      return pointwise_.backward_data(parallel_, shape, out_channels, weights, dy, dx);
    if (!cpu::DirectConvolution::available())
      return Driver::do_conv_backward_data(shape, out_channels, weights, dy, dx);
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.backward_data(parallel_, blas_, shape, out_channels, weights, dy, dx);
  }
  void do_conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                                const float* dy, float* dweights, float* dbias) override {
    if (shape.winograd) {
      return winograd_.backward_weights(parallel_, shape, out_channels, x, dy, dweights, dbias);
    }
    if (shape.pointwise) {
      return pointwise_.backward_weights(parallel_, shape, out_channels, x, dy, dweights, dbias);
    }
    if (!cpu::DirectConvolution::available())
      return Driver::do_conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.backward_weights(parallel_, shape, out_channels, x, dy, dweights, dbias);
  }
  void do_conv_backward(const LoweringShape& shape, index_t out_channels, const float* x,
                        const float* weights, const float* dy, float* dx, float* dweights,
                        float* dbias) override {
    if (shape.winograd) {
      if (dweights != nullptr) {
        winograd_.backward_weights(parallel_, shape, out_channels, x, dy, dweights, dbias);
      }
      if (dx != nullptr) winograd_.backward_data(parallel_, shape, out_channels, weights, dy, dx);
      return;
    }
    if (shape.pointwise) {
      return pointwise_.backward(parallel_, shape, out_channels, x, weights, dy, dx, dweights,
                                 dbias);
    }
    if (!cpu::DirectConvolution::available()) {
      return Driver::do_conv_backward(shape, out_channels, x, weights, dy, dx, dweights, dbias);
    }
    conv_.set_bf16(math_mode() == MathMode::bf16);
    conv_.backward(parallel_, blas_, shape, out_channels, x, weights, dy, dx, dweights, dbias);
  }
  void do_conv_backward_relu(const LoweringShape& shape, index_t out_channels, const float* x,
                             const float* weights, const float* y, float negative_slope, float* dy,
                             float* dx, float* dweights, float* dbias) override {
    if (shape.pointwise && cpu::PointwiseConvolution::one_pass(shape, dx, dweights)) {
      return pointwise_.backward_relu(parallel_, shape, out_channels, x, weights, y, negative_slope,
                                      dy, dx, dweights, dbias);
    }
    Driver::do_conv_backward_relu(shape, out_channels, x, weights, y, negative_slope, dy, dx,
                                  dweights, dbias);
  }

  void do_fill(index_t n, float value, float* x) override { cpu::fill(parallel_, n, value, x); }
  void do_scale(index_t n, float alpha, float* x) override { cpu::scale(parallel_, n, alpha, x); }
  void do_axpy(index_t n, float alpha, const float* x, float* y) override {
    cpu::axpy(parallel_, n, alpha, x, y);
  }
  void do_lincomb(index_t n, float alpha, const float* a, float beta, const float* b,
                  float* y) override {
    cpu::lincomb(parallel_, n, alpha, a, beta, b, y);
  }
  void do_lincomb_relu(index_t n, float alpha, const float* a, float beta, const float* b,
                       float slope, float* y) override {
    cpu::lincomb_relu(parallel_, n, alpha, a, beta, b, slope, y);
  }
  void do_axpby(index_t n, float alpha, const float* x, float beta, float* y) override {
    cpu::axpby(parallel_, n, alpha, x, beta, y);
  }
  void do_add_scalar(index_t n, float alpha, float* x) override {
    cpu::add_scalar(parallel_, n, alpha, x);
  }
  void do_powx(index_t n, const float* x, float exponent, float* y) override {
    cpu::powx(parallel_, n, x, exponent, y);
  }
  void do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                       index_t dst_ld) override {
    cpu::copy_strided(parallel_, rows, cols, src, src_ld, dst, dst_ld);
  }
  void do_copy_strided_batched(index_t batch, index_t rows, index_t cols, const float* src,
                               index_t src_ld, index_t src_stride, float* dst, index_t dst_ld,
                               index_t dst_stride) override {
    cpu::copy_strided_batched(parallel_, batch, rows, cols, src, src_ld, src_stride, dst, dst_ld,
                              dst_stride);
  }
  void do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                         float* y) override {
    if (shape.layout != Layout::nchw)
      return cpu::scale_channels_blocked(parallel_, shape, scale, x, y);
    cpu::scale_channels(parallel_, shape, scale, x, y);
  }
  void do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                         std::int32_t* mask) override {
    cpu::max_accumulate(parallel_, n, x, index, y, mask);
  }
  void do_max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                     float* dx) override {
    cpu::max_select(parallel_, n, mask, index, dy, dx);
  }
  void do_mul(index_t n, const float* a, const float* b, float* y) override {
    cpu::mul(parallel_, n, a, b, y);
  }

  float do_dot(index_t n, const float* x, const float* y) override {
    return cpu::dot(parallel_, n, x, y);
  }
  float do_asum(index_t n, const float* x) override { return cpu::asum(parallel_, n, x); }
  float do_sum(index_t n, const float* x) override { return cpu::sum(parallel_, n, x); }
  void do_bias_backward(const AxisShape& shape, const float* dy, float beta,
                        float* dbias) override {
    if (shape.layout != Layout::nchw)
      return cpu::bias_backward_blocked(parallel_, shape, dy, beta, dbias);
    cpu::bias_backward(parallel_, shape, dy, beta, dbias);
  }

  void do_relu_backward_bias(const AxisShape& shape, float negative_slope, const float* y,
                             const float* dy, float* dx, float* dbias) override {
    if (shape.layout != Layout::nchw)
      return cpu::relu_backward_bias_blocked(parallel_, shape, negative_slope, y, dy, dx, dbias);
    cpu::relu_backward_bias(parallel_, shape, negative_slope, y, dy, dx, dbias);
  }

  void do_bias_forward(const AxisShape& shape, const float* bias, float* y) override {
    if (shape.layout != Layout::nchw) return cpu::bias_forward_blocked(parallel_, shape, bias, y);
    cpu::bias_forward(parallel_, shape, bias, y);
  }
  void do_norm_affine_forward(const AxisShape& shape, const float* x, const float* shift,
                              const float* inv_std, const float* gamma, const float* beta,
                              bool relu, float slope, float* normalised, float* y) override {
    cpu::norm_affine_forward(parallel_, shape, x, shift, inv_std, gamma, beta, relu, slope,
                             normalised, y);
  }
  void do_norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                               const float* normalised, const float* dx_scale, bool relu,
                               float slope, float* dgamma, float* dbeta, float* dx) override {
    cpu::norm_affine_backward(parallel_, shape, dy, y, normalised, dx_scale, relu, slope, dgamma,
                              dbeta, dx);
  }
  void do_swish_forward(index_t n, float beta, const float* x, float* y) override {
    cpu::swish_forward(parallel_, n, beta, x, y);
  }
  void do_swish_backward(index_t n, float beta, const float* x, const float* dy,
                         float* dx) override {
    cpu::swish_backward(parallel_, n, beta, x, dy, dx);
  }
  void do_clip_forward(index_t n, float lo, float hi, const float* x, float* y) override {
    cpu::clip_forward(parallel_, n, lo, hi, x, y);
  }
  void do_clip_backward(index_t n, float lo, float hi, const float* x, const float* dy,
                        float* dx) override {
    cpu::clip_backward(parallel_, n, lo, hi, x, dy, dx);
  }
  void do_relu_forward(index_t n, float negative_slope, const float* x, float* y) override {
    cpu::relu_forward(parallel_, n, negative_slope, x, y);
  }
  void do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                        float* dx) override {
    cpu::relu_backward(parallel_, n, negative_slope, x, dy, dx);
  }
  void do_sigmoid_forward(index_t n, const float* x, float* y) override {
    cpu::sigmoid_forward(parallel_, n, x, y);
  }
  void do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) override {
    cpu::sigmoid_backward(parallel_, n, y, dy, dx);
  }
  void do_tanh_forward(index_t n, const float* x, float* y) override {
    cpu::tanh_forward(parallel_, n, x, y);
  }
  void do_tanh_backward(index_t n, const float* y, const float* dy, float* dx) override {
    cpu::tanh_backward(parallel_, n, y, dy, dx);
  }

  void do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                           std::int32_t* mask) override {
    if (shape.layout != Layout::nchw)
      return cpu::pool_max_forward_blocked(parallel_, shape, x, y, mask);
    cpu::pool_max_forward(parallel_, shape, x, y, mask);
  }
  void do_pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                            float* dx) override {
    if (shape.layout != Layout::nchw)
      return cpu::pool_max_backward_blocked(parallel_, shape, dy, mask, dx);
    cpu::pool_max_backward(parallel_, shape, dy, mask, dx);
  }
  void do_pool_avg_forward(const PoolShape& shape, const float* x, float* y) override {
    if (shape.layout != Layout::nchw) return cpu::pool_avg_forward_blocked(parallel_, shape, x, y);
    cpu::pool_avg_forward(parallel_, shape, x, y);
  }
  void do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) override {
    if (shape.layout != Layout::nchw)
      return cpu::pool_avg_backward_blocked(parallel_, shape, dy, dx);
    cpu::pool_avg_backward(parallel_, shape, dy, dx);
  }

  void do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) override {
    cpu::lrn_forward(parallel_, shape, x, y, scale);
  }
  void do_lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                       const float* dy, float* dx) override {
    cpu::lrn_backward(parallel_, shape, x, y, scale, dy, dx);
  }
  void do_softmax_forward(const AxisShape& shape, const float* x, float* y) override {
    cpu::softmax_forward(parallel_, shape, x, y);
  }
  void do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                           float* dx) override {
    cpu::softmax_backward(parallel_, shape, y, dy, dx);
  }
  void do_dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                          const float* x, float* y, float* mask) override {
    cpu::dropout_forward(parallel_, n, ratio, seed, offset, x, y, mask);
  }
  void do_dropout_forward_layout(const AxisShape& shape, float ratio, std::uint64_t seed,
                                 std::uint64_t offset, const float* x, float* y,
                                 float* mask) override {
    cpu::dropout_forward_layout(parallel_, shape, ratio, seed, offset, x, y, mask);
  }
  void do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                           float* dx) override {
    cpu::dropout_backward(parallel_, n, ratio, mask, dy, dx);
  }

  void do_softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                               bool has_ignore_label, int ignore_label, float* loss,
                               float* valid) override {
    cpu::softmax_loss_forward(parallel_, shape, prob, label, has_ignore_label, ignore_label, loss,
                              valid);
  }
  void do_softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                                bool has_ignore_label, int ignore_label, float scale,
                                float* dx) override {
    cpu::softmax_loss_backward(parallel_, shape, prob, label, has_ignore_label, ignore_label, scale,
                               dx);
  }
  void do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid) override {
    cpu::sigmoid_cross_entropy_forward(parallel_, n, x, target, has_ignore_label, ignore_label,
                                       loss, valid);
  }
  void do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx) override {
    cpu::sigmoid_cross_entropy_backward(parallel_, n, x, target, has_ignore_label, ignore_label,
                                        scale, dx);
  }

  void do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                        float* history, float* history2) override {
    cpu::solver_update(parallel_, u, n, param, grad, history, history2);
  }

 protected:
  // "cpu:1: 2 threads on cores 0-1, BLAS onednn"; for the tuning cache "cpu: 2 threads,
  // BLAS onednn": every instance (cpu, cpu:1) runs on the same cores' kind, and those whose
  // choices were measured apart, in different moments of a noisy machine, ran the same
  // shapes with different algorithms (one 13-15 % slower than the other alone).
  std::string describe(bool tuning) const {
    return fmt::format("{}: {} thread{}{}, BLAS {}{}", tuning ? device().kind : name(),
                       parallel_.threads(), parallel_.threads() == 1 ? "" : "s",
                       cores_.empty() || tuning ? "" : " on cores " + format_cores(cores_),
                       cpu::blas_name(blas_), flush_denormals_ ? "" : ", denormals kept");
  }

  void enter_call() override {
    cpu::bind_team(set_, cores_, parallel_.threads());
    if (flush_denormals_) {
      cpu::begin_flushing_denormals(parallel_.threads());
    } else {
      cpu::keep_denormals_on_team();
    }
  }
  void leave_call() noexcept override {
    if (flush_denormals_) cpu::end_flushing_denormals();
  }

 private:
  cpu::Blas blas_;
  cpu::Parallel parallel_;
  cpu::DirectConvolution conv_;          // oneDNN primitives cached per shape
  cpu::WinogradConvolution winograd_;    // its transformed weights kept between calls
  cpu::PointwiseConvolution pointwise_;  // its packed weights kept between calls
  bool flush_denormals_;                 // option denormals=flush (denormals.h)
  std::vector<int> cores_;               // option cores (binding.h); empty: not bound
  std::uint64_t set_ = next_set_++;      // names cores_ to bind_team
  static inline std::atomic<std::uint64_t> next_set_{1};
};

}  // namespace

DriverKind cpu_driver_kind() {
  DriverKind kind;
  kind.name = "cpu";
  kind.summary = "GEMM through oneDNN or OpenBLAS, lowering and primitives on OpenMP";
  kind.multithreaded = true;
  kind.any_index = true;
  kind.host_memory = true;
  kind.count = [] { return 1; };
  kind.make = [](const Device& device, const DriverOptions& options) -> std::unique_ptr<Driver> {
    int threads = options.integer("threads", 0, device);
    HN_CHECK(threads >= 0, "cpu driver {}: threads must be >= 0 (0 = every core), got {}",
             device.name(), threads);
    const std::string listed = options.text("cores", "any");
    std::vector<int> bound;
    if (listed != "any") {
      bound = parse_cores(listed, fmt::format("cpu driver {}: cores", device.name()));
      const std::vector<int> allowed = allowed_cores();
      for (int core : bound)
        HN_CHECK(std::binary_search(allowed.begin(), allowed.end(), core),
                 "cpu driver {}: core {} of cores={} is not one this process may run on ({})",
                 device.name(), core, listed, format_cores(allowed));
    }
    const int cores = static_cast<int>(bound.empty() ? allowed_cores().size() : bound.size());
    // Far more threads than cores only slows the teams down, and thousands make OpenMP's
    // runtime abort the process when it cannot create them.
    const int most = std::max(64, 4 * cores);
    HN_CHECK(threads <= most,
             "cpu driver {}: threads {} is too many for {} core{} (at most {}; 0 = one per core)",
             device.name(), threads, cores, cores == 1 ? "" : "s", most);
    if (threads == 0) threads = cores;
    return std::make_unique<CpuDriver>(device, threads, cpu::parse_blas(options.text("blas")),
                                       options.text("denormals", "flush") == "flush",
                                       std::move(bound));
  };
  kind.options = {
      {"threads", "worker threads (default 0: one per core, or per core listed in cores)", {}},
      {"cores",
       "the cores its threads run on, as taskset lists them (0-5,8), or any (default; "
       "a Runtime gives each CPU driver beside a GPU or another CPU driver cores of "
       "its own)",
       {}},
      {"blas", "the GEMM library (default: the first)", cpu::blas_names()},
      {"denormals",
       "flush (default): results and inputs below the smallest normal float are "
       "zero during the driver's calls, as in TensorFlow (operations on them are "
       "about 100x slower on Intel cores); keep: IEEE denormals",
       {"flush", "keep"}}};
  return kind;
}

}  // namespace hn::detail
