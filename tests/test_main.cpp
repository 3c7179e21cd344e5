// The main of the C ABI's tests (the C ABI registers the built-in drivers itself).
#include "tests/catch_impl.h"

int main(int argc, char** argv) {
  return hn::test::run_catch(argc, argv);
}
