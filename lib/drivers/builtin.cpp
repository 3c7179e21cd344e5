// The built-in drivers, in the order device_query lists them. A new driver is its folder
// (lib/drivers/NAME/, with a function returning its DriverKind) plus one line here.
#include "lib/drivers/builtin.h"

#include <mutex>

#include "lib/core/driver_registry.h"
#include "lib/drivers/cpu/cpu_driver.h"
#include "lib/drivers/cuda/registration.h"
#include "lib/drivers/reference/reference_driver.h"

namespace hn {

void register_builtin_drivers() {
  static std::once_flag registered;
  std::call_once(registered, [] {
    register_driver_kind(detail::reference_driver_kind());
    register_driver_kind(detail::cpu_driver_kind());
    register_driver_kind(detail::cuda_driver_kind());
  });
}

}  // namespace hn
