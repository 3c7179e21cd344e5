// MpiCommunicator: the base of the MPI backends (mpi.cpp). Internal to comm.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/driver.h"

namespace hn::detail {

// `count` floats of a driver's memory as host memory: the memory itself when the driver
// computes on host memory (after synchronize), else a host copy (of the values, unless
// `overwritten`), written back by write_back().
class HostFloats {
 public:
  HostFloats(Driver& driver, float* data, std::size_t count, bool overwritten = false);
  float* get() { return host_; }
  void write_back();

 private:
  Driver& driver_;
  float* data_;
  std::size_t count_;
  std::vector<float> copy_;
  float* host_;
};

class MpiCommunicator : public Communicator {
 public:
  // `backend`: the name the caller asked for (auto, ring, hier, mpi, nccl). At startup the
  // ranks duplicate MPI_COMM_WORLD (MPI_Comm_idup) and compare their backends (one
  // MPI_Iallgather), both waited for against the deadline: ranks that asked for different
  // backends fail at once naming them, where they would otherwise wait in each other's
  // collectives, and every rank has arrived before a backend's blocking collectives at its
  // construction (hier's MPI_Comm_split_type and MPI_Comm_split).
  explicit MpiCommunicator(const CommOptions& options, const char* backend = "mpi");
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override;
  void broadcast(Driver& driver, float* data, std::size_t count, int root) override;
  void allgather(Driver& driver, const float* sent, std::size_t count, float* received) override;
  void allgatherv(Driver& driver, const float* sent, const std::vector<std::size_t>& counts,
                  float* received) override;
  void reduce_scatterv(Driver& driver, const float* data, const std::vector<std::size_t>& counts,
                       float* received, ReduceOp op) override;
  void barrier() override;
  [[noreturn]] void abort(int exit_code) noexcept override;

 protected:
  // The sequence number of the collective starting now, for errors. Throws a
  // CommunicatorError naming the first failure once a collective has timed out or MPI has
  // returned an error: that collective's requests may still be pending, with the tags the
  // next one would use. (Ranks that passed different sizes are still in step: agree_count
  // fails before any transfer, and the next collective runs.)
  std::uint64_t next_sequence();
  // The `peer` of a wait on ranks of this node only (a barrier of the node).
  static constexpr int kNodeRanks = -2;
  // Waits for every request, until the deadline of collective `what` (#seq); past it,
  // throws hn::Error naming them and `peer`, the rank waited for (-1: any other rank;
  // kNodeRanks: any other rank of this node).
  // Completed requests become MPI_REQUEST_NULL.
  void wait_all(std::vector<MPI_Request>& requests, const char* what, std::uint64_t seq,
                int peer = -1) const;
  // Index of one completed request among `requests` (MPI_Testany), waiting as wait_all.
  int wait_any(std::vector<MPI_Request>& requests, const char* what, std::uint64_t seq,
               int peer = -1) const;
  // One turn of a wait begun at `start` on `peer` (as wait_all's): throws as wait_all once it
  // has lasted the timeout; else yields the CPU, or, where the peer is on another node (any
  // rank: the communicator spans nodes), sleeps once the wait has lasted kSpinBeforeSleep.
  void pause(std::chrono::steady_clock::time_point start, const char* what, std::uint64_t seq,
             int peer) const;
  [[noreturn]] void timed_out(const char* what, std::uint64_t seq, int peer) const;
  // Throws a CommunicatorError naming the collective `what` (#seq), its `count` floats and
  // this rank unless every rank passes the same `count` (and `shape`, a digest of per-rank
  // block counts, for the v-forms): ranks that disagree would fail inside MPI or, where a
  // receive expects more than is sent, finish with wrong sums. One 16-byte allreduce.
  // `shape_what` names what `shape` describes in the errors ("in its blocks").
  void agree_count(const char* what, std::uint64_t seq, std::size_t count, std::uint64_t shape = 0,
                   const char* shape_what = "in its blocks") const;
  // Throws a CommunicatorError naming `call`, the collective `what` (#seq) and this rank
  // unless `code` is MPI_SUCCESS (the communicator returns MPI's errors, never aborts).
  void check(int code, const char* call, const char* what, std::uint64_t seq) const;
  // Throws a CommunicatorError with `message`, which after startup becomes the failure
  // next_sequence() names.
  [[noreturn]] void fail_with(const std::string& message) const;
  // Throws a CommunicatorError naming the ranks whose backend differs from this rank's.
  void agree_backend();
  // Fills node_of_ and spans_nodes_ (MPI_Comm_split_type, then one MPI_Iallgather).
  void find_nodes();
  // The backend's name in errors: name(), or while this class is constructed the one asked
  // for.
  std::string label() const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  CommOptions options_;
  std::uint64_t sequence_ = 0;
  // The backend asked for; errors name it until the subclass is constructed (a virtual
  // name() called from this class's constructor would be this class's).
  const char* backend_;
  bool starting_ = true;
  // Each rank's node, named by its first rank, and whether there is more than one
  // (find_nodes): waits on a rank of another node sleep (pause).
  std::vector<int> node_of_;
  bool spans_nodes_ = false;
  // The first failed collective's error (empty: none).
  mutable std::string failed_;
};

// Throws hn::Error naming `call` and MPI's message when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* call);

// A wait on a rank of another node spins this long, then sleeps kSleep at a time
// (pause). Over a 1 Gbit/s link with a busy thread per core a 64 MiB ring took 1.0-1.3 s
// yielding throughout, 0.58-0.59 s sleeping past 1 ms (0.56 s alone). Sleeping past 50 us
// slowed 2 nodes x 2 ranks at 10 Gbit/s, unloaded, 1.3-2.5x from 256 KiB to 16 MiB; past
// 1 ms it is level with yielding there.
constexpr std::chrono::microseconds kSpinBeforeSleep{1000};
constexpr std::chrono::microseconds kSleep{20};

// The largest count one MPI call carries (an int).
constexpr std::size_t kMpiMaxCount = 1u << 30;

}  // namespace hn::detail
