// Copies between two memory spaces given the drivers that own them (nullptr = plain host
// memory): directly when one side is host memory or both share a space, else staged
// through a host buffer.
#pragma once

#include <cstddef>

#include "hybridnn/driver.h"

namespace hn::detail {

void transfer(Driver* dst_driver, void* dst, Driver* src_driver, const void* src,
              std::size_t bytes);

}  // namespace hn::detail
