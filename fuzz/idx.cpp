// IDX images and labels (raw or gzip, recognised by content) as a Data layer opens them:
// the input's first two bytes give the images file's length, the rest is the labels file.
// Every record the source reports is read.
#include <algorithm>
#include <string>

#include "fuzz/fuzz.h"
#include "lib/data/source.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t images = std::min<std::size_t>(size - 2, (data[0] << 8) | data[1]);
  const std::string path = hn::fuzz::write_file("train-images-idx3-ubyte", data + 2, images);
  hn::fuzz::write_file("train-labels-idx1-ubyte", data + 2 + images, size - 2 - images);
  hn::fuzz::accept_errors([&] {
    hn::detail::SourceOptions options;
    options.context = "fuzz";
    auto source = hn::detail::open_record_source(path, options);
    const std::size_t pixels = source->shape().count();
    volatile unsigned sum = 0;
    for (std::uint64_t i = 0; i < source->size(); ++i) {
      const hn::detail::RecordView view = source->read(i);
      for (std::size_t p = 0; p < pixels; ++p)
        sum = sum + view.bytes[p];
      sum = sum + static_cast<unsigned>(view.label);
    }
  });
  return 0;
}
