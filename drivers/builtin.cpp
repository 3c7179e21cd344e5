// The built-in drivers, in the order device_query lists them. A new driver is its folder
// (drivers/NAME/, with a function returning its DriverKind) plus one line here.
#include "drivers/cpu/cpu_driver.h"
#include "drivers/cuda/registration.h"
#include "drivers/reference/reference_driver.h"
#include "lib/core/driver_registry_internal.h"

namespace hn::detail {

void register_builtin_drivers(std::vector<DriverKind>& kinds) {
  kinds.push_back(reference_driver_kind());
  kinds.push_back(cpu_driver_kind());
  kinds.push_back(cuda_driver_kind());
}

}  // namespace hn::detail
