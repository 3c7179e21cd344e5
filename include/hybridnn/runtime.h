// Runtime: the explicit table of drivers a program uses (no process-wide registry), the
// driver factory, and copies between memory spaces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hybridnn/device.h"
#include "hybridnn/driver.h"
#include "hybridnn/memory.h"

namespace hn {

namespace detail {
class DeviceWorker;
}

struct DriverOptions {
  int threads = 0;               // cpu: worker threads, 0 = every core
  std::string blas;              // cpu: "onednn" or "openblas"; empty = the measured default
  bool separate_memory = false;  // reference: memory the host may not address directly
};

// Builds the driver for `device`. Throws hn::Error when the device does not exist on this
// machine or this build (e.g. "cuda:0" without a GPU or without the CUDA driver built).
std::unique_ptr<Driver> make_driver(const Device& device, const DriverOptions& options = {});

// Devices usable now: "reference", "cpu", and "cuda:N" for every GPU found.
std::vector<Device> available_devices();
// The BLAS libraries the CPU driver of this build can use, its default first.
std::vector<std::string> cpu_blas_backends();
bool cuda_built();
int cuda_device_count();  // 0 when CUDA is not built or no GPU answers

class Runtime {
 public:
  Runtime();
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Adds a driver; throws when one for the same device is already present.
  Driver& add(std::unique_ptr<Driver> driver);
  Driver& add(const Device& device, const DriverOptions& options = {});
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

  // The long-lived host thread that issues `driver`'s slices of split layers, started at
  // the first call and joined with the Runtime (internal: the Net's scheduler uses it).
  detail::DeviceWorker& device_thread(Driver& driver);

 private:
  // The driver whose own memory holds `device`'s data; nullptr for host memory.
  Driver* owner(const Device& device) const;

  // Drivers die last: Buffers and Views they back must be gone before the Runtime is.
  std::vector<std::unique_ptr<Driver>> drivers_;
  // Destroyed (threads joined) before the drivers they drive.
  std::vector<std::pair<const Driver*, std::unique_ptr<detail::DeviceWorker>>> threads_;
};

}  // namespace hn
