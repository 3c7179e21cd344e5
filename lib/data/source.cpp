// Recognising a data source by content, and the in-memory sources: IDX (MNIST /
// Fashion-MNIST, raw or gzip), CIFAR-10 binary files and generated ("synthetic") images.
#include "lib/data/source.h"

#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/files.h"
#include "lib/core/memory.h"
#include "lib/core/philox.h"
#include "lib/core/text.h"

namespace hn::detail {

namespace fs = std::filesystem;

std::string RecordShape::to_string() const {
  return fmt::format("{}x{}x{}", channels, height, width);
}

namespace {

constexpr std::size_t kCifarRecordBytes = 1 + 3 * 32 * 32;
constexpr std::uint64_t kSyntheticRecords = 1024;

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::uint32_t read_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

std::vector<std::uint8_t> read_whole_file(const std::string& path, const std::string& context) {
  // Regular files only: opening a FIFO would block until a writer comes, and a directory
  // has no size to read.
  std::ifstream file = open_input_file(path, context);
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  HN_CHECK(size >= 0, "{}: cannot read the size of '{}'", context, path);
  check_host_bytes(static_cast<std::size_t>(size),
                   [&] { return fmt::format("{}: reading data file '{}'", context, path); });
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  file.seekg(0);
  file.read(reinterpret_cast<char*>(bytes.data()), size);
  HN_CHECK(file.gcount() == size, "{}: read {} of the {} bytes of '{}'", context, file.gcount(),
           size, path);
  return bytes;
}

bool is_gzip(const std::vector<std::uint8_t>& bytes) {
  return bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
}

std::size_t saturating_mul(std::size_t a, std::size_t b) {
  return a != 0 && b > std::numeric_limits<std::size_t>::max() / a
             ? std::numeric_limits<std::size_t>::max()
             : a * b;
}

std::size_t saturating_add(std::size_t a, std::size_t b) {
  return b > std::numeric_limits<std::size_t>::max() - a ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

// Inflates a whole gzip file (concatenated members form one stream, as gzip(1) reads them),
// at most `limit` bytes: past it, `prefix` returns the first `limit` bytes (to read a
// header) and otherwise it fails, so a file that inflates without end (a "gzip bomb")
// stops where what it claims to hold ends.
std::vector<std::uint8_t> gunzip(const std::vector<std::uint8_t>& in, const std::string& path,
                                 const std::string& context, std::size_t limit,
                                 bool prefix = false) {
  z_stream stream{};
  HN_CHECK(inflateInit2(&stream, 16 + MAX_WBITS) == Z_OK, "{}: zlib cannot start inflating '{}'",
           context, path);
  struct End {
    z_stream* stream;
    ~End() { inflateEnd(stream); }
  } end{&stream};

  // The gzip trailer holds the uncompressed size modulo 2^32: a good guess of what to
  // reserve, unless the file is cut (then it is noise, bounded by deflate's 1032:1 ratio).
  std::vector<std::uint8_t> out;
  if (in.size() >= 4) {
    const std::uint8_t* t = in.data() + in.size() - 4;
    const std::size_t trailer = std::uint32_t{t[0]} | (std::uint32_t{t[1]} << 8) |
                                (std::uint32_t{t[2]} << 16) | (std::uint32_t{t[3]} << 24);
    const std::size_t guess = std::min({trailer, saturating_mul(in.size(), 1032), limit});
    if (guess <= host_memory_limit()) {
      try {
        out.reserve(guess);
      } catch (const std::bad_alloc&) {
        // Grown as it inflates instead, each step checked.
      }
    }
  }
  std::vector<std::uint8_t> chunk(std::size_t{1} << 18);
  constexpr std::size_t kMaxInput = std::size_t{1} << 30;  // avail_in is 32-bit
  std::size_t in_pos = 0;
  for (;;) {
    const std::size_t in_chunk = std::min(in.size() - in_pos, kMaxInput);
    stream.next_in = const_cast<Bytef*>(in.data() + in_pos);
    stream.avail_in = static_cast<uInt>(in_chunk);
    stream.next_out = chunk.data();
    stream.avail_out = static_cast<uInt>(chunk.size());
    const int rc = inflate(&stream, Z_NO_FLUSH);
    in_pos += in_chunk - stream.avail_in;
    const std::size_t produced = chunk.size() - stream.avail_out;
    check_host_bytes(out.size() + produced, [&] {
      return fmt::format("{}: inflating gzip file '{}' (at compressed byte offset {})", context,
                         path, in_pos);
    });
    try {
      out.insert(out.end(), chunk.data(), chunk.data() + produced);
    } catch (const std::bad_alloc&) {
      fail("{}: out of memory inflating gzip file '{}' past {} bytes", context, path,
           format_bytes(out.size() + produced));
    }
    if (out.size() > limit) {
      if (prefix) {
        out.resize(limit);
        return out;
      }
      fail(
          "{}: gzip file '{}' inflates to more than the {} bytes its content accounts for "
          "(stopped at compressed byte offset {}): corrupt, or not what it claims to be",
          context, path, limit, in_pos);
    }
    if (rc == Z_STREAM_END) {
      if (in.size() - in_pos >= 2 && in[in_pos] == 0x1f && in[in_pos + 1] == 0x8b) {
        inflateReset(&stream);
        continue;
      }
      break;  // trailing padding after the last member is ignored, as gzip(1) does
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && in_pos == in.size()) {
      fail(
          "{}: gzip file '{}' is truncated: the compressed stream ends early at byte offset {} "
          "(the end of the file) after {} decompressed bytes",
          context, path, in_pos, out.size());
    }
    fail(
        "{}: gzip file '{}' is corrupt at compressed byte offset {} (after {} decompressed bytes): "
        "{}",
        context, path, in_pos, out.size(), stream.msg != nullptr ? stream.msg : "zlib error");
  }
  out.shrink_to_fit();
  return out;
}

// IDX (LeCun's MNIST format): magic 0 0 type ndims, then ndims big-endian 32-bit sizes.
bool looks_like_idx(const std::vector<std::uint8_t>& bytes) {
  return bytes.size() >= 4 && bytes[0] == 0 && bytes[1] == 0 && bytes[2] >= 0x08 &&
         bytes[2] <= 0x0E && bytes[3] >= 1 && bytes[3] <= 4;
}

struct IdxFile {
  std::uint32_t magic = 0;
  std::vector<std::uint64_t> dims;
  std::size_t header_bytes = 0;
  std::size_t expected_bytes = 0;  // header + payload, for unsigned-byte elements
};

IdxFile parse_idx_header(const std::vector<std::uint8_t>& bytes) {
  IdxFile idx;
  if (bytes.size() < 4) return idx;
  idx.magic = read_be32(bytes.data());
  const int ndims = bytes[3];
  idx.header_bytes = 4 + 4 * static_cast<std::size_t>(ndims);
  if (bytes.size() < idx.header_bytes) return idx;
  // Sizes a header claims may multiply past 2^64: saturated, they compare as "more than the
  // file holds" instead of wrapping around.
  std::size_t payload = 1;
  for (int d = 0; d < ndims; ++d) {
    idx.dims.push_back(read_be32(bytes.data() + 4 + 4 * d));
    payload = saturating_mul(payload, static_cast<std::size_t>(idx.dims.back()));
  }
  idx.expected_bytes = saturating_add(idx.header_bytes, payload);
  return idx;
}

// Reads an unsigned-byte IDX file with the expected magic; `item` names one entry
// ("image", "label") in errors.
struct LoadedIdx {
  std::vector<std::uint8_t> bytes;  // the whole (decompressed) file
  IdxFile header;
};

LoadedIdx parse_idx(const std::string& path, std::vector<std::uint8_t> file, std::uint32_t magic,
                    const char* item, const std::string& context) {
  LoadedIdx loaded;
  loaded.bytes = std::move(file);
  const bool gzipped = is_gzip(loaded.bytes);
  if (gzipped) {
    // The header first, then no more than it accounts for.
    const std::vector<std::uint8_t> head = gunzip(loaded.bytes, path, context, 4 + 4 * 4, true);
    const IdxFile claimed = parse_idx_header(head);
    if (!looks_like_idx(head) || head.size() < claimed.header_bytes) {
      loaded.bytes = head;  // enough for the errors below
    } else {
      // The whole file is held decompressed: a header claiming more than memory allows is
      // refused before inflating anything.
      check_host_bytes(claimed.expected_bytes, [&] {
        return fmt::format("{}: gzip IDX file '{}' ({}s of {}, as its header claims)", context,
                           path, item, fmt::join(claimed.dims, "x"));
      });
      loaded.bytes = gunzip(loaded.bytes, path, context, claimed.expected_bytes);
    }
  }
  const char* unit = gzipped ? " (decompressed)" : "";
  const auto& bytes = loaded.bytes;
  HN_CHECK(looks_like_idx(bytes), "{}: '{}' is not an IDX file{}: it starts with {} bytes {}",
           context, path, unit, std::min<std::size_t>(bytes.size(), 4),
           bytes.size() >= 4 ? fmt::format("0x{:08x}", read_be32(bytes.data())) : "(too short)");
  IdxFile& idx = loaded.header;
  idx = parse_idx_header(bytes);
  HN_CHECK(bytes.size() >= idx.header_bytes,
           "{}: IDX file '{}' is truncated: its header needs {} bytes, the file{} holds {} (ends "
           "at byte offset {})",
           context, path, idx.header_bytes, unit, bytes.size(), bytes.size());
  const int ndims = static_cast<int>(magic & 0xff);
  HN_CHECK(idx.magic == magic,
           "{}: IDX file '{}' has magic 0x{:08x}; expected 0x{:08x} (unsigned-byte {}s, {} "
           "dimension{})",
           context, path, idx.magic, magic, item, ndims, ndims == 1 ? "" : "s");
  const std::size_t item_bytes =
      ndims == 1 ? 1 : saturating_mul(static_cast<std::size_t>(idx.dims[1]), idx.dims[2]);
  HN_CHECK(item_bytes > 0, "{}: IDX file '{}' claims {}s of {}x{}: empty", context, path, item,
           idx.dims[1], idx.dims[2]);
  const std::string what =
      ndims == 1 ? fmt::format("{} {}s", idx.dims[0], item)
                 : fmt::format("{} {}s of {}x{}", idx.dims[0], item, idx.dims[1], idx.dims[2]);
  if (bytes.size() < idx.expected_bytes) {
    const std::size_t complete = (bytes.size() - idx.header_bytes) / item_bytes;
    fail(
        "{}: IDX file '{}' is truncated: its header says {} ({} bytes) but the file{} holds {} "
        "bytes; {} {} at byte offset {} is incomplete",
        context, path, what, idx.expected_bytes, unit, bytes.size(), item, complete,
        idx.header_bytes + complete * item_bytes);
  }
  HN_CHECK(bytes.size() == idx.expected_bytes,
           "{}: IDX file '{}' holds {} bytes{}, {} more than its header's {} ({} bytes); extra "
           "data starts at byte offset {}",
           context, path, bytes.size(), unit, bytes.size() - idx.expected_bytes, what,
           idx.expected_bytes, idx.expected_bytes);
  return loaded;
}

LoadedIdx load_idx(const std::string& path, std::uint32_t magic, const char* item,
                   const std::string& context) {
  return parse_idx(path, read_whole_file(path, context), magic, item, context);
}

// The labels file beside an IDX images file: "images-idx3" -> "labels-idx1" (or
// "images.idx3" -> "labels.idx1") in the file name, with or without ".gz".
std::string idx_labels_path(const std::string& images_path, const std::string& context) {
  const fs::path images(images_path);
  const std::string name = images.filename().string();
  const std::pair<const char*, const char*> renames[] = {{"images-idx3", "labels-idx1"},
                                                         {"images.idx3", "labels.idx1"}};
  for (const auto& [from, to] : renames) {
    const std::size_t at = name.rfind(from);
    if (at == std::string::npos) continue;
    std::string labels_name = name;
    labels_name.replace(at, std::strlen(from), to);
    const std::string labels = (images.parent_path() / labels_name).string();
    if (fs::exists(labels)) return labels;
    const std::string other =
        ends_with(labels, ".gz") ? labels.substr(0, labels.size() - 3) : labels + ".gz";
    if (fs::exists(other)) return other;
    fail("{}: the labels of IDX images '{}' should be in '{}', which does not exist", context,
         images_path, labels);
  }
  fail(
      "{}: cannot find the labels of IDX images '{}': its file name contains neither "
      "'images-idx3' nor 'images.idx3' (the labels file is found by replacing that with "
      "'labels-idx1' / 'labels.idx1')",
      context, images_path);
}

// Records held in one byte buffer: record i's pixels start at first + i * stride.
class MemorySource final : public RecordSource {
 public:
  MemorySource(const char* kind, std::string path, RecordShape shape,
               std::vector<std::uint8_t> bytes, std::size_t first, std::size_t stride,
               std::vector<float> labels)
      : kind_(kind),
        path_(std::move(path)),
        shape_(shape),
        bytes_(std::move(bytes)),
        first_(first),
        stride_(stride),
        labels_(std::move(labels)) {}

  const char* kind() const override { return kind_; }
  const std::string& path() const override { return path_; }
  std::uint64_t size() const override { return labels_.size(); }
  RecordShape shape() const override { return shape_; }
  RecordView read(std::uint64_t index) override {
    RecordView view;
    view.bytes = bytes_.data() + first_ + index * stride_;
    view.label = labels_[index];
    return view;
  }

 private:
  const char* kind_;
  std::string path_;
  RecordShape shape_;
  std::vector<std::uint8_t> bytes_;
  std::size_t first_, stride_;
  std::vector<float> labels_;
};

std::unique_ptr<RecordSource> open_idx(const std::string& path, LoadedIdx images,
                                       const std::string& context) {
  const std::string labels_path = idx_labels_path(path, context);
  const LoadedIdx labels = load_idx(labels_path, 0x00000801, "label", context);
  const std::uint64_t count = images.header.dims[0];
  HN_CHECK(count > 0, "{}: IDX file '{}' holds no images", context, path);
  HN_CHECK(labels.header.dims[0] == count,
           "{}: IDX images '{}' hold {} images but the labels '{}' hold {} labels", context, path,
           count, labels_path, labels.header.dims[0]);
  const auto height = images.header.dims[1], width = images.header.dims[2];
  const auto limit = static_cast<std::uint64_t>(std::numeric_limits<int>::max());
  HN_CHECK(height > 0 && width > 0 && height < limit && width < limit,
           "{}: IDX file '{}' has images of {}x{}", context, path, height, width);
  std::vector<float> label_values(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    label_values[i] = labels.bytes[labels.header.header_bytes + i];
  }
  const RecordShape shape{1, static_cast<int>(height), static_cast<int>(width)};
  const std::size_t first = images.header.header_bytes;
  return std::make_unique<MemorySource>("IDX", path, shape, std::move(images.bytes), first,
                                        shape.count(), std::move(label_values));
}

void check_cifar_size(const std::string& path, std::size_t size, const std::string& context) {
  HN_CHECK(size > 0, "{}: CIFAR-10 file '{}' is empty", context, path);
  const std::size_t records = size / kCifarRecordBytes;
  HN_CHECK(size % kCifarRecordBytes == 0,
           "{}: CIFAR-10 file '{}' is truncated: {} bytes is not a multiple of the {}-byte record; "
           "record {} at byte offset {} has {} of its {} bytes",
           context, path, size, kCifarRecordBytes, records, records * kCifarRecordBytes,
           size % kCifarRecordBytes, kCifarRecordBytes);
}

// CIFAR-10 binary: records of a label byte and 3x32x32 CHW pixels; files are concatenated.
std::unique_ptr<RecordSource> open_cifar(const std::string& source,
                                         const std::vector<std::string>& paths,
                                         const std::string& context) {
  std::vector<std::uint8_t> bytes;
  for (const std::string& path : paths) {
    std::vector<std::uint8_t> file = read_whole_file(path, context);
    HN_CHECK(!is_gzip(file),
             "{}: '{}' is gzip-compressed; CIFAR-10 binary files are read uncompressed", context,
             path);
    check_cifar_size(path, file.size(), context);
    if (bytes.empty()) {
      bytes = std::move(file);
    } else {
      bytes.insert(bytes.end(), file.begin(), file.end());
    }
  }
  const std::size_t count = bytes.size() / kCifarRecordBytes;
  std::vector<float> labels(count);
  for (std::size_t i = 0; i < count; ++i)
    labels[i] = bytes[i * kCifarRecordBytes];
  return std::make_unique<MemorySource>("CIFAR-10", source, RecordShape{3, 32, 32},
                                        std::move(bytes), 1, kCifarRecordBytes, std::move(labels));
}

// Generated records for timing nets without a dataset: pixel j of record i is byte j % 4 of
// philox_bits(i, j / 4); the label is i % classes.
class SyntheticSource final : public RecordSource {
 public:
  SyntheticSource(std::string spec, RecordShape shape, int classes)
      : spec_(std::move(spec)), shape_(shape), classes_(classes), pixels_(shape.count()) {}

  const char* kind() const override { return "synthetic"; }
  const std::string& path() const override { return spec_; }
  std::uint64_t size() const override { return kSyntheticRecords; }
  RecordShape shape() const override { return shape_; }
  RecordView read(std::uint64_t index) override {
    const std::size_t count = pixels_.size();
    for (std::size_t j = 0; j < count; j += 4) {
      const std::uint32_t bits = philox_bits(index, j / 4);
      for (std::size_t k = 0; k < 4 && j + k < count; ++k) {
        pixels_[j + k] = static_cast<std::uint8_t>(bits >> (8 * k));
      }
    }
    RecordView view;
    view.bytes = pixels_.data();
    view.label = static_cast<float>(index % static_cast<std::uint64_t>(classes_));
    return view;
  }

 private:
  std::string spec_;
  RecordShape shape_;
  int classes_;
  std::vector<std::uint8_t> pixels_;
};

std::unique_ptr<RecordSource> open_synthetic(const std::string& spec, const std::string& context) {
  int channels = 0, height = 0, width = 0, classes = 10, consumed = 0;
  const char* text = spec.c_str() + std::strlen("synthetic:");
  const int fields = std::sscanf(text, "%dx%dx%d%n", &channels, &height, &width, &consumed);
  bool ok = fields == 3 && channels > 0 && height > 0 && width > 0;
  if (ok && text[consumed] != '\0') {
    int more = 0;
    ok = std::sscanf(text + consumed, ":%d%n", &classes, &more) == 1 &&
         text[consumed + more] == '\0' && classes > 0;
  }
  HN_CHECK(ok,
           "{}: bad synthetic source '{}': expected 'synthetic:CxHxW' or "
           "'synthetic:CxHxW:classes' with positive sizes",
           context, spec);
  return std::make_unique<SyntheticSource>(spec, RecordShape{channels, height, width}, classes);
}

std::unique_ptr<RecordSource> open_database(const std::string& dir, const SourceOptions& options) {
  const std::string& context = options.context;
  const bool lmdb = input_exists(dir + "/data.mdb");
  const bool leveldb = input_exists(dir + "/CURRENT");
  if (options.leveldb_backend || (leveldb && !lmdb)) {
    fail(
        "{}: '{}' is {}: LevelDB is not supported by this build; `hybridnn convert` writes an "
        "LMDB (set backend: LMDB)",
        context, dir,
        options.leveldb_backend ? "a database with backend LEVELDB" : "a LevelDB database");
  }
  HN_CHECK(lmdb, "{}: directory '{}' is not an LMDB database: it holds no data.mdb", context, dir);
  // liblmdb opens data.mdb itself: a FIFO there would block it.
  check_input_path(dir + "/data.mdb", fmt::format("{}: LMDB", context), InputKind::file);
  return open_lmdb_source(dir, context);
}

}  // namespace

std::unique_ptr<RecordSource> open_record_source(const std::string& source,
                                                 const SourceOptions& options) {
  const std::string& context = options.context;
  HN_CHECK(!source.empty(), "{}: no data source (data_param.source is empty)", context);
  if (source.rfind("synthetic:", 0) == 0) return open_synthetic(source, context);

  std::error_code error;
  if (source.find(',') != std::string::npos && !fs::exists(source, error)) {
    return open_cifar(source, split_commas(source, EmptyItems::keep), context);
  }
  // A symlink loop, a missing path, a FIFO each say so.
  check_input_path(source, fmt::format("{}: data source", context), InputKind::file_or_directory);
  if (fs::is_directory(fs::status(source, error))) return open_database(source, options);

  std::vector<std::uint8_t> bytes = read_whole_file(source, context);
  // Content decides; the ".bin" of CIFAR-10's file names only breaks ties. Datasets ship
  // gzip-compressed IDX files; CIFAR-10 ships a tarball, never single .gz files.
  const bool cifar_size = !bytes.empty() && bytes.size() % kCifarRecordBytes == 0;
  const bool idx = looks_like_idx(bytes);
  const bool idx_consistent = idx && parse_idx_header(bytes).expected_bytes == bytes.size();
  if (is_gzip(bytes) || idx_consistent || (idx && !cifar_size && !ends_with(source, ".bin"))) {
    return open_idx(source, parse_idx(source, std::move(bytes), 0x00000803, "image", context),
                    context);
  }
  if (cifar_size || ends_with(source, ".bin")) return open_cifar(source, {source}, context);
  fail(
      "{}: '{}' is not a recognised data source: not a directory holding data.mdb (LMDB), not "
      "an IDX file (it starts with 0x{:08x}), not CIFAR-10 binary ({} bytes is not a multiple of "
      "{})",
      context, source, bytes.size() >= 4 ? read_be32(bytes.data()) : 0u, bytes.size(),
      kCifarRecordBytes);
}

}  // namespace hn::detail
