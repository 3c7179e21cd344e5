// The core-only test driver: straightforward loops, independent of the reference kernels.
#include "tests/core_driver.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "hybridnn/error.h"
#include "lib/core/driver_registry.h"

namespace hn::test {

CoreDriver::CoreDriver(const Device& device, bool separate_memory)
    : Driver(device), separate_memory_(separate_memory) {}

CoreDriver::~CoreDriver() {
  for (const auto& [start, bytes] : allocations_) {
    static_cast<void>(bytes);
    std::free(reinterpret_cast<void*>(start));
  }
}

Capabilities CoreDriver::capabilities() const {
  Capabilities caps;
  caps.host_addressable = !separate_memory_;
  return caps;
}

MemorySpace CoreDriver::memory_space() const {
  return separate_memory_ ? static_cast<MemorySpace>(this) : host_space();
}

std::string CoreDriver::description() const {
  return name() + ": the core calls only (tests), " +
         (separate_memory_ ? "separate memory" : "host memory");
}

bool CoreDriver::owns(const void* address, std::size_t bytes) const {
  if (!separate_memory_) return true;
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.upper_bound(start);
  if (it == allocations_.begin()) return false;
  --it;
  const std::uintptr_t offset = start - it->first;
  return offset <= it->second && bytes <= it->second - offset;
}

void* CoreDriver::do_allocate(std::size_t bytes) {
  void* memory = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (memory == nullptr) throw Error("core driver: out of memory");
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_.emplace(reinterpret_cast<std::uintptr_t>(memory), bytes);
  return memory;
}

void CoreDriver::do_deallocate(void* address) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (allocations_.erase(reinterpret_cast<std::uintptr_t>(address)) > 0) std::free(address);
}

void CoreDriver::do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  std::memcpy(dst, host_src, bytes);
  const std::lock_guard<std::mutex> lock(mutex_);
  copy_from_host_threads_.push_back(std::this_thread::get_id());
}
std::vector<std::thread::id> CoreDriver::copy_from_host_threads() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return copy_from_host_threads_;
}
void CoreDriver::do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  std::memcpy(host_dst, src, bytes);
}
void CoreDriver::do_copy(void* dst, const void* src, std::size_t bytes) {
  std::memmove(dst, src, bytes);
}

void CoreDriver::do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k,
                         float alpha, const float* a, index_t lda, const float* b, index_t ldb,
                         float beta, float* c, index_t ldc) {
  if (gemms_until_failure_ > 0 && --gemms_until_failure_ == 0)
    throw Error(device().name() + ": gemm failed (injected by the test)");
  for (index_t i = 0; i < m; ++i) {
    for (index_t j = 0; j < n; ++j) {
      double product = 0.0;
      for (index_t p = 0; p < k; ++p) {
        const float av = trans_a == Transpose::yes ? a[p * lda + i] : a[i * lda + p];
        const float bv = trans_b == Transpose::yes ? b[j * ldb + p] : b[p * ldb + j];
        product += static_cast<double>(av) * bv;
      }
      float& out = c[i * ldc + j];
      out = static_cast<float>(alpha * product + (beta == 0.0f ? 0.0 : beta * out));
    }
  }
}

// Calls visit(pixel, entry) for every entry of the lowered matrix in order: rows (c, kh,
// kw), columns (n, oh, ow); pixel is the input it reads, or -1 in the padding.
template <class Visit>
static void lowered(const LoweringShape& s, Visit visit) {
  index_t entry = 0;
  for (index_t c = 0; c < s.channels; ++c)
    for (index_t kh = 0; kh < s.kernel_h; ++kh)
      for (index_t kw = 0; kw < s.kernel_w; ++kw)
        for (index_t n = 0; n < s.batch; ++n)
          for (index_t oh = 0; oh < s.out_h(); ++oh)
            for (index_t ow = 0; ow < s.out_w(); ++ow, ++entry) {
              const index_t h = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
              const index_t w = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
              const bool inside = h >= 0 && h < s.height && w >= 0 && w < s.width;
              visit(inside ? ((n * s.channels + c) * s.height + h) * s.width + w : -1, entry);
            }
}

void CoreDriver::do_im2col(const LoweringShape& s, const float* images, float* columns) {
  lowered(s,
          [&](index_t pixel, index_t entry) { columns[entry] = pixel < 0 ? 0.0f : images[pixel]; });
}

void CoreDriver::do_col2im(const LoweringShape& s, const float* columns, float* images) {
  std::memset(images, 0, static_cast<std::size_t>(s.image_count()) * sizeof(float));
  lowered(s, [&](index_t pixel, index_t entry) {
    if (pixel >= 0) images[pixel] += columns[entry];
  });
}

void CoreDriver::do_fill(index_t n, float value, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] = value;
}
void CoreDriver::do_scale(index_t n, float alpha, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] *= alpha;
}
void CoreDriver::do_axpy(index_t n, float alpha, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}
void CoreDriver::do_axpby(index_t n, float alpha, const float* x, float beta, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = alpha * x[i] + (beta == 0.0f ? 0.0f : beta * y[i]);
}
void CoreDriver::do_mul(index_t n, const float* a, const float* b, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = a[i] * b[i];
}
void CoreDriver::do_add_scalar(index_t n, float alpha, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] += alpha;
}
void CoreDriver::do_powx(index_t n, const float* x, float exponent, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = std::pow(x[i], exponent);
}
void CoreDriver::do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld,
                                 float* dst, index_t dst_ld) {
  for (index_t r = 0; r < rows; ++r)
    std::memmove(dst + r * dst_ld, src + r * src_ld, static_cast<std::size_t>(cols) * 4);
}
float CoreDriver::do_dot(index_t n, const float* x, const float* y) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += static_cast<double>(x[i]) * y[i];
  return static_cast<float>(total);
}
float CoreDriver::do_asum(index_t n, const float* x) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += std::fabs(x[i]);
  return static_cast<float>(total);
}
float CoreDriver::do_sum(index_t n, const float* x) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += x[i];
  return static_cast<float>(total);
}

void register_core_driver() {
  static std::once_flag once;
  std::call_once(once, [] {
    DriverKind kind;
    kind.name = "core";
    kind.summary = "the core calls only, every optional call generic (tests)";
    kind.any_index = true;
    kind.count = [] { return 1; };
    kind.options = {{"separate_memory", "true: memory of its own", {"true", "false"}}};
    kind.make = [](const Device& device, const DriverOptions& options) {
      return std::unique_ptr<Driver>(
          new CoreDriver(device, options.flag("separate_memory", false, device)));
    };
    register_driver_kind(std::move(kind));
  });
}

}  // namespace hn::test
