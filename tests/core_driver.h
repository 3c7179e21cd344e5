// A driver that implements only the core of the Driver contract (memory, copies,
// synchronize and the HN_CORE calls of driver_calls.def) with loops of its own, so every
// optional call runs its generic implementation. Registered as the device kind "core"
// (option separate_memory: memory of its own, so the generic calls stage through copies);
// driver_configs() runs the op and layer suites on it in both memory modes.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/core/driver.h"

namespace hn::test {

class CoreDriver : public Driver {
 public:
  CoreDriver(const Device& device, bool separate_memory);
  ~CoreDriver() override;

  Capabilities capabilities() const override;
  MemorySpace memory_space() const override;
  std::string description() const override;
  bool owns(const void* address, std::size_t bytes) const override;
  // The thread of each copy_from_host so far, in order (tests of who makes the copies).
  std::vector<std::thread::id> copy_from_host_threads() const;
  // Makes the `calls`-th gemm from now throw an hn::Error (0: never).
  void fail_gemm(int calls) { gemms_until_failure_ = calls; }

 protected:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* address) noexcept override;
  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void do_copy(void* dst, const void* src, std::size_t bytes) override;
  void do_synchronize() override {}

#define HN_CORE(RET, NAME, PARAMS, ARGS) RET do_##NAME PARAMS override;
#define HN_OPTIONAL(RET, NAME, PARAMS, ARGS)
#include "lib/core/driver_calls.def"

 private:
  const bool separate_memory_;
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;
  std::vector<std::thread::id> copy_from_host_threads_;
  std::atomic<int> gemms_until_failure_{0};
};

// Registers the "core" kind once (driver_configs() does it too).
void register_core_driver();

}  // namespace hn::test
