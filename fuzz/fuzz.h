// Shared by the libFuzzer targets (one per parser of outside input; scripts/fuzz.sh runs
// them). A target feeds its input to the parser and accepts exactly two outcomes: success
// or an hn::Error. Any other exception, a crash, a sanitizer report, a hang or an
// allocation past libFuzzer's limit is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "hybridnn/error.h"
#include "lib/data/source.h"

namespace hn::fuzz {

// A directory of this process's own for inputs that must be files (the parsers read paths);
// removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/hybridnn-fuzz.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    static const std::string removed = pattern;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(removed, ignored);
    });
    return pattern;
  }();
  return dir;
}

// Writes `size` bytes to scratch_dir()/name and returns the path.
inline std::string write_file(const std::string& name, const void* data, std::size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) std::abort();
  return path;
}

// The small net the caffemodel and solverstate targets load into (make_seeds.sh trains it
// for their seeds): a convolution, pooling and an inner product on DummyData.
inline const char* const kTrainNet =
    "name: 'fuzz'\n"
    "layer { name: 'data' type: 'DummyData' top: 'data' top: 'label'\n"
    "  dummy_data_param { shape { dim: 2 dim: 1 dim: 8 dim: 8 } shape { dim: 2 }\n"
    "    data_filler { type: 'gaussian' } } }\n"
    "layer { name: 'conv1' type: 'Convolution' bottom: 'data' top: 'conv1'\n"
    "  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'pool1' type: 'Pooling' bottom: 'conv1' top: 'pool1'\n"
    "  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n"
    "layer { name: 'ip1' type: 'InnerProduct' bottom: 'pool1' top: 'ip1'\n"
    "  inner_product_param { num_output: 2 weight_filler { type: 'xavier' } } }\n"
    "layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'ip1' bottom: 'label' top: 'loss' }\n";

// Runs `body`; an hn::Error is the parser's accepted way to refuse an input. Anything else
// propagates and libFuzzer reports it.
template <class F>
void accept_errors(F&& body) {
  try {
    body();
  } catch (const hn::Error&) {
  }
}

// Opens `path` as a Data layer's source (recognised by content) and reads every record it
// reports, every pixel and label of each.
inline void read_all_records(const std::string& path) {
  hn::detail::SourceOptions options;
  options.context = "fuzz";
  auto source = hn::detail::open_record_source(path, options);
  const std::size_t pixels = source->shape().count();
  volatile float sum = 0;
  for (std::uint64_t i = 0; i < source->size(); ++i) {
    const hn::detail::RecordView view = source->read(i);
    for (std::size_t p = 0; p < pixels; ++p)
      sum = sum + (view.bytes != nullptr ? view.bytes[p] : view.floats[p]);
    sum = sum + view.label;
  }
}

}  // namespace hn::fuzz
