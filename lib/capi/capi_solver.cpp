// The C ABI's solvers (hn_solver_options_*, hn_solver_*), the events they report
// (hn_event_*) and the communicators of data parallelism (hn_comm_*).
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/comm/comm.h"
#include "lib/core/text.h"
#include "lib/solver/solver.h"

// ---- collectives --------------------------------------------------------------------------

namespace {

struct CommBox {
  std::unique_ptr<hn::Communicator> comm;
  std::string name;
};

}  // namespace

struct hn_comm {
  std::shared_ptr<CommBox> box;
};

// ---- solver -------------------------------------------------------------------------------

struct hn_solver_options {
  hn::SolverOptions options;
  std::shared_ptr<CommBox> comm;
};

struct hn_solver_event {
  const hn::SolverEvent* event = nullptr;
};

namespace {

struct SolverBox {
  std::shared_ptr<RuntimeBox> runtime;
  std::shared_ptr<CommBox> comm;
  std::unique_ptr<hn::Solver> solver;
  std::vector<std::pair<std::string, float>> results;
  std::string snapshot;
};

}  // namespace

struct hn_solver {
  std::shared_ptr<SolverBox> box;
};

namespace {

hn::Solver& solver_of(const hn_solver* solver, const char* what) {
  return *checked(solver, what).box->solver;
}

}  // namespace

extern "C" {

hn_status hn_solver_options_create(hn_solver_options** out) {
  return guarded([&] { set_out(out, owned(new hn_solver_options), "hn_solver_options_create"); });
}

void hn_solver_options_destroy(hn_solver_options* options) {
  delete options;
}

hn_status hn_solver_options_set(hn_solver_options* options, const char* key, const char* value) {
  return guarded([&] {
    hn::SolverOptions& s = checked(options, "hn_solver_options_set").options;
    const std::string k = checked_text(key, "hn_solver_options_set: key");
    const std::string v = checked_text(value, "hn_solver_options_set: value");
    if (!set_option_text(s, k, v)) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_options_set: unknown option '{}' (options: {})", k,
                       hn::option_keys(hn::kSolverOption)));
    }
  });
}

hn_status hn_solver_options_set_communicator(hn_solver_options* options, hn_comm* comm) {
  return guarded([&] {
    hn_solver_options& o = checked(options, "hn_solver_options_set_communicator");
    o.comm = comm != nullptr ? comm->box : nullptr;
    o.options.communicator = comm != nullptr ? comm->box->comm.get() : nullptr;
  });
}

hn_status hn_solver_create(hn_runtime* runtime, hn_driver* driver, const char* solver_prototxt_path,
                           const hn_solver_options* options, hn_solver** out) {
  return guarded([&] {
    RuntimeBox& runtime_box = *checked(runtime, "hn_solver_create").box;
    hn_driver& home = checked(driver, "hn_solver_create");
    if (home.box != runtime->box) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_create: driver {} belongs to another runtime", home.name));
    }
    const std::string path = checked_text(solver_prototxt_path, "hn_solver_create: path");
    check_file(path, "hn_solver_create");
    const hn_solver_options defaults;
    const hn_solver_options& chosen = options != nullptr ? *options : defaults;
    auto box = std::make_shared<SolverBox>();
    box->runtime = runtime->box;
    box->comm = chosen.comm;
    box->solver =
        std::make_unique<hn::Solver>(path, runtime_box.runtime, *home.driver, chosen.options);
    set_out(out, owned(new hn_solver{std::move(box)}), "hn_solver_create");
  });
}

void hn_solver_destroy(hn_solver* solver) {
  delete solver;
}

hn_status hn_solver_solve(hn_solver* solver) {
  return guarded([&] { solver_of(solver, "hn_solver_solve").solve(); });
}

hn_status hn_solver_step(hn_solver* solver, int32_t iterations) {
  return guarded([&] {
    if (iterations < 0) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("hn_solver_step: {} iterations", iterations));
    }
    solver_of(solver, "hn_solver_step").step(iterations);
  });
}

void hn_solver_request_stop(hn_solver* solver) {
  if (solver != nullptr) solver->box->solver->request_stop();
}

hn_status hn_solver_snapshot(hn_solver* solver, const char** path) {
  return guarded([&] {
    solver->box->snapshot = solver_of(solver, "hn_solver_snapshot").snapshot();
    if (path != nullptr) *path = solver->box->snapshot.c_str();
  });
}

hn_status hn_solver_restore(hn_solver* solver, const char* solverstate_path) {
  return guarded([&] {
    const std::string path = checked_text(solverstate_path, "hn_solver_restore");
    check_file(path, "hn_solver_restore");
    solver_of(solver, "hn_solver_restore").restore(path);
  });
}

hn_status hn_solver_copy_weights(hn_solver* solver, const char* caffemodel_paths) {
  return guarded([&] {
    const std::string paths = checked_text(caffemodel_paths, "hn_solver_copy_weights");
    for (const std::string& path : hn::detail::split_commas(paths, hn::detail::EmptyItems::drop))
      check_file(path, "hn_solver_copy_weights");
    solver_of(solver, "hn_solver_copy_weights").copy_weights(paths);
  });
}

int32_t hn_solver_iter(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->iter() : 0;
}

float hn_solver_loss(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->last_loss() : 0.0f;
}

float hn_solver_learning_rate(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->learning_rate() : 0.0f;
}

hn_status hn_solver_net(hn_solver* solver, hn_net** out) {
  return guarded([&] {
    hn::Net& net = solver_of(solver, "hn_solver_net").net();
    set_out(out, owned(net_handle(solver->box, net)), "hn_solver_net");
  });
}

int32_t hn_solver_num_test_nets(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->num_test_nets() : 0;
}

hn_status hn_solver_test_net(hn_solver* solver, int32_t index, hn_net** out) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_test_net");
    if (index < 0 || index >= s.num_test_nets()) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("hn_solver_test_net: the solver has {} test "
                                                  "nets, not {}",
                                                  s.num_test_nets(), index));
    }
    set_out(out, owned(net_handle(solver->box, s.test_net(index))), "hn_solver_test_net");
  });
}

hn_status hn_solver_test(hn_solver* solver, int32_t index, int32_t* num_results) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_test");
    if (index < 0 || index >= s.num_test_nets()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_test: the solver has {} test nets, not {}", s.num_test_nets(),
                       index));
    }
    solver->box->results = s.test(index);
    if (num_results != nullptr) *num_results = static_cast<int32_t>(solver->box->results.size());
  });
}

hn_status hn_solver_result(const hn_solver* solver, int32_t index, const char** name,
                           float* value) {
  return guarded([&] {
    const auto& results = checked(solver, "hn_solver_result").box->results;
    if (index < 0 || index >= static_cast<int32_t>(results.size())) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_result: {} results from the last hn_solver_test, not {}",
                       results.size(), index));
    }
    if (name != nullptr) *name = results[static_cast<std::size_t>(index)].first.c_str();
    if (value != nullptr) *value = results[static_cast<std::size_t>(index)].second;
  });
}

hn_status hn_solver_on_event(hn_solver* solver, hn_solver_callback callback, void* user_data) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_on_event");
    if (callback == nullptr) {
      s.on_event(nullptr);
      return;
    }
    s.on_event([callback, user_data](const hn::SolverEvent& event) {
      const hn_solver_event view{&event};
      callback(&view, user_data);
    });
  });
}

int32_t hn_event_kind(const hn_solver_event* event) {
  if (event == nullptr) return -1;
  if (!event->event->snapshot.empty()) return HN_EVENT_SNAPSHOT;
  return event->event->phase == hn::Phase::test ? HN_EVENT_TEST : HN_EVENT_TRAIN;
}

int32_t hn_event_iter(const hn_solver_event* event) {
  return event != nullptr ? event->event->iter : 0;
}

int32_t hn_event_test_net(const hn_solver_event* event) {
  return event != nullptr ? event->event->test_net : 0;
}

float hn_event_loss(const hn_solver_event* event) {
  return event != nullptr ? event->event->loss : 0.0f;
}

float hn_event_learning_rate(const hn_solver_event* event) {
  return event != nullptr ? event->event->lr : 0.0f;
}

double hn_event_images_per_second(const hn_solver_event* event) {
  return event != nullptr ? event->event->images_per_s : 0.0;
}

int32_t hn_event_num_outputs(const hn_solver_event* event) {
  return event != nullptr ? static_cast<int32_t>(event->event->outputs.size()) : 0;
}

const char* hn_event_output(const hn_solver_event* event, int32_t index, float* value) {
  if (event == nullptr || index < 0 ||
      index >= static_cast<int32_t>(event->event->outputs.size())) {
    return nullptr;
  }
  const auto& output = event->event->outputs[static_cast<std::size_t>(index)];
  if (value != nullptr) *value = output.second;
  return output.first.c_str();
}

const char* hn_event_snapshot(const hn_solver_event* event) {
  return event != nullptr ? event->event->snapshot.c_str() : "";
}

// ---- collectives ----------------------------------------------------------------------------

hn_status hn_comm_create(const char* backend, double timeout_seconds, hn_comm** out) {
  return guarded([&] {
    hn::CommOptions options;
    if (timeout_seconds > 0) options.timeout_seconds = timeout_seconds;
    const std::string name = backend != nullptr ? backend : hn::default_communicator();
    auto box = std::make_shared<CommBox>();
    box->comm = hn::make_communicator(name, options);
    box->name = box->comm->name();
    set_out(out, owned(new hn_comm{std::move(box)}), "hn_comm_create");
  });
}

void hn_comm_destroy(hn_comm* comm) {
  delete comm;
}

int32_t hn_comm_rank(const hn_comm* comm) {
  return comm != nullptr ? comm->box->comm->rank() : 0;
}

int32_t hn_comm_size(const hn_comm* comm) {
  return comm != nullptr ? comm->box->comm->size() : 1;
}

const char* hn_comm_backend(const hn_comm* comm) {
  return comm != nullptr ? comm->box->name.c_str() : "";
}

hn_status hn_comm_allreduce(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                            int32_t average) {
  return guarded([&] {
    hn::Communicator& c = *checked(comm, "hn_comm_allreduce").box->comm;
    hn::Driver& d = *checked(driver, "hn_comm_allreduce").driver;
    if (data == nullptr && count > 0)
      fail(HN_ERROR_INVALID_ARGUMENT, "hn_comm_allreduce: NULL data");
    c.allreduce(d, data, count, average != 0 ? hn::ReduceOp::average : hn::ReduceOp::sum);
  });
}

hn_status hn_comm_broadcast(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                            int32_t root) {
  return guarded([&] {
    hn::Communicator& c = *checked(comm, "hn_comm_broadcast").box->comm;
    hn::Driver& d = *checked(driver, "hn_comm_broadcast").driver;
    if (root < 0 || root >= c.size()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_comm_broadcast: root {} of {} ranks", root, c.size()));
    }
    if (data == nullptr && count > 0)
      fail(HN_ERROR_INVALID_ARGUMENT, "hn_comm_broadcast: NULL data");
    c.broadcast(d, data, count, root);
  });
}

hn_status hn_comm_barrier(hn_comm* comm) {
  return guarded([&] { checked(comm, "hn_comm_barrier").box->comm->barrier(); });
}

}  // extern "C"
