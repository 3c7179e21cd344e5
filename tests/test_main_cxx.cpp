// The main of the tests on the library's C++ API: the built-in drivers registered first, as
// every program on that API does (test_main.cpp is the C ABI tests').
#include "lib/drivers/builtin.h"
#include "tests/catch_impl.h"

int main(int argc, char** argv) {
  hn::register_builtin_drivers();
  return hn::test::run_catch(argc, argv);
}
