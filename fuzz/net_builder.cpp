// The net builder: a prototxt that parses must build (in both phases, on the reference
// driver) or fail with hn::Error. Host memory is limited to 64 MiB so that a net asking for
// more fails in the builder's size checks, with the layer and blob named, before anything is
// allocated (libFuzzer would report the allocation itself).
#include <string>

#include "fuzz/fuzz.h"
#include "hybridnn/memory.h"
#include "hybridnn/net.h"
#include "hybridnn/runtime.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hn::set_host_memory_limit(std::size_t{64} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static hn::Runtime runtime;
  static hn::Driver& driver = runtime.add(hn::Device::parse("reference"));
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const hn::Phase phase : {hn::Phase::train, hn::Phase::test}) {
    hn::NetOptions options;
    options.state.phase = phase;
    hn::fuzz::accept_errors(
        [&] { hn::Net::from_text(text, "fuzz.prototxt", runtime, driver, options); });
  }
  return 0;
}
