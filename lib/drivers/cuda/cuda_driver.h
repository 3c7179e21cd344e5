// The CUDA driver: cuBLAS for GEMM, the project's own kernels for lowering and every
// primitive, one stream per driver, pinned staging buffers for host copies. Built when the
// CUDA toolkit is found; constructing it needs a GPU.
#pragma once

#include <memory>

#include "lib/core/driver.h"

namespace hn::detail {

// Throws hn::Error when device.index names no GPU.
std::unique_ptr<Driver> make_cuda_driver(const Device& device);
// Number of GPUs the CUDA runtime reports; 0 when it reports an error (no driver, no GPU).
int cuda_device_count();

}  // namespace hn::detail
