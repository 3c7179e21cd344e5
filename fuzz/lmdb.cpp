// An LMDB data file (data.mdb) as a Data layer's source: the structural check, then
// liblmdb's cursor over every record and the Datum decode of each.
#include <filesystem>
#include <string>

#include "fuzz/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = [] {
    std::string path = hn::fuzz::scratch_dir() + "/lmdb";
    std::filesystem::create_directories(path);
    return path;
  }();
  hn::fuzz::write_file("lmdb/data.mdb", data, size);
  hn::fuzz::accept_errors([&] { hn::fuzz::read_all_records(dir); });
  return 0;
}
