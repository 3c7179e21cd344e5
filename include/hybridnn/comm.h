// Collectives between the processes (ranks) of a data-parallel run. The Solver sums every
// parameter gradient across ranks between the backward and the update, and broadcasts the
// weights from rank 0 before the first iteration, through this interface; what carries the
// bytes (MPI, NCCL) is a Communicator of its own in lib/comm/. A single process uses the
// local one, whose collectives are identities.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace hn {

class Driver;

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi", ...: for logs and errors.
  virtual std::string name() const = 0;

  // In place, on memory of `driver`'s space: every rank ends with the sum over all ranks of
  // `data`. The order of the additions depends only on the size, so every rank holds the
  // same bits and a rerun reproduces them.
  virtual void allreduce_sum(Driver& driver, float* data, std::size_t count) = 0;
  // In place: every rank ends with `root`'s `data`.
  virtual void broadcast(Driver& driver, float* data, std::size_t count, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
};

// One process: rank 0 of 1.
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace hn
