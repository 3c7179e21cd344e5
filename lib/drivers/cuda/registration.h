// The CUDA driver's registry entry (built with or without the CUDA toolkit).
#pragma once

#include "lib/core/driver_registry.h"

namespace hn::detail {

DriverKind cuda_driver_kind();

}  // namespace hn::detail
