// The reference kernels: every compute call of driver_calls.def as a naive loop on host
// memory, with the call's own signature. The reference driver runs them on its memory; the
// generic implementation of an optional call runs them on host copies of a driver's
// operands. Arguments are checked by the Driver's wrappers before they get here.
#pragma once

#include <cstdint>

#include "lib/core/driver.h"
#include "lib/core/shapes.h"

namespace hn::ref {

#define HN_CORE(RET, NAME, PARAMS, ARGS) RET NAME PARAMS;
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

}  // namespace hn::ref
