// Runtime: the explicit table of drivers a program uses, made from the driver registry or
// added by the program, and copies between memory spaces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/core/device.h"
#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"
#include "lib/core/memory.h"

namespace hn {

namespace detail {
class DeviceWorker;
struct RuntimeThreads;
}  // namespace detail

// Builds the driver for `device` from its registry entry (driver_registry.h). Throws
// hn::Error when the device does not exist on this machine or this build (e.g. "cuda:0"
// without a GPU or without the CUDA driver built), or for an option its kind lacks.
std::unique_ptr<Driver> make_driver(const Device& device, const DriverOptions& options = {});

// Devices usable now: one of each kind whose index is free ("reference", "cpu") and every
// device of the kinds whose index names hardware ("cuda:N" for every GPU found).
std::vector<Device> available_devices();
// How many devices of a kind are present now: 0 when the kind is unknown, not built, or
// finds none.
int device_count(std::string_view kind);

class Runtime {
 public:
  Runtime();
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Adds a driver; throws when one for the same device is already present.
  Driver& add(std::unique_ptr<Driver> driver);
  Driver& add(const Device& device, const DriverOptions& options = {});
  // Options for the drivers the Runtime makes itself (provide()): each kind takes the ones
  // it reads (a tool's --threads, --blas).
  void set_driver_options(DriverOptions options) { driver_options_ = std::move(options); }
  // How many processes share this host's cores (the ranks an MPI launcher started on the
  // node; 1 by default): provide() divides this process's share of them.
  void set_processes_per_host(int processes);
  // Makes, from the registry, the driver of every device in `devices` that has none yet (a
  // net's own device and those its splits name: the Net calls it when it is built), all in
  // one go. Unless the options fix `threads`, kinds that run teams of host threads
  // (DriverKind::multithreaded) divide this process's share of the cores among them, less
  // one core for each accelerator's driver thread, counting the drivers already present;
  // unless they name `cores`, each such team is bound to cores of its own (share_cores,
  // affinity.h: this process's cores in device order, the last left to the accelerators'
  // threads) where teams sit beside an accelerator or each other in this process alone on
  // its cores (one process per host). Drivers already present are kept as they are. Throws
  // hn::Error naming each device that cannot be made (no such hardware, kind not built) after
  // making the others.
  void provide(const std::vector<Device>& devices);
  // Throws hn::Error listing the devices present when there is none for `device`.
  Driver& driver(const Device& device) const;
  Driver& driver(std::string_view name) const { return driver(Device::parse(name)); }
  Driver* find(const Device& device) const;
  std::vector<Driver*> drivers() const;

  // The memory space a device's memory lives in ("cpu:N" is host memory even with no cpu
  // driver added).
  MemorySpace space_of(const Device& device) const;

  // Copies between any two memory spaces: directly when one driver can address both,
  // else through a host staging buffer. `dst`/`src` name their devices.
  void copy(const Pointer& dst, const Pointer& src);

  // Dereferences `pointer` for `driver` (see View).
  View view(const Pointer& pointer, Driver& driver, Access access);

 private:
  // The scheduler's device threads (lib/core/worker.h).
  friend struct detail::RuntimeThreads;
  detail::DeviceWorker& device_thread(Driver& driver);

  // The driver whose own memory holds `device`'s data; nullptr for host memory.
  Driver* owner(const Device& device) const;

  // Drivers die last: Buffers and Views they back must be gone before the Runtime is.
  std::vector<std::unique_ptr<Driver>> drivers_;
  DriverOptions driver_options_;
  int processes_per_host_ = 1;
  // Destroyed (threads joined) before the drivers they drive.
  std::vector<std::pair<const Driver*, std::unique_ptr<detail::DeviceWorker>>> threads_;
};

}  // namespace hn
