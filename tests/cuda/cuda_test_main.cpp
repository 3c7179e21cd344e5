// Catch2 main of the GPU-only tests. Without a GPU every run that would execute tests prints
// why and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
// Listing still works, so catch_discover_tests registers the cases on any machine.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <string>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"

namespace {

constexpr int kSkipReturnCode = 77;

bool asks_to_list(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0) return true;
  }
  return false;
}

// Why cuda:0 cannot be used, in the words of the driver factory.
std::string no_device_reason() {
  if (!hn::driver_kind("cuda").make) return "this build has no CUDA driver";
  try {
    hn::make_driver(hn::Device{"cuda", 0});
  } catch (const hn::Error& error) {
    return error.what();
  }
  return "the CUDA runtime reports no device";
}

}  // namespace

int main(int argc, char** argv) {
  hn::register_builtin_drivers();
  Catch::Session session;
  const int status = session.applyCommandLine(argc, argv);
  if (status != 0) return status;
  if (!asks_to_list(argc, argv) && hn::device_count("cuda") == 0) {
    const Catch::Config& config = session.config();
    const auto selected =
        Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
    std::printf("SKIPPED: %zu CUDA test case(s): no CUDA device (%s)\n", selected.size(),
                no_device_reason().c_str());
    return kSkipReturnCode;
  }
  return session.run();
}
