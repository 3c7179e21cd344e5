// Runtime: the driver table, making drivers from the registry, and copies between memory
// spaces.
#include "lib/core/runtime.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "lib/core/affinity.h"
#include "lib/core/check.h"
#include "lib/core/transfer.h"
#include "lib/core/worker.h"

namespace hn {

std::unique_ptr<Driver> make_driver(const Device& device, const DriverOptions& options) {
  const DriverKind kind = driver_kind(device.kind);
  HN_CHECK(kind.make != nullptr, "{}: {}", device.name(), kind.missing);
  for (const auto& [name, value] : options.values()) {
    const auto declared =
        std::find_if(kind.options.begin(), kind.options.end(),
                     [&key = name](const DriverOption& option) { return option.name == key; });
    std::string known;
    for (const DriverOption& option : kind.options)
      known += (known.empty() ? "" : ", ") + option.name;
    HN_CHECK(declared != kind.options.end(), "driver {}: unknown option '{}' (its options: {})",
             device.name(), name, known.empty() ? "none" : known);
    if (!declared->choices.empty()) {
      std::string choices;
      for (const std::string& choice : declared->choices)
        choices += (choices.empty() ? "" : ", ") + choice;
      HN_CHECK(std::find(declared->choices.begin(), declared->choices.end(), value) !=
                   declared->choices.end(),
               "driver {}: option {}='{}' is not one of {}", device.name(), name, value, choices);
    }
  }
  std::unique_ptr<Driver> driver = kind.make(device, options);
  HN_CHECK(driver != nullptr && driver->device() == device,
           "driver kind '{}' made no driver for {}", kind.name, device.name());
  return driver;
}

int device_count(std::string_view kind_name) {
  const std::optional<DriverKind> kind = find_driver_kind(kind_name);
  if (!kind || !kind->make || !kind->count) return 0;
  return kind->count();
}

std::vector<Device> available_devices() {
  std::vector<Device> devices;
  for (const DriverKind& kind : driver_kinds()) {
    const int count = kind.make && kind.count ? kind.count() : 0;
    for (int i = 0; i < (kind.any_index ? std::min(count, 1) : count); ++i)
      devices.push_back(Device{kind.name, i});
  }
  return devices;
}

Runtime::Runtime() = default;
Runtime::~Runtime() = default;

detail::DeviceWorker& Runtime::device_thread(Driver& driver) {
  for (auto& [owner, thread] : threads_) {
    if (owner == &driver) return *thread;
  }
  threads_.emplace_back(&driver, std::make_unique<detail::DeviceWorker>());
  return *threads_.back().second;
}

Driver& Runtime::add(std::unique_ptr<Driver> driver) {
  HN_CHECK(driver != nullptr, "Runtime::add: null driver");
  HN_CHECK(find(driver->device()) == nullptr,
           "Runtime::add: a driver for {} is already present; use cpu:N for another instance",
           driver->name());
  drivers_.push_back(std::move(driver));
  return *drivers_.back();
}

Driver& Runtime::add(const Device& device, const DriverOptions& options) {
  return add(make_driver(device, options));
}

void Runtime::set_processes_per_host(int processes) {
  HN_CHECK(processes >= 1, "Runtime: processes per host must be >= 1, got {}", processes);
  processes_per_host_ = processes;
}

void Runtime::provide(const std::vector<Device>& devices) {
  std::vector<Device> missing, all;
  for (const auto& driver : drivers_)
    all.push_back(driver->device());
  for (const Device& device : devices) {
    if (std::find(all.begin(), all.end(), device) != all.end()) continue;
    all.push_back(device);
    missing.push_back(device);
  }
  if (missing.empty()) return;
  DriverOptions options = driver_options_;
  // Teams side by side would each start a thread per core and wait on each other at every
  // barrier; so would the ranks an MPI launcher started on this node. An accelerator's
  // driver thread takes a core too: it waits on its device (spinning, CUDA's default), and a
  // team with a thread on that core waits for it (16 cores beside an H200, split
  // cpu:0.25,cuda:0:0.75: CaffeNet's conv5 forward took the CPU 7.4 ms with 16 threads, 1.8
  // with 15).
  long teams = 0, accelerators = 0;
  for (const Device& device : all) {
    const DriverKind kind = driver_kind(device.kind);
    teams += kind.multithreaded ? 1 : 0;
    accelerators += kind.accelerator ? 1 : 0;
  }
  const std::vector<int> allowed = detail::allowed_cores();
  const long cores = static_cast<long>(allowed.size());
  const long sharing = teams * processes_per_host_;
  const long free_cores = std::max(1L, cores - accelerators * processes_per_host_);
  const bool shared = teams > 0 && (sharing > 1 || accelerators > 0);
  if (options.values().count("threads") == 0 && shared)
    options.set("threads", static_cast<int>(std::max(1L, free_cores / std::max(1L, sharing))));
  // Each team of this process on cores of its own, in device order, the last ones left to
  // the accelerators' driver threads: unless the options name the cores, or other processes
  // share the same cores (ranks on a node that the launcher did not bind apart).
  const bool bind = shared && options.values().count("cores") == 0 && processes_per_host_ == 1;
  const std::vector<std::vector<int>> team_cores =
      bind ? detail::share_cores(allowed, static_cast<int>(teams), static_cast<int>(accelerators))
           : std::vector<std::vector<int>>{};
  const auto options_of = [&](const Device& device) {
    DriverOptions own = options;
    if (!bind || !driver_kind(device.kind).multithreaded) return own;
    std::size_t team = 0;
    for (const Device& other : all) {
      if (other == device) break;
      team += driver_kind(other.kind).multithreaded ? 1 : 0;
    }
    own.set("cores", detail::format_cores(team_cores.at(team)));
    return own;
  };
  // Every device that can be made is; then one error lists those that cannot.
  std::string failures;
  for (const Device& device : missing) {
    try {
      add(device, options_for(driver_kind(device.kind), options_of(device)));
    } catch (const Error& error) {
      failures += fmt::format("{}{}", failures.empty() ? "" : "; ", error.what());
    }
  }
  if (!failures.empty()) detail::fail("cannot make drivers: {}", failures);
}

Driver* Runtime::find(const Device& device) const {
  for (const auto& driver : drivers_) {
    if (driver->device() == device) return driver.get();
  }
  return nullptr;
}

Driver& Runtime::driver(const Device& device) const {
  if (Driver* found = find(device)) return *found;
  std::string present;
  for (const auto& driver : drivers_)
    present += (present.empty() ? "" : ", ") + driver->name();
  detail::fail("no driver for device {} in this runtime (present: {})", device.name(),
               present.empty() ? "none" : present);
}

std::vector<Driver*> Runtime::drivers() const {
  std::vector<Driver*> out;
  for (const auto& driver : drivers_)
    out.push_back(driver.get());
  return out;
}

MemorySpace Runtime::space_of(const Device& device) const {
  const Driver* found = owner(device);
  return found ? found->memory_space() : host_space();
}

namespace {

void copy_bytes(Driver* dst_driver, void* dst, Driver* src_driver, const void* src,
                std::size_t bytes) {
  // A host-addressable driver's memory is host memory.
  if (dst_driver && dst_driver->memory_space() == host_space()) dst_driver = nullptr;
  if (src_driver && src_driver->memory_space() == host_space()) src_driver = nullptr;
  if (dst_driver == nullptr && src_driver == nullptr) {
    std::memcpy(dst, src, bytes);
  } else if (src_driver == nullptr) {
    dst_driver->copy_from_host(dst, src, bytes);
  } else if (dst_driver == nullptr) {
    src_driver->copy_to_host(dst, src, bytes);
  } else if (dst_driver->memory_space() == src_driver->memory_space()) {
    dst_driver->copy(dst, src, bytes);
  } else {
    // Neither driver can address the other's memory: stage through the host.
    Buffer staging = Buffer::host(bytes);
    src_driver->copy_to_host(staging.address(), src, bytes);
    dst_driver->copy_from_host(dst, staging.address(), bytes);
  }
}

}  // namespace

namespace detail {

TransferTally& transfer_tally() {
  thread_local TransferTally tally;
  return tally;
}

namespace {
thread_local DeferredCopies* deferring = nullptr;
}

DeferTransfers::DeferTransfers(DeferredCopies& into, Driver& on) {
  HN_CHECK(deferring == nullptr, "DeferTransfers: a scope is already open on this thread");
  HN_CHECK(into.copies_.empty() || into.driver_ == &on,
           "DeferTransfers: copies for {} already wait in this list", into.driver_->name());
  into.driver_ = &on;
  deferring = &into;
}

DeferTransfers::~DeferTransfers() {
  deferring = nullptr;
}

DeferredCopies::DeferredCopies(DeferredCopies&& other) noexcept
    : driver_(other.driver_), copies_(std::move(other.copies_)), bytes_(other.bytes_) {
  other.copies_.clear();
  other.bytes_ = 0;
}

DeferredCopies& DeferredCopies::operator=(DeferredCopies&& other) noexcept {
  if (this != &other) {
    undo_from(0);
    driver_ = other.driver_;
    copies_ = std::move(other.copies_);
    bytes_ = other.bytes_;
    other.copies_.clear();
    other.bytes_ = 0;
  }
  return *this;
}

DeferredCopies::~DeferredCopies() {
  undo_from(0);
}

void DeferredCopies::undo_from(std::size_t first) noexcept {
  for (std::size_t i = copies_.size(); i > first; --i) {
    if (copies_[i - 1].unmade) copies_[i - 1].unmade();
  }
  copies_.clear();
  bytes_ = 0;
}

void DeferredCopies::on_unmade(std::function<void()> undo) {
  if (deferring != nullptr && !deferring->copies_.empty())
    deferring->copies_.back().unmade = std::move(undo);
}

double DeferredCopies::make() {
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < copies_.size(); ++i) {
    const Copy& copy = copies_[i];
    try {
      transfer(copy.dst_driver, copy.dst, copy.src_driver, copy.src, copy.bytes);
    } catch (...) {
      undo_from(i);
      throw;
    }
  }
  copies_.clear();
  bytes_ = 0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool transfer(Driver* dst_driver, void* dst, Driver* src_driver, const void* src,
              std::size_t bytes) {
  if (bytes == 0) return false;
  if (DeferredCopies* later = deferring) {
    // Into the deferring driver's memory (or host memory when it computes there), from host
    // memory or its own: its thread can make the copy alone.
    const auto own = [&](Driver* side) {
      return side == nullptr || side->memory_space() == host_space() ||
             side->memory_space() == later->driver_->memory_space();
    };
    if (own(dst_driver) && own(src_driver)) {
      later->copies_.push_back(DeferredCopies::Copy{dst_driver, dst, src_driver, src, bytes, {}});
      later->bytes_ += bytes;
      return true;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  copy_bytes(dst_driver, dst, src_driver, src, bytes);
  TransferTally& tally = transfer_tally();
  tally.bytes += bytes;
  tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return false;
}

}  // namespace detail

Driver* Runtime::owner(const Device& device) const {
  const std::optional<DriverKind> kind = find_driver_kind(device.kind);
  if (kind && kind->host_memory) return nullptr;
  Driver& found = driver(device);
  return found.memory_space() == host_space() ? nullptr : &found;
}

void Runtime::copy(const Pointer& dst, const Pointer& src) {
  HN_CHECK(dst.bytes == src.bytes, "Runtime::copy: {} bytes on {} into {} bytes on {}", src.bytes,
           src.device.name(), dst.bytes, dst.device.name());
  detail::transfer(owner(dst.device), dst.address, owner(src.device), src.address, src.bytes);
}

View Runtime::view(const Pointer& pointer, Driver& for_driver, Access access) {
  View view;
  view.runtime_ = this;
  view.source_ = pointer;
  view.source_owner_ = owner(pointer.device);
  view.driver_ = &for_driver;
  view.access_ = access;
  if (for_driver.can_address(space_of(pointer.device))) {
    view.address_ = pointer.address;
    return view;
  }
  view.staging_ = Buffer(for_driver, pointer.bytes);
  view.address_ = view.staging_.address();
  if (access != Access::write) {
    detail::transfer(&for_driver, view.address_, view.source_owner_, pointer.address,
                     pointer.bytes);
  }
  return view;
}

}  // namespace hn
