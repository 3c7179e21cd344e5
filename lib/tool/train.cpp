// `hybridnn train`: Caffe's `caffe train`. Runs a Solver with its progress printed per display
// interval, optional JSON-lines metrics, and a snapshot when SIGINT or SIGTERM stops it.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "hybridnn/error.h"
#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

// The handler reaches the solver through these; request_stop() only stores an atomic.
std::atomic<Solver*> stop_target{nullptr};
volatile std::sig_atomic_t stop_signal = 0;

extern "C" void on_stop_signal(int signal) {
  if (stop_signal != 0) _exit(128 + signal);  // the second one does not wait
  stop_signal = signal;
  if (Solver* solver = stop_target.load()) solver->request_stop();
  // write() is async-signal-safe; stdio is not.
  static const char message[] =
      "hybridnn train: stopping after this iteration with a snapshot (signal again to quit "
      "at once)\n";
  if (write(STDERR_FILENO, message, sizeof message - 1) < 0) {
    // Nothing to do: the stop goes on without the message.
  }
}

// Routes SIGINT and SIGTERM to on_stop_signal while it lives.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    stop_target.store(nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  void attach(Solver& solver) {
    stop_target.store(&solver);
    if (stop_signal != 0) solver.request_stop();  // arrived while the nets were being built
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

const char* signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal";
}

// --metrics FILE: one JSON object per line, flushed as written so a reader can follow.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path) : path_(path) {
    if (path.empty()) return;
    create_parent_directory(path);
    note_if_fifo("--metrics", path);
    file_.reset(std::fopen(path.c_str(), "w"));
    if (!file_) throw Error(fmt::format("--metrics: cannot write '{}'", path));
  }
  void write(const std::string& line) {
    if (!file_) return;
    if (std::fputs(line.c_str(), file_.get()) < 0 || std::fputc('\n', file_.get()) < 0 ||
        std::fflush(file_.get()) != 0) {
      throw Error(fmt::format("--metrics: writing '{}' failed", path_));
    }
  }

 private:
  struct Close {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, Close> file_;
};

std::map<std::string, float> loss_weights(const Net& net) {
  std::map<std::string, float> weights;
  for (const auto& [name, weight] : net.outputs())
    weights[name] = weight;
  return weights;
}

// Prints a SolverEvent as Caffe's log does and writes its metrics line.
class Reporter {
 public:
  Reporter(Solver& solver, MetricsFile& metrics) : solver_(solver), metrics_(metrics) {
    train_weights_ = loss_weights(solver.net());
    for (int i = 0; i < solver.num_test_nets(); ++i) {
      test_weights_.push_back(loss_weights(solver.test_net(i)));
    }
  }

  void operator()(const SolverEvent& event) {
    if (!event.snapshot.empty()) {
      last_snapshot_ = event.snapshot;
      fmt::print("Snapshotting to binary proto file {}\n", event.snapshot);
      fmt::print("Snapshotting solver state to binary proto file {}\n",
                 solverstate_path(event.snapshot));
      return;
    }
    const bool train = event.phase == Phase::train;
    if (train) {
      // The closing display after the last iteration times nothing.
      const std::string speed =
          event.images_per_s > 0
              ? fmt::format(", {:.0f} images/s, {} remaining", event.images_per_s,
                            format_duration(event.seconds_remaining))
              : std::string();
      // With several ranks: the share of training time spent waiting for the allreduce.
      const std::string comm =
          event.train_seconds > 0 && solver_.communicator().size() > 1
              ? fmt::format(", comm exposed {:.0f}%",
                            100.0 * event.exposed_comm_seconds / event.train_seconds)
              : std::string();
      fmt::print("Iteration {}, loss = {}, lr = {}{}{}\n", event.iter, format_float(event.loss),
                 format_float(event.lr), speed, comm);
    } else {
      fmt::print("Iteration {}, Testing net (#{})\n", event.iter, event.test_net);
    }
    const auto& weights = train ? train_weights_ : test_weights_.at(event.test_net);
    int index = 0;
    for (const auto& [name, value] : event.outputs) {
      const auto weight = weights.find(name);
      fmt::print("    {} net output #{}: {} = {}{}\n", train ? "Train" : "Test", index++, name,
                 format_float(value),
                 loss_note(weight == weights.end() ? 0.0f : weight->second, value));
    }
    std::string line =
        fmt::format(R"({{"iter":{},"phase":"{}",)", event.iter, train ? "train" : "test");
    if (!train && solver_.num_test_nets() > 1)
      line += fmt::format(R"("test_net":{},)", event.test_net);
    line +=
        fmt::format(R"("loss":{},"accuracy":{},"lr":{},"images_per_s":{},"peak_rss_bytes":{}}})",
                    json_number(event.loss), event.accuracy ? json_number(*event.accuracy) : "null",
                    json_number(event.lr),
                    event.images_per_s > 0 ? fmt::format("{:.1f}", event.images_per_s) : "null",
                    peak_resident_bytes());
    if (train && solver_.communicator().size() > 1 && event.train_seconds > 0) {
      line.pop_back();
      line += fmt::format(
          R"(,"ranks":{},"allreduce_s":{},"exposed_comm_s":{},"train_s":{}{}}})",
          solver_.communicator().size(), json_number(event.allreduce_seconds),
          json_number(event.exposed_comm_seconds), json_number(event.train_seconds),
          event.comm_bytes_per_iteration > 0
              ? ",\"comm_bytes_per_iter\":" + json_number(event.comm_bytes_per_iteration)
              : std::string());
    }
    metrics_.write(line);
  }

  const std::string& last_snapshot() const { return last_snapshot_; }

 private:
  static std::string solverstate_path(const std::string& caffemodel) {
    const std::string suffix = ".caffemodel";
    if (caffemodel.size() > suffix.size() &&
        caffemodel.compare(caffemodel.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return caffemodel.substr(0, caffemodel.size() - suffix.size()) + ".solverstate";
    }
    return caffemodel + ".solverstate";
  }

  Solver& solver_;
  MetricsFile& metrics_;
  std::map<std::string, float> train_weights_;
  std::vector<std::map<std::string, float>> test_weights_;
  std::string last_snapshot_;
};

// The flags of train's own from the library's option table (the tuning ones come with
// apply_tune_flags).
constexpr std::initializer_list<const char*> kSolverKeys = {
    "data",  "train_data", "test_data",  "mean_file",      "max_iter",  "snapshot_prefix",
    "seed",  "split",      "split_file", "model_parallel", "bucket_mb", "grad_compress",
    "graphs"};

int run_train(const Args& args) {
  const std::string solver_path = args.required_text("solver");
  if (args.has("weights") && args.has("snapshot")) {
    throw UsageError(
        "give --weights to fine-tune or --snapshot to resume training, not both (as Caffe)");
  }
  SolverOptions options;
  set_table_options(options, args, kSolverKeys);

  // Under mpirun: one rank of a data-parallel run. Rank 0 alone prints (chosen_communicator
  // quiets the others), writes metrics and snapshots.
  Communicator* const comm = &chosen_communicator(args);
  const bool root = comm->rank() == 0;
  options.communicator = comm;
  apply_tune_flags(options, args);
  if (options.grad_compress != GradCompression::none && comm->size() > 1 && !comm->compresses()) {
    fmt::print(
        "Note: the {} backend sends FP32 gradients: --grad-compress {} applies to the ring "
        "backend\n",
        comm->name(), grad_compression_name(options.grad_compress));
  }

  Runtime runtime;
  configure_runtime(runtime, args);
  MetricsFile metrics(root ? args.text("metrics") : std::string());
  StopSignals signals;

  Solver solver(solver_path, runtime, chosen_device(args, options.split, options.layer_splits),
                options);
  Driver& driver = solver.net().driver();
  print_math_notes(solver.net());
  signals.attach(solver);
  // Caffe fails at the first snapshot when the prefix's directory is missing; create it.
  if (root) {
    create_parent_directory(solver.snapshot_prefix());
  }

  const index_t batch = solver.net().batch_size();
  const std::string ranks = comm->size() > 1
                                ? fmt::format(" x {} ranks ({}) = global batch {}", comm->size(),
                                              comm->name(), batch * comm->size())
                                : std::string();
  fmt::print("Solving {} on {} ({} learnable parameter blobs, batch {}{})\n", solver.net().name(),
             driver.description(), solver.net().learnable_params().size(), batch, ranks);
  if (args.has("weights")) {
    fmt::print("Fine-tuning from {}\n", args.text("weights"));
    solver.copy_weights(args.text("weights"));
  }
  if (args.has("snapshot")) {
    fmt::print("Resuming from {}\n", args.text("snapshot"));
    solver.restore(args.text("snapshot"));
    fmt::print("Resumed at iteration {}\n", solver.iter());
  }
  settle_splits(solver.net(), args);

  Reporter reporter(solver, metrics);
  // Said once, at the first event after the solver tried to record an iteration and could
  // not (a GPU alone, --graphs on).
  bool said_recording = false;
  solver.on_event([&](const SolverEvent& event) {
    if (!said_recording && root && solver.iteration_recorded()) {
      fmt::print("Iterations replay one recording (a CUDA graph; --graphs off: call by call)\n");
      said_recording = true;
    } else if (!said_recording && root && !solver.unrecorded_why().empty()) {
      fmt::print(stderr, "Note: training call by call, not as one recorded iteration: {}\n",
                 solver.unrecorded_why());
      said_recording = true;
    }
    reporter(event);
  });
  const int first_iter = solver.iter();
  const auto start = std::chrono::steady_clock::now();
  try {
    solver.solve();
  } catch (const Error& error) {
    if (reporter.last_snapshot().empty()) throw;
    throw Error(fmt::format("{}\nlast snapshot: {}", error.what(), reporter.last_snapshot()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int iterations = solver.iter() - first_iter;
  if (solver.stop_requested()) {
    fmt::print("Training stopped by {} at iteration {}; snapshot: {}\n", signal_name(stop_signal),
               solver.iter(),
               reporter.last_snapshot().empty() ? "none written" : reporter.last_snapshot());
  } else {
    fmt::print(
        "Optimization Done: {} iterations in {} ({:.2f} ms/iteration), peak resident "
        "memory {}\n",
        iterations, format_duration(seconds), iterations > 0 ? seconds * 1e3 / iterations : 0.0,
        format_bytes(peak_resident_bytes()));
  }
  return 0;
}

}  // namespace

Command train_command() {
  Command command;
  command.name = "train";
  command.summary = "train or fine-tune a model (Caffe's caffe train)";
  command.synopsis =
      "--solver FILE [--weights W[,W2] | --snapshot S] [--split SPEC | --split-file FILE] "
      "[--split-save FILE] [--data SRC] [--metrics FILE] [flags]";
  command.details =
      "Prints a line per display interval (iteration, loss, learning rate, images/s, time\n"
      "remaining), the test nets' outputs per test pass and the snapshot paths. SIGINT or\n"
      "SIGTERM stops after the current iteration and writes a snapshot (exit 0); a second one\n"
      "exits at once. --metrics writes JSON lines {\"iter\",\"phase\",\"loss\",\"accuracy\",\n"
      "\"lr\",\"images_per_s\",\"peak_rss_bytes\"} per display interval and test pass (the\n"
      "process's resident high-water mark so far).\n"
      "\n"
      "--split cuts every layer's batch among devices in the training and test nets (the\n"
      "slices run at the same time). --split auto first measures each layer of the training\n"
      "net and prints the chosen fractions (the test nets measure theirs at their first\n"
      "test); --split-save FILE keeps the training net's, and --split-file FILE trains with\n"
      "them again (test nets built from the same prototxt use them too).\n"
      "\n"
      "Under mpirun (mpirun -np N hybridnn train --solver S) the N ranks train one model\n"
      "synchronously: rank r reads records r, r+N, ... (global batch N x the prototxt's),\n"
      "gradients are averaged with a ring allreduce overlapping backward, tests cover the\n"
      "whole test set across the ranks, and rank 0 prints, writes --metrics and snapshots.\n"
      "A rank that fails, or a collective that waits past --comm-timeout, ends every rank.\n"
      "Give --threads (cores per rank) when ranks share a node; the default shares the\n"
      "node's cores among its ranks.";
  command.flags = {
      {"solver", FlagKind::text, "FILE", "the solver prototxt (required)"},
      {"weights", FlagKind::text, "W[,W2]", "fine-tune from these .caffemodel files"},
      {"snapshot", FlagKind::text, "S", "resume from this .solverstate"},
      {"metrics", FlagKind::text, "FILE", "write JSON-lines metrics to FILE"},
  };
  for (const char* key : {"data", "train_data", "test_data", "mean_file", "max_iter",
                          "snapshot_prefix", "seed", "graphs"})
    command.flags.push_back(table_flag(key));
  for (FlagSpec& flag : device_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : comm_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : tune_flags())
    command.flags.push_back(std::move(flag));
  command.run = run_train;
  return command;
}

}  // namespace hn::tool
