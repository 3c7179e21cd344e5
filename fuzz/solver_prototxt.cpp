// Solver prototxt text, parsed as read_solver_prototxt parses a file.
#include <string>

#include "fuzz/fuzz.h"
#include "lib/proto/prototxt.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hn::fuzz::write_file("solver.prototxt", data, size);
  hn::fuzz::accept_errors([&] { hn::detail::read_solver_prototxt(path); });
  return 0;
}
