// A driver that records, for tests of recorded iterations (Driver::begin_recording) without
// a GPU: the reference driver with memory of its own, whose calls made between
// begin_recording() and end_recording() are kept, with their arguments, instead of run, and
// run again in order at each replay. Like a CUDA graph's capture, a recording holds only
// calls with fixed addresses and arguments: a copy to or from the host, a wait for the
// device or a call that returns a value to the host throws while recording, and
// end_recording() then fails naming it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/driver.h"

namespace hn::test {

class RecordingDriver final : public Driver {
 public:
  explicit RecordingDriver(const Device& device = Device{"reference", 7});

  Capabilities capabilities() const override { return inner_->capabilities(); }
  MemorySpace memory_space() const override { return inner_->memory_space(); }
  std::string description() const override;
  bool owns(const void* address, std::size_t bytes) const override {
    return inner_->owns(address, bytes);
  }
  bool records() const override { return true; }
  bool begin_recording(std::string& why) override;
  std::unique_ptr<Recording> end_recording(std::string& why) override;
  // The calls recorded by the recordings so far, and those replayed.
  int recorded_calls() const { return recorded_calls_; }
  // How many `call`s (a driver_calls.def name) the recordings so far hold.
  int recorded(const std::string& call) const {
    const auto it = recorded_by_name_.find(call);
    return it == recorded_by_name_.end() ? 0 : it->second;
  }
  int replayed_calls() const { return replayed_calls_; }

 protected:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* address) noexcept override { inner_->deallocate(address); }
  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void do_copy(void* dst, const void* src, std::size_t bytes) override;
  void do_synchronize() override;

#define HN_CORE(RET, NAME, PARAMS, ARGS)                       \
  RET do_##NAME PARAMS override {                              \
    return run<RET>(#NAME, [=] { return inner_->NAME ARGS; }); \
  }
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

 private:
  class Calls;
  // Runs `call` now, or keeps it while recording; a call returning a value cannot be kept.
  template <typename Ret, typename Call>
  Ret run(const char* name, Call&& call) {
    if constexpr (std::is_void_v<Ret>) {
      if (recording_) {
        keep(name, std::function<void()>(std::forward<Call>(call)));
      } else {
        call();
      }
    } else {
      if (recording_) refuse(name, "returns a value to the host");
      return call();
    }
  }
  void keep(const char* name, std::function<void()> call);
  [[noreturn]] void refuse(const char* call, const char* why);

  std::unique_ptr<Driver> inner_;  // the reference driver, separate memory
  bool recording_ = false;
  std::string failure_;  // the first call refused while recording
  std::shared_ptr<std::vector<std::function<void()>>> calls_;
  std::map<std::string, int> pending_by_name_, recorded_by_name_;
  int recorded_calls_ = 0;
  int replayed_calls_ = 0;
};

}  // namespace hn::test
