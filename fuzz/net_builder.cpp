// The net builder: a prototxt that parses must build (in both phases, on the reference
// driver) or fail with hn::Error. Host memory is limited to 64 MiB so that a net asking for
// more fails in the builder's size checks, with the layer and blob named, before anything is
// allocated (libFuzzer would report the allocation itself).
//
// The seeds' Data layers read Fashion-MNIST from /usr/share/datasets/fashion-mnist. Inflating
// those 55 MB for every input made the target ten times slower without reaching more of the
// builder (the idx target fuzzes that parser), so the target points that directory at gzip
// copies of its files' first 64 items, written once at start.
#include <zlib.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/drivers/builtin.h"
#include "lib/net/net.h"

namespace {

const std::string kDatasetDir = "/usr/share/datasets/fashion-mnist/";

// scratch_dir()/name: the IDX file's header and its first `items` items, gzip-compressed;
// nothing when the file is missing.
void write_head_of_idx(const std::string& name, std::uint32_t items) {
  gzFile in = gzopen((kDatasetDir + name).c_str(), "rb");
  if (in == nullptr) return;
  std::vector<unsigned char> head(1 << 16);
  const int got = gzread(in, head.data(), static_cast<unsigned>(head.size()));
  gzclose(in);
  if (got < 8) return;
  const int dims = head[3];
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(dims);
  std::size_t item_bytes = 1;
  for (int d = 1; d < dims; ++d) {
    const unsigned char* p = head.data() + 4 + 4 * d;
    item_bytes *= (std::size_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
  }
  head[4] = head[5] = head[6] = 0;
  head[7] = static_cast<unsigned char>(items);
  const std::size_t bytes = header + items * item_bytes;
  if (bytes > static_cast<std::size_t>(got)) std::abort();
  gzFile out = gzopen((hn::fuzz::scratch_dir() + "/" + name).c_str(), "wb");
  if (out == nullptr || gzwrite(out, head.data(), static_cast<unsigned>(bytes)) <= 0 ||
      gzclose(out) != Z_OK)
    std::abort();
}

// `text` with every mention of the dataset directory pointing at the small copies.
std::string with_small_datasets(std::string text) {
  const std::string small = hn::fuzz::scratch_dir() + "/";
  for (std::size_t at = text.find(kDatasetDir); at != std::string::npos;
       at = text.find(kDatasetDir, at + small.size()))
    text.replace(at, kDatasetDir.size(), small);
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hn::set_host_memory_limit(std::size_t{64} << 20);
  for (const char* set : {"train", "t10k"}) {
    write_head_of_idx(std::string(set) + "-images-idx3-ubyte.gz", 64);
    write_head_of_idx(std::string(set) + "-labels-idx1-ubyte.gz", 64);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hn::register_builtin_drivers();
  static hn::Runtime runtime;
  static hn::Driver& driver = runtime.add(hn::Device::parse("reference"));
  const std::string text =
      with_small_datasets(std::string(reinterpret_cast<const char*>(data), size));
  for (const hn::Phase phase : {hn::Phase::train, hn::Phase::test}) {
    hn::NetOptions options;
    options.state.phase = phase;
    hn::fuzz::accept_errors(
        [&] { hn::Net::from_text(text, "fuzz.prototxt", runtime, driver, options); });
  }
  return 0;
}
