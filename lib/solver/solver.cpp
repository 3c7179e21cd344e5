// The Solver: Caffe's Solver / SGDSolver loop (solver.cpp, sgd_solver.cpp) over a Net. The
// per-parameter arithmetic (normalisation, regularisation, the update rule and the weight
// update) is one fused Driver::solver_update call per parameter; everything else follows
// Caffe's order, so that Caffe's hyper-parameters give Caffe's trajectory.
//
// Exact resume: iteration i's k-th forward/backward reads batch i * iter_size + k of the
// training data and uses the random stream iteration_seed(seed, i, k), and the snapshot
// holds the weights, every history array and the step of the multistep policy, so a run
// restored at iteration i computes what the uninterrupted run computed.
#include "lib/solver/solver.h"

#include "lib/core/version.h"

#include <fmt/format.h>
#include <google/protobuf/text_format.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>

#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/core/text.h"
#include "lib/proto/prototxt.h"
#include "lib/solver/gradient_sync.h"

namespace hn {

namespace pb = hybridnn::proto;
namespace fs = std::filesystem;

namespace {

static_assert(std::atomic<bool>::is_always_lock_free,
              "request_stop must be safe in a signal handler");

constexpr std::uint64_t kDefaultSeed = 1701;

// The random stream of forward/backward k of iteration `iter` (dropout masks, DummyData).
std::uint64_t iteration_seed(std::uint64_t seed, int iter, int k) {
  return detail::mix_seeds(detail::mix_seeds(seed, static_cast<std::uint64_t>(iter)),
                           static_cast<std::uint64_t>(k));
}

// The stream of the test passes: the same for every pass, apart from the training streams.
std::uint64_t test_seed(std::uint64_t seed, int test_net) {
  return detail::mix_seeds(seed ^ 0x7E57u, static_cast<std::uint64_t>(test_net));
}

struct TypeName {
  const char* name;
  UpdateType type;
};
constexpr TypeName kTypes[] = {
    {"SGD", UpdateType::sgd},           {"Nesterov", UpdateType::nesterov},
    {"AdaGrad", UpdateType::adagrad},   {"RMSProp", UpdateType::rmsprop},
    {"AdaDelta", UpdateType::adadelta}, {"Adam", UpdateType::adam}};

std::string known_types() {
  std::string names;
  for (const TypeName& t : kTypes)
    names += names.empty() ? t.name : std::string(", ") + t.name;
  return names;
}

// Caffe's type string, or the legacy solver_type enum (upgrade_proto.cpp's rule: both may
// not be given).
UpdateType update_type_of(const pb::SolverParameter& param, const std::string& origin) {
  if (param.has_solver_type()) {
    HN_CHECK(!param.has_type(),
             "{}: give the solver either as type: \"...\" or as the old solver_type enum, not "
             "both (type: \"{}\", solver_type: {})",
             origin, param.type(), pb::SolverParameter::SolverType_Name(param.solver_type()));
    return kTypes[static_cast<int>(param.solver_type())].type;
  }
  for (const TypeName& t : kTypes) {
    if (param.type() == t.name) return t.type;
  }
  detail::fail("{}: unknown solver type \"{}\"; known types: {}", origin, param.type(),
               known_types());
}

// A net file named in the solver: as written, else beside the solver file when relative.
std::string resolve_beside(const std::string& path, const std::string& solver_path) {
  const fs::path written(path);
  if (fs::exists(written) || written.is_absolute()) return path;
  const fs::path beside = fs::path(solver_path).parent_path() / written;
  return fs::exists(beside) ? beside.string() : path;
}

NetState merge_state(Phase phase, const pb::NetState* extra) {
  NetState state;
  state.phase = phase;
  if (extra == nullptr) return state;
  // Caffe's NetState::MergeFrom: set fields replace, stages append.
  if (extra->has_phase()) state.phase = extra->phase() == pb::TRAIN ? Phase::train : Phase::test;
  if (extra->has_level()) state.level = extra->level();
  for (const std::string& stage : extra->stage())
    state.stages.push_back(stage);
  return state;
}

std::string text_of(const google::protobuf::Message& net) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(net, &text);
  return text;
}

// The nets' tuning under data parallelism: every rank takes rank 0's choice of algorithm
// (a broadcast per choice, at set-up), so that the ranks compute alike whatever each one
// measured or had cached, and the gradients they average are those of one model.
TuneOptions agreed_tune(const TuneOptions& tune, Communicator& comm, Driver& driver) {
  TuneOptions agreed = tune;
  if (comm.size() <= 1 || tune.mode == TuneMode::off || tune.agree) return agreed;
  agreed.agree = [&comm, &driver](const std::string& choice) {
    return broadcast_text_host(comm, driver, choice, 0);
  };
  return agreed;
}

}  // namespace

struct Solver::Impl {
  Runtime* runtime = nullptr;
  Driver* driver = nullptr;
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
  bool first_display = true;  // the first iteration of a run pays one-off setup: not timed

  void build_nets();
  void check_policy() const;
  // The rate at `iter` and the multistep step it implies (Caffe's GetLearningRate, which
  // advances the multistep step by at most one per call).
  float rate(int* step) const;
  void train_iteration();
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
  void apply_update(float rate);
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

// ---- construction -------------------------------------------------------------------

void Solver::Impl::build_nets() {
  const pb::SolverParameter& p = param;
  const int train_sources =
      p.has_net() + p.has_net_param() + p.has_train_net() + p.has_train_net_param();
  HN_CHECK(train_sources == 1,
           "{}: the solver must name exactly one training net with one of net, net_param, "
           "train_net, train_net_param; it names {}",
           origin, train_sources);
  NetOptions train_options;
  train_options.state = merge_state(Phase::train, p.has_train_state() ? &p.train_state() : nullptr);
  train_options.data_source = options.train_data;
  train_options.mean_file = options.mean_file;
  train_options.seed = seed;
  train_options.split = options.split;
  train_options.layer_splits = options.layer_splits;
  train_options.tune = agreed_tune(options.tune, *comm, *driver);
  train_options.blocked_layout = options.blocked_layout;
  train_options.fuse_layers = options.fuse_layers;
  train_options.data_shard = comm->rank();
  train_options.data_shards = comm->size();
  train_options.communicator = comm;
  train_options.model_parallel = options.model_parallel;
  if (p.has_net() || p.has_train_net()) {
    const std::string path = resolve_beside(p.has_net() ? p.net() : p.train_net(), origin);
    net = std::make_unique<Net>(path, *runtime, *driver, train_options);
    if (comm->size() > 1) net_text = text_of(detail::read_net_prototxt(path));
  } else {
    net_text = text_of(p.has_net_param() ? p.net_param() : p.train_net_param());
    const pb::NetParameter& inline_net = p.has_net_param() ? p.net_param() : p.train_net_param();
    net = Net::from_text(
        text_of(inline_net),
        fmt::format("{} ({})", origin, p.has_net_param() ? "net_param" : "train_net_param"),
        *runtime, *driver, train_options);
  }
  for (const std::string& weights : p.weights())
    net->copy_trained_layers_from(weights);

  // Caffe's InitTestNets: test_net_param first, then test_net files, then as many
  // instances of the generic net (net / net_param) as test_iter entries remain.
  const bool generic = p.has_net() || p.has_net_param();
  const int listed = p.test_net_param_size() + p.test_net_size();
  HN_CHECK(generic ? p.test_iter_size() >= listed : p.test_iter_size() == listed,
           "{}: test_iter must be given once per test net: {} test nets, {} test_iter", origin,
           listed, p.test_iter_size());
  const int count = generic ? p.test_iter_size() : listed;
  HN_CHECK(p.test_state_size() == 0 || p.test_state_size() == count,
           "{}: test_state must be given once per test net or not at all: {} test nets, {} "
           "test_state",
           origin, count, p.test_state_size());
  HN_CHECK(count == 0 || p.test_interval() > 0, "{}: {} test nets need test_interval > 0, got {}",
           origin, count, p.test_interval());
  for (int i = 0; i < count; ++i) {
    NetOptions test_options;
    test_options.state =
        merge_state(Phase::test, p.test_state_size() > 0 ? &p.test_state(i) : nullptr);
    test_options.split = options.split;
    test_options.data_source = options.test_data;
    test_options.mean_file = options.mean_file;
    test_options.seed = seed;
    test_options.tune = agreed_tune(options.tune, *comm, *driver);
    test_options.blocked_layout = options.blocked_layout;
    test_options.fuse_layers = options.fuse_layers;
    test_options.communicator = comm;
    std::unique_ptr<Net> test_net;
    if (i < p.test_net_param_size()) {
      test_net = Net::from_text(text_of(p.test_net_param(i)),
                                fmt::format("{} (test_net_param {})", origin, i), *runtime, *driver,
                                test_options);
    } else if (i < listed) {
      const std::string path = resolve_beside(p.test_net(i - p.test_net_param_size()), origin);
      test_net = std::make_unique<Net>(path, *runtime, *driver, test_options);
    } else {
      // The training net's own prototxt in the test phase: its per-layer splits apply too.
      test_options.layer_splits = options.layer_splits;
      test_options.model_parallel = options.model_parallel;
      if (p.has_net()) {
        test_net =
            std::make_unique<Net>(resolve_beside(p.net(), origin), *runtime, *driver, test_options);
      } else {
        test_net = Net::from_text(text_of(p.net_param()), fmt::format("{} (net_param)", origin),
                                  *runtime, *driver, test_options);
      }
    }
    HN_CHECK(p.test_iter(i) > 0, "{}: test_iter of test net {} must be > 0, got {}", origin, i,
             p.test_iter(i));
    test_net->share_trained_layers_with(*net);
    test_nets.push_back(std::move(test_net));
    test_iters.push_back(p.test_iter(i));
  }

  const bool two = type == UpdateType::adadelta || type == UpdateType::adam;
  for (const NetParam& np : net->learnable_params()) {
    history.push_back(std::make_unique<Tensor>(np.tensor->shape()));
    if (two) history2.push_back(std::make_unique<Tensor>(np.tensor->shape()));
  }
}

void Solver::Impl::check_policy() const {
  const pb::SolverParameter& p = param;
  const std::string& policy = p.lr_policy();
  const char* known = "fixed, step, exp, inv, multistep, poly, sigmoid";
  HN_CHECK(!policy.empty(), "{}: lr_policy is not set; Caffe's policies: {}", origin, known);
  const bool uses_gamma = policy == "step" || policy == "exp" || policy == "inv" ||
                          policy == "multistep" || policy == "sigmoid";
  if (policy == "fixed" || policy == "poly") {
    // no further settings to check
  } else if (policy == "step" || policy == "sigmoid") {
    HN_CHECK(p.stepsize() > 0, "{}: lr_policy \"{}\" needs stepsize > 0, got {}", origin, policy,
             p.stepsize());
  } else if (policy == "multistep") {
    for (int i = 1; i < p.stepvalue_size(); ++i) {
      HN_CHECK(p.stepvalue(i) > p.stepvalue(i - 1),
               "{}: lr_policy \"multistep\" needs increasing stepvalue entries, got {} after {}",
               origin, p.stepvalue(i), p.stepvalue(i - 1));
    }
  } else if (policy != "exp" && policy != "inv") {
    detail::fail("{}: unknown lr_policy \"{}\"; Caffe's policies: {}", origin, policy, known);
  }
  if (uses_gamma) {
    HN_CHECK(p.gamma() >= 0.0f, "{}: lr_policy \"{}\" needs gamma >= 0, got {}", origin, policy,
             p.gamma());
  }
  if (policy == "poly") {
    HN_CHECK(p.max_iter() > 0, "{}: lr_policy \"poly\" needs max_iter > 0, got {}", origin,
             p.max_iter());
  }
}

// ---- the learning rate ----------------------------------------------------------------

float Solver::Impl::rate(int* step) const {
  const pb::SolverParameter& p = param;
  const std::string& policy = p.lr_policy();
  const float base_lr = p.base_lr(), gamma = p.gamma(), power = p.power();
  // Caffe's expressions in Caffe's types: pow(float, int) is evaluated in double.
  if (policy == "fixed") return base_lr;
  if (policy == "step") {
    *step = iter / p.stepsize();
    return static_cast<float>(base_lr * std::pow(gamma, *step));
  }
  if (policy == "exp") return static_cast<float>(base_lr * std::pow(gamma, iter));
  if (policy == "inv") {
    return base_lr * std::pow(1.0f + gamma * static_cast<float>(iter), -power);
  }
  if (policy == "multistep") {
    if (*step < p.stepvalue_size() && iter >= p.stepvalue(*step)) ++*step;
    return static_cast<float>(base_lr * std::pow(gamma, *step));
  }
  if (policy == "poly") {
    return base_lr *
           std::pow(1.0f - static_cast<float>(iter) / static_cast<float>(p.max_iter()), power);
  }
  // sigmoid
  return base_lr * (1.0f / (1.0f + std::exp(-gamma * (static_cast<float>(iter) -
                                                      static_cast<float>(p.stepsize())))));
}

// ---- one iteration -------------------------------------------------------------------

void Solver::Impl::train_iteration() {
  const int iter_size = param.iter_size();
  net->clear_param_diffs();
  float loss = 0.0f;
  for (int k = 0; k < iter_size; ++k) {
    const std::uint64_t batch = static_cast<std::uint64_t>(iter) * iter_size + k;
    if (net->data_position() != batch) net->seek_data(batch);
    std::uint64_t stream = iteration_seed(seed, iter, k);
    // Each rank's dropout masks its own rows.
    if (sync) stream = detail::mix_seeds(stream, static_cast<std::uint64_t>(comm->rank()) + 1);
    net->set_iteration_seed(stream);
    if (!sync || k + 1 < iter_size) {
      loss += net->forward_backward();
      continue;
    }
    loss += net->forward();
    // The last backward of the iteration overlaps the gradients' allreduce.
    sync->backward(loss / static_cast<float>(iter_size), stop.load());
    const detail::GradientSync::Result result = sync->wait();
    loss = result.loss * static_cast<float>(iter_size);
    agreed_stop = result.stop;
    const detail::GradientSync::Stats stats = sync->take_stats();
    allreduce_seconds += stats.allreduce_seconds;
    exposed_comm_seconds += stats.exposed_seconds;
    comm_bytes += static_cast<double>(stats.sent_bytes + net->comm_bytes());
    net->reset_comm_bytes();
  }
  loss /= static_cast<float>(iter_size);
  if (!std::isfinite(loss)) {
    detail::fail(
        "{}: the training loss is {} at iteration {}; stopping before the update (lower base_lr "
        "or set clip_gradients; snapshots already written are unchanged)",
        origin, std::isnan(loss) ? "NaN" : "infinite", iter);
  }
  last_loss = loss;
}

void Solver::Impl::broadcast_weights() {
  if (weights_broadcast || comm->size() == 1) return;
  for (const NetParam& np : net->learnable_params()) {
    if (np.shard.ranks > 1) continue;  // each rank's own rows of a layer cut across ranks
    comm->broadcast(*driver, np.tensor->data_write(*driver), np.tensor->count(), 0);
  }
  weights_broadcast = true;
}

std::vector<std::pair<int, std::size_t>> Solver::Impl::fingerprints_differing(
    const std::vector<std::uint64_t>& fingerprints) {
  // Four 16-bit pieces of each, exact as floats, so that a collective on floats carries
  // them unchanged.
  std::vector<float> mine;
  for (const std::uint64_t value : fingerprints) {
    for (int i = 0; i < 4; ++i)
      mine.push_back(static_cast<float>((value >> (16 * i)) & 0xFFFFu));
  }
  const std::vector<float> all = allgather_host(*comm, *driver, mine);
  std::vector<std::pair<int, std::size_t>> differing;
  for (int r = 1; r < comm->size(); ++r) {
    for (std::size_t i = 0; i < fingerprints.size(); ++i) {
      const float* theirs = all.data() + static_cast<std::size_t>(r) * mine.size() + 4 * i;
      if (!std::equal(theirs, theirs + 4, all.data() + 4 * i)) differing.emplace_back(r, i);
    }
  }
  return differing;
}

std::uint64_t fnv1a(const void* data, std::size_t bytes,
                    std::uint64_t hash = 1469598103934665603u) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i)
    hash = (hash ^ p[i]) * 1099511628211u;
  return hash;
}

std::uint64_t fnv1a(const std::string& text, std::uint64_t hash = 1469598103934665603u) {
  return fnv1a(text.data(), text.size(), hash);
}

void Solver::Impl::check_ranks_agree() {
  const int ranks = comm->size();
  if (ranks == 1) return;
  // What each rank compares, and its fingerprint.
  std::vector<std::pair<std::string, std::uint64_t>> items;
  items.emplace_back(fmt::format("library version ({})", version()), fnv1a(version()));
  // The solver's settings, not where its files lie on each rank (the nets' contents are
  // compared below).
  pb::SolverParameter settings = param;
  settings.clear_net();
  settings.clear_train_net();
  settings.clear_net_param();
  settings.clear_train_net_param();
  settings.clear_test_net();
  settings.clear_snapshot_prefix();
  items.emplace_back("solver parameters", fnv1a(text_of(settings)));
  items.emplace_back("training net prototxt", fnv1a(net_text));
  const std::vector<NetParam>& params = net->learnable_params();
  items.emplace_back(fmt::format("number of learnable parameters ({})", params.size()),
                     params.size());
  std::uint64_t shapes = fnv1a("shapes");
  for (const NetParam& np : params) {
    // A layer cut across ranks: each rank's rows differ, the whole does not.
    const std::string shape =
        np.shard.ranks > 1
            ? fmt::format("{} cut among {} ranks", np.shard.whole.to_string(), np.shard.ranks)
            : np.tensor->shape().to_string();
    shapes = fnv1a(np.layer + "/" + np.name + ":" + shape, shapes);
  }
  items.emplace_back("parameter shapes", shapes);
  std::vector<std::uint64_t> fingerprints;
  for (const auto& item : items)
    fingerprints.push_back(item.second);
  std::string differences;
  for (const auto& [r, i] : fingerprints_differing(fingerprints))
    differences += fmt::format("\n  rank {}: {} differs from rank 0's", r, items[i].first);
  HN_CHECK(differences.empty(),
           "{}: the {} ranks do not all train the same net with the same solver (this is rank "
           "{}; net '{}', {} learnable parameters):{}",
           origin, ranks, comm->rank(), net->name(), params.size(), differences);
}

void Solver::Impl::check_weights_agree(const char* when) {
  const int ranks = comm->size();
  if (ranks == 1) return;
  std::uint64_t hash = fnv1a("weights");
  for (const NetParam& np : net->learnable_params()) {
    if (np.shard.ranks > 1) continue;  // each rank's own rows
    hash = fnv1a(np.tensor->host_data(),
                 static_cast<std::size_t>(np.tensor->count()) * sizeof(float), hash);
  }
  const auto differing = fingerprints_differing({hash});
  HN_CHECK(differing.empty(),
           "{}: {} at iteration {}: the weights of rank {} differ from rank 0's (checksums "
           "compared on all {} ranks; this is rank {}); the ranks no longer train the same model",
           origin, when, iter, differing.empty() ? 0 : differing[0].first, ranks, comm->rank());
}

void Solver::Impl::apply_update(float rate) {
  const std::vector<NetParam>& params = net->learnable_params();
  // Each parameter on the driver that holds it: the Net's, or a device's rows of a layer cut
  // by outputs, which never leave it, nor does their history.
  auto driver_of = [&](const NetParam& np) -> Driver& {
    return np.driver != nullptr ? *np.driver : *driver;
  };
  // Caffe's ClipGradients: one L2 norm over every raw (accumulated) gradient.
  float grad_scale = 1.0f;
  if (param.clip_gradients() >= 0.0f) {
    double sumsq = 0.0, sharded = 0.0;
    for (const NetParam& np : params) {
      Driver& d = driver_of(np);
      const float* diff = np.tensor->diff_read(d);
      (np.shard.ranks > 1 ? sharded : sumsq) += d.dot(np.tensor->count(), diff, diff);
    }
    if (net->model_parallel_ranks() > 1) {  // the other ranks' rows of the cut layers
      std::vector<float> parts{static_cast<float>(sharded)};
      allreduce_host(*comm, *driver, parts, ReduceOp::sum);
      sharded = parts[0];
    }
    sumsq += sharded;
    const float norm = static_cast<float>(std::sqrt(sumsq));
    if (norm > param.clip_gradients()) grad_scale = param.clip_gradients() / norm;
  }
  // Normalize: 1 / iter_size, after clipping.
  if (param.iter_size() != 1) grad_scale *= 1.0f / static_cast<float>(param.iter_size());

  SolverUpdate u;
  u.type = type;
  u.momentum = param.momentum();
  u.momentum2 = param.momentum2();
  u.delta = param.delta();
  u.rms_decay = param.rms_decay();
  u.l1 = l1;
  u.grad_scale = grad_scale;
  float correction = 1.0f;
  if (type == UpdateType::adam) {  // Caffe's AdamSolver folds the bias correction into the rate
    const int t = iter + 1;
    correction = static_cast<float>(std::sqrt(1.0 - std::pow(param.momentum2(), t)) /
                                    (1.0 - std::pow(param.momentum(), t)));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor& tensor = *params[i].tensor;
    Driver& d = driver_of(params[i]);
    u.lr = rate * params[i].lr_mult;
    if (type == UpdateType::adam) u.lr *= correction;
    u.decay = param.weight_decay() * params[i].decay_mult;
    float* h2 = history2.empty() ? nullptr : history2[i]->data_write(d);
    d.solver_update(u, tensor.count(), tensor.data_write(d), tensor.diff_read(d),
                    history[i]->data_write(d), h2);
  }
}

// Caffe's smoothed loss: the mean of the last average_loss losses of this run. Caffe keeps a
// running sum whose rounding errors accumulate over the run; the mean of the window, added
// oldest first, depends only on the losses in it, so a resumed run reports the same values
// as the uninterrupted one once its window has filled.
void Solver::Impl::update_smoothed_loss(float loss) {
  losses.push_back(loss);
  if (static_cast<int>(losses.size()) > std::max(1, param.average_loss())) losses.pop_front();
  double sum = 0.0;
  for (const float value : losses)
    sum += value;
  smoothed_loss = static_cast<float>(sum / static_cast<double>(losses.size()));
}

void Solver::Impl::display(float rate) {
  const double seconds = train_seconds;
  SolverEvent e;
  e.iter = iter;
  e.phase = Phase::train;
  e.loss = smoothed_loss;
  e.lr = rate;
  if (seconds > 0.0 && iterations_since_display > 0 && !first_display) {
    const double per_iteration = seconds / iterations_since_display;
    // The global batch: every rank's.
    e.images_per_s =
        static_cast<double>(net->batch_size()) * param.iter_size() * comm->size() / per_iteration;
    e.seconds_remaining = std::max(0, param.max_iter() - iter) * per_iteration;
  }
  std::vector<float> values;
  for (const auto& [name, weight] : net->outputs()) {
    static_cast<void>(weight);
    const BlobRef blob = net->blob(name);
    values.insert(values.end(), blob.host_data(), blob.host_data() + blob.count());
  }
  // With several ranks: the means over the ranks, as the loss.
  if (comm->size() > 1) allreduce_host(*comm, *driver, values, ReduceOp::average);
  std::size_t at = 0;
  for (const auto& [name, weight] : net->outputs()) {
    static_cast<void>(weight);
    const index_t count = net->blob(name).count();
    for (index_t k = 0; k < count; ++k) {
      e.outputs.emplace_back(count == 1 ? name : fmt::format("{}[{}]", name, k), values[at++]);
    }
  }
  for (const auto& [name, value] : e.outputs) {
    if (name.rfind("accuracy", 0) == 0) {
      e.accuracy = value;
      break;
    }
  }
  e.train_seconds = train_seconds;
  e.allreduce_seconds = allreduce_seconds;
  e.exposed_comm_seconds = exposed_comm_seconds;
  if (iterations_since_display > 0)
    e.comm_bytes_per_iteration = comm_bytes / iterations_since_display;
  train_seconds = allreduce_seconds = exposed_comm_seconds = comm_bytes = 0.0;
  iterations_since_display = 0;
  first_display = false;
  emit(e);
}

// ---- testing ---------------------------------------------------------------------------

// Caffe's Solver::Test: the mean of every output element over test_iter forwards. Returns
// nothing when a stop request interrupts it (interruptible only; the request stays pending).
// With several ranks, rank r runs passes r, r + N, ... (each reading the batch one process
// would read in that pass) and the sums are added over the ranks: the means cover the whole
// test set, as one process's do.
std::optional<std::vector<std::pair<std::string, float>>> Solver::Impl::run_test(
    int index, float* loss, bool interruptible) {
  Net& test_net = *test_nets[index];
  const std::vector<std::pair<std::string, float>> outputs = test_net.outputs();
  std::size_t values = 0;
  for (const auto& [name, weight] : outputs) {
    static_cast<void>(weight);
    values += static_cast<std::size_t>(test_net.blob(name).count());
  }
  std::vector<double> sums(values, 0.0);
  double loss_sum = 0.0;
  const int passes = test_iters[index];
  const int ranks = comm->size(), rank = comm->rank();
  // Stop requests arrive on each rank separately; the ranks must still run the same
  // collectives, so only a single process interrupts a test.
  interruptible = interruptible && ranks == 1;
  test_net.set_iteration_seed(test_seed(seed, index));
  // A net with layers cut across ranks runs collectives in its forward: every rank runs as
  // many, and a rank past the last pass runs one more and counts nothing of it.
  const bool in_step = test_net.model_parallel_ranks() > 1;
  const int rounds = in_step ? (passes + ranks - 1) / ranks * ranks : passes;
  for (int i = rank; i < rounds; i += ranks) {
    if (interruptible && stop.load()) return std::nullopt;
    if (test_net.data_position() != static_cast<std::uint64_t>(i)) {
      test_net.seek_data(static_cast<std::uint64_t>(i));
    }
    const float pass_loss = test_net.forward();
    if (i >= passes) continue;
    loss_sum += pass_loss;
    std::size_t at = 0;
    for (const auto& [name, weight] : outputs) {
      static_cast<void>(weight);
      const BlobRef blob = test_net.blob(name);
      const float* v = blob.host_data();
      for (index_t k = 0; k < blob.count(); ++k)
        sums[at++] += v[k];
    }
  }
  if (ranks > 1) {
    // Per-rank sums in float, added over the ranks.
    std::vector<float> totals(sums.begin(), sums.end());
    totals.push_back(static_cast<float>(loss_sum));
    allreduce_host(*comm, *driver, totals, ReduceOp::sum);
    std::copy(totals.begin(), totals.end() - 1, sums.begin());
    loss_sum = totals.back();
  }
  std::vector<std::pair<std::string, float>> means;
  std::size_t at = 0;
  for (const auto& [name, weight] : outputs) {
    static_cast<void>(weight);
    const index_t count = test_net.blob(name).count();
    for (index_t k = 0; k < count; ++k) {
      means.emplace_back(count == 1 ? name : fmt::format("{}[{}]", name, k),
                         static_cast<float>(sums[at++] / passes));
    }
  }
  *loss = static_cast<float>(loss_sum / passes);
  return means;
}

void Solver::Impl::test_all() {
  for (int i = 0; i < static_cast<int>(test_nets.size()); ++i) {
    SolverEvent e = event(Phase::test);
    e.test_net = i;
    auto means = run_test(i, &e.loss, true);
    if (!means) return;
    e.outputs = std::move(*means);
    for (const auto& [name, value] : e.outputs) {
      if (name.rfind("accuracy", 0) == 0) {
        e.accuracy = value;
        break;
      }
    }
    emit(e);
  }
}

// ---- snapshots -----------------------------------------------------------------------

// Caffe's snapshot_prefix rules (upgrade_proto.cpp): unset, the solver file without its
// extension; a directory, the solver file's stem inside it.
std::string Solver::Impl::prefix() const {
  std::string prefix =
      options.snapshot_prefix.empty() ? param.snapshot_prefix() : options.snapshot_prefix;
  if (prefix.empty()) return fs::path(origin).replace_extension().string();
  if (fs::is_directory(prefix)) return (fs::path(prefix) / fs::path(origin).stem()).string();
  return prefix;
}

std::string Solver::snapshot_prefix() const {
  return impl_->prefix();
}

void Solver::Impl::check_snapshot_prefix() const {
  if (comm->rank() != 0) return;  // rank 0 writes the snapshots
  const std::string p = prefix();
  const fs::path parent = fs::path(p).parent_path();
  HN_CHECK(parent.empty() || fs::is_directory(parent),
           "{}: snapshot_prefix '{}' lies in '{}', which is not a directory; create it or set "
           "another prefix",
           origin, p, parent.string());
  // Writable now, not only hours later at the first snapshot: create and remove a file
  // beside the snapshots (permission bits do not tell for root or a read-only mount).
  const std::string probe = fmt::format("{}.write-test.{}", p, static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  HN_CHECK(fd >= 0, "{}: cannot write snapshots with snapshot_prefix '{}': creating '{}': {}",
           origin, p, probe, std::strerror(errno));
  ::close(fd);
  std::remove(probe.c_str());
}

std::string Solver::Impl::snapshot() {
  HN_CHECK(param.snapshot_format() == pb::SolverParameter::BINARYPROTO,
           "{}: snapshot_format HDF5 is not supported; use BINARYPROTO", origin);
  const std::string base = fmt::format("{}_iter_{}", prefix(), iter);
  const std::string model = base + ".caffemodel";
  check_weights_agree("snapshot");
  // Rank 0 writes them; with layers cut across ranks every rank takes part in gathering
  // their rows first.
  const bool gathered = net->model_parallel_ranks() > 1;
  if (comm->rank() != 0 && !gathered) return model;
  net->save(model, param.snapshot_diff());
  pb::SolverState state;
  state.set_iter(iter);
  state.set_learned_net(model);
  state.set_current_step(current_step);
  // Caffe's layout: one blob per whole parameter, the shards of a layer cut by outputs
  // joined.
  const std::vector<NetParam>& params = net->learnable_params();
  auto add = [&](std::vector<std::unique_ptr<Tensor>>& arrays) {
    if (arrays.empty()) return;  // a solver without a second history
    for (const WholeParam& whole : whole_params(params)) {
      pb::BlobProto* blob = state.add_history();
      for (index_t d : whole.shape.dims())
        blob->mutable_shape()->add_dim(d);
      std::vector<const float*> shards;
      for (std::size_t i = whole.first; i < whole.last; ++i)
        shards.push_back(arrays[i]->host_data());
      const std::vector<float> values = net->whole_values(whole, shards);
      blob->mutable_data()->Add(values.begin(), values.end());
    }
  };
  add(history);
  add(history2);
  if (comm->rank() != 0) return model;
  detail::write_binary_proto(base + ".solverstate", state);
  SolverEvent e = event(Phase::train);
  e.loss = smoothed_loss;
  e.snapshot = model;
  emit(e);
  return model;
}

// ---- the loop ------------------------------------------------------------------------

// Caffe's Solver::Step. Returns the iterations run.
int Solver::Impl::run(int iterations) {
  const int start_iter = iter, stop_iter = iter + iterations;
  losses.clear();
  smoothed_loss = 0.0f;
  train_seconds = 0.0;
  iterations_since_display = 0;
  first_display = true;
  broadcast_weights();
  while (iter < stop_iter) {
    if (param.test_interval() > 0 && iter % param.test_interval() == 0 &&
        (iter > 0 || param.test_initialization())) {
      test_all();
    }
    if (take_stop()) break;
    Clock::time_point start = Clock::now();
    train_iteration();
    train_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    ++iterations_since_display;
    update_smoothed_loss(last_loss);
    const float lr = rate(&current_step);
    if (param.display() > 0 && iter % param.display() == 0) display(lr);
    start = Clock::now();
    apply_update(lr);
    train_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    ++iter;
    if (options.checksum_interval > 0 && iter % options.checksum_interval == 0) {
      check_weights_agree("weight check");
    }
    if (param.snapshot() > 0 && iter % param.snapshot() == 0) snapshot();
    if (take_stop()) break;
  }
  return iter - start_iter;
}

// ---- Solver --------------------------------------------------------------------------

Solver::Solver(const std::string& solver_prototxt_path, Runtime& runtime, Driver& driver,
               const SolverOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.runtime = &runtime;
  s.driver = &driver;
  s.options = options;
  if (options.communicator == nullptr) s.local_comm = make_local_communicator();
  s.comm = options.communicator ? options.communicator : s.local_comm.get();
  s.origin = solver_prototxt_path;
  s.param = detail::read_solver_prototxt(solver_prototxt_path);
  pb::SolverParameter& p = s.param;
  if (options.max_iter > 0) p.set_max_iter(options.max_iter);
  s.type = update_type_of(p, s.origin);
  HN_CHECK(p.regularization_type() == "L2" || p.regularization_type() == "L1",
           "{}: unknown regularization_type \"{}\"; use L2 or L1", s.origin,
           p.regularization_type());
  s.l1 = p.regularization_type() == "L1";
  HN_CHECK(p.snapshot_format() == pb::SolverParameter::BINARYPROTO,
           "{}: snapshot_format HDF5 is not supported; use BINARYPROTO", s.origin);
  HN_CHECK(p.iter_size() >= 1, "{}: iter_size must be >= 1, got {}", s.origin, p.iter_size());
  HN_CHECK(p.max_iter() >= 0, "{}: max_iter must be >= 0, got {}", s.origin, p.max_iter());
  HN_CHECK(p.average_loss() >= 1, "{}: average_loss must be >= 1, got {}", s.origin,
           p.average_loss());
  HN_CHECK(p.snapshot() >= 0 && p.display() >= 0 && p.test_interval() >= 0,
           "{}: snapshot, display and test_interval must be >= 0 (got {}, {}, {})", s.origin,
           p.snapshot(), p.display(), p.test_interval());
  s.check_policy();
  if (options.seed != 0) {
    s.seed = options.seed;
  } else if (p.random_seed() >= 0) {
    s.seed = static_cast<std::uint64_t>(p.random_seed());
  }
  HN_CHECK(options.checksum_interval >= 0, "{}: checksum_interval must be >= 0, got {}", s.origin,
           options.checksum_interval);
  s.build_nets();
  if (s.comm->size() > 1) {
    s.check_ranks_agree();
    s.sync = std::make_unique<detail::GradientSync>(*s.net, *s.comm, options.bucket_bytes);
  }
}

Solver::~Solver() = default;

void Solver::on_event(std::function<void(const SolverEvent&)> callback) {
  impl_->callback = std::move(callback);
}

void Solver::copy_weights(const std::string& caffemodel_paths) {
  const std::vector<std::string> paths =
      detail::split_commas(caffemodel_paths, detail::EmptyItems::drop);
  HN_CHECK(!paths.empty(), "copy_weights: no .caffemodel path given ('{}')", caffemodel_paths);
  for (const std::string& path : paths)
    impl_->net->copy_trained_layers_from(path);
}

void Solver::restore(const std::string& solverstate_path) {
  Impl& s = *impl_;
  HN_CHECK(fs::exists(solverstate_path), "restore: solver state '{}' does not exist",
           solverstate_path);
  pb::SolverState state;
  detail::read_binary_proto(solverstate_path, state);
  HN_CHECK(state.iter() >= 0, "{}: iteration {} is negative", solverstate_path, state.iter());
  // The multistep policy's position among the solver's stepvalues (0 for the others).
  HN_CHECK(state.current_step() >= 0 && state.current_step() <= s.param.stepvalue_size(),
           "{}: current_step {} is outside [0, {}] (the solver has {} stepvalue{})",
           solverstate_path, state.current_step(), s.param.stepvalue_size(),
           s.param.stepvalue_size(), s.param.stepvalue_size() == 1 ? "" : "s");

  // Check everything before changing anything.
  const std::vector<NetParam>& params = s.net->learnable_params();
  // One blob per whole parameter (the shards of a layer cut by outputs joined).
  const std::vector<WholeParam> wholes = whole_params(params);
  const std::size_t expected = wholes.size() * (s.history2.empty() ? 1 : 2);
  HN_CHECK(static_cast<std::size_t>(state.history_size()) == expected,
           "{}: holds {} history blobs, but the {} solver of net '{}' keeps {} ({} learnable "
           "parameters{}); was it written for another net or solver type?",
           solverstate_path, state.history_size(), update_type_name(s.type), s.net->name(),
           expected, wholes.size(), s.history2.empty() ? "" : " x 2");
  for (int i = 0; i < state.history_size(); ++i) {
    const pb::BlobProto& blob = state.history(i);
    const NetParam& np = params[wholes[static_cast<std::size_t>(i) % wholes.size()].first];
    const Shape& shape = wholes[static_cast<std::size_t>(i) % wholes.size()].shape;
    HN_CHECK(detail::blob_shape_matches(blob, shape),
             "{}: history blob {} has shape {}, but parameter '{}' of layer '{}' is {}",
             solverstate_path, i, detail::blob_shape(blob).to_string(), np.name, np.layer,
             shape.to_string());
    const index_t values = blob.double_data_size() > 0 ? blob.double_data_size() : blob.data_size();
    HN_CHECK(values == shape.count(),
             "{}: history blob {} (parameter '{}' of layer '{}', shape {}) holds {} values, its "
             "shape needs {}",
             solverstate_path, i, np.name, np.layer, shape.to_string(), values, shape.count());
  }
  std::string model;
  if (state.has_learned_net() && !state.learned_net().empty()) {
    model = state.learned_net();
    if (!fs::exists(model)) {
      const fs::path beside = fs::path(solverstate_path).parent_path() / fs::path(model).filename();
      HN_CHECK(fs::exists(beside),
               "{}: its weights '{}' do not exist, neither as written nor beside the solver "
               "state ('{}')",
               solverstate_path, model, beside.string());
      model = beside.string();
    }
  }

  if (!model.empty()) s.net->copy_trained_layers_from(model);
  for (int i = 0; i < state.history_size(); ++i) {
    const pb::BlobProto& blob = state.history(i);
    const WholeParam& whole = wholes[static_cast<std::size_t>(i) % wholes.size()];
    auto& arrays = static_cast<std::size_t>(i) < wholes.size() ? s.history : s.history2;
    std::vector<float> data(static_cast<std::size_t>(whole.shape.count()));
    if (blob.double_data_size() > 0) {
      for (int k = 0; k < blob.double_data_size(); ++k)
        data[static_cast<std::size_t>(k)] = static_cast<float>(blob.double_data(k));
    } else {
      std::copy(blob.data().begin(), blob.data().end(), data.begin());
    }
    for (std::size_t p = whole.first; p < whole.last; ++p)
      whole_to_shard(params[p], data.data(), arrays[p]->host_data_mut());
  }
  s.iter = state.iter();
  s.current_step = state.current_step();
}

void Solver::solve() {
  impl_->with_rank_context([this] { impl_->solve(); });
}

// Solver::solve without the error context.
void Solver::Impl::solve() {
  Impl& s = *this;
  s.stopped = false;
  s.check_snapshot_prefix();
  const int start_iter = s.iter;
  s.run(std::max(0, s.param.max_iter() - s.iter));
  const bool was_stopped = s.stopped;
  const bool just_written =
      s.param.snapshot() > 0 && s.iter % s.param.snapshot() == 0 && s.iter > start_iter;
  if ((s.param.snapshot_after_train() || was_stopped) && !just_written) s.snapshot();
  if (was_stopped) return;
  // Caffe's closing display (one more forward of the training net) and test.
  if (s.param.display() > 0 && s.iter % s.param.display() == 0) {
    s.net->set_iteration_seed(iteration_seed(s.seed, s.iter, 0));
    float loss = s.net->forward();
    if (s.comm->size() > 1) {  // the global batch's, as during training
      std::vector<float> mean = {loss};
      allreduce_host(*s.comm, *s.driver, mean, ReduceOp::average);
      loss = mean[0];
    }
    s.update_smoothed_loss(loss);
    int step = s.current_step;
    const float lr = s.rate(&step);
    s.iterations_since_display = 0;  // no training iterations to time
    s.display(lr);
  }
  if (s.param.test_interval() > 0 && s.iter % s.param.test_interval() == 0) s.test_all();
}

void Solver::step(int iterations) {
  HN_CHECK(iterations >= 0, "step: iterations must be >= 0, got {}", iterations);
  impl_->stopped = false;
  if (impl_->param.snapshot() > 0 && iterations > 0) impl_->check_snapshot_prefix();
  impl_->with_rank_context([this, iterations] { impl_->run(iterations); });
}

void Solver::request_stop() noexcept {
  impl_->stop.store(true);
}

// Pending, or acted on by the last solve()/step().
bool Solver::stop_requested() const noexcept {
  return impl_->stop.load() || impl_->stopped;
}

std::vector<std::pair<std::string, float>> Solver::test(int index) {
  HN_CHECK(index >= 0 && index < num_test_nets(), "test({}): the solver has {} test nets", index,
           num_test_nets());
  float loss = 0.0f;
  std::vector<std::pair<std::string, float>> means;
  impl_->with_rank_context([&] { means = *impl_->run_test(index, &loss, false); });
  return means;
}

std::string Solver::snapshot() {
  std::string model;
  impl_->with_rank_context([&] { model = impl_->snapshot(); });
  return model;
}

int Solver::iter() const {
  return impl_->iter;
}
int Solver::max_iter() const {
  return impl_->param.max_iter();
}
float Solver::learning_rate() const {
  int step = impl_->current_step;
  return impl_->rate(&step);
}
float Solver::last_loss() const {
  return impl_->last_loss;
}
Communicator& Solver::communicator() {
  return *impl_->comm;
}
Net& Solver::net() {
  return *impl_->net;
}
int Solver::num_test_nets() const {
  return static_cast<int>(impl_->test_nets.size());
}
Net& Solver::test_net(int index) {
  HN_CHECK(index >= 0 && index < num_test_nets(), "test_net({}): the solver has {} test nets",
           index, num_test_nets());
  return *impl_->test_nets[index];
}

std::vector<Device> solver_split_devices(const std::string& solver_path) {
  const pb::SolverParameter p = detail::read_solver_prototxt(solver_path);
  std::vector<pb::NetParameter> nets;
  if (p.has_net()) nets.push_back(detail::read_net_prototxt(resolve_beside(p.net(), solver_path)));
  if (p.has_train_net())
    nets.push_back(detail::read_net_prototxt(resolve_beside(p.train_net(), solver_path)));
  if (p.has_net_param()) nets.push_back(p.net_param());
  if (p.has_train_net_param()) nets.push_back(p.train_net_param());
  for (const std::string& test_net : p.test_net())
    nets.push_back(detail::read_net_prototxt(resolve_beside(test_net, solver_path)));
  for (const pb::NetParameter& test_net : p.test_net_param())
    nets.push_back(test_net);
  std::vector<Device> devices;
  for (const pb::NetParameter& net : nets) {
    for (const Device& device : detail::split_devices(net)) {
      if (std::find(devices.begin(), devices.end(), device) == devices.end())
        devices.push_back(device);
    }
  }
  return devices;
}

}  // namespace hn
