// The reference driver: the reference kernels (lib/core/ref_kernels.h, naive loops written
// to be obviously correct rather than fast) on memory of its own, so it is the oracle of
// every driver test. Its code is the memory calls; the arithmetic is one line per call.
#include "lib/drivers/reference/reference_driver.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/memory.h"
#include "lib/core/ref_kernels.h"

namespace hn::detail {

namespace {

constexpr std::size_t kAlignment = 64;

class ReferenceDriver final : public Driver {
 public:
  ReferenceDriver(const Device& device, bool separate_memory)
      : Driver(device), separate_memory_(separate_memory) {}

  ~ReferenceDriver() override {
    // Buffers should be gone by now; free whatever is still live rather than leak it.
    for (const auto& [start, bytes] : allocations_) {
      static_cast<void>(bytes);
      std::free(reinterpret_cast<void*>(start));
    }
  }

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_addressable = !separate_memory_;
    caps.convolution = true;
    return caps;
  }

  // With separate memory the driver is a space of its own: host addresses are foreign.
  MemorySpace memory_space() const override {
    return separate_memory_ ? static_cast<MemorySpace>(this) : host_space();
  }

  std::string description() const override {
    return name() + ": naive single-thread loops, " +
           (separate_memory_ ? "separate memory space (models a device)" : "host memory");
  }

  bool owns(const void* address, std::size_t bytes) const override {
    if (!separate_memory_) return true;
    const auto start = reinterpret_cast<std::uintptr_t>(address);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.upper_bound(start);
    if (it == allocations_.begin()) return false;
    --it;  // the last allocation starting at or before `address`
    const std::uintptr_t offset = start - it->first;
    return offset <= it->second && bytes <= it->second - offset;
  }

 protected:
  // ---- memory -------------------------------------------------------------------------

  void* do_allocate(std::size_t bytes) override {
    HN_CHECK(bytes <= std::numeric_limits<std::size_t>::max() - kAlignment,
             "allocate on {}: {} bytes is too large", name(), bytes);
    check_host_bytes(bytes, [&] { return fmt::format("allocate on {}", name()); });
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    std::unique_ptr<void, decltype(&std::free)> memory(std::aligned_alloc(kAlignment, rounded),
                                                       &std::free);
    HN_CHECK(memory != nullptr, "allocate on {}: out of host memory for {} bytes", name(), bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      allocations_.emplace(reinterpret_cast<std::uintptr_t>(memory.get()), bytes);
    }
    return memory.release();
  }

  // Frees only what this driver allocated: a foreign address is ignored, never freed.
  void do_deallocate(void* address) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(address));
      if (it == allocations_.end()) return;
      allocations_.erase(it);
    }
    std::free(address);
  }

  // The memory is host RAM in both modes; separate mode only separates the address space.
  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void do_copy(void* dst, const void* src, std::size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void do_synchronize() override {}

  // ---- arithmetic: every compute call runs its reference kernel --------------------
#define HN_CORE(RET, NAME, PARAMS, ARGS) \
  RET do_##NAME PARAMS override {        \
    return ref::NAME ARGS;               \
  }
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

 private:
  const bool separate_memory_;
  // Every live allocation, start -> size: owns() checks against it in separate mode, and
  // deallocate frees only what is listed. Buffers may die on another thread than the one
  // computing, hence the lock.
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;
};

}  // namespace

DriverKind reference_driver_kind() {
  DriverKind kind;
  kind.name = "reference";
  kind.summary = "naive single-thread loops, the oracle of every test";
  kind.oracle = true;
  kind.any_index = true;
  kind.count = [] { return 1; };
  kind.make = [](const Device& device, const DriverOptions& options) -> std::unique_ptr<Driver> {
    return std::make_unique<ReferenceDriver>(device,
                                             options.flag("separate_memory", false, device));
  };
  kind.options = {{"separate_memory",
                   "true: memory of its own that the host may not address, so copies show "
                   "without a GPU (default false)",
                   {"true", "false"}}};
  return kind;
}

}  // namespace hn::detail
