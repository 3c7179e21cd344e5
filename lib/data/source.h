// Record sources behind a data feed and `convert`: where the records come from (an LMDB of
// Datum records, IDX files, CIFAR-10 binary files, generated images) and how one is read by
// its index. The source is recognised by content; errors start with the caller's context
// ("layer 'mnist' (Data)") and name the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace hybridnn::proto {
class Datum;
}

namespace hn::detail {

struct RecordShape {
  int channels = 0, height = 0, width = 0;

  std::size_t count() const {
    return static_cast<std::size_t>(channels) * static_cast<std::size_t>(height) *
           static_cast<std::size_t>(width);
  }
  std::string to_string() const;  // "3x32x32"
  friend bool operator==(const RecordShape& a, const RecordShape& b) {
    return a.channels == b.channels && a.height == b.height && a.width == b.width;
  }
  friend bool operator!=(const RecordShape& a, const RecordShape& b) { return !(a == b); }
};

// One record's CHW pixels, as bytes or as floats (exactly one is set), and its label.
struct RecordView {
  const std::uint8_t* bytes = nullptr;
  const float* floats = nullptr;
  float label = 0;
};

class RecordSource {
 public:
  virtual ~RecordSource() = default;
  virtual const char* kind() const = 0;  // "LMDB", "IDX", "CIFAR-10", "synthetic"
  virtual const std::string& path() const = 0;
  virtual std::uint64_t size() const = 0;
  virtual RecordShape shape() const = 0;
  // Record `index` (< size()); the view is valid until the next read. Not thread-safe: one
  // thread at a time reads. Reading index i+1 after i is the cheap case (an LMDB cursor).
  virtual RecordView read(std::uint64_t index) = 0;
};

struct SourceOptions {
  std::string context;  // prefix of every error message
  // The layer asked for backend LEVELDB: a database directory is then an error.
  bool leveldb_backend = false;
};

// Recognises and opens `source`: a directory holding data.mdb (LMDB), an IDX images file
// (raw or gzip; its labels file beside it), CIFAR-10 binary files (comma-separated), or
// "synthetic:CxHxW[:classes]".
std::unique_ptr<RecordSource> open_record_source(const std::string& source,
                                                 const SourceOptions& options);

// One LMDB value as a Caffe Datum: parsed into `datum`, checked (raw pixels, positive
// dimensions, as many pixels as they need, and the shape `first` when given) and returned as
// a view into `datum`. Errors start with `where` ("layer 'data' (Data): LMDB 'x': record 3
// (key '00000003')").
RecordView decode_datum(const void* bytes, std::size_t size, hybridnn::proto::Datum& datum,
                        const RecordShape* first, const std::string& where);

// The LMDB reader (lmdb_store.cpp); `dir` holds data.mdb.
std::unique_ptr<RecordSource> open_lmdb_source(const std::string& dir, const std::string& context);

}  // namespace hn::detail
