// The communicator backends this build has: one line each.
#include <cstdlib>
#include <functional>
#include <utility>

#include "lib/comm/comm.h"
#include "lib/comm/mpi.h"
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
    {"auto",
     [](const CommOptions& options) { return detail::make_hier_communicator(options, false); }},
    {"ring", [](const CommOptions& options) { return detail::make_ring_communicator(options); }},
    {"hier",
     [](const CommOptions& options) { return detail::make_hier_communicator(options, true); }},
    {"mpi", [](const CommOptions& options) { return detail::make_mpi_communicator(options); }},
#endif
#if HYBRIDNN_WITH_NCCL
    {"nccl", [](const CommOptions& options) { return detail::make_nccl_communicator(options); }},
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

namespace detail {

int launcher_value(std::initializer_list<const char*> variables, int minimum, int fallback) {
  for (const char* variable : variables) {
    const char* value = std::getenv(variable);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long number = std::strtol(value, &end, 10);
    if (end != value && *end == '\0' && number >= minimum && number <= (1 << 24))
      return static_cast<int>(number);
  }
  return fallback;
}

}  // namespace detail

// Open MPI's variables, then the PMI / PMIx ones of MPICH's Hydra, Slurm and others.
int launched_ranks() {
  return detail::launcher_value({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"},
                                1, 1);
}

int launched_local_ranks() {
  return detail::launcher_value({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"},
                                1, 1);
}

std::string default_communicator() {
  const int ranks = launched_ranks();
  if (ranks == 1) return "local";
#if HYBRIDNN_WITH_MPI
  return "auto";
#else
  detail::fail(
      "started as one of {} processes by an MPI launcher, but this build of hybridnn has no MPI "
      "(install libopenmpi-dev and rebuild, or run a single process)",
      ranks);
#endif
}

std::unique_ptr<Communicator> make_communicator(const std::string& name,
                                                const CommOptions& options) {
  HN_CHECK(options.timeout_seconds > 0, "communicator {}: timeout must be > 0 s, got {}", name,
           options.timeout_seconds);
  HN_CHECK(options.ranks_per_node >= 0, "communicator {}: ranks_per_node must be >= 0, got {}",
           name, options.ranks_per_node);
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
               " (built without MPI: install libopenmpi-dev and rebuild for auto, ring, hier and "
               "mpi)"
#endif
  );
}

const char* grad_compression_name(GradCompression compression) {
  return compression == GradCompression::bf16 ? "bf16" : "none";
}

GradCompression parse_grad_compression(const std::string& text) {
  if (text == "none") return GradCompression::none;
  if (text == "bf16") return GradCompression::bf16;
  detail::fail("unknown gradient compression '{}' (none or bf16)", text);
}

}  // namespace hn
