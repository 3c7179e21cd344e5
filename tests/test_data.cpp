// Data feeds and `convert`: IDX, CIFAR-10, LMDB and synthetic sources, Caffe's transform_param,
// wrap-around, seeking, prefetching and error messages. Fixtures are written here with zlib,
// LMDB and protobuf directly; expected batches come from naive per-pixel loops.
#include <lmdb.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "hybridnn.pb.h"
#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/philox.h"
#include "lib/data/convert.h"
#include "lib/data/data.h"
#include "lib/data/lmdb_check.h"
#include "lib/data/lmdb_store.h"
#include "lib/data/source.h"
#include "tests/support.h"

namespace Catch {
template <>
struct StringMaker<hn::Shape> {
  static std::string convert(const hn::Shape& shape) { return shape.to_string(); }
};
}  // namespace Catch

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using hn::detail::DataFeed;
using hn::detail::FeedOptions;
using hn::test::TempDir;

// Images with CHW pixels and labels.
struct Images {
  int n = 0, c = 0, h = 0, w = 0;
  std::vector<std::uint8_t> pixels;  // n * c * h * w
  std::vector<int> labels;

  int count() const { return c * h * w; }
  float pixel(int r, int ch, int y, int x) const {
    return pixels[((static_cast<std::size_t>(r) * c + ch) * h + y) * w + x];
  }
};

Images random_images(int n, int c, int h, int w, unsigned seed, int classes = 10) {
  Images images{n, c, h, w, {}, {}};
  std::mt19937 rng(seed);
  images.pixels.resize(static_cast<std::size_t>(n) * c * h * w);
  for (auto& p : images.pixels)
    p = static_cast<std::uint8_t>(rng() & 0xff);
  for (int i = 0; i < n; ++i)
    images.labels.push_back(static_cast<int>(rng() % classes));
  return images;
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  REQUIRE(file.good());
}

void write_gzip(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

void put_be32(std::vector<std::uint8_t>& bytes, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    bytes.push_back((value >> shift) & 0xff);
}

std::vector<std::uint8_t> idx_images_bytes(const Images& images) {
  std::vector<std::uint8_t> bytes;
  put_be32(bytes, 0x00000803);
  put_be32(bytes, images.n);
  put_be32(bytes, images.h);
  put_be32(bytes, images.w);
  bytes.insert(bytes.end(), images.pixels.begin(), images.pixels.end());
  return bytes;
}

std::vector<std::uint8_t> idx_labels_bytes(const std::vector<int>& labels) {
  std::vector<std::uint8_t> bytes;
  put_be32(bytes, 0x00000801);
  put_be32(bytes, static_cast<std::uint32_t>(labels.size()));
  for (int label : labels)
    bytes.push_back(static_cast<std::uint8_t>(label));
  return bytes;
}

// Writes PREFIX-images-idx3-ubyte[.gz] and PREFIX-labels-idx1-ubyte[.gz]; returns the images.
std::string write_idx(const TempDir& dir, const std::string& prefix, const Images& images,
                      bool gzip_images, bool gzip_labels) {
  const std::string path = dir.file(prefix + "-images-idx3-ubyte" + (gzip_images ? ".gz" : ""));
  const std::string labels = dir.file(prefix + "-labels-idx1-ubyte" + (gzip_labels ? ".gz" : ""));
  (gzip_images ? write_gzip : write_file)(path, idx_images_bytes(images));
  (gzip_labels ? write_gzip : write_file)(labels, idx_labels_bytes(images.labels));
  return path;
}

std::string write_cifar(const TempDir& dir, const std::string& name, const Images& images,
                        int first, int count) {
  std::vector<std::uint8_t> bytes;
  for (int r = first; r < first + count; ++r) {
    bytes.push_back(static_cast<std::uint8_t>(images.labels[r]));
    const auto begin = images.pixels.begin() + static_cast<std::ptrdiff_t>(r) * images.count();
    bytes.insert(bytes.end(), begin, begin + images.count());
  }
  const std::string path = dir.file(name);
  write_file(path, bytes);
  return path;
}

// An LMDB written with LMDB's own API, in the given (not necessarily sorted) key order.
void write_lmdb(const std::string& dir,
                const std::vector<std::pair<std::string, hybridnn::proto::Datum>>& records,
                std::size_t map_bytes = std::size_t{1} << 26) {
  fs::create_directories(dir);
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == MDB_SUCCESS);
  REQUIRE(mdb_env_set_mapsize(env, map_bytes) == MDB_SUCCESS);
  REQUIRE(mdb_env_open(env, dir.c_str(), 0, 0664) == MDB_SUCCESS);
  MDB_txn* txn = nullptr;
  REQUIRE(mdb_txn_begin(env, nullptr, 0, &txn) == MDB_SUCCESS);
  MDB_dbi dbi;
  REQUIRE(mdb_dbi_open(txn, nullptr, 0, &dbi) == MDB_SUCCESS);
  for (const auto& [key, datum] : records) {
    std::string value = datum.SerializeAsString();
    MDB_val k{key.size(), const_cast<char*>(key.data())};
    MDB_val v{value.size(), value.data()};
    REQUIRE(mdb_put(txn, dbi, &k, &v, 0) == MDB_SUCCESS);
  }
  REQUIRE(mdb_txn_commit(txn) == MDB_SUCCESS);
  mdb_env_close(env);
}

// Calls body(txn, dbi) in a read-only transaction on the main database of the LMDB in `dir`,
// opened with LMDB's own API.
template <class Body>
void in_read_txn(const std::string& dir, Body&& body) {
  MDB_env* env = nullptr;
  REQUIRE(mdb_env_create(&env) == MDB_SUCCESS);
  REQUIRE(mdb_env_open(env, dir.c_str(), MDB_RDONLY, 0664) == MDB_SUCCESS);
  MDB_txn* txn = nullptr;
  REQUIRE(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn) == MDB_SUCCESS);
  MDB_dbi dbi;
  REQUIRE(mdb_dbi_open(txn, nullptr, 0, &dbi) == MDB_SUCCESS);
  body(txn, dbi);
  mdb_txn_abort(txn);
  mdb_env_close(env);
}

// Every (key, Datum) of an LMDB in key order, read with LMDB's own API.
std::vector<std::pair<std::string, hybridnn::proto::Datum>> read_lmdb(const std::string& dir) {
  std::vector<std::pair<std::string, hybridnn::proto::Datum>> records;
  in_read_txn(dir, [&](MDB_txn* txn, MDB_dbi dbi) {
    MDB_cursor* cursor = nullptr;
    REQUIRE(mdb_cursor_open(txn, dbi, &cursor) == MDB_SUCCESS);
    MDB_val k, v;
    for (int rc = mdb_cursor_get(cursor, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT)) {
      hybridnn::proto::Datum datum;
      REQUIRE(datum.ParseFromArray(v.mv_data, static_cast<int>(v.mv_size)));
      records.emplace_back(std::string(static_cast<const char*>(k.mv_data), k.mv_size), datum);
    }
    mdb_cursor_close(cursor);
  });
  return records;
}

hybridnn::proto::Datum byte_datum(const Images& images, int r) {
  hybridnn::proto::Datum datum;
  datum.set_channels(images.c);
  datum.set_height(images.h);
  datum.set_width(images.w);
  datum.set_data(images.pixels.data() + static_cast<std::size_t>(r) * images.count(),
                 images.count());
  datum.set_label(images.labels[r]);
  return datum;
}

hybridnn::proto::LayerParameter data_layer(const std::string& source, int batch, int tops = 2) {
  hybridnn::proto::LayerParameter layer;
  layer.set_name("feed");
  layer.set_type("Data");
  layer.add_top("data");
  if (tops == 2) layer.add_top("label");
  layer.mutable_data_param()->set_source(source);
  layer.mutable_data_param()->set_batch_size(static_cast<unsigned>(batch));
  return layer;
}

FeedOptions options_for(hn::Phase phase, int prefetch, std::uint64_t seed = 0) {
  FeedOptions options;
  options.phase = phase;
  options.prefetch = prefetch;
  options.seed = seed;
  return options;
}

struct Batch {
  std::vector<float> data, labels;
  friend bool operator==(const Batch& a, const Batch& b) {
    return a.data == b.data && a.labels == b.labels;
  }
};

Batch next_batch(DataFeed& feed) {
  const auto shapes = feed.top_shapes();
  Batch batch;
  batch.data.resize(static_cast<std::size_t>(shapes[0].count()));
  std::vector<float*> tops = {batch.data.data()};
  if (shapes.size() == 2) {
    batch.labels.resize(static_cast<std::size_t>(shapes[1].count()));
    tops.push_back(batch.labels.data());
  }
  feed.next(tops);
  return batch;
}

std::vector<Batch> first_batches(DataFeed& feed, int count) {
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i)
    batches.push_back(next_batch(feed));
  return batches;
}

// Caffe's transform of record r written from the output side: output (c, y, x) reads input
// (c, h_off + y, w_off + x), or w_off + (width - 1 - x) when mirrored.
struct Transform {
  float scale = 1;
  std::vector<float> mean;  // per input pixel, empty for none
  int crop = 0, h_off = 0, w_off = 0;
  bool mirror = false;
};

std::vector<float> naive_transform(const Images& images, int r, const Transform& t) {
  const int oh = t.crop > 0 ? t.crop : images.h, ow = t.crop > 0 ? t.crop : images.w;
  std::vector<float> out(static_cast<std::size_t>(images.c) * oh * ow);
  for (int c = 0; c < images.c; ++c) {
    for (int y = 0; y < oh; ++y) {
      for (int x = 0; x < ow; ++x) {
        const int sy = t.h_off + y, sx = t.w_off + (t.mirror ? ow - 1 - x : x);
        const float mean =
            t.mean.empty() ? 0.0f
                           : t.mean[(static_cast<std::size_t>(c) * images.h + sy) * images.w + sx];
        out[(static_cast<std::size_t>(c) * oh + y) * ow + x] =
            (images.pixel(r, c, sy, sx) - mean) * t.scale;
      }
    }
  }
  return out;
}

// The batch `b` of `batch` records, each transformed by `t`, wrapping around the images.
Batch expected_batch(const Images& images, int b, int batch, const Transform& t) {
  Batch expected;
  for (int i = 0; i < batch; ++i) {
    const int r = (b * batch + i) % images.n;
    const std::vector<float> image = naive_transform(images, r, t);
    expected.data.insert(expected.data.end(), image.begin(), image.end());
    expected.labels.push_back(static_cast<float>(images.labels[r]));
  }
  return expected;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const hn::Error& error) {
    return error.what();
  }
  FAIL("expected an hn::Error");
  return {};
}

std::string blob_bytes(const hybridnn::proto::BlobProto& blob) {
  return blob.SerializeAsString();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("IDX images raw and gzip give hand-computed batches that wrap around the records") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(5, 1, 3, 4, 1);
  const auto [gzip_images, gzip_labels] =
      GENERATE(std::make_tuple(false, false), std::make_tuple(true, true),
               std::make_tuple(true, false), std::make_tuple(false, true));
  const int prefetch = GENERATE(0, 3);
  CAPTURE(gzip_images, gzip_labels, prefetch);
  const std::string path = write_idx(dir, "digits", images, gzip_images, gzip_labels);
  auto layer = data_layer(path, 2);
  layer.mutable_transform_param()->set_scale(0.5f);
  auto feed = hn::detail::open_data_feed(layer, options_for(hn::Phase::test, prefetch));
  REQUIRE(feed->top_shapes() == std::vector<hn::Shape>{hn::Shape{2, 1, 3, 4}, hn::Shape{2}});
  Transform t;
  t.scale = 0.5f;
  // Five records in batches of two: batch 2 holds records 4 and 0, batch 7 records 4 and 0.
  for (int b = 0; b < 8; ++b) {
    CAPTURE(b);
    CHECK(next_batch(*feed) == expected_batch(images, b, 2, t));
  }
  CHECK_THAT(feed->describe(), Contains("layer 'feed' (Data)") && Contains("IDX") &&
                                   Contains(path) && Contains("(5 records)"));
}

TEST_CASE("CIFAR-10 files given comma-separated are one stream of 3x32x32 CHW records") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(5, 3, 32, 32, 2);
  const std::string first = write_cifar(dir, "data_batch_1.bin", images, 0, 3);
  const std::string second = write_cifar(dir, "data_batch_2.bin", images, 3, 2);
  const int prefetch = GENERATE(0, 2);
  auto feed = hn::detail::open_data_feed(data_layer(first + "," + second, 4),
                                         options_for(hn::Phase::train, prefetch));
  REQUIRE(feed->top_shapes() == std::vector<hn::Shape>{hn::Shape{4, 3, 32, 32}, hn::Shape{4}});
  for (int b = 0; b < 4; ++b)
    CHECK(next_batch(*feed) == expected_batch(images, b, 4, {}));
  CHECK_THAT(feed->describe(), Contains("CIFAR-10") && Contains("(5 records)"));
}

TEST_CASE(
    "an LMDB of hand-made Datum records is read in key order with uint8 and float_data alike") {
  TempDir dir("hybridnn-data");
  // Four 2x2x3 records; b and d carry float_data, a and c bytes. Inserted out of key order.
  const Images images = random_images(4, 2, 2, 3, 3);
  auto datum = [&](int r, bool floats) {
    hybridnn::proto::Datum d = byte_datum(images, r);
    if (floats) {
      d.clear_data();
      for (int i = 0; i < images.count(); ++i) {
        d.add_float_data(images.pixels[static_cast<std::size_t>(r) * images.count() + i]);
      }
    }
    return d;
  };
  const std::string db = dir.file("db");
  write_lmdb(db, {{"c", datum(2, false)},
                  {"a", datum(0, false)},
                  {"d", datum(3, true)},
                  {"b", datum(1, true)}});
  auto layer = data_layer(db, 3);
  layer.mutable_data_param()->set_backend(hybridnn::proto::DataParameter::LMDB);
  layer.mutable_transform_param()->set_scale(2.0f);
  layer.mutable_transform_param()->add_mean_value(10.0f);
  layer.mutable_transform_param()->add_mean_value(20.5f);
  const int prefetch = GENERATE(0, 2);
  auto feed = hn::detail::open_data_feed(layer, options_for(hn::Phase::test, prefetch));
  Transform t;
  t.scale = 2.0f;
  t.mean.assign(12, 10.0f);
  std::fill(t.mean.begin() + 6, t.mean.end(), 20.5f);
  for (int b = 0; b < 5; ++b)
    CHECK(next_batch(*feed) == expected_batch(images, b, 3, t));
  CHECK_THAT(feed->describe(), Contains("LMDB") && Contains(db) && Contains("(4 records)"));

  SECTION("float_data keeps values that are not bytes") {
    write_lmdb(dir.file("floats"), {{"x", [] {
                                       hybridnn::proto::Datum d;
                                       d.set_channels(1);
                                       d.set_height(1);
                                       d.set_width(2);
                                       d.add_float_data(-1.25f);
                                       d.add_float_data(300.5f);
                                       d.set_label(7);
                                       return d;
                                     }()}});
    auto floats = hn::detail::open_data_feed(data_layer(dir.file("floats"), 2),
                                             options_for(hn::Phase::test, prefetch));
    const Batch batch = next_batch(*floats);
    CHECK(batch.data == std::vector<float>{-1.25f, 300.5f, -1.25f, 300.5f});
    CHECK(batch.labels == std::vector<float>{7, 7});
  }
}

namespace {

// The process's virtual memory size, from /proc/self/status (VmSize, in bytes).
std::uint64_t virtual_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

}  // namespace

TEST_CASE("reading an LMDB maps what its file holds, not the writer's 1 TiB map size") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(3, 1, 2, 2, 4);
  const std::string db = dir.file("db");
  // Caffe's convert_imageset records a map size of 1 TiB in the file, as ours does.
  write_lmdb(db, {{"a", byte_datum(images, 0)}, {"b", byte_datum(images, 1)}},
             std::size_t{1} << 40);
  const std::uint64_t before = virtual_bytes();
  REQUIRE(before > 0);
  auto feed = hn::detail::open_data_feed(data_layer(db, 2), options_for(hn::Phase::test, 0));
  next_batch(*feed);
  // The file is a few pages; a 1 TiB map would add 2^40 to VmSize (and fail under ulimit -v).
  CHECK(virtual_bytes() - before < (std::uint64_t{1} << 36));
}

TEST_CASE("the LMDB writer maps little address space and grows its map as records need") {
  TempDir dir("hybridnn-data");
  const std::string db = dir.file("db");
  std::filesystem::create_directories(db);
  const std::uint64_t before = virtual_bytes();
  {
    // Caffe's (and our former) 1 TiB map failed under `ulimit -v`; 64 MiB by default now.
    hn::detail::LmdbWriter writer(db, "convert");
    CHECK(writer.map_size() == std::size_t{64} << 20);
    CHECK(virtual_bytes() - before < (std::uint64_t{1} << 30));
  }
  std::filesystem::remove_all(db);
  std::filesystem::create_directories(db);
  // 1 MiB to start, 3000 records of 3 KiB in three commits: the map doubles to 16 MiB, each
  // full commit redone whole, and every record reads back.
  const Images images = random_images(3000, 3, 32, 32, 4);
  {
    hn::detail::LmdbWriter writer(db, "convert", std::size_t{1} << 20);
    for (int k = 0; k < 3000; ++k) {
      writer.put(std::to_string(100000 + k), byte_datum(images, k).SerializeAsString());
      if ((k + 1) % 1000 == 0) writer.commit();
    }
    CHECK(writer.map_size() == std::size_t{16} << 20);
  }
  auto source = hn::detail::open_record_source(db, {"test", false});
  REQUIRE(source->size() == 3000);
  for (const int k : {0, 999, 1000, 2999}) {
    const hn::detail::RecordView record = source->read(static_cast<std::uint64_t>(k));
    REQUIRE(record.bytes != nullptr);
    CHECK(std::equal(record.bytes, record.bytes + 3072, images.pixels.begin() + k * 3072));
    CHECK(record.label == static_cast<float>(images.labels[static_cast<std::size_t>(k)]));
  }
}

namespace {

// The bytes of a file, and writing them back.
std::vector<std::uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void overwrite(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// liblmdb's own statistics of an LMDB's main database.
MDB_stat lmdb_stat(const std::string& dir) {
  MDB_stat stat{};
  in_read_txn(
      dir, [&](MDB_txn* txn, MDB_dbi dbi) { REQUIRE(mdb_stat(txn, dbi, &stat) == MDB_SUCCESS); });
  return stat;
}

// Reads every record of the LMDB in `dir` as the Data layer does; "" or the hn::Error.
std::string read_whole_lmdb(const std::string& dir) {
  try {
    auto source = hn::detail::open_record_source(dir, {"test", false});
    for (std::uint64_t i = 0; i < source->size(); ++i)
      source->read(i);
  } catch (const hn::Error& error) {
    return error.what();
  }
  return {};
}

// Hand-made corruption, in liblmdb 0.9's 64-bit layout: page p at p * 4096, 16-byte page
// headers (number, pad, flags, lower, upper), node offsets after them; a meta page's main
// database record at 88 (its root page at 88 + 40), its transaction id at 144.
constexpr std::size_t kPage = 4096;

template <class T>
T get(const std::vector<std::uint8_t>& bytes, std::size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof value);
  return value;
}
template <class T>
void set(std::vector<std::uint8_t>& bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

// The first page with `flags` (2: leaf, 1: branch) past the meta pages.
std::size_t first_page(const std::vector<std::uint8_t>& bytes, std::uint16_t flags) {
  for (std::size_t p = 2; p < bytes.size() / kPage; ++p) {
    if ((get<std::uint16_t>(bytes, p * kPage + 10) & flags) != 0) return p;
  }
  FAIL("no page with flags " << flags);
  return 0;
}

// The meta page a reader opens: the one with the later transaction id.
std::size_t reader_meta(const std::vector<std::uint8_t>& bytes) {
  return get<std::uint64_t>(bytes, 144) < get<std::uint64_t>(bytes, kPage + 144) ? kPage : 0;
}

// Two LMDBs in `dir`: "small", 60 records of 1x28x28 (values in the leaves, a branch above
// them), and "large", 3 records of 3x48x48 (values on overflow pages of 2 pages each).
void write_small_and_large_lmdb(const TempDir& dir) {
  for (const auto& [name, images] : {std::pair{"small", random_images(60, 1, 28, 28, 4)},
                                     std::pair{"large", random_images(3, 3, 48, 48, 5)}}) {
    std::vector<std::pair<std::string, hybridnn::proto::Datum>> records;
    for (int r = 0; r < images.n; ++r)
      records.emplace_back(std::to_string(1000 + r), byte_datum(images, r));
    write_lmdb(dir.file(name), records);
  }
}

}  // namespace

TEST_CASE("the LMDB check walks the tree liblmdb reads and agrees with its statistics") {
  TempDir dir("hybridnn-data");
  write_small_and_large_lmdb(dir);
  for (const char* name : {"small", "large"}) {
    INFO(name);
    const std::vector<std::uint8_t> bytes = file_bytes(dir.file(name) + "/data.mdb");
    const hn::detail::LmdbLayout layout =
        hn::detail::check_lmdb_image(bytes.data(), bytes.size(), name);
    const MDB_stat stat = lmdb_stat(dir.file(name));
    CHECK(layout.page_size == stat.ms_psize);
    CHECK(layout.entries == stat.ms_entries);
    CHECK(layout.depth == stat.ms_depth);
    CHECK(layout.tree_pages == stat.ms_branch_pages + stat.ms_leaf_pages);
    CHECK(layout.overflow_pages == stat.ms_overflow_pages);
  }
  CHECK(lmdb_stat(dir.file("small")).ms_depth == 2);
  CHECK(lmdb_stat(dir.file("large")).ms_overflow_pages == 6);
}

TEST_CASE("a corrupt LMDB file fails with an error naming the page at fault, never a crash") {
  TempDir dir("hybridnn-data");
  write_small_and_large_lmdb(dir);
  const std::vector<std::uint8_t> small_file = file_bytes(dir.file("small") + "/data.mdb");
  const std::vector<std::uint8_t> large_file = file_bytes(dir.file("large") + "/data.mdb");
  const std::string db = dir.file("db");
  fs::create_directories(db);
  // Writes `bytes` as the database `db` (a fresh lock file each time).
  const auto install = [&](const std::vector<std::uint8_t>& bytes) {
    fs::remove(db + "/lock.mdb");
    overwrite(db + "/data.mdb", bytes);
  };
  install(small_file);
  REQUIRE(read_whole_lmdb(db).empty());

  SECTION("a root page past the file's end") {
    std::vector<std::uint8_t> bytes = small_file;
    set<std::uint64_t>(bytes, reader_meta(bytes) + 88 + 40, 100000);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db), Contains(db + "/data.mdb") && Contains("root page") &&
                                        Contains("page 100000, outside the file's pages"));
  }
  SECTION("a node offset past its page's end") {
    std::vector<std::uint8_t> bytes = small_file;
    const std::size_t leaf = first_page(bytes, 2);
    set<std::uint16_t>(bytes, leaf * kPage + 16, 4094);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db),
               Contains("page " + std::to_string(leaf) + " (leaf page at level 2 of 2)") &&
                   Contains("node 0 is at offset 4094"));
  }
  SECTION("a branch that points back at itself") {
    std::vector<std::uint8_t> bytes = small_file;
    const std::size_t branch = first_page(bytes, 1);
    const auto node = get<std::uint16_t>(bytes, branch * kPage + 16 + 2);  // node 1
    set<std::uint16_t>(bytes, branch * kPage + node, static_cast<std::uint16_t>(branch));
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db),
               Contains("depth 2 puts a leaf page here") || Contains("reached twice"));
  }
  SECTION("a leaf that points back at an earlier leaf") {
    // Branch node 1's child made node 0's: liblmdb would read that leaf twice.
    std::vector<std::uint8_t> bytes = small_file;
    const std::size_t branch = first_page(bytes, 1);
    const auto node0 = get<std::uint16_t>(bytes, branch * kPage + 16);
    const auto node1 = get<std::uint16_t>(bytes, branch * kPage + 18);
    const auto leaf = get<std::uint16_t>(bytes, branch * kPage + node0);
    set<std::uint16_t>(bytes, branch * kPage + node1, leaf);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db),
               Contains("page " + std::to_string(leaf) + " is reached twice in the tree"));
  }
  SECTION("a later transaction id on the page of the other parity") {
    // Found by fuzz_lmdb (SIGBUS in mdb_cursor_get): with a lock file, a reader takes meta
    // page (latest id & 1), which a corrupt id can make the other page than the later one.
    std::vector<std::uint8_t> bytes = small_file;
    const std::size_t later = reader_meta(bytes), other = later == 0 ? kPage : 0;
    // The later meta page gets an id of the other page's parity; the other page a root
    // outside the file.
    const std::uint64_t id = get<std::uint64_t>(bytes, later + 144) + 1;
    set<std::uint64_t>(bytes, later + 144, (id & 1) == (other / kPage) ? id : id + 1);
    set<std::uint64_t>(bytes, other + 88 + 40, 100000);
    install(bytes);
    // (The other page of a one-commit file is the empty first snapshot: its depth 0 no longer
    // fits a root, the first thing checked.)
    CHECK_THAT(read_whole_lmdb(db), Contains("meta page " + std::to_string(other / kPage)));
  }
  SECTION("a record count the tree does not hold") {
    std::vector<std::uint8_t> bytes = small_file;
    set<std::uint64_t>(bytes, reader_meta(bytes) + 88 + 32, 61);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db), Contains("the tree holds 60 records, but meta page"));
  }
  SECTION("a value's overflow pages past the file's end") {
    std::vector<std::uint8_t> bytes = large_file;
    const std::size_t leaf = first_page(bytes, 2);
    const auto node = get<std::uint16_t>(bytes, leaf * kPage + 16);
    const auto key_size = get<std::uint16_t>(bytes, leaf * kPage + node + 6);
    REQUIRE((get<std::uint16_t>(bytes, leaf * kPage + node + 4) & 1) == 1);  // F_BIGDATA
    set<std::uint64_t>(bytes, leaf * kPage + node + 8 + key_size, bytes.size() / kPage - 1);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db),
               Contains("node 0's value of") && Contains("runs past the file's last page"));
  }
  SECTION("no LMDB magic, a wrong page size, a file cut short") {
    std::vector<std::uint8_t> bytes = small_file;
    set<std::uint32_t>(bytes, 16, 0x12345678);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db), Contains("page 0 is not an LMDB meta page"));
    bytes = small_file;
    set<std::uint32_t>(bytes, 40, 3000);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db), Contains("states a page size of 3000 bytes"));
    bytes.assign(small_file.begin(), small_file.begin() + 3 * kPage);
    install(bytes);
    CHECK_THAT(read_whole_lmdb(db), Contains("outside the file's pages 2 to 2"));
  }
  SECTION("random bytes flipped: an error or the records, never a crash") {
    // The case: 4 of 30 such files crashed liblmdb. Flips land anywhere in a tree
    // page (the meta pages, the branch, the leaves) or, for the large file, anywhere.
    std::mt19937 rng(11);
    int refused = 0, read = 0;
    for (int attempt = 0; attempt < 400; ++attempt) {
      const bool large_one = attempt % 4 == 3;
      std::vector<std::uint8_t> bytes = large_one ? large_file : small_file;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        const std::size_t page = rng() % (bytes.size() / kPage);
        // Headers and node offsets are in a page's first bytes, nodes in its last.
        const std::size_t in_page = rng() % 2 == 0 ? rng() % 64 : kPage - 1 - rng() % 1024;
        bytes[page * kPage + in_page] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      }
      install(bytes);
      (read_whole_lmdb(db).empty() ? read : refused) += 1;
    }
    INFO(refused << " refused, " << read << " read");
    CHECK(refused > 40);
    CHECK(read > 40);
  }
}

TEST_CASE("scale and mean_value and mean_file and the centred test crop match a naive loop") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(3, 3, 32, 32, 4);
  const std::string source = write_cifar(dir, "test_batch.bin", images, 0, 3);
  auto layer = data_layer(source, 3);
  auto* transform = layer.mutable_transform_param();
  transform->set_scale(0.0078125f);
  Transform t;
  t.scale = 0.0078125f;
  FeedOptions options = options_for(hn::Phase::test, 2);

  std::vector<float> mean_image(3 * 32 * 32);
  std::mt19937 rng(5);
  for (float& m : mean_image)
    m = static_cast<float>(rng() % 25600) / 100.0f;
  hybridnn::proto::BlobProto legacy_blob;  // as Caffe's compute_image_mean writes it
  legacy_blob.set_num(1);
  legacy_blob.set_channels(3);
  legacy_blob.set_height(32);
  legacy_blob.set_width(32);
  for (float m : mean_image)
    legacy_blob.add_data(m);
  write_text(dir.file("mean.binaryproto"), blob_bytes(legacy_blob));
  hybridnn::proto::BlobProto shaped_blob;
  for (int d : {1, 3, 32, 32})
    shaped_blob.mutable_shape()->add_dim(d);
  for (float m : mean_image)
    shaped_blob.add_double_data(m);
  write_text(dir.file("shaped.binaryproto"), blob_bytes(shaped_blob));

  SECTION("scale only") {}
  SECTION("one mean_value for every channel") {
    transform->add_mean_value(127.5f);
    t.mean.assign(mean_image.size(), 127.5f);
  }
  SECTION("a mean_value per channel") {
    for (float m : {104.0f, 117.0f, 123.0f})
      transform->add_mean_value(m);
    t.mean.resize(mean_image.size());
    const float per_channel[] = {104.0f, 117.0f, 123.0f};
    for (int c = 0; c < 3; ++c)
      std::fill_n(t.mean.begin() + c * 1024, 1024, per_channel[c]);
  }
  SECTION("mean_file with legacy dimensions") {
    transform->set_mean_file(dir.file("mean.binaryproto"));
    t.mean = mean_image;
  }
  SECTION("mean_file with a shape and double data, given as an option") {
    transform->set_mean_file(dir.file("missing.binaryproto"));
    options.mean_file = dir.file("shaped.binaryproto");
    t.mean = mean_image;
  }
  SECTION("the mean_file option none drops the mean") {
    transform->set_mean_file(dir.file("missing.binaryproto"));
    options.mean_file = "none";
  }
  SECTION("centre crop 28 in test, mirror ignored, with the mean of the uncropped pixels") {
    transform->set_crop_size(28);
    transform->set_mirror(true);
    transform->set_mean_file(dir.file("mean.binaryproto"));
    t.mean = mean_image;
    t.crop = 28;
    t.h_off = t.w_off = 2;
  }
  SECTION("an odd margin rounds the centre offset down") {
    transform->set_crop_size(27);
    t.crop = 27;
    t.h_off = t.w_off = 2;
  }
  auto feed = hn::detail::open_data_feed(layer, options);
  const int side = t.crop > 0 ? t.crop : 32;
  REQUIRE(feed->top_shapes()[0] == hn::Shape{3, 3, side, side});
  for (int b = 0; b < 2; ++b)
    CHECK(next_batch(*feed) == expected_batch(images, b, 3, t));
}

TEST_CASE("train-phase crops and mirrors are valid and varied and reproducible and seekable") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(7, 1, 8, 9, 6);
  const std::string source = write_idx(dir, "train", images, true, true);
  auto layer = data_layer(source, 3);
  layer.mutable_transform_param()->set_crop_size(5);
  layer.mutable_transform_param()->set_mirror(true);
  layer.mutable_transform_param()->set_scale(0.25f);
  auto reference = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, 0, 42));
  const std::vector<Batch> batches = first_batches(*reference, 12);

  // Every image is the naive transform of its record for some offsets and mirror in range.
  std::set<std::tuple<int, int, bool>> seen;
  for (int b = 0; b < 12; ++b) {
    for (int i = 0; i < 3; ++i) {
      const int r = (b * 3 + i) % 7;
      const std::vector<float> got(batches[b].data.begin() + i * 25,
                                   batches[b].data.begin() + (i + 1) * 25);
      bool found = false;
      for (int h_off = 0; h_off <= 3 && !found; ++h_off) {
        for (int w_off = 0; w_off <= 4 && !found; ++w_off) {
          for (bool mirror : {false, true}) {
            const Transform t{0.25f, {}, 5, h_off, w_off, mirror};
            if (naive_transform(images, r, t) == got) {
              found = true;
              seen.emplace(h_off, w_off, mirror);
              break;
            }
          }
        }
      }
      CAPTURE(b, i);
      CHECK(found);
      CHECK(batches[b].labels[i] == static_cast<float>(images.labels[r]));
    }
  }
  CHECK(seen.size() >= 8);
  CHECK(std::count_if(seen.begin(), seen.end(), [](const auto& s) { return std::get<2>(s); }) > 0);
  CHECK(std::count_if(seen.begin(), seen.end(), [](const auto& s) { return !std::get<2>(s); }) > 0);

  const int prefetch = GENERATE(0, 1, 3);
  CAPTURE(prefetch);
  auto again = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, prefetch, 42));
  CHECK(first_batches(*again, 12) == batches);
  for (int b : {7, 2, 9, 0, 11, 4}) {
    CAPTURE(b);
    again->seek(static_cast<std::uint64_t>(b));
    CHECK(next_batch(*again) == batches[b]);
    if (b + 1 < 12) CHECK(next_batch(*again) == batches[b + 1]);
  }
  auto other_seed = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, prefetch, 43));
  CHECK(first_batches(*other_seed, 12) != batches);
}

TEST_CASE("convert writes IDX records as Datum in an LMDB that reads like the IDX itself") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(23, 1, 5, 6, 7);
  const std::string source = write_idx(dir, "t10k", images, true, true);
  const std::string db = dir.file("t10k_lmdb");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> progress;
  hn::detail::ConvertOptions options;
  options.mean_file = dir.file("mean.binaryproto");
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    progress.emplace_back(done, total);
  };
  hn::detail::convert_to_lmdb(source, db, options);
  REQUIRE(!progress.empty());
  CHECK(progress.back() == std::make_pair(std::uint64_t{23}, std::uint64_t{23}));

  // Read back with LMDB's own API: keys "%08d", raw bytes and labels in order.
  const auto records = read_lmdb(db);
  REQUIRE(records.size() == 23);
  for (int r = 0; r < 23; ++r) {
    char key[16];
    std::snprintf(key, sizeof key, "%08d", r);
    CHECK(records[r].first == key);
    const auto& datum = records[r].second;
    CHECK(datum.SerializeAsString() == byte_datum(images, r).SerializeAsString());
  }

  // The mean image as compute_image_mean writes it.
  hybridnn::proto::BlobProto mean;
  std::ifstream file(options.mean_file, std::ios::binary);
  REQUIRE(mean.ParseFromIstream(&file));
  CHECK(std::make_tuple(mean.num(), mean.channels(), mean.height(), mean.width()) ==
        std::make_tuple(1, 1, 5, 6));
  REQUIRE(mean.data_size() == 30);
  for (int i = 0; i < 30; ++i) {
    double sum = 0;
    for (int r = 0; r < 23; ++r)
      sum += images.pixels[static_cast<std::size_t>(r) * 30 + i];
    CHECK(mean.data(i) == Approx(sum / 23).epsilon(1e-6));
  }

  // The feed over the LMDB equals the feed over the IDX files, seeking back and forth too.
  const int prefetch = GENERATE(0, 2);
  auto layer = data_layer(db, 4);
  layer.mutable_transform_param()->set_crop_size(4);
  layer.mutable_transform_param()->set_mirror(true);
  auto from_lmdb = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, prefetch, 3));
  layer.mutable_data_param()->set_source(source);
  auto from_idx = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, prefetch, 3));
  const auto expected = first_batches(*from_idx, 14);
  CHECK(first_batches(*from_lmdb, 14) == expected);
  for (int b : {3, 1, 12, 5, 0}) {
    from_lmdb->seek(static_cast<std::uint64_t>(b));
    CHECK(next_batch(*from_lmdb) == expected[b]);
  }

  SECTION("shuffling is a deterministic permutation of the records") {
    auto shuffled_records = [&](const std::string& name, std::uint64_t seed) {
      hn::detail::ConvertOptions shuffle;
      shuffle.shuffle = true;
      shuffle.seed = seed;
      hn::detail::convert_to_lmdb(source, dir.file(name), shuffle);
      std::vector<std::string> values;
      for (const auto& [key, datum] : read_lmdb(dir.file(name))) {
        values.push_back(datum.SerializeAsString());
      }
      return values;
    };
    const auto a = shuffled_records("a", 9), b = shuffled_records("b", 9);
    const auto c = shuffled_records("c", 10);
    std::vector<std::string> plain;
    for (const auto& [key, datum] : records)
      plain.push_back(datum.SerializeAsString());
    CHECK(a == b);
    CHECK(a != plain);
    CHECK(a != c);
    CHECK(std::multiset<std::string>(a.begin(), a.end()) ==
          std::multiset<std::string>(plain.begin(), plain.end()));
  }
}

TEST_CASE("convert writes CIFAR-10 files as one LMDB that reads like the files themselves") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(7, 3, 32, 32, 15);
  const std::string source = write_cifar(dir, "data_batch_1.bin", images, 0, 4) + "," +
                             write_cifar(dir, "data_batch_2.bin", images, 4, 3);
  hn::detail::convert_to_lmdb(source, dir.file("cifar_lmdb"));
  const auto records = read_lmdb(dir.file("cifar_lmdb"));
  REQUIRE(records.size() == 7);
  for (int r = 0; r < 7; ++r) {
    CHECK(records[r].second.SerializeAsString() == byte_datum(images, r).SerializeAsString());
  }
  auto layer = data_layer(dir.file("cifar_lmdb"), 3);
  layer.mutable_transform_param()->set_crop_size(30);
  layer.mutable_transform_param()->set_mirror(true);
  auto from_lmdb = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, 2, 8));
  layer.mutable_data_param()->set_source(source);
  auto from_files = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, 0, 8));
  CHECK(first_batches(*from_lmdb, 6) == first_batches(*from_files, 6));
}

TEST_CASE("convert refuses a non-empty directory and leaves nothing behind when it fails") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(2500, 1, 2, 2, 8);
  const std::string source = write_idx(dir, "small", images, false, false);

  SECTION("an existing non-empty directory") {
    fs::create_directories(dir.file("full"));
    write_text(dir.file("full/keep.txt"), "mine");
    CHECK_THAT(error_of([&] { hn::detail::convert_to_lmdb(source, dir.file("full")); }),
               Contains(dir.file("full")) && Contains("not empty"));
    CHECK(fs::exists(dir.file("full/keep.txt")));
  }
  SECTION("a failure part-way removes the directory convert created") {
    hn::detail::ConvertOptions options;
    options.progress = [](std::uint64_t done, std::uint64_t) {
      if (done >= 1000) throw hn::Error("interrupted");
    };
    CHECK_THAT(error_of([&] { hn::detail::convert_to_lmdb(source, dir.file("new/db"), options); }),
               Contains("interrupted"));
    CHECK(!fs::exists(dir.file("new/db")));
  }
  SECTION("a failure part-way empties an existing empty directory") {
    fs::create_directories(dir.file("empty"));
    hn::detail::ConvertOptions options;
    options.progress = [](std::uint64_t, std::uint64_t) { throw hn::Error("interrupted"); };
    CHECK_THROWS_AS(hn::detail::convert_to_lmdb(source, dir.file("empty"), options), hn::Error);
    CHECK(fs::is_directory(dir.file("empty")));
    CHECK(fs::is_empty(dir.file("empty")));
  }
  SECTION("a missing source creates nothing") {
    CHECK_THAT(error_of([&] { hn::detail::convert_to_lmdb(dir.file("none.gz"), dir.file("db")); }),
               Contains(dir.file("none.gz")));
    CHECK(!fs::exists(dir.file("db")));
  }
  SECTION("an LMDB is not a convert source") {
    hn::detail::convert_to_lmdb(source, dir.file("db"));
    CHECK_THAT(error_of([&] { hn::detail::convert_to_lmdb(dir.file("db"), dir.file("db2")); }),
               Contains("already an LMDB"));
  }
}

TEST_CASE("bad sources give errors naming the layer and the path and where the data goes wrong") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(6, 1, 4, 4, 9);
  auto open = [&](const std::string& source) {
    return [source] {
      hn::detail::open_data_feed(data_layer(source, 2), options_for(hn::Phase::test, 0));
    };
  };
  const std::string layer_name = "layer 'feed' (Data)";

  SECTION("a missing file") {
    const std::string path = dir.file("gone-images-idx3-ubyte.gz");
    CHECK_THAT(error_of(open(path)), Contains(layer_name) && Contains(path));
  }
  SECTION("a raw IDX file shorter than its header says") {
    const std::string path = write_idx(dir, "cut", images, false, false);
    fs::resize_file(path, 16 + 16 * 3 + 5);
    // Image 3 starts at byte 16 + 3 * 16 = 64; the header promises 16 + 6 * 16 = 112 bytes.
    CHECK_THAT(error_of(open(path)), Contains(layer_name) && Contains(path) &&
                                         Contains("truncated") && Contains("offset 64") &&
                                         Contains("112"));
  }
  SECTION("a gzip stream that ends early") {
    const std::string path = write_idx(dir, "gz", random_images(300, 1, 28, 28, 10), true, true);
    fs::resize_file(path, fs::file_size(path) / 2);
    CHECK_THAT(error_of(open(path)), Contains(layer_name) && Contains(path) &&
                                         Contains("ends early") && Contains("offset"));
  }
  SECTION("a complete gzip stream of a truncated IDX file") {
    const std::string path = dir.file("short-images-idx3-ubyte.gz");
    std::vector<std::uint8_t> bytes = idx_images_bytes(images);
    bytes.resize(bytes.size() - 20);
    write_gzip(path, bytes);
    write_gzip(dir.file("short-labels-idx1-ubyte.gz"), idx_labels_bytes(images.labels));
    CHECK_THAT(error_of(open(path)),
               Contains(path) && Contains("truncated") && Contains("offset 80") && Contains("112"));
  }
  SECTION("an IDX header whose sizes multiply past 2^64") {
    // 3 dimensions of 2^32 - 1: 2^96 bytes claimed, 16 held.
    const std::string path = dir.file("huge-images-idx3-ubyte");
    write_file(path, {0, 0, 8, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255});
    CHECK_THAT(error_of(open(path)),
               Contains(path) && Contains("truncated") && Contains("4294967295 images"));
  }
  SECTION("an IDX header claiming images of 0x0") {
    const std::string path = dir.file("flat-images-idx3-ubyte");
    write_file(path, {0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK_THAT(error_of(open(path)),
               Contains(path) && Contains("images of 0x0") && Contains("empty"));
  }
  SECTION("a gzip file that inflates far past what its IDX header claims") {
    // 2 images of 4x4 (48 bytes with the header), then 64 MiB of zeros: a "gzip bomb" is
    // stopped once it passes the header's size, not inflated whole.
    std::vector<std::uint8_t> bytes = idx_images_bytes(random_images(2, 1, 4, 4, 3));
    bytes.resize(std::size_t{64} << 20, 0);
    const std::string path = dir.file("bomb-images-idx3-ubyte.gz");
    write_gzip(path, bytes);
    CHECK(fs::file_size(path) < (std::size_t{1} << 20));
    CHECK_THAT(error_of(open(path)), Contains(path) && Contains("inflates to more than the 48 "
                                                                "bytes"));
  }
  SECTION("a gzip IDX header claiming more than the memory limit allows") {
    // 2^31 images of 1000x1000 claimed (2 PB): refused from the header, before inflating
    // what the file holds (64 MiB of zeros here; 3.9 GB resident in the report).
    std::vector<std::uint8_t> bytes = {0, 0, 8,    3,    0x80, 0, 0,    0,
                                       0, 0, 0x03, 0xe8, 0,    0, 0x03, 0xe8};
    bytes.resize(std::size_t{64} << 20, 0);
    const std::string path = dir.file("claims-images-idx3-ubyte.gz");
    write_gzip(path, bytes);
    const std::size_t peak_before = hn::peak_resident_bytes();
    CHECK_THAT(error_of(open(path)), Contains(layer_name) && Contains(path) &&
                                         Contains("2147483648x1000x1000") &&
                                         Contains("host memory limit"));
    if (peak_before > 0) CHECK(hn::peak_resident_bytes() < peak_before + (std::size_t{32} << 20));
    // Under a limit of 1 MiB, a header within reach that the file overruns stops at the limit.
    hn::set_host_memory_limit(std::size_t{1} << 20);
    const std::string honest = dir.file("big-images-idx3-ubyte.gz");
    std::vector<std::uint8_t> many = {0, 0, 8, 3, 0, 0, 0x10, 0, 0, 0, 0, 32, 0, 0, 0, 32};
    many.resize(16 + 4096 * 1024, 1);
    write_gzip(honest, many);
    const std::string error = error_of(open(honest));
    hn::set_host_memory_limit(0);
    CHECK_THAT(error, Contains(honest) && Contains("host memory limit of 1.0 MiB"));
  }
  SECTION("a symlink loop as the source") {
    const std::string loop = dir.file("loop");
    fs::create_symlink(loop, loop);
    CHECK_THAT(error_of(open(loop)),
               Contains(layer_name) && Contains(loop) && Contains("symbolic links"));
  }
  SECTION("an LMDB directory whose data.mdb is a FIFO") {
    const std::string lmdb = dir.file("fifo_lmdb");
    fs::create_directories(lmdb);
    REQUIRE(mkfifo((lmdb + "/data.mdb").c_str(), 0600) == 0);
    // liblmdb would block opening it for reading.
    CHECK_THAT(error_of(open(lmdb)),
               Contains(layer_name) && Contains("data.mdb") && Contains("a FIFO"));
  }
  SECTION("a batch too large for memory") {
    hn::set_host_memory_limit(std::size_t{1} << 30);
    const std::string error = error_of([&] {
      hn::detail::open_data_feed(data_layer("synthetic:3x32x32", 10000000),
                                 options_for(hn::Phase::test, 1));
    });
    hn::set_host_memory_limit(0);
    CHECK_THAT(error,
               Contains(layer_name) && Contains("batch 10000000") && Contains("host memory limit"));
  }
  SECTION("a FIFO or a directory as the source") {
    const std::string fifo = dir.file("pipe-images-idx3-ubyte");
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    // Opening it would wait for a writer forever: refused from its type alone.
    CHECK_THAT(error_of(open(fifo)), Contains(fifo) && Contains("not a regular file"));
    fs::create_directories(dir.file("folder-images-idx3-ubyte"));
    // A directory is taken for an LMDB, and said not to be one.
    CHECK_THAT(error_of(open(dir.file("folder-images-idx3-ubyte"))),
               Contains("folder-images-idx3-ubyte") && Contains("not an LMDB database"));
  }
  SECTION("a CIFAR-10 file whose size is not a multiple of 3073") {
    const std::string path = dir.file("data_batch_1.bin");
    write_file(path, std::vector<std::uint8_t>(2 * 3073 + 100, 1));
    CHECK_THAT(error_of(open(path)), Contains(layer_name) && Contains(path) && Contains("3073") &&
                                         Contains("offset 6146"));
    const std::string good = write_cifar(dir, "good.bin", random_images(1, 3, 32, 32, 11), 0, 1);
    CHECK_THAT(error_of(open(good + "," + path)), Contains(path) && Contains("offset 6146"));
  }
  SECTION("an unrecognised file") {
    const std::string path = dir.file("notes.txt");
    write_text(path, "not a dataset\n");
    CHECK_THAT(error_of(open(path)),
               Contains(layer_name) && Contains(path) && Contains("not a recognised"));
  }
  SECTION("IDX images and labels that disagree in count") {
    const std::string path = write_idx(dir, "odd", images, false, false);
    write_file(dir.file("odd-labels-idx1-ubyte"), idx_labels_bytes({1, 2, 3}));
    CHECK_THAT(error_of(open(path)), Contains(path) &&
                                         Contains(dir.file("odd-labels-idx1-ubyte")) &&
                                         Contains("6 images") && Contains("3 labels"));
  }
  SECTION("IDX images without their labels file") {
    const std::string path = write_idx(dir, "lone", images, false, false);
    fs::remove(dir.file("lone-labels-idx1-ubyte"));
    CHECK_THAT(error_of(open(path)), Contains(path) && Contains("lone-labels-idx1-ubyte"));
  }
  SECTION("an IDX labels file given as the source") {
    write_idx(dir, "swap", images, false, false);
    const std::string path = dir.file("swap-labels-idx1-ubyte");
    CHECK_THAT(error_of(open(path)), Contains(path) && Contains("0x00000801"));
  }
  SECTION("an LMDB record whose shape differs from the first, met by the prefetch thread") {
    const Images small = random_images(4, 1, 2, 2, 12);
    hybridnn::proto::Datum odd = byte_datum(random_images(1, 1, 3, 2, 13), 0);
    const std::string db = dir.file("mixed");
    write_lmdb(db, {{"0", byte_datum(small, 0)},
                    {"1", byte_datum(small, 1)},
                    {"2", odd},
                    {"3", byte_datum(small, 3)}});
    auto feed = hn::detail::open_data_feed(data_layer(db, 2), options_for(hn::Phase::test, 2));
    CHECK_NOTHROW(next_batch(*feed));
    for (int attempt = 0; attempt < 2; ++attempt) {  // the error stays until a seek
      CHECK_THAT(error_of([&] { next_batch(*feed); }), Contains(layer_name) && Contains(db) &&
                                                           Contains("record 2") &&
                                                           Contains("1x3x2") && Contains("1x2x2"));
    }
    feed->seek(0);
    CHECK_NOTHROW(next_batch(*feed));
  }
  SECTION("an LMDB of encoded images") {
    hybridnn::proto::Datum encoded;
    encoded.set_encoded(true);
    encoded.set_data("\xff\xd8\xff");
    write_lmdb(dir.file("jpeg"), {{"0", encoded}});
    CHECK_THAT(error_of(open(dir.file("jpeg"))),
               Contains(dir.file("jpeg")) && Contains("encoded") && Contains("record 0"));
  }
  SECTION("backend LEVELDB and LevelDB directories are refused with a pointer to convert") {
    write_lmdb(dir.file("db"), {{"0", byte_datum(images, 0)}});
    auto layer = data_layer(dir.file("db"), 2);
    layer.mutable_data_param()->set_backend(hybridnn::proto::DataParameter::LEVELDB);
    CHECK_THAT(
        error_of([&] { hn::detail::open_data_feed(layer, options_for(hn::Phase::test, 0)); }),
        Contains(dir.file("db")) && Contains("LevelDB") && Contains("hybridnn convert"));
    fs::create_directories(dir.file("leveldb"));
    write_text(dir.file("leveldb/CURRENT"), "MANIFEST-000001\n");
    CHECK_THAT(error_of(open(dir.file("leveldb"))), Contains("LevelDB") && Contains("convert"));
  }
  SECTION("a directory that is not a database") {
    fs::create_directories(dir.file("plain"));
    CHECK_THAT(error_of(open(dir.file("plain"))),
               Contains(dir.file("plain")) && Contains("data.mdb"));
  }
  SECTION("a malformed synthetic source") {
    CHECK_THAT(error_of(open("synthetic:3x32")), Contains("synthetic:3x32"));
    CHECK_THAT(error_of(open("synthetic:3x32x32:0")), Contains("synthetic:3x32x32:0"));
  }
  SECTION("transform_param errors") {
    const std::string source = write_idx(dir, "ok", images, false, false);
    auto layer = data_layer(source, 2);
    auto* transform = layer.mutable_transform_param();
    auto open_layer = [&] { hn::detail::open_data_feed(layer, options_for(hn::Phase::test, 0)); };
    SECTION("a missing mean_file") {
      transform->set_mean_file(dir.file("absent.binaryproto"));
      CHECK_THAT(error_of(open_layer),
                 Contains(layer_name) && Contains(dir.file("absent.binaryproto")));
    }
    SECTION("a mean_file of another shape") {
      hybridnn::proto::BlobProto blob;
      for (int d : {1, 1, 5, 4})
        blob.mutable_shape()->add_dim(d);
      blob.mutable_data()->Resize(20, 0.0f);
      write_text(dir.file("mean.binaryproto"), blob_bytes(blob));
      transform->set_mean_file(dir.file("mean.binaryproto"));
      CHECK_THAT(error_of(open_layer), Contains(dir.file("mean.binaryproto")) &&
                                           Contains("1x1x5x4") && Contains("1x4x4"));
    }
    SECTION("mean_file and mean_value together") {
      transform->set_mean_file(dir.file("absent.binaryproto"));
      transform->add_mean_value(1);
      CHECK_THAT(error_of(open_layer), Contains("mean_file") && Contains("mean_value"));
    }
    SECTION("as many mean_value entries as neither 1 nor the channels") {
      transform->add_mean_value(1);
      transform->add_mean_value(2);
      CHECK_THAT(error_of(open_layer), Contains("mean_value"));
    }
    SECTION("a crop larger than the images") {
      transform->set_crop_size(5);
      CHECK_THAT(error_of(open_layer), Contains("crop_size 5") && Contains("1x4x4"));
    }
    SECTION("a layer that is not a Data layer") {
      layer.set_type("ImageData");
      CHECK_THAT(error_of(open_layer), Contains("ImageData"));
    }
    SECTION("no batch size") {
      layer.mutable_data_param()->clear_batch_size();
      CHECK_THAT(error_of(open_layer), Contains("batch_size"));
    }
  }
}

TEST_CASE(
    "synthetic records are philox bytes keyed by the record index with label index mod classes") {
  auto feed = hn::detail::open_data_feed(data_layer("synthetic:2x3x5:7", 4),
                                         options_for(hn::Phase::train, 1));
  REQUIRE(feed->top_shapes() == std::vector<hn::Shape>{hn::Shape{4, 2, 3, 5}, hn::Shape{4}});
  CHECK_THAT(feed->describe(), Contains("synthetic") && Contains("(1024 records)"));
  // 1024 records: batch 256 wraps around to records 0..3.
  for (std::uint64_t b : {0u, 255u, 256u, 3u}) {
    feed->seek(b);
    const Batch batch = next_batch(*feed);
    for (int i = 0; i < 4; ++i) {
      const std::uint64_t r = (b * 4 + i) % 1024;
      CHECK(batch.labels[i] == static_cast<float>(r % 7));
      for (int j = 0; j < 30; ++j) {
        const auto byte = (hn::detail::philox_bits(r, j / 4) >> (8 * (j % 4))) & 0xffu;
        CHECK(batch.data[i * 30 + j] == static_cast<float>(byte));
      }
    }
  }
  auto ten = hn::detail::open_data_feed(data_layer("synthetic:1x2x2", 12),
                                        options_for(hn::Phase::test, 0));
  CHECK(next_batch(*ten).labels == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
}

TEST_CASE("options replace the source and batch size and a one-top layer has one top") {
  TempDir dir("hybridnn-data");
  const Images images = random_images(5, 1, 2, 3, 14);
  const std::string path = write_idx(dir, "opt", images, false, true);
  auto layer = data_layer(dir.file("elsewhere_lmdb"), 100, 1);
  layer.mutable_data_param()->set_backend(hybridnn::proto::DataParameter::LEVELDB);
  FeedOptions options = options_for(hn::Phase::test, 2);
  options.source = path;
  options.batch_size = 3;
  auto feed = hn::detail::open_data_feed(layer, options);
  REQUIRE(feed->top_shapes() == std::vector<hn::Shape>{hn::Shape{3, 1, 2, 3}});
  Batch batch;
  batch.data.resize(18);
  feed->next({batch.data.data()});
  CHECK(batch.data == expected_batch(images, 0, 3, {}).data);
  CHECK_THROWS_AS(feed->next({batch.data.data(), batch.data.data()}), hn::Error);
}

TEST_CASE("a feed destroyed while its thread prefetches returns promptly", "[feed]") {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  // Timed from each feed's start (its slots allocated, its thread making the first batch)
  // to its end.
  double seconds = 0.0;
  double one_batch = 0.0;  // the first batch of a new feed, as this machine makes it now
  for (int round = 0; round < 3; ++round) {
    auto feed = hn::detail::open_data_feed(data_layer("synthetic:3x227x227", 64),
                                           options_for(hn::Phase::train, 3));
    const auto start = Clock::now();
    if (round == 1) {
      next_batch(*feed);
      one_batch = seconds_since(start);
    }
    if (round == 2) feed->seek(5);
    feed.reset();
    seconds += seconds_since(start);
  }
  {
    // A small feed whose thread has filled every slot and waits for room.
    auto feed = hn::detail::open_data_feed(data_layer("synthetic:1x2x2", 2),
                                           options_for(hn::Phase::train, 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto start = Clock::now();
    feed.reset();
    seconds += seconds_since(start);
  }
  // Each end (and the seek's restart) waits for the batch being made, if any: about two
  // batches' time in all with round 1's (AMD EPYC, 2 cores: 0.10-0.11 s, a batch 0.058).
  // Waiting for the prefetch slots to fill took seven to eight. The bound is in batches made
  // on this machine at this moment, so that a loaded machine (ThreadSanitizer, a shared
  // core) does not fail it and a fast one still would.
  INFO("one batch " << one_batch << " s");
  CHECK(seconds < 0.05 + 4.5 * one_batch);
}

TEST_CASE("Fashion-MNIST from the Debian package opens with 64x1x28x28 batches and labels 0 to 9") {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  if (!fs::exists(dir + "train-images-idx3-ubyte.gz")) {
    WARN("Fashion-MNIST is not installed in " << dir
                                              << " (package dataset-fashion-mnist): skipped");
    return;
  }
  for (const char* name : {"train", "t10k"}) {
    auto layer = data_layer(dir + name + "-images-idx3-ubyte.gz", 64);
    layer.mutable_transform_param()->set_scale(0.00390625f);
    auto feed = hn::detail::open_data_feed(layer, options_for(hn::Phase::train, 3));
    REQUIRE(feed->top_shapes() == std::vector<hn::Shape>{hn::Shape{64, 1, 28, 28}, hn::Shape{64}});
    CHECK_THAT(feed->describe(),
               Contains(std::string(name) == "train" ? "(60000 records)" : "(10000 records)"));
    std::set<float> labels;
    float low = 1, high = 0;
    Batch batch = next_batch(*feed);
    std::vector<float*> tops = {batch.data.data(), batch.labels.data()};
    // (Whether the thread's batch is ready by the next call is a speed property, for a
    // benchmark: a fixed bound on next()'s time here, 0.25 ms, failed under
    // AddressSanitizer beside another test at 0.29.)
    constexpr int kBatches = 200;
    for (int b = 0; b < kBatches; ++b) {
      labels.insert(batch.labels.begin(), batch.labels.end());
      const auto [min, max] = std::minmax_element(batch.data.begin(), batch.data.end());
      low = std::min(low, *min);
      high = std::max(high, *max);
      feed->next(tops);
    }
    CHECK(low >= 0.0f);
    CHECK(high <= 255.0f / 256.0f);
    CHECK(labels == std::set<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  }
}
