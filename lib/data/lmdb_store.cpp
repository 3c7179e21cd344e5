// LMDB access: the read-only cursor source of Caffe Datum records behind the Data layer, and
// the append writer behind `convert`.
#include "lib/data/lmdb_store.h"

#include <lmdb.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/data/lmdb_check.h"
#include "lib/data/source.h"

namespace hn::detail {

namespace {

// The writer's first map size; it doubles whenever a commit fills it (Caffe maps 1 TiB up
// front, which only reserves address space but fails under `ulimit -v`).
constexpr std::size_t kInitialMapSize = std::size_t{64} << 20;

void check_mdb(int rc, const char* call, const std::string& dir, const std::string& context) {
  HN_CHECK(rc == MDB_SUCCESS, "{}: LMDB '{}': {} failed: {}", context, dir, call, mdb_strerror(rc));
}

// Printable form of a key for error messages.
std::string printable_key(const MDB_val& key) {
  std::string text;
  const auto* bytes = static_cast<const unsigned char*>(key.mv_data);
  for (std::size_t i = 0; i < key.mv_size && i < 64; ++i) {
    text += std::isprint(bytes[i]) ? static_cast<char>(bytes[i]) : '?';
  }
  if (key.mv_size > 64) text += "...";
  return text;
}

// One read-only environment per database and process: LMDB forbids opening the same
// database twice in one process (closing one handle drops the other's file locks), and a
// net's train and test feeds may read the same source.
class ReadEnv {
 public:
  ReadEnv(const std::string& dir, const std::string& context) {
    // liblmdb trusts the file: a corrupt one would crash it, so it is checked first.
    check_lmdb_file(dir, context);
    // MDB_NOTLS: a feed's transaction is opened here and read on its prefetch thread.
    unsigned flags = MDB_RDONLY | MDB_NOTLS;
    int rc = open(dir, flags);
    if (rc == EACCES || rc == EROFS) {
      // A database on read-only storage: its lock file cannot be created, and no one
      // writes it, so reading without locks is safe (Caffe's ALLOW_LMDB_NOLOCK).
      rc = open(dir, flags | MDB_NOLOCK);
    }
    if (rc != MDB_SUCCESS && env_ != nullptr) {
      mdb_env_close(env_);  // LMDB's rule after a failed mdb_env_open
      env_ = nullptr;
    }
    check_mdb(rc, "mdb_env_open", dir, context);
  }
  ~ReadEnv() {
    if (env_ != nullptr) mdb_env_close(env_);
  }
  ReadEnv(const ReadEnv&) = delete;
  ReadEnv& operator=(const ReadEnv&) = delete;

  MDB_env* get() const { return env_; }

  static std::shared_ptr<ReadEnv> shared(const std::string& dir, const std::string& context) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<ReadEnv>> open_envs;
    std::error_code error;
    std::string key = std::filesystem::canonical(dir, error).string();
    if (error) key = dir;
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = open_envs.begin(); it != open_envs.end();) {
      it = it->second.expired() ? open_envs.erase(it) : std::next(it);
    }
    if (auto env = open_envs[key].lock()) return env;
    auto env = std::make_shared<ReadEnv>(dir, context);
    open_envs[key] = env;
    return env;
  }

 private:
  int open(const std::string& dir, unsigned flags) {
    if (env_ != nullptr) mdb_env_close(env_);
    env_ = nullptr;
    int rc = mdb_env_create(&env_);
    if (rc != MDB_SUCCESS) return rc;
    // Map what the file holds, not the writer's map size (Caffe's and ours: 1 TiB of
    // address space, refused under `ulimit -v`). LMDB raises a smaller size to the
    // committed data's, so the file's size is enough to read all of it.
    std::error_code error;
    const std::uintmax_t bytes = std::filesystem::file_size(dir + "/data.mdb", error);
    if (!error) {
      constexpr std::uintmax_t kGrain = std::uintmax_t{1} << 20;
      rc = mdb_env_set_mapsize(env_, static_cast<std::size_t>((bytes / kGrain + 1) * kGrain));
      if (rc != MDB_SUCCESS) return rc;
    }
    return mdb_env_open(env_, dir.c_str(), flags, 0664);
  }

  MDB_env* env_ = nullptr;
};

// Reads records in key order with one cursor; stepping forward is cheap, stepping back
// restarts from the first key.
class LmdbSource final : public RecordSource {
 public:
  LmdbSource(const std::string& dir, std::string context)
      : path_(dir), context_(std::move(context)), env_(ReadEnv::shared(dir, context_)) {
    MDB_txn* txn = nullptr;
    check_mdb(mdb_txn_begin(env_->get(), nullptr, MDB_RDONLY, &txn), "mdb_txn_begin", path_,
              context_);
    txn_.reset(txn);
    check_mdb(mdb_dbi_open(txn, nullptr, 0, &dbi_), "mdb_dbi_open", path_, context_);
    MDB_stat stat{};
    check_mdb(mdb_stat(txn, dbi_, &stat), "mdb_stat", path_, context_);
    entries_ = stat.ms_entries;
    HN_CHECK(entries_ > 0, "{}: LMDB '{}' holds no records", context_, path_);
    MDB_cursor* cursor = nullptr;
    check_mdb(mdb_cursor_open(txn, dbi_, &cursor), "mdb_cursor_open", path_, context_);
    cursor_.reset(cursor);
    // The first record fixes the shape every other record must have.
    read(0);
    shape_ = shape_of(datum_);
  }

  const char* kind() const override { return "LMDB"; }
  const std::string& path() const override { return path_; }
  std::uint64_t size() const override { return entries_; }
  RecordShape shape() const override { return shape_; }

  RecordView read(std::uint64_t index) override {
    MDB_val key{}, value{};
    int rc;
    if (position_ == index) {
      rc = mdb_cursor_get(cursor_.get(), &key, &value, MDB_GET_CURRENT);
    } else {
      std::uint64_t at = position_;
      if (position_ == kNone || index < position_) {
        rc = mdb_cursor_get(cursor_.get(), &key, &value, MDB_FIRST);
        at = 0;
      } else {
        rc = MDB_SUCCESS;
      }
      for (; rc == MDB_SUCCESS && at < index; ++at) {
        rc = mdb_cursor_get(cursor_.get(), &key, &value, MDB_NEXT);
      }
    }
    if (rc != MDB_SUCCESS) position_ = kNone;
    HN_CHECK(rc != MDB_NOTFOUND, "{}: LMDB '{}' ends before record {} (mdb_stat counts {})",
             context_, path_, index, entries_);
    check_mdb(rc, "mdb_cursor_get", path_, context_);
    position_ = index;
    return decode(index, key, value);
  }

 private:
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  static RecordShape shape_of(const hybridnn::proto::Datum& datum) {
    return {datum.channels(), datum.height(), datum.width()};
  }

  RecordView decode(std::uint64_t index, const MDB_val& key, const MDB_val& value) {
    const std::string where = fmt::format("{}: LMDB '{}': record {} (key '{}')", context_, path_,
                                          index, printable_key(key));
    return decode_datum(value.mv_data, value.mv_size, datum_, index == 0 ? nullptr : &shape_,
                        where);
  }

  std::string path_, context_;
  struct TxnAbort {
    void operator()(MDB_txn* txn) const { mdb_txn_abort(txn); }
  };
  struct CursorClose {
    void operator()(MDB_cursor* cursor) const { mdb_cursor_close(cursor); }
  };

  std::shared_ptr<ReadEnv> env_;  // declared first: closed after the cursor and transaction
  std::unique_ptr<MDB_txn, TxnAbort> txn_;
  MDB_dbi dbi_ = 0;
  std::unique_ptr<MDB_cursor, CursorClose> cursor_;
  std::uint64_t entries_ = 0;
  std::uint64_t position_ = kNone;  // the record under the cursor
  RecordShape shape_;
  hybridnn::proto::Datum datum_;
};

}  // namespace

RecordView decode_datum(const void* bytes, std::size_t size, hybridnn::proto::Datum& datum,
                        const RecordShape* first, const std::string& where) {
  HN_CHECK(size <= static_cast<std::size_t>(std::numeric_limits<int>::max()) &&
               datum.ParseFromArray(bytes, static_cast<int>(size)),
           "{} is not a Datum ({} bytes)", where, size);
  HN_CHECK(!datum.encoded(),
           "{} holds an encoded (JPEG/PNG) image; this build has no image decoder: write raw "
           "pixels (convert_imageset without --encoded, or `hybridnn convert`)",
           where);
  const RecordShape shape{datum.channels(), datum.height(), datum.width()};
  HN_CHECK(shape.channels > 0 && shape.height > 0 && shape.width > 0, "{} has shape {}", where,
           shape.to_string());
  HN_CHECK(first == nullptr || shape == *first,
           "{} is {}, but the first record is {}; all records must have one shape", where,
           shape.to_string(), first != nullptr ? first->to_string() : "");
  RecordView view;
  view.label = static_cast<float>(datum.label());
  if (!datum.data().empty()) {
    HN_CHECK(datum.data().size() == shape.count(), "{} has {} data bytes; its shape {} needs {}",
             where, datum.data().size(), shape.to_string(), shape.count());
    view.bytes = reinterpret_cast<const std::uint8_t*>(datum.data().data());
  } else {
    HN_CHECK(static_cast<std::size_t>(datum.float_data_size()) == shape.count(),
             "{} has {} float_data values (and no data bytes); its shape {} needs {}", where,
             datum.float_data_size(), shape.to_string(), shape.count());
    view.floats = datum.float_data().data();
  }
  return view;
}

std::unique_ptr<RecordSource> open_lmdb_source(const std::string& dir, const std::string& context) {
  return std::make_unique<LmdbSource>(dir, context);
}

struct LmdbWriter::Impl {
  std::string dir, context;
  MDB_env* env = nullptr;
  std::size_t map_size = 0;
  // The puts since the last commit: a commit that fills the map is aborted, the map grown
  // and the same puts made again, as Caffe's LMDBTransaction does.
  std::vector<std::pair<std::string, std::string>> pending;

  ~Impl() {
    if (env != nullptr) mdb_env_close(env);
  }

  // Puts `pending` in one transaction; MDB_MAP_FULL when the map is too small.
  int write_pending() {
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env, nullptr, 0, &txn);
    if (rc != MDB_SUCCESS) return rc;
    MDB_dbi dbi = 0;
    rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
    for (std::size_t i = 0; rc == MDB_SUCCESS && i < pending.size(); ++i) {
      MDB_val k{pending[i].first.size(), pending[i].first.data()};
      MDB_val v{pending[i].second.size(), pending[i].second.data()};
      rc = mdb_put(txn, dbi, &k, &v, MDB_APPEND);
    }
    if (rc != MDB_SUCCESS) {
      mdb_txn_abort(txn);
      return rc;
    }
    return mdb_txn_commit(txn);  // frees the transaction, even when it fails
  }
};

LmdbWriter::LmdbWriter(const std::string& dir, std::string context, std::size_t initial_map_size)
    : impl_(std::make_unique<Impl>()) {
  impl_->dir = dir;
  impl_->context = std::move(context);
  impl_->map_size = initial_map_size > 0 ? initial_map_size : kInitialMapSize;
  check_mdb(mdb_env_create(&impl_->env), "mdb_env_create", dir, impl_->context);
  check_mdb(mdb_env_set_mapsize(impl_->env, impl_->map_size), "mdb_env_set_mapsize", dir,
            impl_->context);
  check_mdb(mdb_env_open(impl_->env, dir.c_str(), 0, 0664), "mdb_env_open", dir, impl_->context);
}

LmdbWriter::~LmdbWriter() = default;

void LmdbWriter::put(const std::string& key, const std::string& value) {
  impl_->pending.emplace_back(key, value);
}

void LmdbWriter::commit() {
  Impl& w = *impl_;
  if (w.pending.empty()) return;
  for (;;) {
    const int rc = w.write_pending();
    if (rc != MDB_MAP_FULL) {
      check_mdb(rc, "commit", w.dir, w.context);
      break;
    }
    HN_CHECK(w.map_size <= std::numeric_limits<std::size_t>::max() / 2,
             "{}: LMDB '{}': the map cannot grow past {} bytes", w.context, w.dir, w.map_size);
    w.map_size *= 2;
    check_mdb(mdb_env_set_mapsize(w.env, w.map_size), "mdb_env_set_mapsize", w.dir, w.context);
  }
  w.pending.clear();
}

std::size_t LmdbWriter::map_size() const {
  return impl_->map_size;
}

}  // namespace hn::detail
