// Main of the GPU-only tests. Without a GPU every run that would execute tests prints why and
// exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), never as passed. Listing still
// works, so catch_discover_tests registers the cases on any machine. (Catch2's implementation
// comes compiled from tests/catch_impl.cpp.)
#include <string>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"
#include "tests/catch_impl.h"

namespace {

// Why cuda:0 cannot be used, in the words of the driver factory; empty when it can.
std::string no_device_reason() {
  if (hn::device_count("cuda") > 0) return {};
  if (!hn::driver_kind("cuda").make) return "no CUDA device (this build has no CUDA driver)";
  try {
    hn::make_driver(hn::Device{"cuda", 0});
  } catch (const hn::Error& error) {
    return std::string("no CUDA device (") + error.what() + ")";
  }
  return "no CUDA device (the CUDA runtime reports no device)";
}

}  // namespace

int main(int argc, char** argv) {
  hn::register_builtin_drivers();
  return hn::test::run_catch_unless(argc, argv, no_device_reason);
}
