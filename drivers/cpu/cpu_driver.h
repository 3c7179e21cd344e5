// The fast CPU driver: GEMM through a BLAS (oneDNN's sgemm or OpenBLAS), lowering and
// primitives vectorised and parallelised on OpenMP (parallel.h), the runtime oneDNN uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hybridnn/driver.h"

namespace hn::detail {

// blas: "onednn", "openblas", or empty for the build's default. threads: 0 = every core.
std::unique_ptr<Driver> make_cpu_driver(const Device& device, int threads, const std::string& blas);
// The BLAS libraries this build can use, the default first.
std::vector<std::string> cpu_blas_backends();

}  // namespace hn::detail
