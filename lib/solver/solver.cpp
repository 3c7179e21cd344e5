// The Solver: Caffe's Solver / SGDSolver loop (solver.cpp, sgd_solver.cpp) over a Net. The
// per-parameter arithmetic (normalisation, regularisation, the update rule and the weight
// update) is one fused Driver::solver_update call per parameter; everything else follows
// Caffe's order, so that Caffe's hyper-parameters give Caffe's trajectory.
//
// Exact resume: iteration i's k-th forward/backward reads batch i * iter_size + k of the
// training data and uses the random stream iteration_seed(seed, i, k), and the snapshot
// holds the weights, every history array and the step of the multistep policy, so a run
// restored at iteration i computes what the uninterrupted run computed.
//
// The settings and nets: solver_settings.cpp; snapshots, restore and the ranks' checks:
// solver_snapshot.cpp; Solver::Impl: solver_impl.h.
#include "lib/solver/solver.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/core/text.h"
#include "lib/layers/registry.h"
#include "lib/proto/prototxt.h"
#include "lib/solver/gradient_sync.h"
#include "lib/solver/solver_impl.h"

namespace hn {

namespace {

static_assert(std::atomic<bool>::is_always_lock_free,
              "request_stop must be safe in a signal handler");

// The random stream of forward/backward k of iteration `iter` (dropout masks, DummyData).
std::uint64_t iteration_seed(std::uint64_t seed, int iter, int k) {
  return detail::mix_seeds(detail::mix_seeds(seed, static_cast<std::uint64_t>(iter)),
                           static_cast<std::uint64_t>(k));
}

// The stream of the test passes: the same for every pass, apart from the training streams.
std::uint64_t test_seed(std::uint64_t seed, int test_net) {
  return detail::mix_seeds(seed ^ 0x7E57u, static_cast<std::uint64_t>(test_net));
}

}  // namespace

// ---- one iteration -------------------------------------------------------------------

void Solver::Impl::train_iteration(float rate) {
  const int iter_size = param.iter_size();
  if (!update_recorded) net->clear_param_diffs();  // else the recording clears them
  float loss = 0.0f;
  for (int k = 0; k < iter_size; ++k) {
    const std::uint64_t batch = static_cast<std::uint64_t>(iter) * iter_size + k;
    if (net->data_position() != batch) net->seek_data(batch);
    std::uint64_t stream = iteration_seed(seed, iter, k);
    // Each rank's dropout masks its own rows.
    if (sync) stream = detail::mix_seeds(stream, static_cast<std::uint64_t>(comm->rank()) + 1);
    net->set_iteration_seed(stream);
    if (!sync || k + 1 < iter_size) {
      loss += forward_backward(iter > run_start_iter, rate);
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

float Solver::Impl::forward_backward(bool may_record, float rate) {
  if (recording) {
    replay(true, rate);
    return net->read_loss();
  }
  if (!may_record || !unrecorded.empty() || !options.graphs || !driver->records())
    return net->forward_backward();
  if (sync) unrecorded = "several ranks reduce the gradients during backward";
  for (int l = 0; l < net->num_layers() && unrecorded.empty(); ++l) {
    const LayerType* layer_type = find_layer_type(net->layer_type(l));
    if (layer_type != nullptr && layer_type->draws_per_iteration) {
      unrecorded = fmt::format(
          "layer '{}' ({}) draws anew every iteration from a seed a recording would fix",
          net->layer_name(l), net->layer_type(l));
    }
  }
  if (unrecorded.empty()) {
    const std::uint64_t batch = net->data_position();
    // The update joins the recording where nothing in it needs the host: one batch per
    // update, no clipping (its norm is read back), every parameter on the Net's driver.
    bool with_update = param.iter_size() == 1 && param.clip_gradients() < 0.0f;
    for (const NetParam& np : net->learnable_params())
      with_update = with_update && (np.driver == nullptr || np.driver == driver);
    std::function<void()> before, after;
    if (with_update) {
      // [rate, gate, scratch] on the driver, made before the recording (no allocation in it).
      if (!update_scalars) update_scalars = std::make_unique<Tensor>(Shape{3});
      float* scalars = update_scalars->data_write(*driver);
      before = [this] { net->clear_param_diffs(); };
      after = [this, scalars] {
        net->sum_losses_on_driver(scalars + 1, scalars + 2);
        apply_update(1.0f, scalars, scalars + 1);
      };
    }
    std::string why;
    recording = net->record_iteration(why, before, after);
    if (recording) {
      update_recorded = with_update;
      replay(false, rate);  // the batch record_iteration fetched
      return net->read_loss();
    }
    unrecorded = why.empty() ? "the driver recorded nothing" : why;
    net->seek_data(batch);  // the batch the recording fetched, once more
  }
  return net->forward_backward();
}

void Solver::Impl::replay(bool fetch_data, float rate) {
  if (update_recorded) {
    // Histories written elsewhere since (a restore) reach the driver first.
    for (std::size_t i = 0; i < history.size(); ++i) {
      history[i]->data_read(*driver);
      if (!history2.empty()) history2[i]->data_read(*driver);
    }
    // This iteration's rate, where the recorded update reads it.
    const float applied = update_rate(rate);
    driver->copy_from_host(update_scalars->data_write(*driver), &applied, sizeof(float));
  }
  net->replay_iteration(*recording, fetch_data);
  if (update_recorded) mark_update_replayed();
}

float Solver::Impl::update_rate(float rate) const {
  if (type != UpdateType::adam) return rate;
  // Caffe's AdamSolver folds the bias correction into the rate.
  const int t = iter + 1;
  return rate * static_cast<float>(std::sqrt(1.0 - std::pow(param.momentum2(), t)) /
                                   (1.0 - std::pow(param.momentum(), t)));
}

void Solver::Impl::mark_update_replayed() {
  // The replay wrote the histories on the driver (the Net marks its own blobs).
  for (std::size_t i = 0; i < history.size(); ++i) {
    history[i]->data_write(*driver);
    if (!history2.empty()) history2[i]->data_write(*driver);
  }
}

void Solver::Impl::broadcast_weights() {
  if (weights_broadcast || comm->size() == 1) return;
  for (const NetParam& np : net->learnable_params()) {
    if (np.shard.ranks > 1) continue;  // each rank's own rows of a layer cut across ranks
    comm->broadcast(*driver, np.tensor->data_write(*driver), np.tensor->count(), 0);
  }
  weights_broadcast = true;
}

void Solver::Impl::apply_update(float rate, const float* rate_on_driver,
                                const float* gate_on_driver) {
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
  // A recorded update reads the iteration's rate (update_rate) and the loss it may not
  // follow when NaN on the driver; the product lr_mult * rate is the same either way.
  u.rate = rate_on_driver;
  u.gate = gate_on_driver;
  const float local_rate = rate_on_driver != nullptr ? 1.0f : update_rate(rate);
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor& tensor = *params[i].tensor;
    Driver& d = driver_of(params[i]);
    u.lr = params[i].lr_mult * local_rate;
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

// ---- the loop ------------------------------------------------------------------------

// Caffe's Solver::Step. Returns the iterations run.
int Solver::Impl::run(int iterations) {
  const int start_iter = iter, stop_iter = iter + iterations;
  run_start_iter = iter;
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
    // The rate before the iteration: a recorded update reads it during the replay (the
    // multistep step it implies is kept once the iteration has trained).
    int step = current_step;
    const float lr = rate(&step);
    Clock::time_point start = Clock::now();
    train_iteration(lr);
    current_step = step;
    train_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    ++iterations_since_display;
    update_smoothed_loss(last_loss);
    if (param.display() > 0 && iter % param.display() == 0) display(lr);
    start = Clock::now();
    if (!update_recorded) apply_update(lr);  // else it ran in the replay
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
  impl_->driver = &driver;
  impl_->device = driver.device();
  impl_->start(solver_prototxt_path, runtime, options);
}

Solver::Solver(const std::string& solver_prototxt_path, Runtime& runtime, const Device& device,
               const SolverOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->start(solver_prototxt_path, runtime, options);
}

void Solver::Impl::start(const std::string& solver_prototxt_path, Runtime& runtime_,
                         const SolverOptions& options_) {
  Impl& s = *this;
  s.runtime = &runtime_;
  s.options = options_;
  if (s.options.communicator == nullptr) s.local_comm = make_local_communicator();
  s.comm = s.options.communicator ? s.options.communicator : s.local_comm.get();
  s.origin = solver_prototxt_path;
  s.param = detail::read_solver_prototxt(solver_prototxt_path);
  pb::SolverParameter& p = s.param;
  if (s.options.max_iter > 0) p.set_max_iter(s.options.max_iter);
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
  if (s.options.seed != 0) {
    s.seed = s.options.seed;
  } else if (p.random_seed() >= 0) {
    s.seed = static_cast<std::uint64_t>(p.random_seed());
  }
  HN_CHECK(s.options.checksum_interval >= 0, "{}: checksum_interval must be >= 0, got {}", s.origin,
           s.options.checksum_interval);
  s.build_nets();
  if (s.comm->size() > 1) {
    s.check_ranks_agree();
    s.sync = std::make_unique<detail::GradientSync>(*s.net, *s.comm, s.options.bucket_bytes,
                                                    s.options.grad_compress);
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

bool Solver::iteration_recorded() const {
  return impl_->recording != nullptr;
}

const std::string& Solver::unrecorded_why() const {
  return impl_->unrecorded;
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

}  // namespace hn
