// Net prototxt text (and Caffe's V0/V1 upgrades, which parse_net_prototxt applies).
#include <string>

#include "fuzz/fuzz.h"
#include "lib/proto/prototxt.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  hn::fuzz::accept_errors([&] { hn::detail::parse_net_prototxt(text, "fuzz.prototxt"); });
  return 0;
}
