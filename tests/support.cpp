// Test support: driver configurations.
#include "tests/support.h"

#include <cstdio>

namespace hn::test {

std::vector<DriverConfig> driver_configs() {
  std::vector<DriverConfig> configs;
  configs.push_back({"reference", Device{DeviceKind::reference, 0}, {}});
  DriverOptions separate;
  separate.separate_memory = true;
  configs.push_back({"reference (separate memory)", Device{DeviceKind::reference, 0}, separate});
  for (const std::string& blas : cpu_blas_backends()) {
    for (int threads : {1, 0}) {
      DriverOptions cpu;
      cpu.threads = threads;
      cpu.blas = blas;
      configs.push_back({"cpu (" + blas + (threads == 1 ? ", 1 thread)" : ", all cores)"),
                         Device{DeviceKind::cpu, 0}, cpu});
    }
  }
  const int gpus = cuda_device_count();
  for (int i = 0; i < gpus; ++i) {
    const Device gpu{DeviceKind::cuda, i};
    configs.push_back({gpu.name(), gpu, {}});
  }
  if (gpus == 0) {
    static bool told = false;
    if (!told) {
      told = true;
      std::fprintf(stderr, "SKIPPED: cuda:N driver configurations: %s\n",
                   cuda_built() ? "no CUDA device found" : "CUDA driver not built");
    }
  }
  return configs;
}

}  // namespace hn::test
