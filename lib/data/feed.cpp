// The Data layer's feed: batches of transformed records, prepared ahead by one background
// thread into a small ring of buffers, so that next() is a copy.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "lib/core/check.h"
#include "lib/core/memory.h"
#include "lib/data/data.h"
#include "lib/data/source.h"
#include "lib/data/transform.h"

namespace hn::detail {

namespace {

class Feed final : public DataFeed {
 public:
  Feed(std::string context, std::unique_ptr<RecordSource> source, Transformer transform, int batch,
       bool labels, const FeedOptions& options)
      : context_(std::move(context)),
        source_(std::move(source)),
        transform_(std::move(transform)),
        batch_(batch),
        shard_(static_cast<std::uint64_t>(options.shard)),
        shards_(static_cast<std::uint64_t>(options.shards)),
        labels_(labels),
        image_count_(transform_.output_shape().count()) {
    slots_.resize(static_cast<std::size_t>(std::max(options.prefetch, 0)));
    // Sized by the batch a caller or prototxt asks for: checked, and named when too large.
    const std::size_t floats = static_cast<std::size_t>(batch_) *
                               (static_cast<std::size_t>(image_count_) + (labels_ ? 1 : 0));
    const auto describe = [&] {
      return fmt::format("{}: {} prefetch slot{} of batch {} ({} floats an image{})", context_,
                         slots_.size(), slots_.size() == 1 ? "" : "s", batch_, image_count_,
                         labels_ ? ", and labels" : "");
    };
    check_host_bytes(sizeof(float) * floats * slots_.size(), describe);
    try {
      for (Slot& slot : slots_) {
        slot.data.resize(static_cast<std::size_t>(batch_) * image_count_);
        if (labels_) slot.labels.resize(static_cast<std::size_t>(batch_));
      }
    } catch (const std::bad_alloc&) {
      fail("{}: out of memory ({})", describe(),
           format_bytes(sizeof(float) * floats * slots_.size()));
    }
    start(0);
  }
  ~Feed() override { stop(); }

  std::vector<Shape> top_shapes() const override {
    const RecordShape out = transform_.output_shape();
    std::vector<Shape> shapes = {Shape{batch_, out.channels, out.height, out.width}};
    if (labels_) shapes.push_back(Shape{batch_});
    return shapes;
  }

  void next(const std::vector<float*>& tops) override {
    const std::size_t expected = labels_ ? 2 : 1;
    HN_CHECK(tops.size() == expected, "{}: next() got {} tops; the layer has {}", context_,
             tops.size(), expected);
    if (slots_.empty()) {
      fill(next_batch_, tops[0], labels_ ? tops[1] : nullptr);
      ++next_batch_;
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ready_cv_.wait(lock, [&] { return !ready_.empty() || error_ != nullptr; });
    // Batches finished before the thread failed come first; the error stays until seek().
    if (ready_.empty()) std::rethrow_exception(error_);
    const std::size_t index = ready_.front();
    ready_.pop_front();
    lock.unlock();
    const Slot& slot = slots_[index];
    std::memcpy(tops[0], slot.data.data(), slot.data.size() * sizeof(float));
    if (labels_) std::memcpy(tops[1], slot.labels.data(), slot.labels.size() * sizeof(float));
    ++next_batch_;
    lock.lock();
    free_.push_back(index);
    lock.unlock();
    space_cv_.notify_one();
  }

  void seek(std::uint64_t batch) override {
    stop();
    start(batch);
  }

  std::string describe() const override {
    std::string text = fmt::format("{} reading {} '{}' ({} records)", context_, source_->kind(),
                                   source_->path(), source_->size());
    if (shards_ > 1) text += fmt::format(", shard {} of {}", shard_, shards_);
    return text;
  }

 private:
  struct Slot {
    std::vector<float> data, labels;
  };

  // Batch `batch` holds stream positions [batch * batch_, (batch + 1) * batch_) of this
  // shard, position p being p * shards + shard of the whole stream, each taken modulo the
  // number of records. Returns false when stopped part-way.
  bool fill(std::uint64_t batch, float* data, float* labels) {
    const std::uint64_t records = source_->size();
    for (int i = 0; i < batch_; ++i) {
      if (stopping_.load(std::memory_order_relaxed)) return false;
      const std::uint64_t position =
          (batch * static_cast<std::uint64_t>(batch_) + i) * shards_ + shard_;
      const RecordView record = source_->read(position % records);
      transform_.apply(record, position, data + static_cast<std::size_t>(i) * image_count_);
      if (labels != nullptr) labels[i] = record.label;
    }
    return true;
  }

  void produce() {
    for (;;) {
      std::size_t index;
      std::uint64_t batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_cv_.wait(lock, [&] { return stopping_.load() || !free_.empty(); });
        if (stopping_.load()) return;
        index = free_.front();
        free_.pop_front();
        batch = produce_batch_++;
      }
      Slot& slot = slots_[index];
      bool done;
      try {
        done = fill(batch, slot.data.data(), labels_ ? slot.labels.data() : nullptr);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
        ready_cv_.notify_all();
        return;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (!done) return;
      ready_.push_back(index);
      ready_cv_.notify_one();
    }
  }

  void start(std::uint64_t batch) {
    next_batch_ = batch;
    if (slots_.empty()) return;
    produce_batch_ = batch;
    error_ = nullptr;
    ready_.clear();
    free_.clear();
    for (std::size_t i = 0; i < slots_.size(); ++i)
      free_.push_back(i);
    stopping_ = false;
    try {
      thread_ = std::thread([this] { produce(); });
    } catch (const std::system_error& error) {
      // next() reports it, rather than waiting for batches that never come.
      error_ = std::make_exception_ptr(
          Error(fmt::format("{}: cannot start the prefetch thread: {}", context_, error.what())));
    }
  }

  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    space_cv_.notify_all();
    thread_.join();
  }

  std::string context_;
  std::unique_ptr<RecordSource> source_;  // read only by the thread while it runs
  Transformer transform_;
  int batch_;
  std::uint64_t shard_, shards_;
  bool labels_;
  std::size_t image_count_;
  std::uint64_t next_batch_ = 0;  // what next() returns

  std::vector<Slot> slots_;  // one per prefetched batch; none when synchronous
  std::mutex mutex_;
  std::condition_variable ready_cv_, space_cv_;
  std::deque<std::size_t> ready_, free_;  // slot indices: filled in batch order, and empty
  std::uint64_t produce_batch_ = 0;       // what the thread fills next
  std::exception_ptr error_;              // the thread's failure, for the batch after ready_
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace

std::unique_ptr<DataFeed> open_data_feed(const hybridnn::proto::LayerParameter& layer,
                                         const FeedOptions& options) {
  const std::string context = fmt::format("layer '{}' ({})", layer.name(), layer.type());
  HN_CHECK(layer.type() == "Data", "{}: open_data_feed reads Data layers only", context);
  HN_CHECK(layer.top_size() == 1 || layer.top_size() == 2,
           "{}: a Data layer has 1 or 2 tops (data, label), not {}", context, layer.top_size());
  const auto& param = layer.data_param();
  const int batch =
      options.batch_size > 0 ? options.batch_size : static_cast<int>(param.batch_size());
  HN_CHECK(batch > 0, "{}: data_param.batch_size must be positive, is {}", context, batch);
  HN_CHECK(options.shards >= 1 && options.shard >= 0 && options.shard < options.shards,
           "{}: data shard {} of {} does not exist", context, options.shard, options.shards);
  SourceOptions source_options;
  source_options.context = context;
  // The backend describes the layer's own source, not one given in its place.
  source_options.leveldb_backend = options.source.empty() && param.has_backend() &&
                                   param.backend() == hybridnn::proto::DataParameter::LEVELDB;
  auto source =
      open_record_source(options.source.empty() ? param.source() : options.source, source_options);
  Transformer transform(layer, options, source->shape(), context);
  return std::make_unique<Feed>(context, std::move(source), std::move(transform), batch,
                                layer.top_size() == 2, options);
}

}  // namespace hn::detail
