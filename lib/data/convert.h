// Converting datasets to Caffe's LMDB of Datum records (the tool's `convert`): part of the
// C++ API that programs built with the library use (lib/capi/hybridnn.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace hn::detail {

// `hybridnn convert`: writes the records of `source` (IDX images file with its labels beside
// it, or CIFAR-10 binary files, comma-separated) into a new LMDB directory of Datum
// records with keys "%08d". Shuffles with `seed` when shuffle is set. Calls progress(done,
// total) now and then. Refuses to overwrite an existing non-empty directory.
struct ConvertOptions {
  bool shuffle = false;
  std::uint64_t seed = 1;
  std::string mean_file;  // non-empty: also writes the mean image as a .binaryproto
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};
void convert_to_lmdb(const std::string& source, const std::string& lmdb_path,
                     const ConvertOptions& options = {});

}  // namespace hn::detail
