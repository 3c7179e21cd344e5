// The Solver's settings: the SolverParameter's update type and checks, the training and test
// nets it names (Solver::Impl::build_nets) and the learning rate policies.
#include "lib/solver/solver_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "lib/core/check.h"
#include "lib/onnx/onnx_import.h"
#include "lib/proto/prototxt.h"

namespace hn {

namespace fs = std::filesystem;

namespace {

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

// ---- construction -------------------------------------------------------------------

void Solver::Impl::build_nets() {
  const pb::SolverParameter& p = param;
  const int train_sources =
      p.has_net() + p.has_net_param() + p.has_train_net() + p.has_train_net_param();
  HN_CHECK(train_sources == 1,
           "{}: the solver must name exactly one training net with one of net, net_param, "
           "train_net, train_net_param; it names {}",
           origin, train_sources);
  // The training net, read once: its split entries name devices that get drivers with the
  // solver's own (Runtime::provide) before anything runs on them.
  pb::NetParameter train_param;
  std::string train_origin;
  if (p.has_net() || p.has_train_net()) {
    train_origin = resolve_beside(p.has_net() ? p.net() : p.train_net(), origin);
    // An ONNX graph has no data layer and no loss to train with (issue 37's next step wraps
    // them around it); said plainly rather than as a prototxt syntax error on binary bytes.
    HN_CHECK(!detail::is_onnx_path(train_origin),
             "{}: the training net '{}' is an ONNX model; a solver trains a prototxt net with "
             "a data layer and a loss (training ONNX models is not supported yet: "
             "docs/onnx.md)",
             origin, train_origin);
    train_param = detail::read_net_prototxt(train_origin);
  } else {
    train_param = p.has_net_param() ? p.net_param() : p.train_net_param();
    train_origin =
        fmt::format("{} ({})", origin, p.has_net_param() ? "net_param" : "train_net_param");
  }
  if (driver == nullptr) {
    // A split's device that cannot be made is reported by the net, naming its layer.
    std::string unmade;
    try {
      runtime->provide(
          detail::devices_named(device, options.split, options.layer_splits, train_param));
    } catch (const Error& error) {
      unmade = error.what();
    }
    HN_CHECK(runtime->find(device) != nullptr, "{}: the solver's device {}: {}", origin,
             device.name(), unmade);
    driver = &runtime->driver(device);
  }
  NetOptions train_options;
  train_options.state = merge_state(Phase::train, p.has_train_state() ? &p.train_state() : nullptr);
  train_options.data_source = options.train_data.empty() ? options.data : options.train_data;
  train_options.mean_file = options.mean_file;
  train_options.seed = seed;
  train_options.split = options.split;
  train_options.layer_splits = options.layer_splits;
  train_options.tune = agreed_tune(options.tune, *comm, *driver);
  train_options.blocked_layout = options.blocked_layout;
  train_options.fuse_layers = options.fuse_layers;
  train_options.math = options.math;
  train_options.data_shard = comm->rank();
  train_options.data_shards = comm->size();
  train_options.communicator = comm;
  train_options.model_parallel = options.model_parallel;
  net = Net::from_param(train_param, train_origin, *runtime, *driver, train_options);
  if (comm->size() > 1) net_text = text_of(train_param);
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
    test_options.data_source = options.test_data.empty() ? options.data : options.test_data;
    test_options.mean_file = options.mean_file;
    test_options.seed = seed;
    test_options.tune = agreed_tune(options.tune, *comm, *driver);
    test_options.blocked_layout = options.blocked_layout;
    test_options.fuse_layers = options.fuse_layers;
    test_options.math = options.math;
    test_options.communicator = comm;
    test_options.cuts_like = net.get();  // it shares their weights: cut alike
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

}  // namespace hn
