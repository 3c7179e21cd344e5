// The reference driver: naive single-thread loops, written for obviousness, the oracle
// every other driver is tested against. With separate_memory it models a device whose
// memory the host may not address: its allocations form their own memory space and every
// call checks that its addresses lie in them, so Pointer staging runs in CI without a GPU.
#pragma once

#include <memory>

#include "hybridnn/driver.h"

namespace hn::detail {

std::unique_ptr<Driver> make_reference_driver(const Device& device, bool separate_memory);

}  // namespace hn::detail
