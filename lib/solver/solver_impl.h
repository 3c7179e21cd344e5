// Solver::Impl, the Solver's state, and what solver.cpp (the loop, tests, the public calls),
// solver_settings.cpp (the solver file, its nets, the rate) and solver_snapshot.cpp share.
#pragma once

#include <fmt/format.h>
#include <google/protobuf/text_format.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/solver/gradient_sync.h"
#include "lib/solver/solver.h"

namespace hn {

namespace pb = hybridnn::proto;

inline constexpr std::uint64_t kDefaultSeed = 1701;

// The update rule the solver names (solver_settings.cpp).
UpdateType update_type_of(const pb::SolverParameter& param, const std::string& origin);

inline std::string text_of(const google::protobuf::Message& net) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(net, &text);
  return text;
}

struct Solver::Impl {
  Runtime* runtime = nullptr;
  Driver* driver = nullptr;  // null until build_nets makes it for `device`
  Device device;
  SolverOptions options;
  std::unique_ptr<Communicator> local_comm;  // when options.communicator is null
  Communicator* comm = nullptr;
  bool weights_broadcast = false;              // rank 0's weights reached every rank
  std::unique_ptr<detail::GradientSync> sync;  // more than one rank
  std::string net_text;                        // the training net's prototxt, for the start check
  std::string origin;                          // the solver file
  pb::SolverParameter param;
  UpdateType type = UpdateType::sgd;
  bool l1 = false;
  std::uint64_t seed = kDefaultSeed;

  std::unique_ptr<Net> net;
  std::vector<std::unique_ptr<Net>> test_nets;
  std::vector<int> test_iters;
  // Caffe's history_: one array per learnable parameter, then (AdaDelta, Adam) a second.
  std::vector<std::unique_ptr<Tensor>> history, history2;

  int iter = 0;
  int current_step = 0;  // step and multistep policies
  float last_loss = 0.0f;
  std::deque<float> losses;  // the average_loss window, oldest first
  float smoothed_loss = 0.0f;
  // A pending stop request (set by request_stop, taken by the loop) and whether the last
  // solve()/step() ended on one.
  std::atomic<bool> stop{false};
  bool stopped = false;
  std::function<void(const SolverEvent&)> callback;

  using Clock = std::chrono::steady_clock;
  // Training time since the last display: forward, backward and update only (tests and
  // snapshots excluded), so images/s and the time remaining measure training.
  double train_seconds = 0.0;
  double allreduce_seconds = 0.0, exposed_comm_seconds = 0.0;
  double comm_bytes = 0.0;  // sent since the last display
  int iterations_since_display = 0;
  // The training net's recorded iteration (SolverOptions::graphs), once made; `unrecorded`:
  // why none will be (said once), empty while the run may still make one.
  std::unique_ptr<Driver::Recording> recording;
  std::string unrecorded;
  int run_start_iter = 0;  // the iteration the current solve()/step() began at
  // The recording holds the clearing of the gradients and the update too (one batch per
  // update, no clipping): the rate, the loss gate and a scratch float on the driver.
  // (Then every iteration's update runs in its replay.)
  bool update_recorded = false;
  std::unique_ptr<Tensor> update_scalars;
  // Replays the recording, the iteration's `rate` written first where it holds the update.
  void replay(bool fetch_data, float rate);
  void mark_update_replayed();
  // The forward and backward of one batch: replayed where recorded, else call by call;
  // records at the run's second iteration where the net and options allow. `rate`: the
  // iteration's, for a recorded update.
  float forward_backward(bool may_record, float rate);
  bool first_display = true;  // the first iteration of a run pays one-off setup: not timed

  // The constructors' work, once driver (or device) is set.
  void start(const std::string& solver_prototxt_path, Runtime& runtime,
             const SolverOptions& options);
  void build_nets();
  void check_policy() const;
  // The rate at `iter` and the multistep step it implies (Caffe's GetLearningRate, which
  // advances the multistep step by at most one per call).
  float rate(int* step) const;
  void train_iteration(float rate);
  // The collectives of data parallelism (no-ops for a single rank).
  void broadcast_weights();
  // Every rank's `fingerprints`, gathered: the (rank, index) pairs where a rank's differ
  // from rank 0's, in rank order.
  std::vector<std::pair<int, std::size_t>> fingerprints_differing(
      const std::vector<std::uint64_t>& fingerprints);
  // At construction: every rank runs the same net, solver and library, or all fail.
  void check_ranks_agree();
  // Every rank holds the same weights, or all fail naming the first that differs.
  void check_weights_agree(const char* when);
  // The update at `rate` (rate_on_driver: read there instead, as update_rate(rate); gate:
  // no update where it is not finite), as recorded.
  void apply_update(float rate, const float* rate_on_driver = nullptr,
                    const float* gate_on_driver = nullptr);
  // The policy's rate as the update applies it (Adam's bias correction folded in).
  float update_rate(float rate) const;
  void update_smoothed_loss(float loss);
  void display(float rate);
  void test_all();
  std::optional<std::vector<std::pair<std::string, float>>> run_test(int index, float* loss,
                                                                     bool interruptible);
  // Takes a pending stop request: true when there was one. With several ranks, a request
  // counts once every rank knows of it (the last iteration's reduction), so that all stop
  // after the same iteration.
  bool agreed_stop = false;
  bool take_stop() {
    if (sync) {
      if (!agreed_stop) return false;
      agreed_stop = false;
      stop.store(false);
      stopped = true;
      return true;
    }
    if (!stop.exchange(false)) return false;
    stopped = true;
    return true;
  }
  std::string snapshot();
  std::string prefix() const;
  void check_snapshot_prefix() const;
  int run(int iterations);
  void solve();
  // Runs `work`; a failed collective's error (CommunicatorError) gains this rank and the
  // iteration.
  template <class Work>
  void with_rank_context(Work&& work) {
    try {
      work();
    } catch (const CommunicatorError& error) {
      if (comm->size() == 1) throw;
      throw CommunicatorError(fmt::format("{}: rank {} of {}, iteration {}: {}", origin,
                                          comm->rank(), comm->size(), iter, error.what()));
    }
  }
  void emit(const SolverEvent& event) const {
    if (callback) callback(event);
  }
  SolverEvent event(Phase phase) const {
    SolverEvent e;
    e.iter = iter;
    e.phase = phase;
    int step = current_step;
    e.lr = rate(&step);
    return e;
  }
};

}  // namespace hn
