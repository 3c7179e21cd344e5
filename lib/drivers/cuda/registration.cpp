// The CUDA driver's registry entry, built in every configuration: without the toolkit the
// kind is still known (a split file naming cuda:0 parses), and making one says why not.
#include "lib/drivers/cuda/registration.h"

#if HYBRIDNN_WITH_CUDA
#include "lib/drivers/cuda/cuda_driver.h"
#endif

namespace hn::detail {

DriverKind cuda_driver_kind() {
  DriverKind kind;
  kind.name = "cuda";
  kind.summary = "cuBLAS, own kernels, cuDNN where found; one stream per driver";
  kind.accelerator = true;
#if HYBRIDNN_WITH_CUDA
  kind.count = [] { return cuda_device_count(); };
  kind.make = [](const Device& device, const DriverOptions&) { return make_cuda_driver(device); };
#else
  kind.missing =
      "this build of hybridnn has no CUDA driver (configure with the CUDA toolkit present, or "
      "-DHYBRIDNN_CUDA=ON)";
#endif
  return kind;
}

}  // namespace hn::detail
