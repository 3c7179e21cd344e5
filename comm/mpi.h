// The MPI backends (built with HYBRIDNN_WITH_MPI): MpiCommunicator runs MPI's own
// collectives (non-blocking, each waited for against the deadline); the ring backend
// (ring.cpp) replaces its allreduce with ours over MPI point-to-point.
#pragma once

#include <memory>

#include "hybridnn/comm.h"

namespace hn::detail {

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options);
std::unique_ptr<Communicator> make_ring_communicator(const CommOptions& options);
// nccl.cpp, built with MPI, CUDA and NCCL (HYBRIDNN_WITH_NCCL).
std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options);

}  // namespace hn::detail
