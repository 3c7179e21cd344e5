// The MPI backends (built with HYBRIDNN_WITH_MPI): MpiCommunicator runs MPI's own
// collectives (non-blocking, each waited for against the deadline); the ring backend
// (ring.cpp) replaces its allreduce with ours over MPI point-to-point.
#pragma once

#include <initializer_list>
#include <memory>

#include "lib/comm/comm.h"

namespace hn::detail {

// The first of `variables` holding an integer in [minimum, 2^24] (what an MPI launcher put
// in the environment), else `fallback` (backends.cpp).
int launcher_value(std::initializer_list<const char*> variables, int minimum, int fallback);

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options);
std::unique_ptr<Communicator> make_ring_communicator(const CommOptions& options);
// hier.cpp: `required` (the hier backend) refuses ranks not numbered node by node; without
// it (auto) the flat ring runs where the hierarchy is impossible or gains nothing.
std::unique_ptr<Communicator> make_hier_communicator(const CommOptions& options, bool required);
// nccl.cpp, built with MPI, CUDA and NCCL (HYBRIDNN_WITH_NCCL).
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options);

}  // namespace hn::detail
