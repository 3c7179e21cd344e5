// Solver: Caffe's training loop from a SolverParameter prototxt: the training net and its
// test nets, the update rules (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam), learning
// rate policies, regularisation, gradient clipping, iter_size, periodic tests, display,
// snapshots (.caffemodel + .solverstate, written atomically) and exact resume.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"

namespace hn {

struct SolverOptions {
  // Data sources replacing those of the training net's and the test nets' Data layers (see
  // NetOptions::data_source); empty keeps the prototxt's. `data` is both nets' where
  // train_data or test_data is empty.
  std::string data;
  std::string train_data;
  std::string test_data;
  std::string mean_file;  // see NetOptions::mean_file
  // Replaces the solver's snapshot_prefix (empty: keep). Relative prefixes and the `net`
  // path resolve against the working directory, as in Caffe.
  std::string snapshot_prefix;
  // Replaces max_iter when > 0.
  int max_iter = 0;
  std::uint64_t seed = 0;  // 0: the solver's random_seed when set, else a fixed default
  // Cuts every layer's batch among devices in the training and test nets (see
  // NetOptions::split); empty: the nets' prototxt decides.
  Split split;
  // Splits of single layers (see NetOptions::layer_splits) of the training net, and of the
  // test nets built from the same prototxt (net / net_param); test nets from files of their
  // own (test_net, test_net_param) use `split`.
  LayerSplits layer_splits;
  // The ranks this solver trains with (synchronous data parallelism). Not owned; null: this
  // process alone (make_local_communicator()). With more than one rank:
  //  - at construction the ranks compare their nets (every parameter's shape, the
  //    prototxt), solvers and library versions, and all fail naming the ranks that differ;
  //  - rank r's Data layers read records r, r + N, r + 2N, ... (NetOptions::data_shard), so
  //    the global batch is N times the prototxt's;
  //  - the weights are broadcast from rank 0 before the first iteration;
  //  - backward hands the parameter gradients, in buckets of `bucket_bytes`, to a
  //    communication thread that averages them over the ranks while the layers below are
  //    still computing; the update waits for the buckets still in flight;
  //  - the loss and the display outputs are means over the ranks, and a test pass spreads
  //    its test_iter batches over the ranks and reports the means over all of them;
  //  - every `checksum_interval` iterations and at every snapshot the ranks compare a
  //    checksum of their weights and fail naming the first rank that differs;
  //  - only rank 0 writes snapshots.
  //  With InnerProduct layers cut across the ranks (model_parallel below, or
  //  `model_parallel: true` in the prototxt), each rank holds and updates only its outputs'
  //  rows of their weights and history: those gradients are divided by the ranks instead
  //  of averaged, and neither broadcast nor compared; snapshots gather them, so they stay
  //  whole Caffe files; every rank runs every test pass's forwards in step.
  Communicator* communicator = nullptr;
  // Layers cut across the ranks by name (NetOptions::model_parallel), in the training net
  // and in the test nets built from the same prototxt.
  std::vector<std::string> model_parallel;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // The gradients sent as BF16 with FP32 sums at every hop (Communicator::allreduce_bf16:
  // half the bytes; the ring backend), or FP32. The loss, the checksums and the test
  // passes' means stay FP32.
  GradCompression grad_compress = GradCompression::none;
  int checksum_interval = 1000;  // 0: only at snapshots
  // Measured choice of algorithms in the training and test nets (NetOptions::tune).
  TuneOptions tune;
  // Blocked activations between the layers that take them (NetOptions::blocked_layout).
  bool blocked_layout = false;
  // BatchNorm + Scale [+ ReLU] and Eltwise SUM + ReLU chains run as one layer
  // (NetOptions::fuse_layers).
  bool fuse_layers = true;
  // The nets' math mode (NetOptions::math); unset: each net's prototxt decides.
  std::optional<MathMode> math;
  // On a driver that records (a GPU alone, Driver::records), the training net's forward
  // and backward are recorded once, at the run's second iteration, and replayed as one
  // launch (a CUDA graph) at every iteration after, with the clearing of the gradients and
  // the update where iter_size is 1 and clip_gradients unset (the update reads its rate and
  // the loss on the driver, and updates nothing after a NaN loss); the data layers and the
  // loss check run outside it. The losses and weights are those of training call by call. A net the
  // recording cannot hold trains call by call, with a note on stderr saying why: several ranks, a
  // split or cut across devices, a Dropout layer (its masks' seed would be fixed), a call that
  // waits for the device. false: call by call always.
  bool graphs = true;
};

// What the Solver reports while it runs: one event per display interval (phase train) and
// one per test pass and test net (phase test).
struct SolverEvent {
  int iter = 0;
  Phase phase = Phase::train;
  int test_net = 0;
  float loss = 0.0f;  // train: smoothed over average_loss iterations; test: mean over test_iter
  std::optional<float> accuracy;  // the first output blob named "accuracy*" when present
  std::vector<std::pair<std::string, float>> outputs;  // every net output (test: means)
  float lr = 0.0f;
  double images_per_s = 0.0;       // train: since the previous display
  double seconds_remaining = 0.0;  // train: estimated to max_iter
  std::string snapshot;            // set on snapshot events (the .caffemodel path)
  // Data parallelism, train: since the previous display, the time the gradient allreduces
  // took (on the communication thread) and the part of it training waited for.
  double allreduce_seconds = 0.0;
  double exposed_comm_seconds = 0.0;
  double train_seconds = 0.0;  // forward, backward and update, for the shares
  // Bytes this rank sent to the others per iteration since the previous display: the
  // gradient allreduce (2(R-1)/R of the bytes reduced, as the ring sends them) and the
  // collectives of layers cut across ranks (Net::comm_bytes).
  double comm_bytes_per_iteration = 0.0;
};

class Solver {
 public:
  // Reads the solver prototxt and builds its nets on `driver`. The `net` / `train_net` path
  // is taken as written; when relative and missing it is also looked up beside the solver
  // file.
  Solver(const std::string& solver_prototxt_path, Runtime& runtime, Driver& driver,
         const SolverOptions& options = {});
  // The same on `device`, whose driver the runtime makes with those of the training net's
  // splits when it has none, all at once (Runtime::provide).
  Solver(const std::string& solver_prototxt_path, Runtime& runtime, const Device& device,
         const SolverOptions& options = {});
  Solver(const Solver&) = delete;
  Solver& operator=(const Solver&) = delete;
  ~Solver();

  // Receives display, test and snapshot events (called on the solving thread).
  void on_event(std::function<void(const SolverEvent&)> callback);

  // Copies weights from one or more .caffemodel files ("a,b") into the training net.
  void copy_weights(const std::string& caffemodel_paths);
  // Restores weights, history and iteration from a .solverstate (its learned_net is
  // looked up as written, then beside the .solverstate).
  void restore(const std::string& solverstate_path);

  // Trains until max_iter (or a stop request), testing and snapshotting as configured,
  // with Caffe's final snapshot and test. Throws hn::Error when the loss becomes NaN or
  // infinite, naming the iteration; snapshots already written stay as they were.
  void solve();
  // Runs `iterations` training iterations (no final snapshot).
  void step(int iterations);
  // Asks solve()/step() to stop after the current iteration; solve() then writes a
  // snapshot. Only stores to a lock-free atomic: safe to call from a signal handler.
  void request_stop() noexcept;
  bool stop_requested() const noexcept;

  // Runs test_iter forward passes of test net `index` from the start of its data and
  // returns the mean of each output blob.
  std::vector<std::pair<std::string, float>> test(int index);
  // Writes <prefix>_iter_N.caffemodel and .solverstate (rank 0 only; with several ranks a
  // collective: every rank calls it, and they compare weight checksums first); returns the
  // .caffemodel path.
  std::string snapshot();
  // Where snapshots go: <prefix>_iter_N.* (Caffe's rules: the solver's snapshot_prefix or
  // SolverOptions::snapshot_prefix; unset, the solver file's path without its extension; a
  // directory, the solver file's stem inside it).
  std::string snapshot_prefix() const;
  // The ranks this solver trains with.
  Communicator& communicator();

  // Whether the training net's iteration replays a recording (SolverOptions::graphs), and
  // where it was tried and could not, why (empty otherwise: not yet tried, graphs off, or a
  // driver that records nothing, such as a CPU's).
  bool iteration_recorded() const;
  const std::string& unrecorded_why() const;

  int iter() const;
  int max_iter() const;
  float learning_rate() const;  // at the current iteration, per lr_policy
  float last_loss() const;      // of the last iteration (unsmoothed, mean over iter_size)
  Net& net();
  int num_test_nets() const;
  Net& test_net(int index);

 private:
  struct Impl;  // lib/solver/solver.cpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace hn
