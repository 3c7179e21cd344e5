// The one function that lists the built-in drivers (drivers/builtin.cpp): adding a driver
// to the library is its folder plus one line there.
#pragma once

#include <vector>

#include "hybridnn/driver_registry.h"

namespace hn::detail {

void register_builtin_drivers(std::vector<DriverKind>& kinds);

}  // namespace hn::detail
