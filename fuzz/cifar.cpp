// A CIFAR-10 binary file (or whatever the source recognises the bytes as) under a CIFAR
// name; every record is read.
#include <string>

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = hn::fuzz::write_file("data_batch_1.bin", data, size);
  hn::fuzz::accept_errors([&] { hn::fuzz::read_all_records(path); });
  return 0;
}
