// The CUDA driver's class and what its sources share: cuda_driver.cpp (construction, memory,
// copies, errors), cuda_kernels.cpp (cuBLAS and our kernels) and cuda_cudnn.cpp (cuDNN).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#if HYBRIDNN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cuda/cuda_driver.h"
#include "lib/drivers/cuda/kernels/launchers.h"

namespace hn::detail {

// "<name>: <description>" of a CUDA runtime status (cuda_driver.cpp).
std::string cuda_status_text(cudaError_t status);

// ---- RAII for CUDA objects ------------------------------------------------------------

struct StreamDeleter {
  void operator()(cudaStream_t stream) const noexcept { cudaStreamDestroy(stream); }
};
using StreamHandle = std::unique_ptr<CUstream_st, StreamDeleter>;

struct EventDeleter {
  void operator()(cudaEvent_t event) const noexcept { cudaEventDestroy(event); }
};
using EventHandle = std::unique_ptr<CUevent_st, EventDeleter>;

struct GraphExecDeleter {
  void operator()(cudaGraphExec_t graph) const noexcept { cudaGraphExecDestroy(graph); }
};
using GraphExecHandle = std::unique_ptr<CUgraphExec_st, GraphExecDeleter>;

// ---- cuBLAS, loaded when the first CUDA driver is made (cublas(), cuda_driver.cpp) ----

struct Cublas {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetWorkspace) set_workspace = nullptr;
  decltype(&cublasGetVersion) get_version = nullptr;
  decltype(&cublasSgemm_64) sgemm = nullptr;
  decltype(&cublasGemmEx_64) gemm_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

const Cublas& cublas();

struct BlasDeleter {
  void operator()(cublasHandle_t handle) const noexcept { cublas().destroy(handle); }
};
using BlasHandle = std::unique_ptr<cublasContext, BlasDeleter>;

struct DeviceMemoryDeleter {
  void operator()(void* address) const noexcept { cudaFree(address); }
};
using DeviceMemory = std::unique_ptr<void, DeviceMemoryDeleter>;

struct PinnedMemoryDeleter {
  void operator()(void* address) const noexcept { cudaFreeHost(address); }
};
using PinnedMemory = std::unique_ptr<void, PinnedMemoryDeleter>;

#if HYBRIDNN_WITH_CUDNN
struct CudnnDeleter {
  void operator()(cudnnHandle_t handle) const noexcept { cudnnDestroy(handle); }
};
using CudnnHandle = std::unique_ptr<cudnnContext, CudnnDeleter>;

struct TensorDescriptorDeleter {
  void operator()(cudnnTensorDescriptor_t desc) const noexcept {
    cudnnDestroyTensorDescriptor(desc);
  }
};
using TensorDescriptor = std::unique_ptr<cudnnTensorStruct, TensorDescriptorDeleter>;

struct LrnDescriptorDeleter {
  void operator()(cudnnLRNDescriptor_t desc) const noexcept { cudnnDestroyLRNDescriptor(desc); }
};
using LrnDescriptor = std::unique_ptr<cudnnLRNStruct, LrnDescriptorDeleter>;

struct FilterDescriptorDeleter {
  void operator()(cudnnFilterDescriptor_t desc) const noexcept {
    cudnnDestroyFilterDescriptor(desc);
  }
};
using FilterDescriptor = std::unique_ptr<cudnnFilterStruct, FilterDescriptorDeleter>;

struct ConvolutionDescriptorDeleter {
  void operator()(cudnnConvolutionDescriptor_t desc) const noexcept {
    cudnnDestroyConvolutionDescriptor(desc);
  }
};
using ConvolutionDescriptor = std::unique_ptr<cudnnConvolutionStruct, ConvolutionDescriptorDeleter>;

// One convolution shape's descriptors and algorithms, made once (the heuristics query is
// slow next to a small convolution).
struct ConvPlan {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  std::size_t forward_bytes = 0, data_bytes = 0, filter_bytes = 0;
};

// A convolution shape, its output channels and the math mode: the key of the plan cache
// (conv_plan).
using ConvKey = std::array<index_t, 15>;
#endif

inline std::size_t float_bytes(index_t n) {
  return static_cast<std::size_t>(n) * sizeof(float);
}

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(const Device& device);
  ~CudaDriver() override;

  Capabilities capabilities() const override;

  MemorySpace memory_space() const override { return this; }
  std::string description() const override { return description_; }
  bool owns(const void* address, std::size_t bytes) const override;
  // CUDA events on the driver's stream (cuda_driver.cpp).
  std::unique_ptr<Marks> make_marks(int count) override;
  std::string math_note(MathMode mode) const override;
  // CUDA graphs: the stream's work captured, then launched as one graph (cuda_driver.cpp).
  bool records() const override { return true; }
  bool begin_recording(std::string& why) override;
  std::unique_ptr<Recording> end_recording(std::string& why) override;

 protected:
  // ---- cuda_driver.cpp: memory, copies, synchronize -----------------------------------
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* address) noexcept override;
  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void do_copy(void* dst, const void* src, std::size_t bytes) override;
  void do_synchronize() override;

  // ---- cuda_kernels.cpp: GEMM, lowering, element-wise, reductions, activations, pooling
  void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
               const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
               index_t ldc) override;
  void do_im2col(const LoweringShape& shape, const float* images, float* columns) override;
  void do_col2im(const LoweringShape& shape, const float* columns, float* images) override;
  void do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) override;
  void do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
               float* y) override;
  void do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                        float* products_diff) override;
  void do_fill(index_t n, float value, float* x) override;
  void do_scale(index_t n, float alpha, float* x) override;
  void do_axpy(index_t n, float alpha, const float* x, float* y) override;
  void do_axpby(index_t n, float alpha, const float* x, float beta, float* y) override;
  void do_mul(index_t n, const float* a, const float* b, float* y) override;
  void do_add_scalar(index_t n, float alpha, float* x) override;
  void do_powx(index_t n, const float* x, float exponent, float* y) override;
  void do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                       index_t dst_ld) override;
  void do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                         float* y) override;
  void do_norm_affine_forward(const AxisShape& shape, const float* x, const float* shift,
                              const float* inv_std, const float* gamma, const float* beta,
                              bool relu, float slope, float* normalised, float* y) override;
  void do_norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                               const float* normalised, const float* dx_scale, bool relu,
                               float slope, float* dgamma, float* dbeta, float* dx) override;
  void do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                         std::int32_t* mask) override;
  void do_max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                     float* dx) override;
  float do_dot(index_t n, const float* x, const float* y) override;
  float do_asum(index_t n, const float* x) override;
  float do_sum(index_t n, const float* x) override;
  void do_bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias) override;
  void do_bias_forward(const AxisShape& shape, const float* bias, float* y) override;
  void do_relu_forward(index_t n, float negative_slope, const float* x, float* y) override;
  void do_clip_forward(index_t n, float lo, float hi, const float* x, float* y) override;
  void do_clip_backward(index_t n, float lo, float hi, const float* x, const float* dy,
                        float* dx) override;
  void do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                        float* dx) override;
  void do_sigmoid_forward(index_t n, const float* x, float* y) override;
  void do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) override;
  void do_tanh_forward(index_t n, const float* x, float* y) override;
  void do_tanh_backward(index_t n, const float* y, const float* dy, float* dx) override;
  void do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                           std::int32_t* mask) override;
  void do_pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                            float* dx) override;
  void do_pool_avg_forward(const PoolShape& shape, const float* x, float* y) override;
  void do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) override;

  // ---- cuda_cudnn.cpp: LRN, direct convolution, softmax (cuDNN when it may) -----------
  void do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) override;
  void do_lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                       const float* dy, float* dx) override;
  void do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                       const float* weights, const float* bias, float* y) override;
  void do_conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                             const float* dy, float* dx) override;
  void do_conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                                const float* dy, float* dweights, float* dbias) override;
  void do_softmax_forward(const AxisShape& shape, const float* x, float* y) override;
  void do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                           float* dx) override;

  // ---- cuda_kernels.cpp: dropout, losses, solver --------------------------------------
  void do_dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                          const float* x, float* y, float* mask) override;
  void do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                           float* dx) override;
  void do_softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                               bool has_ignore_label, int ignore_label, float* loss,
                               float* valid) override;
  void do_softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                                bool has_ignore_label, int ignore_label, float scale,
                                float* dx) override;
  void do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid) override;
  void do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx) override;
  void do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                        float* history, float* history2) override;

 private:
  friend class CudaMarks;
  friend class CudaRecording;
  static constexpr std::size_t kReduceScratchBytes =
      cuda::kReduceMaxBlocks * sizeof(double) + sizeof(double);

  cudaStream_t stream() const { return stream_.get(); }

  // Whether a depthwise shape runs our own kernels (cuda_cudnn.cpp).
  bool own_depthwise(const LoweringShape& shape, index_t out_channels) const;

  // ---- cuda_driver.cpp: errors, activation, staging, scratch, label errors ------------
  void activate() const;

  template <class... Args>
  void check(cudaError_t status, const char* call, fmt::format_string<Args...> details,
             Args&&... args) const {
    if (status == cudaSuccess) return;
    cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
    fail("{}: {} failed: {} ({})", name(), call, cuda_status_text(status),
         fmt::format(details, std::forward<Args>(args)...));
  }

  // A kernel launch; errors of kernels queued earlier may surface here too.
  template <class... Args>
  void launched(cudaError_t status, const char* call, fmt::format_string<Args...> details,
                Args&&... args) const {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    fail("{}: {} kernel launch failed: {} ({})", name(), call, cuda_status_text(status),
         fmt::format(details, std::forward<Args>(args)...));
  }

  template <class... Args>
  void check_blas(cublasStatus_t status, const char* call, fmt::format_string<Args...> details,
                  Args&&... args) const {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fail("{}: {} failed: {}: {} ({})", name(), call, cublas().status_name(status),
         cublas().status_string(status), fmt::format(details, std::forward<Args>(args)...));
  }

  void sync(const char* call, std::size_t bytes);
  bool is_device_memory(const void* address) const;
  static bool is_pinned(const void* host, std::size_t bytes);
  std::size_t reserve_staging(std::size_t bytes);
  char* staging_half(std::size_t half, std::size_t chunk) const;
  void record_staging(std::size_t half, const char* call, std::size_t bytes);
  void wait_staging(std::size_t half, const char* call, std::size_t bytes);
  float* scratch(std::size_t bytes);
  cuda::LabelError* label_error() const {
    return static_cast<cuda::LabelError*>(label_error_.get());
  }
  void report_label_error();

  // What dot, asum and sum share (cuda_kernels.cpp).
  float reduce(cuda::ReduceOp op, const char* call, index_t n, const float* x, const float* y);

#if HYBRIDNN_WITH_CUDNN
  template <class... Args>
  void check_dnn(cudnnStatus_t status, const char* call, fmt::format_string<Args...> details,
                 Args&&... args) const {
    if (status == CUDNN_STATUS_SUCCESS) return;
    fail("{}: {} failed: {} ({})", name(), call, cudnnGetErrorString(status),
         fmt::format(details, std::forward<Args>(args)...));
  }

  // ---- cuda_cudnn.cpp: cuDNN descriptors and convolution plans ------------------------
  bool cudnn_axis_fits(const AxisShape& s) const;
  bool cudnn_lrn_fits(const LrnShape& s) const;
  TensorDescriptor tensor_descriptor(index_t n, index_t c, index_t h, index_t w,
                                     const std::string& what) const;
  TensorDescriptor axis_descriptor(const AxisShape& s) const;
  TensorDescriptor image_descriptor(const LrnShape& s) const;
  void* conv_workspace(std::size_t bytes);
  const ConvPlan& conv_plan(const char* call, const LoweringShape& s, index_t out_channels);
  ConvPlan make_conv_plan(const char* call, const LoweringShape& s, index_t out_channels) const;
  LrnDescriptor lrn_descriptor(const LrnShape& s) const;
#endif

  const int ordinal_;
  std::string description_;
  // Declared first so it is destroyed last: handles bound to it go before it.
  StreamHandle stream_;
  EventHandle staging_done_[2];
  BlasHandle blas_;
#if HYBRIDNN_WITH_CUDNN
  CudnnHandle cudnn_;
  bool cudnn_depthwise_ = false;     // cuDNN runs depthwise convolutions too (the default)
  bool cudnn_find_ = false;          // convolution algorithms measured (HYBRIDNN_CUDNN_ALGO)
  bool cudnn_deterministic_ = true;  // only deterministic ones (HYBRIDNN_CUDNN_DETERMINISTIC)
  bool cudnn_transforms_ = false;    // FFT and Winograd too (HYBRIDNN_CUDNN_TRANSFORMS)
  int compute_major_ = 0;            // the GPU's compute capability, major: TF32 from 8
  std::map<ConvKey, ConvPlan> conv_plans_;
  std::vector<ConvKey> conv_plan_order_;  // insertion order, for eviction
#endif
  PinnedMemory staging_;
  std::size_t staging_bytes_ = 0;
  DeviceMemory reduce_scratch_;
  PinnedMemory reduce_result_;
  DeviceMemory scratch_;
  std::size_t scratch_bytes_ = 0;
  DeviceMemory label_error_;          // cuda::LabelError, written by the loss kernels
  PinnedMemory label_error_host_;     // its copy, read by report_label_error
  bool label_check_pending_ = false;  // a loss call ran since the last report
  bool recording_ = false;            // the stream is being captured (begin_recording)
  bool pending_before_recording_ = false;
  DeviceMemory blas_workspace_;  // cuBLAS's, set once: it allocates none while capturing
  mutable std::mutex allocations_mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;  // start -> bytes of live allocations
};

}  // namespace hn::detail
