// Test support: driver configurations.
#include "tests/support.h"

#include <cstdio>

#include "tests/core_driver.h"

namespace hn::test {

std::vector<DriverConfig> driver_configs() {
  std::vector<DriverConfig> configs;
  configs.push_back({"reference", Device{"reference", 0}, {}});
  DriverOptions separate;
  separate.set("separate_memory", true);
  configs.push_back({"reference (separate memory)", Device{"reference", 0}, separate});
  // Every optional call generic: on host memory directly, and staged through copies.
  register_core_driver();
  configs.push_back({"core only", Device{"core", 0}, {}});
  configs.push_back({"core only (separate memory)", Device{"core", 0}, separate});
  for (const std::string& blas : driver_kind("cpu").choices("blas")) {
    for (int threads : {1, 0}) {
      DriverOptions cpu;
      cpu.set("threads", threads).set("blas", blas);
      configs.push_back({"cpu (" + blas + (threads == 1 ? ", 1 thread)" : ", all cores)"),
                         Device{"cpu", 0}, cpu});
    }
  }
  const int gpus = device_count("cuda");
  for (int i = 0; i < gpus; ++i) {
    const Device gpu{"cuda", i};
    configs.push_back({gpu.name(), gpu, {}});
  }
  if (gpus == 0) {
    static bool told = false;
    if (!told) {
      told = true;
      std::fprintf(stderr, "SKIPPED: cuda:N driver configurations: %s\n",
                   driver_kind("cuda").make ? "no CUDA device found" : "CUDA driver not built");
    }
  }
  return configs;
}

}  // namespace hn::test
