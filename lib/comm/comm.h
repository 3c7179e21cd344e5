// Collectives between the processes (ranks) of a data-parallel run. The Solver sums every
// parameter gradient across ranks between the backward and the update, and broadcasts the
// weights from rank 0 before the first iteration, through this interface. The backends live
// in comm/, one file each, listed by communicator_backends():
//   local  one process: rank 0 of 1, every collective an identity;
//   ring   our ring allreduce (reduce-scatter, then allgather) over non-blocking MPI
//          point-to-point, chunked and pipelined; MPI's own collectives for the rest;
//   hier   the ring's sums node by node: the ranks of a node add through shared memory and
//          rings between the nodes (one per local rank) carry the partial sums; the same
//          bits as ring;
//   auto   hier where the nodes hold several ranks each (numbered node by node; on one
//          node, at least 3), else ring: the default under mpirun;
//   mpi    MPI_Allreduce and MPI's other collectives: the reference and the fallback.
// The MPI backends exist when the library was built with MPI (HYBRIDNN_MPI); they join
// the ranks mpirun started (MPI_COMM_WORLD), initialising MPI on first use.
//
// Every collective of an MPI backend carries a sequence number and waits at most the
// communicator's timeout for the other ranks; past it, it throws hn::Error naming the
// backend, the collective, its sequence number and the rank, instead of hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "hybridnn/error.h"

namespace hn {

class Driver;

enum class ReduceOp { sum, average };

// What a collective throws when it fails: a rank that did not arrive by the deadline, an
// error of MPI or NCCL. An hn::Error, of its own type so that a caller can add where it
// happened (the Solver adds its rank and iteration).
class CommunicatorError : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "ring", "hier", "mpi": for logs and errors (auto names what it runs).
  virtual std::string name() const = 0;

  // In place, on `count` floats of `driver`'s memory: every rank ends with the sum (or the
  // mean) over all ranks of `data`. The order of the additions depends only on (count,
  // size), so every rank holds the same bits and a rerun reproduces them.
  virtual void allreduce(Driver& driver, float* data, std::size_t count,
                         ReduceOp op = ReduceOp::sum) = 0;
  // allreduce with the values sent as BF16 and the sums kept in FP32 at every hop (the
  // gradient compression of Horovod and PyTorch DDP's hooks): half the bytes on the wire;
  // every rank ends with the same bits (the sums rounded to BF16, then scaled for the mean)
  // and a rerun reproduces them. Backends without it (compresses() false) run allreduce.
  virtual void allreduce_bf16(Driver& driver, float* data, std::size_t count,
                              ReduceOp op = ReduceOp::sum) {
    allreduce(driver, data, count, op);
  }
  virtual bool compresses() const { return false; }
  // Host memory for `count` floats whose allreduce runs in place without messages (the
  // ring and hier backends with every rank on one node: an MPI-3 shared window, in which
  // each rank sums its segment through all the ranks' buffers), or nullptr where the
  // backend has none, the ranks span nodes, some rank passed 0 or another count, or
  // /dev/shm lacks the room: the caller's own memory is then as good. A collective: every
  // rank calls it at the same point. The first call only: later ones return nullptr. The
  // memory lasts as long as the communicator; an allreduce of a range of it takes the
  // shared path when every rank passes the same range (their disagreement is an error
  // naming it, as different counts are).
  virtual float* shared_buffer(std::size_t count) {
    (void)count;
    return nullptr;
  }
  // In place: every rank ends with `root`'s `data`.
  virtual void broadcast(Driver& driver, float* data, std::size_t count, int root) = 0;
  // `received` (size() * count floats) gets every rank's `sent` (count floats), rank r's
  // at r * count.
  virtual void allgather(Driver& driver, const float* sent, std::size_t count, float* received) = 0;
  // Blocks of different lengths: rank r sends counts[r] floats (counts has size() entries,
  // the same on every rank), and `received` (their sum) gets rank r's at the sum of the
  // counts before r. The default pads every block to the largest and calls allgather.
  virtual void allgatherv(Driver& driver, const float* sent, const std::vector<std::size_t>& counts,
                          float* received);
  // The inverse: `data` holds the sum of the counts on every rank, block r at the sum of
  // the counts before r; rank r's `received` (counts[r] floats) gets the sum (or mean) over
  // the ranks of block r. The default allreduces a copy of `data` and keeps block r.
  virtual void reduce_scatterv(Driver& driver, const float* data,
                               const std::vector<std::size_t>& counts, float* received,
                               ReduceOp op = ReduceOp::sum);
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Ends the whole run at once: this process and every other rank's exit with `exit_code`
  // (MPI_Abort). For a rank that failed while the others wait in a collective or compute.
  [[noreturn]] virtual void abort(int exit_code) noexcept = 0;
};

// How the Solver sends its gradients (SolverOptions::grad_compress): FP32, or BF16 where
// the backend compresses (Communicator::allreduce_bf16).
enum class GradCompression { none, bf16 };
const char* grad_compression_name(GradCompression compression);
// "none" or "bf16"; anything else is an hn::Error naming the value.
GradCompression parse_grad_compression(const std::string& text);

struct CommOptions {
  // How long a collective waits for the other ranks before it fails.
  double timeout_seconds = 300.0;
  // The ring's pipeline: bytes per chunk (0: the default, 256 KiB) and chunks in flight.
  std::size_t chunk_bytes = 0;
  int chunks_in_flight = 2;
  // The hier backend's nodes: 0 as MPI finds them (the ranks that share memory,
  // MPI_COMM_TYPE_SHARED); k > 0 groups the ranks k at a time, nodes simulated on one
  // machine (for tests: the ranks must still share memory).
  int ranks_per_node = 0;
};

// The backends this build has, "local" first.
std::vector<std::string> communicator_backends();
// Makes backend `name`; throws hn::Error naming the backends built when there is none of
// that name.
std::unique_ptr<Communicator> make_communicator(const std::string& name,
                                                const CommOptions& options = {});
// One process: rank 0 of 1.
std::unique_ptr<Communicator> make_local_communicator();

// The collectives on host vectors (counts, checksums, metrics), whatever memory `driver`
// computes on: staged through a Tensor on it. allgather_host returns size() * values.size()
// floats, rank r's at r * values.size().
void allreduce_host(Communicator& comm, Driver& driver, std::vector<float>& values,
                    ReduceOp op = ReduceOp::sum);
std::vector<float> allgather_host(Communicator& comm, Driver& driver,
                                  const std::vector<float>& values);
// `root`'s text on every rank (a collective: every rank calls it).
std::string broadcast_text_host(Communicator& comm, Driver& driver, const std::string& text,
                                int root);
// The backend to use when none is named: "auto" when an MPI launcher (mpirun, srun with
// PMI) started this process as one of several, else "local". Throws hn::Error when a
// launcher started several processes but this build has no MPI.
std::string default_communicator();
// The number of processes the launcher started (1 without one), and how many of them on
// this node, from its environment.
int launched_ranks();
int launched_local_ranks();

}  // namespace hn
