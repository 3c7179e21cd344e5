#include "lib/solver/gradient_sync.h"

#include <algorithm>
#include <map>

#include "lib/core/check.h"

namespace hn::detail {

namespace {

constexpr int kLossJob = -1;

double seconds_between(GradientSync::Clock::time_point a, GradientSync::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

GradientSync::GradientSync(Net& net, Communicator& communicator, std::size_t bucket_bytes,
                           GradCompression compression)
    : net_(net),
      comm_(communicator),
      driver_(net.driver()),
      bf16_(compression == GradCompression::bf16) {
  HN_CHECK(bucket_bytes >= sizeof(float), "gradient buckets must hold at least one float, got {} B",
           bucket_bytes);
  std::map<std::string, int> layer_index;
  for (int l = 0; l < net.num_layers(); ++l)
    layer_index[net.layer_name(l)] = l;
  const std::vector<NetParam>& params = net.learnable_params();
  const std::size_t bucket_floats = bucket_bytes / sizeof(float);
  // learnable_params() lists parameters in layer order at their owner (the first layer
  // using them), and backward finishes a parameter with its owner's backward: the reverse
  // of the list is the order in which gradients become final.
  for (std::size_t k = params.size(); k-- > 0;) {
    const NetParam& param = params[k];
    if (param.shard.ranks > 1) {  // each rank's own rows of a layer cut across ranks
      sharded_.push_back(k);
      continue;
    }
    const auto owner = layer_index.find(param.layer);
    HN_CHECK(owner != layer_index.end(), "net '{}': parameter '{}' names no layer ('{}')",
             net.name(), param.name, param.layer);
    const auto count = static_cast<std::size_t>(param.tensor->count());
    if (buckets_.empty() ||
        (buckets_.back().count > 0 && buckets_.back().count + count > bucket_floats)) {
      buckets_.emplace_back();
    }
    Bucket& bucket = buckets_.back();
    bucket.params.push_back(k);
    bucket.offsets.push_back(bucket.count);
    bucket.count += count;
    // The smallest layer computing them so far: parameters go downwards, but a Scale folded
    // into the convolution before it (net_fusion.cpp) has its gradients at the convolution's.
    const int at = net.layer_computed_by(owner->second);
    bucket.ready_after = bucket.params.size() == 1 ? at : std::min(bucket.ready_after, at);
  }
  // Where the communicator's allreduce runs in place in shared memory (every rank on one
  // node: Communicator::shared_buffer), every bucket is packed there, one parameter's too.
  // Every rank asks (a collective); a driver whose memory the host cannot address asks for
  // nothing, and then no rank gets the memory.
  std::size_t total = 0;
  for (const Bucket& bucket : buckets_)
    total += bucket.count;
  float* shared = communicator.shared_buffer(driver_.capabilities().host_addressable ? total : 0);
  for (Bucket& bucket : buckets_) {
    if (shared != nullptr) {
      bucket.shared = shared;
      shared += bucket.count;
    } else if (bucket.params.size() > 1) {
      bucket.buffer = std::make_unique<Tensor>(Shape{static_cast<index_t>(bucket.count)});
    }
  }
  thread_ = std::thread([this] { run_thread(); });
}

GradientSync::~GradientSync() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void GradientSync::backward(
    float loss, bool stop,
    const std::function<void(int, Clock::time_point, Clock::time_point)>& on_layer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HN_CHECK(issued_ == finished_,
             "GradientSync::backward: the previous iteration's {} "
             "allreduces were not waited for",
             issued_ - finished_);
    records_.clear();
  }
  float* host = loss_.host_data_mut();
  host[0] = loss;
  host[1] = stop ? 1.0f : 0.0f;
  int next = 0;
  for (int l = net_.num_layers() - 1; l >= 0; --l) {
    // A layer cut across ranks runs collectives of its own: the communication thread's
    // first (one caller of the communicator at a time).
    if (net_.layer_communicates(l) && net_.layer_needs_backward(l)) drain();
    const Clock::time_point start = Clock::now();
    net_.backward_layer(l);
    if (on_layer && net_.layer_needs_backward(l)) on_layer(l, start, Clock::now());
    while (next < num_buckets() && buckets_[next].ready_after >= l)
      issue(next++);
  }
  while (next < num_buckets())
    issue(next++);
  enqueue(kLossJob);
}

void GradientSync::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return finished_ == issued_; });
}

void GradientSync::issue(int index) {
  Bucket& bucket = buckets_[index];
  const std::vector<NetParam>& params = net_.learnable_params();
  if (!bucket.packed()) {
    bucket.data = params[bucket.params[0]].tensor->diff_write(driver_);
  } else {
    bucket.data = bucket.shared != nullptr ? bucket.shared : bucket.buffer->data_write(driver_);
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      Tensor& tensor = *params[bucket.params[i]].tensor;
      driver_.copy(bucket.data + bucket.offsets[i], tensor.diff_read(driver_),
                   static_cast<std::size_t>(tensor.count()) * sizeof(float));
    }
  }
  enqueue(index);
}

void GradientSync::enqueue(int job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job == kLossJob) loss_data_ = loss_.data_write(driver_);
    queue_.push_back(job);
    ++issued_;
  }
  wake_.notify_one();
}

void GradientSync::run_thread() {
  for (;;) {
    int job = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    Record record;
    record.bucket = job;
    record.start = Clock::now();
    bool failed = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failed = error_ != nullptr;  // after a failure, the remaining jobs are dropped
    }
    if (!failed) {
      try {
        if (job == kLossJob) {
          record.bytes = 2 * sizeof(float);
          comm_.allreduce(driver_, loss_data_, 2, ReduceOp::average);
        } else {
          const Bucket& bucket = buckets_[job];
          record.bytes = bucket.count * sizeof(float);
          if (bf16_) {
            comm_.allreduce_bf16(driver_, bucket.data, bucket.count, ReduceOp::average);
          } else {
            comm_.allreduce(driver_, bucket.data, bucket.count, ReduceOp::average);
          }
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
      }
    }
    record.end = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failed) {
        records_.push_back(record);
        stats_.allreduce_seconds += seconds_between(record.start, record.end);
        stats_.bytes += record.bytes;
        const auto ranks = static_cast<std::size_t>(comm_.size());
        const bool halved = bf16_ && record.bucket >= 0 && comm_.compresses();
        stats_.sent_bytes += 2 * (ranks - 1) * record.bytes / ranks / (halved ? 2 : 1);
      }
      ++finished_;
    }
    done_.notify_all();
  }
}

GradientSync::Result GradientSync::wait() {
  const Clock::time_point start = Clock::now();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return finished_ == issued_; });
    stats_.exposed_seconds += seconds_between(start, Clock::now());
    ++stats_.iterations;
    last_records_ = records_;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
  const std::vector<NetParam>& params = net_.learnable_params();
  for (Bucket& bucket : buckets_) {
    if (!bucket.packed()) continue;
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      Tensor& tensor = *params[bucket.params[i]].tensor;
      driver_.copy(tensor.diff_write(driver_), bucket.data + bucket.offsets[i],
                   static_cast<std::size_t>(tensor.count()) * sizeof(float));
    }
  }
  // The rows of layers cut across ranks hold the gradient of every rank's loss: the mean's
  // is 1/R of it, as the allreduce gives for the others.
  const float mean = 1.0f / static_cast<float>(comm_.size());
  for (const std::size_t k : sharded_) {
    const NetParam& param = params[k];
    Driver& holder = param.driver != nullptr ? *param.driver : driver_;
    holder.scale(param.tensor->count(), mean, param.tensor->diff_write(holder));
  }
  const float* reduced = loss_.host_data();
  return {reduced[0], reduced[1] > 0.0f};
}

GradientSync::Stats GradientSync::take_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats stats = stats_;
  stats_ = Stats();
  return stats;
}

}  // namespace hn::detail
