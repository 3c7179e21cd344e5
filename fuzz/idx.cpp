// IDX images and labels (raw or gzip, recognised by content) as a Data layer opens them:
// the input's first two bytes give the images file's length, the rest is the labels file.
// Every record the source reports is read.
#include <algorithm>
#include <string>

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t images = std::min<std::size_t>(size - 2, (data[0] << 8) | data[1]);
  const std::string path = hn::fuzz::write_file("train-images-idx3-ubyte", data + 2, images);
  hn::fuzz::write_file("train-labels-idx1-ubyte", data + 2 + images, size - 2 - images);
  hn::fuzz::accept_errors([&] { hn::fuzz::read_all_records(path); });
  return 0;
}
