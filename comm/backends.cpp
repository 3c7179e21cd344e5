// The communicator backends this build has: one line each.
#include <functional>
#include <utility>

#include "comm/mpi.h"
#include "hybridnn/comm.h"
#include "lib/core/check.h"

namespace hn {

namespace {

struct Backend {
  const char* name;
  std::function<std::unique_ptr<Communicator>(const CommOptions&)> make;
};

const std::vector<Backend>& backends() {
  static const std::vector<Backend> table = {
    {"local", [](const CommOptions&) { return make_local_communicator(); }},
#if HYBRIDNN_WITH_MPI
    {"ring", [](const CommOptions& options) { return detail::make_ring_communicator(options); }},
    {"mpi", [](const CommOptions& options) { return detail::make_mpi_communicator(options); }},
#endif
  };
  return table;
}

}  // namespace

std::vector<std::string> communicator_backends() {
  std::vector<std::string> names;
  for (const Backend& backend : backends())
    names.emplace_back(backend.name);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const std::string& name,
                                                const CommOptions& options) {
  HN_CHECK(options.timeout_seconds > 0, "communicator {}: timeout must be > 0 s, got {}", name,
           options.timeout_seconds);
  HN_CHECK(options.chunks_in_flight >= 1, "communicator {}: chunks_in_flight must be >= 1, got {}",
           name, options.chunks_in_flight);
  for (const Backend& backend : backends()) {
    if (name == backend.name) return backend.make(options);
  }
  std::string known;
  for (const std::string& backend : communicator_backends())
    known += (known.empty() ? "" : ", ") + backend;
  detail::fail("unknown communicator '{}': this build has {}{}", name, known,
#if HYBRIDNN_WITH_MPI
               ""
#else
               " (built without MPI: install libopenmpi-dev and rebuild for ring and mpi)"
#endif
  );
}

}  // namespace hn
