// A CIFAR-10 binary file (or whatever the source recognises the bytes as) under a CIFAR
// name; every record is read.
#include <string>

#include "fuzz/fuzz.h"
#include "lib/data/source.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hn::fuzz::write_file("data_batch_1.bin", data, size);
  hn::fuzz::accept_errors([&] {
    hn::detail::SourceOptions options;
    options.context = "fuzz";
    auto source = hn::detail::open_record_source(path, options);
    const std::size_t pixels = source->shape().count();
    volatile float sum = 0;
    for (std::uint64_t i = 0; i < source->size(); ++i) {
      const hn::detail::RecordView view = source->read(i);
      for (std::size_t p = 0; p < pixels; ++p)
        sum = sum + (view.bytes != nullptr ? view.bytes[p] : view.floats[p]);
    }
  });
  return 0;
}
