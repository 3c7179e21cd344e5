// A binary .caffemodel copied into a small net (kTrainNet): layer names, shapes, legacy
// 4-d blobs and V1 layers against the net's parameters.
#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"
#include "lib/net/net.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hn::register_builtin_drivers();
  static hn::Runtime runtime;
  static hn::Driver& driver = runtime.add(hn::Device::parse("reference"));
  static const std::unique_ptr<hn::Net> net = [] {
    hn::NetOptions options;
    options.state.phase = hn::Phase::test;
    return hn::Net::from_text(hn::fuzz::kTrainNet, "fuzz.prototxt", runtime, driver, options);
  }();
  const std::string path = hn::fuzz::write_file("fuzz.caffemodel", data, size);
  hn::fuzz::accept_errors([&] { net->copy_trained_layers_from(path); });
  return 0;
}
