// Copies between two memory spaces given the drivers that own them (nullptr = plain host
// memory): directly when one side is host memory or both share a space, else staged
// through a host buffer.
#pragma once

#include <cstddef>

#include "lib/core/driver.h"

namespace hn::detail {

void transfer(Driver* dst_driver, void* dst, Driver* src_driver, const void* src,
              std::size_t bytes);

// What transfer() has moved on the calling thread: the split scheduler reads it around the
// operand resolution of each slice to charge the copies to that slice's device.
struct TransferTally {
  std::size_t bytes = 0;
  double seconds = 0.0;
};
TransferTally& transfer_tally();

}  // namespace hn::detail
