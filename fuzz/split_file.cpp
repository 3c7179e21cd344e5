// The split format: a split as text (--split, a layer's split) and the per-layer file that
// --split-save writes and --split-file reads.
#include <string>
#include <string_view>

#include "fuzz/fuzz.h"
#include "lib/drivers/builtin.h"
#include "lib/scheduler/split.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hn::register_builtin_drivers();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hn::fuzz::accept_errors([&] {
    const hn::Split split = hn::Split::parse(text);
    // What parses prints as text that parses to the same split.
    if (hn::Split::parse(split.to_string()).to_string() != split.to_string()) std::abort();
  });
  const std::string path = hn::fuzz::write_file("splits.txt", data, size);
  hn::fuzz::accept_errors([&] { hn::read_layer_splits(path); });
  return 0;
}
