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
//
// The class is declared in cuda_internal.h. This file holds its construction, memory,
// copies, synchronisation and error reporting; cuda_kernels.cpp the calls that run cuBLAS or
// our kernels, cuda_cudnn.cpp those cuDNN can run.
#include "lib/drivers/cuda/cuda_driver.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#if HYBRIDNN_WITH_CUDNN
#include <cudnn.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cuda/cuda_internal.h"
#include "lib/drivers/cuda/kernels/launchers.h"

namespace hn::detail {

namespace {

// Staging grows to the copy size rounded up, up to this cap; larger copies stream through
// two halves so the host memcpy of one chunk overlaps the DMA of the other.
constexpr std::size_t kMinStaging = std::size_t{1} << 20;
constexpr std::size_t kMaxStaging = std::size_t{32} << 20;

#if HYBRIDNN_WITH_CUDNN
// cuDNN is used unless the environment says HYBRIDNN_CUDNN=0; depthwise convolutions too,
// unless it says HYBRIDNN_CUDNN=own-depthwise, which gives them our own kernels (read when
// the driver is made). On an H200, cuDNN ran MobileNet v1's depthwise layers (forward and
// backward, batch 32) 5x faster than our kernels: 12.5 ms against 66.
bool cudnn_wanted() {
  const char* value = std::getenv("HYBRIDNN_CUDNN");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// cuDNN's algorithms for a convolution shape are those its heuristics rank first, unless
// HYBRIDNN_CUDNN_ALGO=find measures them once (cudnnFind*): on an H200 the zoo's FP32
// iterations took the same time either way (ResNet-50 batch 32: 53.2 ms measured, 52.5 by
// the heuristics), and measuring costs every new shape a search.
bool cudnn_measures() {
  const char* value = std::getenv("HYBRIDNN_CUDNN_ALGO");
  return value != nullptr && std::strcmp(value, "find") == 0;
}

// Only deterministic convolution algorithms, unless HYBRIDNN_CUDNN_DETERMINISTIC=0 allows
// those that add with atomics (PyTorch's default: faster backward passes, results that
// differ between runs in the last bits).
bool cudnn_deterministic() {
  const char* value = std::getenv("HYBRIDNN_CUDNN_DETERMINISTIC");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// FFT and Winograd convolutions too, where HYBRIDNN_CUDNN_TRANSFORMS=1: on an H200 they
// halved ResNet-50's 3x3 convolutions (measured), but round further from the CPU's results
// (1e-4 to 1e-3 of the largest value) than a split's slices may, so they are asked for.
bool cudnn_transforms() {
  const char* value = std::getenv("HYBRIDNN_CUDNN_TRANSFORMS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool cudnn_for_depthwise() {
  const char* value = std::getenv("HYBRIDNN_CUDNN");
  return value == nullptr || std::strcmp(value, "own-depthwise") != 0;
}
#endif

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

std::string cuda_status_text(cudaError_t status) {
  return fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status));
}

// ---- cuBLAS, loaded when the first CUDA driver is made ------------------------------
// Linking libcublas makes every process that loads the library pay for it: the loader's
// relocations of libcublasLt alone touch about 215 MB, resident in a CPU-only run that never
// calls them (CaffeNet's `hybridnn time` peaked at 1.09 GB, 0.22 of it this). So the
// handful of cuBLAS functions the driver calls are resolved with dlopen/dlsym on first use.
#define HN_CUBLAS_NAME_(f) #f
#define HN_CUBLAS_NAME(f) HN_CUBLAS_NAME_(f)  // the exported name after cublas_v2.h's macros

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
    resolve(t.set_workspace, HN_CUBLAS_NAME(cublasSetWorkspace));
    resolve(t.get_version, HN_CUBLAS_NAME(cublasGetVersion));
    resolve(t.sgemm, HN_CUBLAS_NAME(cublasSgemm_64));
    resolve(t.gemm_ex, HN_CUBLAS_NAME(cublasGemmEx_64));
    resolve(t.status_name, HN_CUBLAS_NAME(cublasGetStatusName));
    resolve(t.status_string, HN_CUBLAS_NAME(cublasGetStatusString));
    return t;  // the library stays loaded for the process
  }();
  return table;
}

CudaDriver::CudaDriver(const Device& device) : Driver(device), ordinal_(device.index) {
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
    check(cudaEventCreateWithFlags(&created, cudaEventDisableTiming), "cudaEventCreate", "staging");
    event.reset(created);
  }

  cublasHandle_t blas = nullptr;
  check_blas(cublas().create(&blas), "cublasCreate", "device {}", ordinal_);
  blas_.reset(blas);
  check_blas(cublas().set_stream(blas, stream), "cublasSetStream", "driver stream");
  // cuBLAS's workspace, given once (the size it takes by default on Hopper): left to itself
  // it may allocate one while a graph is being captured, which capture forbids.
  constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;
  void* blas_workspace = nullptr;
  check(cudaMalloc(&blas_workspace, kBlasWorkspaceBytes), "cudaMalloc",
        "{} bytes of cuBLAS workspace", kBlasWorkspaceBytes);
  blas_workspace_.reset(blas_workspace);
  check_blas(cublas().set_workspace(blas, blas_workspace, kBlasWorkspaceBytes),
             "cublasSetWorkspace", "{} bytes", kBlasWorkspaceBytes);
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

  compute_major_ = props.major;
  description_ = fmt::format("{}: {} (sm_{}{}, {} MiB), cuBLAS {}", name(), props.name, props.major,
                             props.minor, props.totalGlobalMem >> 20, blas_version);
#if HYBRIDNN_WITH_CUDNN
  if (cudnn_wanted()) {
    cudnnHandle_t dnn = nullptr;
    check_dnn(cudnnCreate(&dnn), "cudnnCreate",
              "device {}; set HYBRIDNN_CUDNN=0 to run without cuDNN", ordinal_);
    cudnn_.reset(dnn);
    check_dnn(cudnnSetStream(dnn, stream), "cudnnSetStream", "driver stream");
    cudnn_depthwise_ = cudnn_for_depthwise();
    cudnn_find_ = cudnn_measures();
    cudnn_deterministic_ = cudnn_deterministic();
    cudnn_transforms_ = cudnn_transforms();
    description_ += fmt::format(
        ", cuDNN {} (softmax, cross-channel LRN, convolution{}; {} algorithms{}{})",
        cudnnGetVersion(),
        cudnn_depthwise_ ? ", depthwise too" : " except depthwise: HYBRIDNN_CUDNN=own-depthwise",
        cudnn_find_ ? "measured" : "heuristics'",
        cudnn_deterministic_ ? "" : ", non-deterministic allowed",
        cudnn_transforms_ ? ", FFT and Winograd allowed" : "");
  } else {
    description_ += ", cuDNN off (HYBRIDNN_CUDNN=0)";
  }
#endif
}

CudaDriver::~CudaDriver() {
  // Queued work may still use the memory about to be freed; errors cannot be reported here.
  if (cudaSetDevice(ordinal_) == cudaSuccess) cudaStreamSynchronize(stream_.get());
  cudaGetLastError();
}

Capabilities CudaDriver::capabilities() const {
  Capabilities caps;
  caps.host_addressable = false;
  // Without cuDNN only depthwise shapes run natively; the rest would be staged to the host.
#if HYBRIDNN_WITH_CUDNN
  caps.convolution = cudnn_ != nullptr;
#endif
  return caps;
}

// A range inside one of this driver's allocations, or device memory of this GPU that this
// driver did not allocate (a framework may hand in buffers of its own; both ends must then
// be device memory here). A range that starts in one of our allocations must end in it.
bool CudaDriver::owns(const void* address, std::size_t bytes) const {
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

// ---- memory -------------------------------------------------------------------------

void* CudaDriver::do_allocate(std::size_t bytes) {
  activate();
  void* address = nullptr;
  check(cudaMalloc(&address, bytes), "allocate: cudaMalloc", "{} bytes", bytes);
  std::lock_guard<std::mutex> lock(allocations_mutex_);
  allocations_.emplace(reinterpret_cast<std::uintptr_t>(address), bytes);
  return address;
}

// Frees only what this driver allocated; cudaFree waits for work still using the memory.
void CudaDriver::do_deallocate(void* address) noexcept {
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

void CudaDriver::do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
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

void CudaDriver::do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
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

void CudaDriver::do_copy(void* dst, const void* src, std::size_t bytes) {
  activate();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
        "copy: cudaMemcpyAsync", "{} bytes device to device", bytes);
}

void CudaDriver::do_synchronize() {
  activate();
  check(cudaStreamSynchronize(stream()), "synchronize: cudaStreamSynchronize", "stream of {}",
        name());
  report_label_error();
}

// ---- marks: CUDA events with timing ------------------------------------------------

class CudaMarks final : public Driver::Marks {
 public:
  CudaMarks(CudaDriver& driver, int count) : driver_(driver), events_(count) {
    driver_.activate();
    for (EventHandle& event : events_) {
      cudaEvent_t created = nullptr;
      driver_.check(cudaEventCreate(&created), "cudaEventCreate", "{} marks", count);
      event.reset(created);
    }
  }
  int count() const override { return static_cast<int>(events_.size()); }
  void record(int mark) override {
    HN_CHECK(mark >= 0 && mark < count(), "{}: mark {} of {}", driver_.name(), mark, count());
    driver_.activate();
    driver_.check(cudaEventRecord(events_[mark].get(), driver_.stream()), "cudaEventRecord",
                  "mark {}", mark);
  }
  double elapsed_ms(int from, int to) const override {
    HN_CHECK(from >= 0 && from < count() && to >= 0 && to < count(), "{}: marks {} and {} of {}",
             driver_.name(), from, to, count());
    float ms = 0.0f;
    driver_.check(cudaEventElapsedTime(&ms, events_[from].get(), events_[to].get()),
                  "cudaEventElapsedTime", "marks {} and {}", from, to);
    return ms;
  }

 private:
  CudaDriver& driver_;
  std::vector<EventHandle> events_;
};

// ---- recordings: CUDA graphs of the stream's work ---------------------------------

class CudaRecording final : public Driver::Recording {
 public:
  CudaRecording(CudaDriver& driver, GraphExecHandle graph, bool checks_labels)
      : driver_(driver), graph_(std::move(graph)), checks_labels_(checks_labels) {}
  void replay() override {
    HN_CHECK(!driver_.recording_, "{}: a recording replayed while recording another",
             driver_.name());
    driver_.activate();
    driver_.check(cudaGraphLaunch(graph_.get(), driver_.stream()), "cudaGraphLaunch",
                  "a recorded iteration");
    // Its loss calls' label checks are reported at the next synchronising call, as theirs.
    driver_.label_check_pending_ = driver_.label_check_pending_ || checks_labels_;
  }

 private:
  CudaDriver& driver_;
  GraphExecHandle graph_;
  bool checks_labels_;
};

// Thread-local capture: a call of this thread that capture cannot hold (a wait for the
// stream, an allocation) fails instead of running, and the capture with it.
bool CudaDriver::begin_recording(std::string& why) {
  HN_CHECK(!recording_, "{}: begin_recording while recording", name());
  activate();
  const cudaError_t status = cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    cudaGetLastError();
    why = fmt::format("{}: cudaStreamBeginCapture failed: {}", name(), cuda_status_text(status));
    return false;
  }
  recording_ = true;
  pending_before_recording_ = label_check_pending_;
  label_check_pending_ = false;
  return true;
}

std::unique_ptr<Driver::Recording> CudaDriver::end_recording(std::string& why) {
  HN_CHECK(recording_, "{}: end_recording without begin_recording", name());
  activate();
  recording_ = false;
  const bool checks_labels = label_check_pending_;
  label_check_pending_ = pending_before_recording_;  // nothing recorded has run
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(stream(), &graph);
  if (status != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    why = fmt::format("{}: the capture failed: {}{}", name(), cuda_status_text(status),
                      why.empty() ? "" : fmt::format(" (after: {})", why));
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    why = fmt::format("{}: cudaGraphInstantiate failed: {}", name(), cuda_status_text(status));
    return nullptr;
  }
  return std::make_unique<CudaRecording>(*this, GraphExecHandle(exec), checks_labels);
}

// TF32 and BF16 tensor cores came with compute capability 8 (Ampere); older GPUs compute
// those modes in FP32. cuDNN has no BF16 convolution of FP32 data: BF16 runs them in TF32.
std::string CudaDriver::math_note(MathMode mode) const {
  if (mode == MathMode::fp32) return {};
  if (compute_major_ < 8) {
    return fmt::format("{} computes FP32 for {} math: sm_{}x has no TF32 or BF16 tensor cores",
                       name(), math_mode_name(mode), compute_major_);
  }
  if (mode == MathMode::bf16) {
    return fmt::format(
        "{}: BF16 math for GEMMs; convolutions in TF32 (cuDNN has no BF16 "
        "convolution of FP32 data)",
        name());
  }
  return {};
}

std::unique_ptr<Driver::Marks> CudaDriver::make_marks(int count) {
  HN_CHECK(count >= 0, "{}: {} marks", name(), count);
  return std::make_unique<CudaMarks>(*this, count);
}

// A thread may drive several GPUs: make this driver's GPU current before any call.
void CudaDriver::activate() const {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice", "activating device {}", ordinal_);
  if (current != ordinal_) check(cudaSetDevice(ordinal_), "cudaSetDevice", "device {}", ordinal_);
}

void CudaDriver::sync(const char* call, std::size_t bytes) {
  count_wait();
  check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", "{} of {} bytes", call, bytes);
}

bool CudaDriver::is_device_memory(const void* address) const {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, address) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) &&
         attributes.device == ordinal_;
}

// Page-locked host memory (cudaHostAlloc / cudaHostRegister) needs no staging.
bool CudaDriver::is_pinned(const void* host, std::size_t bytes) {
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
std::size_t CudaDriver::reserve_staging(std::size_t bytes) {
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

char* CudaDriver::staging_half(std::size_t half, std::size_t chunk) const {
  return static_cast<char*>(staging_.get()) + half * chunk;
}

void CudaDriver::record_staging(std::size_t half, const char* call, std::size_t bytes) {
  check(cudaEventRecord(staging_done_[half].get(), stream()), "cudaEventRecord", "{} of {} bytes",
        call, bytes);
}

void CudaDriver::wait_staging(std::size_t half, const char* call, std::size_t bytes) {
  count_wait();
  check(cudaEventSynchronize(staging_done_[half].get()), "cudaEventSynchronize", "{} of {} bytes",
        call, bytes);
}

// Device scratch for calls whose output aliases an input or that need an intermediate
// (one call at a time); grown on demand.
float* CudaDriver::scratch(std::size_t bytes) {
  if (scratch_bytes_ < bytes) {
    scratch_.reset();  // cudaFree waits for kernels still using the old scratch
    scratch_bytes_ = 0;
    void* memory = nullptr;
    count_allocation();
    check(cudaMalloc(&memory, bytes), "cudaMalloc", "{} bytes of scratch", bytes);
    scratch_.reset(memory);
    scratch_bytes_ = bytes;
  }
  return static_cast<float*>(scratch_.get());
}

// Throws the first invalid softmax_loss label recorded on the GPU since the last report
// (kernels/losses.cuh), then clears the record. Called after the stream has drained, by
// every synchronising call; costs one small copy, only when a loss call ran since.
void CudaDriver::report_label_error() {
  if (!label_check_pending_) return;
  label_check_pending_ = false;
  auto* record = static_cast<cuda::LabelError*>(label_error_host_.get());
  check(cudaMemcpyAsync(record, label_error(), sizeof(cuda::LabelError), cudaMemcpyDeviceToHost,
                        stream()),
        "cudaMemcpyAsync", "{} bytes of the label error record", sizeof(cuda::LabelError));
  count_wait();
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
