// An ONNX model file read into a net (issue 37): ONNX's checker and shape inference, then
// the importer's converters, initializers inline and their sizes, attributes of every type.
// The importer must turn anything malformed into an hn::Error.
#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"
#include "lib/net/net.h"

// A model's shapes may ask for any size: past 64 MiB the library's own limit refuses them as
// an hn::Error (as the net builder's target sets it), where libFuzzer's RSS limit would end
// the run.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hn::set_host_memory_limit(std::size_t{64} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hn::register_builtin_drivers();
  static hn::Runtime runtime;
  static hn::Driver& driver = runtime.add(hn::Device::parse("reference"));
  const std::string path = hn::fuzz::write_file("fuzz.onnx", data, size);
  hn::NetOptions options;
  options.state.phase = hn::Phase::test;
  hn::fuzz::accept_errors([&] { hn::Net net(path, runtime, driver, options); });
  return 0;
}
