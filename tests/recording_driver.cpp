// The recording test driver: the reference driver's calls, kept and replayed.
#include "tests/recording_driver.h"

#include <fmt/format.h>

#include <utility>

#include "hybridnn/error.h"
#include "lib/core/check.h"
#include "lib/core/runtime.h"

namespace hn::test {

namespace {
std::unique_ptr<Driver> separate_reference() {
  DriverOptions separate;
  separate.set("separate_memory", true);
  return make_driver(Device::parse("reference"), separate);
}
}  // namespace

class RecordingDriver::Calls final : public Driver::Recording {
 public:
  Calls(std::shared_ptr<std::vector<std::function<void()>>> calls, int& replayed)
      : calls_(std::move(calls)), replayed_(replayed) {}
  void replay() override {
    for (const std::function<void()>& call : *calls_)
      call();
    replayed_ += static_cast<int>(calls_->size());
  }

 private:
  std::shared_ptr<std::vector<std::function<void()>>> calls_;
  int& replayed_;
};

RecordingDriver::RecordingDriver(const Device& device)
    : Driver(device), inner_(separate_reference()) {}

std::string RecordingDriver::description() const {
  return name() + ": the reference driver's calls, recorded and replayed (tests)";
}

bool RecordingDriver::begin_recording(std::string& why) {
  HN_CHECK(!recording_, "{}: begin_recording while recording", name());
  why.clear();
  recording_ = true;
  failure_.clear();
  pending_by_name_.clear();
  calls_ = std::make_shared<std::vector<std::function<void()>>>();
  return true;
}

std::unique_ptr<Driver::Recording> RecordingDriver::end_recording(std::string& why) {
  HN_CHECK(recording_, "{}: end_recording without begin_recording", name());
  recording_ = false;
  std::shared_ptr<std::vector<std::function<void()>>> calls = std::move(calls_);
  if (!failure_.empty()) {
    why = failure_;
    return nullptr;
  }
  recorded_calls_ += static_cast<int>(calls->size());
  for (const auto& [call, count] : pending_by_name_)
    recorded_by_name_[call] += count;
  return std::make_unique<Calls>(std::move(calls), replayed_calls_);
}

void RecordingDriver::keep(const char* name, std::function<void()> call) {
  calls_->push_back(std::move(call));
  ++pending_by_name_[name];
}

void RecordingDriver::refuse(const char* call, const char* why) {
  const std::string message = fmt::format("{}: {} {}: it cannot be recorded", name(), call, why);
  if (failure_.empty()) failure_ = message;
  throw Error(message);
}

void* RecordingDriver::do_allocate(std::size_t bytes) {
  if (recording_) refuse("allocate", "allocates");
  return inner_->allocate(bytes);
}

void RecordingDriver::do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  if (recording_) refuse("copy_from_host", "copies through the host");
  inner_->copy_from_host(dst, host_src, bytes);
}

void RecordingDriver::do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (recording_) refuse("copy_to_host", "copies through the host");
  inner_->copy_to_host(host_dst, src, bytes);
}

void RecordingDriver::do_copy(void* dst, const void* src, std::size_t bytes) {
  run<void>("copy", [=] { inner_->copy(dst, src, bytes); });
}

void RecordingDriver::do_synchronize() {
  if (recording_) refuse("synchronize", "waits for the device");
  inner_->synchronize();
}

}  // namespace hn::test
