// GradientSync: the data-parallel half of an iteration. It runs a net's backward layer by
// layer and, as soon as the last gradient of a bucket is final, hands the bucket's allreduce
// (the mean over the ranks) to a communication thread, so that moving one bucket overlaps
// computing the gradients of the layers below it; wait() then waits only for the buckets
// still in flight (PyTorch DDP's and Horovod's scheme).
//
// Buckets hold parameter gradients in the order backward finishes them (last layer first),
// up to `bucket_bytes` each (a larger parameter gets a bucket of its own). The order depends
// only on the net, so every rank issues the same buckets in the same order, and the
// collectives' sequence numbers agree. A bucket of one parameter is reduced in place; others
// are packed into one buffer on the net's driver and unpacked by wait(). Where the
// communicator offers shared memory (every rank on one node: Communicator::shared_buffer),
// every bucket is packed there, and its allreduce sends no message. After the
// parameter buckets come two floats: the iteration's loss, so that every rank sees the mean
// loss of the global batch, and whether this rank was asked to stop, so that all stop
// after the same iteration.
//
// Parameters of layers cut across ranks (NetOptions::model_parallel) are in no bucket: each
// rank holds its own rows, whose gradients already sum every rank's loss, and wait() divides
// them by the ranks. Before such a layer's backward (which runs collectives of its own) the
// buckets in flight are waited for.
//
// Only the communication thread calls the communicator while buckets are in flight; between
// wait() and the next backward the caller may use it (MPI_THREAD_SERIALIZED suffices).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/net/net.h"

namespace hn::detail {

class GradientSync {
 public:
  using Clock = std::chrono::steady_clock;

  // One allreduce as it ran on the communication thread (for timelines).
  struct Record {
    int bucket = 0;  // -1: the loss
    std::size_t bytes = 0;
    Clock::time_point start, end;
  };
  // Totals since the last take_stats().
  struct Stats {
    double allreduce_seconds = 0.0;  // the communication thread's busy time
    double exposed_seconds = 0.0;    // the caller's time blocked in wait()
    std::size_t bytes = 0;           // allreduced per rank
    // Sent by this rank: 2(R-1)/R of `bytes`, as the ring (half that with BF16 on the wire).
    std::size_t sent_bytes = 0;
    int iterations = 0;
  };

  // `compression`: the parameter buckets through Communicator::allreduce_bf16 (the loss and
  // the stop flag stay FP32).
  GradientSync(Net& net, Communicator& communicator, std::size_t bucket_bytes,
               GradCompression compression = GradCompression::none);
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync();

  // The net's backward, each bucket's allreduce started as soon as its gradients are final.
  // `loss` and `stop` (this rank's) are reduced after the buckets; `on_layer(index, start,
  // end)`, when set, hears each layer's backward.
  void backward(
      float loss, bool stop,
      const std::function<void(int, Clock::time_point, Clock::time_point)>& on_layer = {});
  // Waits for the buckets in flight, puts the mean gradients back into the parameters and
  // returns the mean loss and whether some rank was asked to stop. Rethrows the first error of the
  // communication thread (a collective that timed out, naming its sequence number and the ranks
  // waited for).
  struct Result {
    float loss = 0.0f;
    bool stop = false;
  };
  Result wait();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Parameters (learnable_params() indices) in bucket `index`, in packing order.
  const std::vector<std::size_t>& bucket_params(int index) const {
    return buckets_.at(index).params;
  }
  std::size_t bucket_bytes(int index) const { return buckets_.at(index).count * sizeof(float); }
  // The allreduces of the last iteration, in the order they ran.
  const std::vector<Record>& records() const { return last_records_; }
  Stats take_stats();

 private:
  struct Bucket {
    std::vector<std::size_t> params;
    std::vector<std::size_t> offsets;  // into `buffer`, floats
    std::size_t count = 0;
    int ready_after = 0;             // the layer whose backward makes it final
    std::unique_ptr<Tensor> buffer;  // multi-parameter buckets
    float* shared = nullptr;         // or every bucket, in the communicator's shared buffer
    float* data = nullptr;           // what the thread reduces
    bool packed() const { return buffer != nullptr || shared != nullptr; }
  };

  void drain();  // waits until the communication thread has finished every job issued
  void issue(int bucket);
  void enqueue(int job);
  void run_thread();

  Net& net_;
  Communicator& comm_;
  Driver& driver_;
  bool bf16_ = false;  // GradCompression::bf16
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> sharded_;  // parameters cut across ranks: scaled, not reduced
  Tensor loss_{Shape{2}};             // on the net's driver, as the communicator wants
  float* loss_data_ = nullptr;

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<int> queue_;  // bucket indices; kLossJob for the loss
  int issued_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<Record> records_, last_records_;
  Stats stats_;
  std::thread thread_;
};

}  // namespace hn::detail
