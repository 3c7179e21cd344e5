// `hybridnn convert`: IDX or CIFAR-10 records into a new LMDB of Caffe Datum records (as
// Caffe's convert_mnist_data / convert_cifar_data write them), optionally shuffled, with
// the mean image that Caffe's compute_image_mean would write.
#include <filesystem>
#include <numeric>
#include <system_error>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/data/convert.h"
#include "lib/data/data.h"
#include "lib/data/lmdb_store.h"
#include "lib/data/source.h"
#include "lib/proto/prototxt.h"

namespace hn::detail {

namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kRecordsPerCommit = 1000;

// Fisher-Yates with philox draws: the same seed gives the same order on every machine.
std::vector<std::uint64_t> record_order(std::uint64_t count, bool shuffle, std::uint64_t seed) {
  std::vector<std::uint64_t> order(count);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  if (!shuffle) return order;
  for (std::uint64_t i = count; i > 1; --i) {
    const std::uint64_t draw =
        (std::uint64_t{philox_bits(seed, 2 * i)} << 32) | philox_bits(seed, 2 * i + 1);
    std::swap(order[i - 1], order[draw % i]);
  }
  return order;
}

void write_mean(const std::string& path, RecordShape shape, const std::vector<double>& sum,
                std::uint64_t count) {
  hybridnn::proto::BlobProto blob;
  blob.set_num(1);
  blob.set_channels(shape.channels);
  blob.set_height(shape.height);
  blob.set_width(shape.width);
  for (double value : sum)
    blob.add_data(static_cast<float>(value / static_cast<double>(count)));
  write_binary_proto(path, blob);
}

}  // namespace

void convert_to_lmdb(const std::string& source, const std::string& lmdb_path,
                     const ConvertOptions& options) {
  const std::string context = "convert";
  std::error_code error;
  const fs::file_status target = fs::status(lmdb_path, error);
  if (fs::exists(target)) {
    HN_CHECK(fs::is_directory(target), "{}: '{}' exists and is not a directory", context,
             lmdb_path);
    HN_CHECK(fs::is_empty(lmdb_path, error) && !error,
             "{}: refusing to write into '{}': the directory exists and is not empty", context,
             lmdb_path);
  }
  auto records = open_record_source(source, SourceOptions{context, false});
  HN_CHECK(records->kind() != std::string("LMDB"),
           "{}: '{}' is already an LMDB; convert reads IDX or CIFAR-10 files", context, source);
  const RecordShape shape = records->shape();
  const std::uint64_t count = records->size();

  const bool created = !fs::exists(target);
  if (created) {
    fs::create_directories(lmdb_path, error);
    HN_CHECK(!error, "{}: cannot create the directory '{}': {}", context, lmdb_path,
             error.message());
  }
  try {
    const std::vector<std::uint64_t> order = record_order(count, options.shuffle, options.seed);
    std::vector<double> sum(options.mean_file.empty() ? 0 : shape.count(), 0.0);
    hybridnn::proto::Datum datum;
    datum.set_channels(shape.channels);
    datum.set_height(shape.height);
    datum.set_width(shape.width);
    std::string value;
    {
      LmdbWriter writer(lmdb_path, context);
      for (std::uint64_t k = 0; k < count; ++k) {
        const RecordView record = records->read(order[k]);
        datum.set_data(record.bytes, shape.count());
        datum.set_label(static_cast<int>(record.label));
        datum.SerializeToString(&value);
        writer.put(fmt::format("{:08d}", k), value);
        for (std::size_t i = 0; i < sum.size(); ++i)
          sum[i] += record.bytes[i];
        if ((k + 1) % kRecordsPerCommit == 0 || k + 1 == count) {
          writer.commit();
          if (options.progress) options.progress(k + 1, count);
        }
      }
    }
    if (!options.mean_file.empty()) write_mean(options.mean_file, shape, sum, count);
  } catch (...) {
    // Leave nothing half-written: the directory if convert made it, else what it put there.
    if (created) {
      fs::remove_all(lmdb_path, error);
    } else {
      for (const char* name : {"data.mdb", "lock.mdb"})
        fs::remove(fs::path(lmdb_path) / name, error);
    }
    throw;
  }
}

}  // namespace hn::detail
