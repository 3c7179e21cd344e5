// The built-in drivers, in the order device_query lists them, registered when the program
// (or libhybridnn.so) is loaded. A new driver is its folder (lib/drivers/NAME/, with a
// function returning its DriverKind) plus one line here. This file is not in the archive
// (an unreferenced member of a static library is dropped): CMake links its object into
// every target that links hybridnn_cxx (lib/drivers/CMakeLists.txt).
#include "lib/core/driver_registry.h"
#include "lib/drivers/cpu/cpu_driver.h"
#include "lib/drivers/cuda/registration.h"
#include "lib/drivers/reference/reference_driver.h"

namespace hn {
namespace {

[[maybe_unused]] const bool registered = [] {
  register_driver_kind(detail::reference_driver_kind());
  register_driver_kind(detail::cpu_driver_kind());
  register_driver_kind(detail::cuda_driver_kind());
  return true;
}();

}  // namespace
}  // namespace hn
