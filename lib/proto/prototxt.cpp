// Readers and writers of Caffe-format protobuf files, with errors that point at the file
// and position rather than protobuf's default logging to stderr.
#include "lib/proto/prototxt.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "lib/core/check.h"
#include "lib/core/files.h"

namespace hn::detail {

namespace {

// A whole prototxt or binary proto file. Only regular files: a directory would read as an
// empty or garbled message and a FIFO would block; and nothing past protobuf's 2 GiB limit
// (its sizes are ints), refused before reading it.
std::string read_file(const std::string& path) {
  check_input_path(path, "read", InputKind::file);
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  HN_CHECK(!error, "cannot read the size of '{}': {}", path, error.message());
  HN_CHECK(size <= static_cast<std::uintmax_t>(std::numeric_limits<int>::max()),
           "'{}' is {} bytes, over the 2 GiB limit of a protobuf message", path, size);
  std::ifstream file(path, std::ios::binary);
  HN_CHECK(file.is_open(), "cannot open '{}' for reading", path);
  std::string contents(static_cast<std::size_t>(size), '\0');
  file.read(contents.data(), static_cast<std::streamsize>(size));
  HN_CHECK(!file.bad() && file.gcount() == static_cast<std::streamsize>(size),
           "error while reading '{}': {} of {} bytes read", path, file.gcount(), size);
  return contents;
}

// Keeps the first error (protobuf reports 0-based positions) instead of logging it.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(std::string path) : path_(std::move(path)) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!first_) first_ = fmt::format("{}:{}:{}: {}", path_, line + 1, column + 1, message);
  }
  // Warnings (e.g. deprecated fields) do not stop parsing and are not errors.
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}

  const std::optional<std::string>& first() const { return first_; }

 private:
  std::string path_;
  std::optional<std::string> first_;
};

// A stream that ends once the parser has reported an error: protobuf's tokenizer goes on
// reading after a bad character, which on a 3 GiB file of NUL bytes read it all.
class UntilError : public google::protobuf::io::ZeroCopyInputStream {
 public:
  UntilError(google::protobuf::io::ZeroCopyInputStream& in, const FirstErrorCollector& errors)
      : in_(in), errors_(errors) {}
  bool Next(const void** data, int* size) override {
    return !errors_.first() && in_.Next(data, size);
  }
  void BackUp(int count) override { in_.BackUp(count); }
  bool Skip(int count) override { return !errors_.first() && in_.Skip(count); }
  std::int64_t ByteCount() const override { return in_.ByteCount(); }

 private:
  google::protobuf::io::ZeroCopyInputStream& in_;
  const FirstErrorCollector& errors_;
};

}  // namespace

void read_text_proto(const std::string& path, google::protobuf::Message& message) {
  // Streamed: a huge file that is not text fails at its first bad token, not after it was
  // read whole.
  std::ifstream file = open_input_file(path, "read");
  google::protobuf::io::IstreamInputStream file_stream(&file);
  FirstErrorCollector errors(path);
  UntilError stream(file_stream, errors);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.Parse(&stream, &message)) {
    HN_CHECK(!file.bad(), "error while reading '{}'", path);
    if (errors.first()) throw Error(*errors.first());
    fail("{}: not a valid {} in text format", path, message.GetTypeName());
  }
}

void parse_text_proto(const std::string& text, const std::string& path,
                      google::protobuf::Message& message) {
  FirstErrorCollector errors(path);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &message)) {
    if (errors.first()) throw Error(*errors.first());
    fail("{}: not a valid {} in text format", path, message.GetTypeName());
  }
}

std::vector<Device> split_devices(const hybridnn::proto::NetParameter& net) {
  std::vector<Device> devices;
  const auto add = [&devices](const hybridnn::proto::SplitEntry& entry) {
    try {
      const Device device = Device::parse(entry.device());
      if (std::find(devices.begin(), devices.end(), device) == devices.end())
        devices.push_back(device);
    } catch (const Error&) {
      // Building the net names the layer and the entry.
    }
  };
  for (const hybridnn::proto::SplitEntry& entry : net.split())
    add(entry);
  for (const hybridnn::proto::LayerParameter& layer : net.layer()) {
    for (const hybridnn::proto::SplitEntry& entry : layer.split())
      add(entry);
  }
  return devices;
}

hybridnn::proto::NetParameter read_net_prototxt(const std::string& path) {
  hybridnn::proto::NetParameter net;
  read_text_proto(path, net);
  return net;
}

hybridnn::proto::NetParameter parse_net_prototxt(const std::string& text,
                                                 const std::string& origin) {
  hybridnn::proto::NetParameter net;
  parse_text_proto(text, origin, net);
  return net;
}

hybridnn::proto::SolverParameter read_solver_prototxt(const std::string& path) {
  hybridnn::proto::SolverParameter solver;
  read_text_proto(path, solver);
  return solver;
}

void read_binary_proto(const std::string& path, google::protobuf::Message& message) {
  const std::string bytes = read_file(path);
  // .caffemodel files of large nets exceed protobuf's 64 MiB default limit (Caffe lifts
  // it too); the limit is an int, so files up to 2 GiB are readable.
  HN_CHECK(bytes.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
           "'{}' is {} bytes, over the 2 GiB limit of a protobuf message", path, bytes.size());
  google::protobuf::io::ArrayInputStream stream(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream input(&stream);
  input.SetTotalBytesLimit(std::numeric_limits<int>::max());
  message.Clear();
  HN_CHECK(message.ParseFromCodedStream(&input) && input.ConsumedEntireMessage(),
           "'{}' ({} bytes) is truncated or not a binary {}", path, bytes.size(),
           message.GetTypeName());
}

void write_binary_proto(const std::string& path, const google::protobuf::Message& message) {
  std::string bytes;
  HN_CHECK(message.SerializeToString(&bytes), "cannot serialise {} for '{}'", message.GetTypeName(),
           path);
  replace_file(path, bytes, fmt::format("writing {}", message.GetTypeName()));
}

Shape shape_of(const hybridnn::proto::BlobShape& shape) {
  return Shape(std::vector<index_t>(shape.dim().begin(), shape.dim().end()));
}

Shape blob_shape(const hybridnn::proto::BlobProto& blob) {
  if (blob.has_shape()) return shape_of(blob.shape());
  return Shape({blob.num(), blob.channels(), blob.height(), blob.width()});
}

bool blob_shape_matches(const hybridnn::proto::BlobProto& blob, const Shape& shape) {
  if (blob.has_shape()) return shape_of(blob.shape()) == shape;
  if (shape.axes() > 4) return false;
  std::vector<index_t> legacy(4, 1);
  for (int i = 0; i < shape.axes(); ++i)
    legacy[4 - shape.axes() + i] = shape[i];
  return legacy == std::vector<index_t>{blob.num(), blob.channels(), blob.height(), blob.width()};
}

}  // namespace hn::detail
