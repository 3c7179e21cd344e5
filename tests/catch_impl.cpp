// Catch2's implementation (about 25 s of a core to compile), compiled once for the test
// executables whose mains are test_main.cpp (C ABI tests) and test_main_cxx.cpp (the rest).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/catch_impl.h"

int hn::test::run_catch(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
