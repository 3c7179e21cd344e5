// Catch2's implementation (about 25 s of a core to compile), compiled once for the test
// executables whose mains are test_main.cpp (C ABI tests), test_main_cxx.cpp (the rest) and
// cuda/cuda_test_main.cpp (the GPU's).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/catch_impl.h"

#include <cstdio>
#include <cstring>

namespace {

bool asks_to_list(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--list", 6) == 0) return true;
  }
  return false;
}

}  // namespace

int hn::test::run_catch(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}

int hn::test::run_catch_unless(int argc, char** argv,
                               const std::function<std::string()>& skip_reason) {
  Catch::Session session;
  const int status = session.applyCommandLine(argc, argv);
  if (status != 0) return status;
  if (!asks_to_list(argc, argv)) {
    const std::string reason = skip_reason();
    if (!reason.empty()) {
      const Catch::Config& config = session.config();
      const auto selected =
          Catch::filterTests(Catch::getAllTestCasesSorted(config), config.testSpec(), config);
      std::printf("SKIPPED: %zu test case(s): %s\n", selected.size(), reason.c_str());
      return kSkipReturnCode;
    }
  }
  return session.run();
}
