// The reference driver: naive single-thread loops, written for obviousness, the oracle
// every other driver is tested against. With separate_memory it models a device whose
// memory the host may not address: its allocations form their own memory space and every
// call checks that its addresses lie in them, so Pointer staging runs in CI without a GPU.
#pragma once

#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"

namespace hn::detail {

// Options: separate_memory (true: a memory space of its own).
DriverKind reference_driver_kind();

}  // namespace hn::detail
