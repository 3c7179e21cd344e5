// The fast CPU driver: GEMM through a BLAS (oneDNN's sgemm or OpenBLAS), lowering and
// primitives vectorised and parallelised on OpenMP (parallel.h), the runtime oneDNN uses.
#pragma once

#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"

namespace hn::detail {

// Options: threads (0 = every core), blas (one of the BLAS libraries this build has, the
// default first in the option's choices).
DriverKind cpu_driver_kind();

}  // namespace hn::detail
