// The CUDA driver: device memory, one non-blocking stream, cuBLAS for GEMM, the project's own
// kernels (lib/drivers/cuda/kernels) for everything else, depthwise convolution included, and
// cuDNN for softmax, cross-channel LRN and the other direct convolutions when the build has
// it. Host copies go through reusable pinned staging buffers. Every CUDA, cuBLAS and cuDNN
// failure becomes an hn::Error naming the call.
//
// An invalid softmax_loss label is found on the GPU: the kernels record it in device memory
// (kernels/losses.cuh) and the driver throws hn::Error for it at its next synchronising call
// (synchronize, copy_to_host, copy_from_host, dot / asum / sum), as driver.h allows, so the
// loss calls stay asynchronous. Only the first invalid label since the last report is named.
#include "lib/drivers/cuda/cuda_driver.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#if HYBRIDNN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cuda/kernels/launchers.h"

namespace hn::detail {

namespace {

// Staging grows to the copy size rounded up, up to this cap; larger copies stream through
// two halves so the host memcpy of one chunk overlaps the DMA of the other.
constexpr std::size_t kMinStaging = std::size_t{1} << 20;
constexpr std::size_t kMaxStaging = std::size_t{32} << 20;

std::string cuda_status_text(cudaError_t status) {
  return fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status));
}

// ---- RAII for CUDA objects ------------------------------------------------------------

struct StreamDeleter {
  void operator()(cudaStream_t stream) const noexcept { cudaStreamDestroy(stream); }
};
using StreamHandle = std::unique_ptr<CUstream_st, StreamDeleter>;

struct EventDeleter {
  void operator()(cudaEvent_t event) const noexcept { cudaEventDestroy(event); }
};
using EventHandle = std::unique_ptr<CUevent_st, EventDeleter>;

// ---- cuBLAS, loaded when the first CUDA driver is made ------------------------------
// Linking libcublas makes every process that loads the library pay for it: the loader's
// relocations of libcublasLt alone touch about 215 MB, resident in a CPU-only run that never
// calls them (CaffeNet's `hybridnn time` peaked at 1.09 GB, 0.22 of it this). So the
// handful of cuBLAS functions the driver calls are resolved with dlopen/dlsym on first use.
#define HN_CUBLAS_NAME_(f) #f
#define HN_CUBLAS_NAME(f) HN_CUBLAS_NAME_(f)  // the exported name after cublas_v2.h's macros

struct Cublas {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasGetVersion) get_version = nullptr;
  decltype(&cublasSgemm_64) sgemm = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

const Cublas& cublas() {
  static const Cublas table = [] {
    const std::string soname = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
    void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    // Not on the loader's path: the toolkit this library was built with.
    const std::string built = std::string(HYBRIDNN_CUDA_LIBRARY_DIR) + "/" + soname;
    if (library == nullptr) library = dlopen(built.c_str(), RTLD_NOW | RTLD_LOCAL);
    HN_CHECK(library != nullptr, "cuda driver: cannot load cuBLAS ({}, also tried {}): {}", soname,
             built, dlerror());
    Cublas t;
    const auto resolve = [&](auto& function, const char* name) {
      function =
          reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(library, name));
      HN_CHECK(function != nullptr, "cuda driver: {} has no function {}", soname, name);
    };
    resolve(t.create, HN_CUBLAS_NAME(cublasCreate));
    resolve(t.destroy, HN_CUBLAS_NAME(cublasDestroy));
    resolve(t.set_stream, HN_CUBLAS_NAME(cublasSetStream));
    resolve(t.get_version, HN_CUBLAS_NAME(cublasGetVersion));
    resolve(t.sgemm, HN_CUBLAS_NAME(cublasSgemm_64));
    resolve(t.status_name, HN_CUBLAS_NAME(cublasGetStatusName));
    resolve(t.status_string, HN_CUBLAS_NAME(cublasGetStatusString));
    return t;  // the library stays loaded for the process
  }();
  return table;
}

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

// Batch slices of different sizes are different shapes: room for a few nets' worth.
constexpr std::size_t kMaxConvPlans = 64;
using ConvKey = std::array<index_t, 14>;

// Algorithms that sum the products as a GEMM does. FFT and Winograd transform the operands
// first: their results are 1e-4 to 1e-3 from the CPU's relative to the largest value (an H200
// measured 7e-4 on CIFAR-10 quick's conv1 weight gradient), too far for a split whose slices
// must agree with the CPU driver's to float rounding.
bool sums_directly(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool sums_directly(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool sums_directly(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// Of cuDNN's heuristic ranking, the first algorithm that runs in full FP32 (no TF32), sums
// directly and is deterministic (a run must be reproducible); else the first that is FP32 and
// sums directly; else the first FP32 one; else the first.
template <class Perf>
const Perf& pick_algorithm(const Perf* results, int count) {
  const Perf* direct = nullptr;
  const Perf* fp32 = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.mathType != CUDNN_FMA_MATH) continue;
    if (fp32 == nullptr) fp32 = &r;
    if (!sums_directly(r.algo)) continue;
    if (r.determinism == CUDNN_DETERMINISTIC) return r;
    if (direct == nullptr) direct = &r;
  }
  if (direct != nullptr) return *direct;
  return fp32 != nullptr ? *fp32 : results[0];
}

// cuDNN is used unless the environment says HYBRIDNN_CUDNN=0; depthwise convolutions too,
// unless it says HYBRIDNN_CUDNN=own-depthwise, which gives them our own kernels (read when
// the driver is made). On an H200, cuDNN ran MobileNet v1's depthwise layers (forward and
// backward, batch 32) 5x faster than our kernels: 12.5 ms against 66.
bool cudnn_wanted() {
  const char* value = std::getenv("HYBRIDNN_CUDNN");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

bool cudnn_for_depthwise() {
  const char* value = std::getenv("HYBRIDNN_CUDNN");
  return value == nullptr || std::strcmp(value, "own-depthwise") != 0;
}

bool fits_int(index_t value) {
  return value >= 0 && value <= INT_MAX;
}
#endif

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

std::size_t float_bytes(index_t n) {
  return static_cast<std::size_t>(n) * sizeof(float);
}

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(const Device& device) : Driver(device), ordinal_(device.index) {
    check(cudaSetDevice(ordinal_), "cudaSetDevice", "device {}", ordinal_);
    cudaDeviceProp props{};
    check(cudaGetDeviceProperties(&props, ordinal_), "cudaGetDeviceProperties", "device {}",
          ordinal_);

    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
          "non-blocking");
    stream_.reset(stream);
    for (EventHandle& event : staging_done_) {
      cudaEvent_t created = nullptr;
      check(cudaEventCreateWithFlags(&created, cudaEventDisableTiming), "cudaEventCreate",
            "staging");
      event.reset(created);
    }

    cublasHandle_t blas = nullptr;
    check_blas(cublas().create(&blas), "cublasCreate", "device {}", ordinal_);
    blas_.reset(blas);
    check_blas(cublas().set_stream(blas, stream), "cublasSetStream", "driver stream");
    int blas_version = 0;
    check_blas(cublas().get_version(blas, &blas_version), "cublasGetVersion", "handle");

    void* scratch = nullptr;
    check(cudaMalloc(&scratch, kReduceScratchBytes), "cudaMalloc", "{} bytes of reduction scratch",
          kReduceScratchBytes);
    reduce_scratch_.reset(scratch);
    void* result = nullptr;
    check(cudaHostAlloc(&result, sizeof(float), cudaHostAllocDefault), "cudaHostAlloc",
          "{} bytes for reduction results", sizeof(float));
    reduce_result_.reset(result);
    void* record = nullptr;
    check(cudaMalloc(&record, sizeof(cuda::LabelError)), "cudaMalloc",
          "{} bytes for the label error record", sizeof(cuda::LabelError));
    label_error_.reset(record);
    void* record_copy = nullptr;
    check(cudaHostAlloc(&record_copy, sizeof(cuda::LabelError), cudaHostAllocDefault),
          "cudaHostAlloc", "{} bytes for the label error record", sizeof(cuda::LabelError));
    label_error_host_.reset(record_copy);
    launched(cuda::launch_reset_label_error(stream, label_error()), "label error record reset",
             "device {}", ordinal_);

    description_ = fmt::format("{}: {} (sm_{}{}, {} MiB), cuBLAS {}", name(), props.name,
                               props.major, props.minor, props.totalGlobalMem >> 20, blas_version);
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_wanted()) {
      cudnnHandle_t dnn = nullptr;
      check_dnn(cudnnCreate(&dnn), "cudnnCreate",
                "device {}; set HYBRIDNN_CUDNN=0 to run without cuDNN", ordinal_);
      cudnn_.reset(dnn);
      check_dnn(cudnnSetStream(dnn, stream), "cudnnSetStream", "driver stream");
      cudnn_depthwise_ = cudnn_for_depthwise();
      description_ += fmt::format(
          ", cuDNN {} (softmax, cross-channel LRN, convolution{})", cudnnGetVersion(),
          cudnn_depthwise_ ? ", depthwise too" : " except depthwise: HYBRIDNN_CUDNN=own-depthwise");
    } else {
      description_ += ", cuDNN off (HYBRIDNN_CUDNN=0)";
    }
#endif
  }

  ~CudaDriver() override {
    // Queued work may still use the memory about to be freed; errors cannot be reported here.
    if (cudaSetDevice(ordinal_) == cudaSuccess) cudaStreamSynchronize(stream_.get());
    cudaGetLastError();
  }

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_addressable = false;
    // Without cuDNN only depthwise shapes run natively; the rest would be staged to the host.
#if HYBRIDNN_WITH_CUDNN
    caps.convolution = cudnn_ != nullptr;
#endif
    return caps;
  }

  MemorySpace memory_space() const override {
    return this;
  }
  std::string description() const override {
    return description_;
  }

  // A range inside one of this driver's allocations, or device memory of this GPU that this
  // driver did not allocate (a framework may hand in buffers of its own; both ends must then
  // be device memory here). A range that starts in one of our allocations must end in it.
  bool owns(const void* address, std::size_t bytes) const override {
    const auto start = reinterpret_cast<std::uintptr_t>(address);
    {
      std::lock_guard<std::mutex> lock(allocations_mutex_);
      auto it = allocations_.upper_bound(start);
      if (it != allocations_.begin()) {
        --it;
        const std::uintptr_t offset = start - it->first;
        if (offset < it->second) return bytes <= it->second - offset;
      }
    }
    const auto* last = static_cast<const char*>(address) + (bytes == 0 ? 0 : bytes - 1);
    return is_device_memory(address) && is_device_memory(last);
  }

 protected:
  // ---- memory -------------------------------------------------------------------------

  void* do_allocate(std::size_t bytes) override {
    activate();
    void* address = nullptr;
    check(cudaMalloc(&address, bytes), "allocate: cudaMalloc", "{} bytes", bytes);
    std::lock_guard<std::mutex> lock(allocations_mutex_);
    allocations_.emplace(reinterpret_cast<std::uintptr_t>(address), bytes);
    return address;
  }

  // Frees only what this driver allocated; cudaFree waits for work still using the memory.
  void do_deallocate(void* address) noexcept override {
    {
      std::lock_guard<std::mutex> lock(allocations_mutex_);
      const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(address));
      if (it == allocations_.end()) return;
      allocations_.erase(it);
    }
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != ordinal_) cudaSetDevice(ordinal_);
    cudaFree(address);
    cudaGetLastError();  // a noexcept call cannot report; do not leave the error behind
  }

  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    activate();
    if (is_pinned(host_src, bytes)) {
      check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()),
            "copy_from_host: cudaMemcpyAsync", "{} bytes from pinned memory", bytes);
    } else {
      const std::size_t chunk = reserve_staging(bytes);
      const auto* src = static_cast<const char*>(host_src);
      auto* out = static_cast<char*>(dst);
      for (std::size_t done = 0, k = 0; done < bytes; done += chunk, ++k) {
        const std::size_t part = std::min(chunk, bytes - done);
        const std::size_t half = k % 2;
        // The DMA that last read this half must be over before the half is refilled.
        if (k >= 2) wait_staging(half, "copy_from_host", bytes);
        char* stage = staging_half(half, chunk);
        std::memcpy(stage, src + done, part);
        check(cudaMemcpyAsync(out + done, stage, part, cudaMemcpyHostToDevice, stream()),
              "copy_from_host: cudaMemcpyAsync", "{} of {} bytes at offset {}", part, bytes, done);
        record_staging(half, "copy_from_host", bytes);
      }
    }
    // The source may be reused as soon as we return, and staging is shared: wait.
    sync("copy_from_host", bytes);
    report_label_error();
  }

  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    activate();
    if (is_pinned(host_dst, bytes)) {
      check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()),
            "copy_to_host: cudaMemcpyAsync", "{} bytes to pinned memory", bytes);
      sync("copy_to_host", bytes);
      report_label_error();
      return;
    }
    const std::size_t chunk = reserve_staging(bytes);
    const auto* in = static_cast<const char*>(src);
    auto* out = static_cast<char*>(host_dst);
    const std::size_t chunks = (bytes + chunk - 1) / chunk;
    // Chunk k lands in half k % 2; chunk k - 1 is copied out while chunk k is in flight.
    const auto drain = [&](std::size_t k) {
      const std::size_t done = k * chunk, part = std::min(chunk, bytes - done);
      wait_staging(k % 2, "copy_to_host", bytes);
      std::memcpy(out + done, staging_half(k % 2, chunk), part);
    };
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::size_t done = k * chunk, part = std::min(chunk, bytes - done);
      check(cudaMemcpyAsync(staging_half(k % 2, chunk), in + done, part, cudaMemcpyDeviceToHost,
                            stream()),
            "copy_to_host: cudaMemcpyAsync", "{} of {} bytes at offset {}", part, bytes, done);
      record_staging(k % 2, "copy_to_host", bytes);
      if (k > 0) drain(k - 1);
    }
    drain(chunks - 1);
    report_label_error();
  }

  void do_copy(void* dst, const void* src, std::size_t bytes) override {
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
          "copy: cudaMemcpyAsync", "{} bytes device to device", bytes);
  }

  void do_synchronize() override {
    activate();
    check(cudaStreamSynchronize(stream()), "synchronize: cudaStreamSynchronize", "stream of {}",
          name());
    report_label_error();
  }

  // ---- GEMM ---------------------------------------------------------------------------

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
  void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
               const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
               index_t ldc) override {
    activate();
    if (k == 0) {  // C = beta * C, without asking cuBLAS about an empty product
      launched(cuda::launch_scale_matrix(stream(), m, n, ldc, beta, c), "gemm (k = 0)",
               "m={} n={} ldc={}", m, n, ldc);
      return;
    }
    const cublasOperation_t op_a = trans_a == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b == Transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_blas(
        cublas().sgemm(blas_.get(), op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc),
        "gemm: cublasSgemm_64", "m={} n={} k={} lda={} ldb={} ldc={} trans_a={} trans_b={}", m, n,
        k, lda, ldb, ldc, trans_a == Transpose::yes, trans_b == Transpose::yes);
  }

  // ---- lowering -----------------------------------------------------------------------

  void do_im2col(const LoweringShape& shape, const float* images, float* columns) override {
    activate();
    launched(cuda::launch_im2col(stream(), cuda::lowering_dims(shape), images, columns), "im2col",
             "{}", shape.to_string());
  }

  void do_col2im(const LoweringShape& shape, const float* columns, float* images) override {
    activate();
    launched(cuda::launch_col2im(stream(), cuda::lowering_dims(shape), columns, images), "col2im",
             "{}", shape.to_string());
  }

  void do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) override {
    activate();
    launched(cuda::launch_swap_axes(stream(), d0, d1, inner, src, dst), "swap_axes",
             "d0={} d1={} inner={}", d0, d1, inner);
  }

  void do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
               float* y) override {
    activate();
    launched(cuda::launch_lift(stream(), cuda::lowering_dims(shape), out_channels, products, y),
             "lift", "{} out_channels={}", shape.to_string(), out_channels);
  }

  void do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                        float* products_diff) override {
    activate();
    launched(cuda::launch_lift_backward(stream(), cuda::lowering_dims(shape), out_channels, dy,
                                        products_diff),
             "lift_backward", "{} out_channels={}", shape.to_string(), out_channels);
  }

  // ---- element-wise -------------------------------------------------------------------

  void do_fill(index_t n, float value, float* x) override {
    activate();
    launched(cuda::launch_fill(stream(), n, value, x), "fill", "n={}", n);
  }
  void do_scale(index_t n, float alpha, float* x) override {
    activate();
    launched(cuda::launch_scale(stream(), n, alpha, x), "scale", "n={}", n);
  }
  void do_axpy(index_t n, float alpha, const float* x, float* y) override {
    activate();
    launched(cuda::launch_axpy(stream(), n, alpha, x, y), "axpy", "n={}", n);
  }
  void do_axpby(index_t n, float alpha, const float* x, float beta, float* y) override {
    activate();
    launched(cuda::launch_axpby(stream(), n, alpha, x, beta, y), "axpby", "n={}", n);
  }
  void do_mul(index_t n, const float* a, const float* b, float* y) override {
    activate();
    launched(cuda::launch_mul(stream(), n, a, b, y), "mul", "n={}", n);
  }
  void do_add_scalar(index_t n, float alpha, float* x) override {
    activate();
    launched(cuda::launch_add_scalar(stream(), n, alpha, x), "add_scalar", "n={}", n);
  }
  void do_powx(index_t n, const float* x, float exponent, float* y) override {
    activate();
    launched(cuda::launch_powx(stream(), n, x, exponent, y), "powx", "n={} exponent={}", n,
             exponent);
  }
  void do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                       index_t dst_ld) override {
    activate();
    launched(cuda::launch_copy_strided(stream(), rows, cols, src, src_ld, dst, dst_ld),
             "copy_strided", "rows={} cols={} src_ld={} dst_ld={}", rows, cols, src_ld, dst_ld);
  }
  void do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                         float* y) override {
    activate();
    launched(cuda::launch_scale_channels(stream(), shape, scale, x, y), "scale_channels", "{}",
             shape.to_string());
  }
  // The generic sequence (Driver::do_norm_affine_backward) with its two intermediates in
  // this driver's scratch: the generic ones are allocations, a cudaMalloc and a cudaFree
  // (which waits for the device) each per call. On an H200 ResNet-50's Scale layers went
  // from 42 to 23 ms of an iteration (batch 32, forward and backward).
  void do_norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                               const float* normalised, const float* dx_scale, bool relu,
                               float slope, float* dgamma, float* dbeta, float* dx) override {
    activate();
    const index_t count = shape.count();
    float* dz = scratch(float_bytes(count) * (dgamma != nullptr ? 2 : 1));
    if (relu) {
      do_relu_backward(count, slope, y, dy, dz);
    } else {
      do_copy(dz, dy, float_bytes(count));
    }
    if (dbeta != nullptr) do_bias_backward(shape, dz, 1.0f, dbeta);
    if (dgamma != nullptr) {
      float* product = dz + count;
      do_mul(count, dz, normalised, product);
      do_bias_backward(shape, product, 1.0f, dgamma);
    }
    if (dx != nullptr) do_scale_channels(shape, dx_scale, dz, dx);
  }
  void do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                         std::int32_t* mask) override {
    activate();
    launched(cuda::launch_max_accumulate(stream(), n, x, index, y, mask), "max_accumulate",
             "n={} index={}", n, index);
  }
  void do_max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                     float* dx) override {
    activate();
    launched(cuda::launch_max_select(stream(), n, mask, index, dy, dx), "max_select",
             "n={} index={}", n, index);
  }

  // ---- reductions ---------------------------------------------------------------------

  float do_dot(index_t n, const float* x, const float* y) override {
    return reduce(cuda::ReduceOp::dot, "dot", n, x, y);
  }
  float do_asum(index_t n, const float* x) override {
    return reduce(cuda::ReduceOp::asum, "asum", n, x, x);
  }
  float do_sum(index_t n, const float* x) override {
    return reduce(cuda::ReduceOp::sum, "sum", n, x, x);
  }

  void do_bias_backward(const AxisShape& shape, const float* dy, float beta,
                        float* dbias) override {
    activate();
    launched(cuda::launch_bias_backward(stream(), shape, dy, beta, dbias), "bias_backward", "{}",
             shape.to_string());
  }

  // ---- activations --------------------------------------------------------------------

  void do_bias_forward(const AxisShape& shape, const float* bias, float* y) override {
    activate();
    launched(cuda::launch_bias_forward(stream(), shape, bias, y), "bias_forward", "{}",
             shape.to_string());
  }
  void do_relu_forward(index_t n, float negative_slope, const float* x, float* y) override {
    activate();
    launched(cuda::launch_relu_forward(stream(), n, negative_slope, x, y), "relu_forward", "n={}",
             n);
  }
  void do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                        float* dx) override {
    activate();
    launched(cuda::launch_relu_backward(stream(), n, negative_slope, x, dy, dx), "relu_backward",
             "n={}", n);
  }
  void do_sigmoid_forward(index_t n, const float* x, float* y) override {
    activate();
    launched(cuda::launch_sigmoid_forward(stream(), n, x, y), "sigmoid_forward", "n={}", n);
  }
  void do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) override {
    activate();
    launched(cuda::launch_sigmoid_backward(stream(), n, y, dy, dx), "sigmoid_backward", "n={}", n);
  }
  void do_tanh_forward(index_t n, const float* x, float* y) override {
    activate();
    launched(cuda::launch_tanh_forward(stream(), n, x, y), "tanh_forward", "n={}", n);
  }
  void do_tanh_backward(index_t n, const float* y, const float* dy, float* dx) override {
    activate();
    launched(cuda::launch_tanh_backward(stream(), n, y, dy, dx), "tanh_backward", "n={}", n);
  }

  // ---- pooling ------------------------------------------------------------------------

  void do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                           std::int32_t* mask) override {
    activate();
    launched(cuda::launch_pool_max_forward(stream(), cuda::pool_dims(shape), x, y, mask),
             "pool_max_forward", "{}", shape.to_string());
  }
  void do_pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                            float* dx) override {
    activate();
    launched(cuda::launch_pool_max_backward(stream(), cuda::pool_dims(shape), dy, mask, dx),
             "pool_max_backward", "{}", shape.to_string());
  }
  void do_pool_avg_forward(const PoolShape& shape, const float* x, float* y) override {
    activate();
    launched(cuda::launch_pool_avg_forward(stream(), cuda::pool_dims(shape), x, y),
             "pool_avg_forward", "{}", shape.to_string());
  }
  void do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) override {
    activate();
    launched(cuda::launch_pool_avg_backward(stream(), cuda::pool_dims(shape), dy, dx),
             "pool_avg_backward", "{}", shape.to_string());
  }

  // ---- LRN ----------------------------------------------------------------------------

  void do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) override {
    activate();
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_lrn_fits(shape) &&
        !overlaps(x, float_bytes(shape.count()), y, float_bytes(shape.count()))) {
      // cuDNN computes y; our kernel fills `scale`, which the interface promises backward.
      launched(cuda::launch_lrn_across_scale(stream(), shape, x, scale), "lrn_forward (scale)",
               "{}", shape.to_string());
      const TensorDescriptor desc = image_descriptor(shape);
      const LrnDescriptor lrn = lrn_descriptor(shape);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(cudnnLRNCrossChannelForward(cudnn_.get(), lrn.get(), CUDNN_LRN_CROSS_CHANNEL_DIM1,
                                            &one, desc.get(), x, &zero, desc.get(), y),
                "lrn_forward: cudnnLRNCrossChannelForward", "{}", shape.to_string());
      return;
    }
#endif
    launched(cuda::launch_lrn_forward(stream(), shape, x, y, scale), "lrn_forward", "{}",
             shape.to_string());
  }

  // Each dx element reads dy (and x, y, scale) across a window, so a dx that aliases an
  // input is computed into scratch first (the reference driver allows dx == dy).
  void do_lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                       const float* dy, float* dx) override {
    activate();
    const std::size_t bytes = float_bytes(shape.count());
    const bool aliased = overlaps(dx, bytes, x, bytes) || overlaps(dx, bytes, y, bytes) ||
                         overlaps(dx, bytes, scale, bytes) || overlaps(dx, bytes, dy, bytes);
    float* out = aliased ? scratch(bytes) : dx;
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_lrn_fits(shape)) {
      const TensorDescriptor desc = image_descriptor(shape);
      const LrnDescriptor lrn = lrn_descriptor(shape);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(cudnnLRNCrossChannelBackward(cudnn_.get(), lrn.get(), CUDNN_LRN_CROSS_CHANNEL_DIM1,
                                             &one, desc.get(), y, desc.get(), dy, desc.get(), x,
                                             &zero, desc.get(), out),
                "lrn_backward: cudnnLRNCrossChannelBackward", "{}", shape.to_string());
    } else
#endif
    {
      launched(cuda::launch_lrn_backward(stream(), shape, x, y, scale, dy, out), "lrn_backward",
               "{}", shape.to_string());
    }
    if (aliased) {
      check(cudaMemcpyAsync(dx, out, bytes, cudaMemcpyDeviceToDevice, stream()),
            "lrn_backward: cudaMemcpyAsync", "{} bytes from scratch", bytes);
    }
  }

  // ---- direct convolution: own depthwise kernels, cuDNN, or the generic one ----------

  void do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                       const float* weights, const float* bias, float* y) override {
    if (own_depthwise(shape, out_channels)) {
      activate();
      launched(cuda::launch_depthwise_forward(stream(), cuda::lowering_dims(shape), out_channels, x,
                                              weights, bias, y),
               "conv_forward (depthwise)", "{} out_channels={}", shape.to_string(), out_channels);
      return;
    }
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_) {
      activate();
      const ConvPlan& plan = conv_plan("conv_forward", shape, out_channels);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(cudnnConvolutionForward(cudnn_.get(), &one, plan.x.get(), x, plan.w.get(), weights,
                                        plan.conv.get(), plan.forward_algo,
                                        conv_workspace(plan.forward_bytes), plan.forward_bytes,
                                        &zero, plan.y.get(), y),
                "conv_forward: cudnnConvolutionForward", "{} out_channels={} algo={}",
                shape.to_string(), out_channels, static_cast<int>(plan.forward_algo));
      if (bias == nullptr) return;
      check_dnn(cudnnAddTensor(cudnn_.get(), &one, plan.bias.get(), bias, &one, plan.y.get(), y),
                "conv_forward: cudnnAddTensor", "bias of {} out_channels={}", shape.to_string(),
                out_channels);
      return;
    }
#endif
    Driver::do_conv_forward(shape, out_channels, x, weights, bias, y);
  }

  void do_conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                             const float* dy, float* dx) override {
    if (own_depthwise(shape, out_channels)) {
      activate();
      launched(cuda::launch_depthwise_backward_data(stream(), cuda::lowering_dims(shape),
                                                    out_channels, weights, dy, dx),
               "conv_backward_data (depthwise)", "{} out_channels={}", shape.to_string(),
               out_channels);
      return;
    }
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_) {
      activate();
      const ConvPlan& plan = conv_plan("conv_backward_data", shape, out_channels);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(cudnnConvolutionBackwardData(cudnn_.get(), &one, plan.w.get(), weights,
                                             plan.y.get(), dy, plan.conv.get(), plan.data_algo,
                                             conv_workspace(plan.data_bytes), plan.data_bytes,
                                             &zero, plan.x.get(), dx),
                "conv_backward_data: cudnnConvolutionBackwardData", "{} out_channels={} algo={}",
                shape.to_string(), out_channels, static_cast<int>(plan.data_algo));
      return;
    }
#endif
    Driver::do_conv_backward_data(shape, out_channels, weights, dy, dx);
  }

  // Adds to the gradients, as Caffe accumulates them (beta = 1 for cuDNN and bias_backward).
  void do_conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                                const float* dy, float* dweights, float* dbias) override {
    if (own_depthwise(shape, out_channels)) {
      activate();
      launched(cuda::launch_depthwise_backward_weights(stream(), cuda::lowering_dims(shape),
                                                       out_channels, x, dy, dweights),
               "conv_backward_weights (depthwise)", "{} out_channels={}", shape.to_string(),
               out_channels);
      if (dbias == nullptr) return;
      const AxisShape planes{shape.batch, out_channels, shape.out_h() * shape.out_w()};
      launched(cuda::launch_bias_backward(stream(), planes, dy, 1.0f, dbias),
               "conv_backward_weights (depthwise bias)", "{} out_channels={}", shape.to_string(),
               out_channels);
      return;
    }
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_) {
      activate();
      const ConvPlan& plan = conv_plan("conv_backward_weights", shape, out_channels);
      const float one = 1.0f;
      check_dnn(cudnnConvolutionBackwardFilter(cudnn_.get(), &one, plan.x.get(), x, plan.y.get(),
                                               dy, plan.conv.get(), plan.filter_algo,
                                               conv_workspace(plan.filter_bytes), plan.filter_bytes,
                                               &one, plan.w.get(), dweights),
                "conv_backward_weights: cudnnConvolutionBackwardFilter",
                "{} out_channels={} algo={}", shape.to_string(), out_channels,
                static_cast<int>(plan.filter_algo));
      if (dbias == nullptr) return;
      check_dnn(cudnnConvolutionBackwardBias(cudnn_.get(), &one, plan.y.get(), dy, &one,
                                             plan.bias.get(), dbias),
                "conv_backward_weights: cudnnConvolutionBackwardBias", "{} out_channels={}",
                shape.to_string(), out_channels);
      return;
    }
#endif
    Driver::do_conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
  }

  // ---- softmax ------------------------------------------------------------------------

  void do_softmax_forward(const AxisShape& shape, const float* x, float* y) override {
    activate();
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_axis_fits(shape) && x != y) {
      const TensorDescriptor desc = axis_descriptor(shape);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(
          cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                              &one, desc.get(), x, &zero, desc.get(), y),
          "softmax_forward: cudnnSoftmaxForward", "{}", shape.to_string());
      return;
    }
#endif
    launched(cuda::launch_softmax_forward(stream(), shape, x, y), "softmax_forward", "{}",
             shape.to_string());
  }

  void do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                           float* dx) override {
    activate();
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_axis_fits(shape) && dx != dy && dx != y) {
      const TensorDescriptor desc = axis_descriptor(shape);
      const float one = 1.0f, zero = 0.0f;
      check_dnn(
          cudnnSoftmaxBackward(cudnn_.get(), CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL,
                               &one, desc.get(), y, desc.get(), dy, &zero, desc.get(), dx),
          "softmax_backward: cudnnSoftmaxBackward", "{}", shape.to_string());
      return;
    }
#endif
    launched(cuda::launch_softmax_backward(stream(), shape, y, dy, dx), "softmax_backward", "{}",
             shape.to_string());
  }

  // ---- dropout ------------------------------------------------------------------------

  void do_dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                          const float* x, float* y, float* mask) override {
    activate();
    launched(cuda::launch_dropout_forward(stream(), n, ratio, seed, offset, x, y, mask),
             "dropout_forward", "n={} ratio={}", n, ratio);
  }
  void do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                           float* dx) override {
    activate();
    launched(cuda::launch_dropout_backward(stream(), n, ratio, mask, dy, dx), "dropout_backward",
             "n={} ratio={}", n, ratio);
  }

  // ---- losses -------------------------------------------------------------------------

  void do_softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                               bool has_ignore_label, int ignore_label, float* loss,
                               float* valid) override {
    activate();
    launched(cuda::launch_softmax_loss_forward(stream(), shape, prob, label, has_ignore_label,
                                               ignore_label, loss, valid, label_error()),
             "softmax_loss_forward", "{}", shape.to_string());
    label_check_pending_ = true;
  }
  void do_softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                                bool has_ignore_label, int ignore_label, float scale,
                                float* dx) override {
    activate();
    launched(cuda::launch_softmax_loss_backward(stream(), shape, prob, label, has_ignore_label,
                                                ignore_label, scale, dx, label_error()),
             "softmax_loss_backward", "{}", shape.to_string());
    label_check_pending_ = true;
  }
  void do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid) override {
    activate();
    launched(cuda::launch_sigmoid_cross_entropy_forward(stream(), n, x, target, has_ignore_label,
                                                        ignore_label, loss, valid),
             "sigmoid_cross_entropy_forward", "n={}", n);
  }
  void do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx) override {
    activate();
    launched(cuda::launch_sigmoid_cross_entropy_backward(stream(), n, x, target, has_ignore_label,
                                                         ignore_label, scale, dx),
             "sigmoid_cross_entropy_backward", "n={}", n);
  }

  // ---- solver -------------------------------------------------------------------------

  void do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                        float* history, float* history2) override {
    activate();
    launched(cuda::launch_solver_update(stream(), u, n, param, grad, history, history2),
             "solver_update", "{} n={}", update_type_name(u.type), n);
  }

 private:
  static constexpr std::size_t kReduceScratchBytes =
      cuda::kReduceMaxBlocks * sizeof(double) + sizeof(double);

  cudaStream_t stream() const {
    return stream_.get();
  }

  // Depthwise shapes run kernels/depthwise.cuh without cuDNN or with
  // HYBRIDNN_CUDNN=own-depthwise.
  bool own_depthwise(const LoweringShape& shape, index_t out_channels) const {
#if HYBRIDNN_WITH_CUDNN
    if (cudnn_ && cudnn_depthwise_) return false;
#endif
    return cuda::is_depthwise(shape, out_channels);
  }

  // A thread may drive several GPUs: make this driver's GPU current before any call.
  void activate() const {
    int current = -1;
    check(cudaGetDevice(&current), "cudaGetDevice", "activating device {}", ordinal_);
    if (current != ordinal_) check(cudaSetDevice(ordinal_), "cudaSetDevice", "device {}", ordinal_);
  }

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

  void sync(const char* call, std::size_t bytes) {
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", "{} of {} bytes", call, bytes);
  }

  bool is_device_memory(const void* address) const {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) &&
           attributes.device == ordinal_;
  }

  // Page-locked host memory (cudaHostAlloc / cudaHostRegister) needs no staging.
  static bool is_pinned(const void* host, std::size_t bytes) {
    const auto pinned = [](const void* address) {
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      return attributes.type == cudaMemoryTypeHost;
    };
    return pinned(host) && pinned(static_cast<const char*>(host) + bytes - 1);
  }

  // Makes the pinned staging buffer ready for a copy of `bytes`; returns the chunk size
  // (half the buffer).
  std::size_t reserve_staging(std::size_t bytes) {
    if (staging_bytes_ < kMaxStaging && staging_bytes_ < 2 * bytes) {
      std::size_t want = kMinStaging;
      while (want < 2 * bytes && want < kMaxStaging)
        want *= 2;
      staging_.reset();
      staging_bytes_ = 0;
      void* memory = nullptr;
      check(cudaHostAlloc(&memory, want, cudaHostAllocDefault), "cudaHostAlloc",
            "{} bytes of pinned staging for a {}-byte copy", want, bytes);
      staging_.reset(memory);
      staging_bytes_ = want;
    }
    return staging_bytes_ / 2;
  }

  char* staging_half(std::size_t half, std::size_t chunk) const {
    return static_cast<char*>(staging_.get()) + half * chunk;
  }

  void record_staging(std::size_t half, const char* call, std::size_t bytes) {
    check(cudaEventRecord(staging_done_[half].get(), stream()), "cudaEventRecord", "{} of {} bytes",
          call, bytes);
  }

  void wait_staging(std::size_t half, const char* call, std::size_t bytes) {
    check(cudaEventSynchronize(staging_done_[half].get()), "cudaEventSynchronize", "{} of {} bytes",
          call, bytes);
  }

  // Device scratch for calls whose output aliases an input or that need an intermediate
  // (one call at a time); grown on demand.
  float* scratch(std::size_t bytes) {
    if (scratch_bytes_ < bytes) {
      scratch_.reset();  // cudaFree waits for kernels still using the old scratch
      scratch_bytes_ = 0;
      void* memory = nullptr;
      check(cudaMalloc(&memory, bytes), "cudaMalloc", "{} bytes of scratch", bytes);
      scratch_.reset(memory);
      scratch_bytes_ = bytes;
    }
    return static_cast<float*>(scratch_.get());
  }

  cuda::LabelError* label_error() const {
    return static_cast<cuda::LabelError*>(label_error_.get());
  }

  // Throws the first invalid softmax_loss label recorded on the GPU since the last report
  // (kernels/losses.cuh), then clears the record. Called after the stream has drained, by
  // every synchronising call; costs one small copy, only when a loss call ran since.
  void report_label_error() {
    if (!label_check_pending_) return;
    label_check_pending_ = false;
    auto* record = static_cast<cuda::LabelError*>(label_error_host_.get());
    check(cudaMemcpyAsync(record, label_error(), sizeof(cuda::LabelError), cudaMemcpyDeviceToHost,
                          stream()),
          "cudaMemcpyAsync", "{} bytes of the label error record", sizeof(cuda::LabelError));
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", "label error record");
    if (record->position == cuda::kNoLabelError) return;
    const cuda::LabelError found = *record;
    launched(cuda::launch_reset_label_error(stream(), label_error()), "label error record reset",
             "device {}", ordinal_);
    AxisShape shape;
    shape.outer = found.outer;
    shape.channels = found.channels;
    shape.inner = found.inner;
    const auto position = static_cast<index_t>(found.position);
    fail(
        "{}: label {} at position (outer {}, inner {}) is outside [0, {}) ({}); found on {}, "
        "reported at the next synchronising call",
        found.call == static_cast<std::int32_t>(cuda::LossCall::softmax_loss_forward)
            ? "softmax_loss_forward"
            : "softmax_loss_backward",
        found.label, position / shape.inner, position % shape.inner, shape.channels,
        shape.to_string(), name());
  }

  float reduce(cuda::ReduceOp op, const char* call, index_t n, const float* x, const float* y) {
    activate();
    auto* partials = static_cast<double*>(reduce_scratch_.get());
    auto* result = reinterpret_cast<float*>(partials + cuda::kReduceMaxBlocks);
    launched(cuda::launch_reduce(stream(), op, n, x, y, partials, result), call, "n={}", n);
    check(cudaMemcpyAsync(reduce_result_.get(), result, sizeof(float), cudaMemcpyDeviceToHost,
                          stream()),
          "cudaMemcpyAsync", "{} result, n={}", call, n);
    check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", "{}, n={}", call, n);
    const float value = *static_cast<const float*>(reduce_result_.get());
    report_label_error();
    return value;
  }

#if HYBRIDNN_WITH_CUDNN
  template <class... Args>
  void check_dnn(cudnnStatus_t status, const char* call, fmt::format_string<Args...> details,
                 Args&&... args) const {
    if (status == CUDNN_STATUS_SUCCESS) return;
    fail("{}: {} failed: {} ({})", name(), call, cudnnGetErrorString(status),
         fmt::format(details, std::forward<Args>(args)...));
  }

  // cuDNN takes int dimensions, and its LRN window at most CUDNN_LRN_MAX_N wide.
  bool cudnn_axis_fits(const AxisShape& s) const {
    return cudnn_ && fits_int(s.outer) && fits_int(s.channels) && fits_int(s.inner) &&
           fits_int(s.count());
  }

  bool cudnn_lrn_fits(const LrnShape& s) const {
    return cudnn_ && s.region == LrnRegion::across_channels && s.size >= CUDNN_LRN_MIN_N &&
           s.size <= CUDNN_LRN_MAX_N && s.k >= CUDNN_LRN_MIN_K && s.beta >= CUDNN_LRN_MIN_BETA &&
           fits_int(s.batch) && fits_int(s.channels) && fits_int(s.height) && fits_int(s.width) &&
           fits_int(s.count());
  }

  TensorDescriptor tensor_descriptor(index_t n, index_t c, index_t h, index_t w,
                                     const std::string& what) const {
    cudnnTensorDescriptor_t raw = nullptr;
    check_dnn(cudnnCreateTensorDescriptor(&raw), "cudnnCreateTensorDescriptor", "{}", what);
    TensorDescriptor desc(raw);
    check_dnn(
        cudnnSetTensor4dDescriptor(raw, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(n),
                                   static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)),
        "cudnnSetTensor4dDescriptor", "{}", what);
    return desc;
  }

  TensorDescriptor axis_descriptor(const AxisShape& s) const {
    return tensor_descriptor(s.outer, s.channels, s.inner, 1, s.to_string());
  }

  TensorDescriptor image_descriptor(const LrnShape& s) const {
    return tensor_descriptor(s.batch, s.channels, s.height, s.width, s.to_string());
  }

  void* conv_workspace(std::size_t bytes) {
    return bytes == 0 ? nullptr : scratch(bytes);
  }

  const ConvPlan& conv_plan(const char* call, const LoweringShape& s, index_t out_channels) {
    const ConvKey key = {s.batch,      s.channels,   s.height, s.width,     s.kernel_h,
                         s.kernel_w,   s.pad_h,      s.pad_w,  s.stride_h,  s.stride_w,
                         s.dilation_h, s.dilation_w, s.groups, out_channels};
    const auto found = conv_plans_.find(key);
    if (found != conv_plans_.end()) return found->second;
    ConvPlan plan = make_conv_plan(call, s, out_channels);
    if (conv_plans_.size() >= kMaxConvPlans) {
      conv_plans_.erase(conv_plan_order_.front());
      conv_plan_order_.erase(conv_plan_order_.begin());
    }
    conv_plan_order_.push_back(key);
    return conv_plans_.emplace(key, std::move(plan)).first->second;
  }

  ConvPlan make_conv_plan(const char* call, const LoweringShape& s, index_t out_channels) const {
    const std::string what =
        fmt::format("{}: {} out_channels={}", call, s.to_string(), out_channels);
    const index_t out_h = s.out_h(), out_w = s.out_w();
    HN_CHECK(cudnn_ != nullptr, "{}: cuDNN is off (HYBRIDNN_CUDNN=0)", what);
    HN_CHECK(fits_int(s.image_count()) && fits_int(s.batch * out_channels * out_h * out_w) &&
                 fits_int(out_channels * (s.channels / s.groups) * s.kernel_h * s.kernel_w) &&
                 fits_int(s.pad_h) && fits_int(s.pad_w) && fits_int(s.stride_h) &&
                 fits_int(s.stride_w) && fits_int(s.dilation_h) && fits_int(s.dilation_w),
             "{}: sizes beyond cuDNN's int range", what);
    const auto i = [](index_t v) { return static_cast<int>(v); };
    ConvPlan plan;
    plan.x = tensor_descriptor(s.batch, s.channels, s.height, s.width, what);
    plan.y = tensor_descriptor(s.batch, out_channels, out_h, out_w, what);
    plan.bias = tensor_descriptor(1, out_channels, 1, 1, what);

    cudnnFilterDescriptor_t filter = nullptr;
    check_dnn(cudnnCreateFilterDescriptor(&filter), "cudnnCreateFilterDescriptor", "{}", what);
    plan.w.reset(filter);
    check_dnn(
        cudnnSetFilter4dDescriptor(filter, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, i(out_channels),
                                   i(s.channels / s.groups), i(s.kernel_h), i(s.kernel_w)),
        "cudnnSetFilter4dDescriptor", "{}", what);

    cudnnConvolutionDescriptor_t conv = nullptr;
    check_dnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor", "{}",
              what);
    plan.conv.reset(conv);
    // Caffe's layers compute a cross-correlation, in FP32 (FMA math: no TF32 tensor cores).
    check_dnn(cudnnSetConvolution2dDescriptor(conv, i(s.pad_h), i(s.pad_w), i(s.stride_h),
                                              i(s.stride_w), i(s.dilation_h), i(s.dilation_w),
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "cudnnSetConvolution2dDescriptor", "{}", what);
    check_dnn(cudnnSetConvolutionGroupCount(conv, i(s.groups)), "cudnnSetConvolutionGroupCount",
              "{}", what);
    check_dnn(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType",
              "{}", what);
    int dims[4] = {0, 0, 0, 0};
    check_dnn(cudnnGetConvolutionNdForwardOutputDim(conv, plan.x.get(), plan.w.get(), 4, dims),
              "cudnnGetConvolutionNdForwardOutputDim", "{}", what);
    HN_CHECK(dims[0] == i(s.batch) && dims[1] == i(out_channels) && dims[2] == i(out_h) &&
                 dims[3] == i(out_w),
             "{}: cuDNN's output {}x{}x{}x{} differs from {}x{}x{}x{}", what, dims[0], dims[1],
             dims[2], dims[3], s.batch, out_channels, out_h, out_w);

    cudnnHandle_t handle = cudnn_.get();
    int count = 0;
    {
      cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(
                    handle, plan.x.get(), plan.w.get(), conv, plan.y.get(),
                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionForwardAlgorithm_v7", "{}", what);
      HN_CHECK(count > 0, "{}: cuDNN offers no forward algorithm", what);
      const auto& best = pick_algorithm(results, count);
      plan.forward_algo = best.algo;
      check_dnn(
          cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x.get(), plan.w.get(), conv,
                                                  plan.y.get(), best.algo, &plan.forward_bytes),
          "cudnnGetConvolutionForwardWorkspaceSize", "{}", what);
    }
    {
      cudnnConvolutionBwdDataAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    handle, plan.w.get(), plan.y.get(), conv, plan.x.get(),
                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7", "{}", what);
      HN_CHECK(count > 0, "{}: cuDNN offers no backward data algorithm", what);
      const auto& best = pick_algorithm(results, count);
      plan.data_algo = best.algo;
      check_dnn(
          cudnnGetConvolutionBackwardDataWorkspaceSize(handle, plan.w.get(), plan.y.get(), conv,
                                                       plan.x.get(), best.algo, &plan.data_bytes),
          "cudnnGetConvolutionBackwardDataWorkspaceSize", "{}", what);
    }
    {
      cudnnConvolutionBwdFilterAlgoPerf_t results[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      check_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    handle, plan.x.get(), plan.y.get(), conv, plan.w.get(),
                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, results),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7", "{}", what);
      HN_CHECK(count > 0, "{}: cuDNN offers no backward filter algorithm", what);
      const auto& best = pick_algorithm(results, count);
      plan.filter_algo = best.algo;
      check_dnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, plan.x.get(), plan.y.get(),
                                                               conv, plan.w.get(), best.algo,
                                                               &plan.filter_bytes),
                "cudnnGetConvolutionBackwardFilterWorkspaceSize", "{}", what);
    }
    return plan;
  }

  LrnDescriptor lrn_descriptor(const LrnShape& s) const {
    cudnnLRNDescriptor_t raw = nullptr;
    check_dnn(cudnnCreateLRNDescriptor(&raw), "cudnnCreateLRNDescriptor", "{}", s.to_string());
    LrnDescriptor desc(raw);
    // cuDNN divides alpha by the window width itself, as Caffe does.
    check_dnn(cudnnSetLRNDescriptor(raw, static_cast<unsigned>(s.size), s.alpha, s.beta, s.k),
              "cudnnSetLRNDescriptor", "{}", s.to_string());
    return desc;
  }
#endif

  const int ordinal_;
  std::string description_;
  // Declared first so it is destroyed last: handles bound to it go before it.
  StreamHandle stream_;
  EventHandle staging_done_[2];
  BlasHandle blas_;
#if HYBRIDNN_WITH_CUDNN
  CudnnHandle cudnn_;
  bool cudnn_depthwise_ = false;  // cuDNN runs depthwise convolutions too (the default)
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
  mutable std::mutex allocations_mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;  // start -> bytes of live allocations
};

// cudaGetDeviceCount's status, cleared so later runtime calls do not see it.
cudaError_t query_device_count(int* count) {
  *count = 0;
  const cudaError_t status = cudaGetDeviceCount(count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *count = 0;
  }
  return status;
}

}  // namespace

std::unique_ptr<Driver> make_cuda_driver(const Device& device) {
  int count = 0;
  const cudaError_t status = query_device_count(&count);
  HN_CHECK(status == cudaSuccess, "{}: no CUDA device available: cudaGetDeviceCount failed: {}",
           device.name(), cuda_status_text(status));
  HN_CHECK(device.index < count, "{}: no such GPU: the CUDA runtime reports {} device(s)",
           device.name(), count);
  return std::make_unique<CudaDriver>(device);
}

int cuda_device_count() {
  int count = 0;
  query_device_count(&count);
  return count;
}

}  // namespace hn::detail
