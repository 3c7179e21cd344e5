// The `hier` backend (and `auto`): the flat ring's sums, bit for bit, computed node by node.
//
// The flat ring (ring.cpp) sums segment g of N as the chain ((x_g + x_(g+1)) + ...) + x_(g-1)
// round the ranks. Where the ranks are numbered node by node (node j holds ranks j m ..
// j m + m - 1, Open MPI's default --map-by slot), that chain visits the nodes one after
// the other, so it can be computed without a message between two ranks of one node:
//
// * the ranks of a node put their buffers in an MPI-3 shared window (one copy in), where
//   every rank of the node reads them;
// * block j, node j's m segments, starts at node j: segment j m + l is summed through the
//   node's ranks l .. m - 1; then a ring between the nodes (RingPass) takes every block one
//   node on per step, and each node extends every segment of it through all its ranks in
//   order; after k steps (k nodes) block j is back at node j, whose ranks 0 .. l - 1 end
//   segment j m + l; the ring then passes the finished blocks round (k - 1 steps) and every
//   rank copies the node's sums out of the window.
// * The work is shared out as NCCL's and Horovod's hierarchical rings do: local rank l of
//   every node runs that ring for slice l of every block (m rings side by side, each
//   joining one rank per node, "rails"), so each rank reads 1/m of the node's buffers and
//   every rank's link carries 1/m of the traffic. The elements are independent, so the
//   slicing changes no sum.
//
// A bucket's critical path crosses the network 2 k - 1 times instead of 2 (N - 1), in
// pipelined chunks as the ring's, and a node's link carries (2 k - 1) / k of the buffer
// against the flat ring's 2 (N - 1) / N. With BF16 on the wire each extension rounds the
// partial sum to BF16 before adding the next rank's values, as the flat ring's hops do, and
// the finished sums are rounded once: the flat ring's bits again.
//
// On one node (k = 1) no message is sent at all: each rank sums its slice through the
// window, instead of the ring's messages through MPI's shared-memory queues (measured ahead
// of them with 4 ranks, level with 2: docs/benchmarks.md).
//
// Where the ranks are not numbered node by node the chain alternates nodes at every rank:
// `hier` refuses it (naming the mapping), `auto` runs the flat ring; `auto` also runs it
// with one rank per node, where there is nothing to share, and for 2 ranks of one node,
// which sum as fast through MPI's shared-memory queues. A window too large for a node's
// /dev/shm fails `hier` with the sizes, and `auto` runs that allreduce on the flat ring.
#include <fmt/format.h>
#include <mpi.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib/comm/mpi.h"
#include "lib/comm/ring.h"

namespace hn::detail {

namespace {

Range intersect(Range a, Range b) {
  const std::size_t begin = std::max(a.begin, b.begin), end = std::min(a.end, b.end);
  return begin < end ? Range{begin, end} : Range{begin, begin};
}

class HierCommunicator final : public RingCommunicator {
 public:
  HierCommunicator(const CommOptions& options, bool required);
  ~HierCommunicator() override;
  std::string name() const override { return name_; }

 protected:
  void sum(float* buffer, std::size_t count, std::uint64_t seq, bool bf16) override;

 private:
  // Finds the nodes; the ranks agree on hierarchical_ (or all throw).
  void find_nodes(bool required);
  // Whether every node has room for a window of `count` floats per rank (agreed by all
  // ranks); when one has not, hier fails naming it and auto runs the flat ring.
  bool room_for(std::size_t count, std::uint64_t seq);
  // The window holds `count` floats per rank of the node.
  void reserve(std::size_t count, std::uint64_t seq);
  void free_window();
  void node_barrier(std::uint64_t seq) const;
  // This rank's slice of the node's sums into sums_, from the node's buffers in the window.
  void slice_sum(std::size_t count, std::uint64_t seq, bool bf16);

  std::string name_;
  bool required_ = false;
  bool hierarchical_ = false;
  bool broken_ = false;
  // The node's ranks; this rank's rail (local rank l of every node, by node).
  MPI_Comm node_ = MPI_COMM_NULL, rail_ = MPI_COMM_NULL;
  int local_rank_ = 0, local_size_ = 1, node_index_ = 0, nodes_ = 1;
  MPI_Win window_ = MPI_WIN_NULL;
  std::size_t capacity_ = 0;
  // The smallest count a node had no room for (auto runs those on the flat ring).
  std::size_t no_room_ = SIZE_MAX;
  // In the window: every rank's copy of its buffer (entry l for local rank l), and the
  // node's sums (after local rank 0's buffer).
  std::vector<const float*> shared_;
  float* sums_ = nullptr;
};

HierCommunicator::HierCommunicator(const CommOptions& options, bool required)
    : RingCommunicator(options, required ? "hier" : "auto"),
      name_(required ? "hier" : "auto"),
      required_(required) {
  try {
    find_nodes(required);
  } catch (...) {
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    if (rail_ != MPI_COMM_NULL) MPI_Comm_free(&rail_);
    throw;
  }
}

void HierCommunicator::find_nodes(bool required) {
  const int per_node = options_.ranks_per_node;
  if (per_node > 0) {
    check(MPI_Comm_split(comm_, rank_ / per_node, rank_, &node_), "MPI_Comm_split", "startup", 0);
  } else {
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_),
          "MPI_Comm_split_type", "startup", 0);
  }
  check(MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "startup", 0);
  MPI_Comm_rank(node_, &local_rank_);
  MPI_Comm_size(node_, &local_size_);
  // Every rank's node, by its first rank (the node's ranks are ordered by world rank), and
  // the number of ranks on it.
  int first = rank_;
  std::vector<MPI_Request> request(1);
  check(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, node_, request.data()),
        "MPI_Iallreduce", "startup", 0);
  wait_all(request, "startup", 0);
  const int mine[2] = {first, local_size_};
  std::vector<int> all(2 * static_cast<std::size_t>(size_));
  check(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, request.data()),
        "MPI_Iallgather", "startup", 0);
  wait_all(request, "startup", 0);

  const int m = all[1];
  std::string fault;
  for (int r = 0; r < size_ && fault.empty(); ++r) {
    const int node_first = all[2 * static_cast<std::size_t>(r)],
              node_size = all[2 * static_cast<std::size_t>(r) + 1];
    if (node_size != m) {
      fault = fmt::format("the nodes hold different numbers of ranks (rank 0's {}, rank {}'s {})",
                          m, r, node_size);
    } else if (node_first != r - r % m) {
      fault = fmt::format(
          "rank {} shares a node with rank {}: the ranks are not numbered node by node (mpirun "
          "--map-by slot or core numbers them so)",
          r, node_first);
    }
  }
  if (!fault.empty() && required) {
    throw CommunicatorError(fmt::format(
        "communicator hier on rank {} of {}: {}; the hierarchical sums would not be the flat "
        "ring's (--comm ring runs it)",
        rank_, size_, fault));
  }
  nodes_ = size_ / m;
  node_index_ = rank_ / m;
  // auto: several ranks a node, and on one node at least 3 (2 ranks of one node sum as
  // fast through MPI's queues as through the window here: docs/benchmarks.md).
  hierarchical_ = fault.empty() && (required || (m > 1 && (nodes_ > 1 || m > 2)));
  name_ = hierarchical_ ? "hier" : "ring";
  if (!hierarchical_) {
    MPI_Comm_free(&node_);
    return;
  }
  check(MPI_Comm_split(comm_, local_rank_, rank_, &rail_), "MPI_Comm_split", "startup", 0);
  check(MPI_Comm_set_errhandler(rail_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "startup", 0);
}

HierCommunicator::~HierCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After a failed collective the node's other ranks may be gone: freeing the window (a
  // collective of the node) could wait for them forever, so it is left to the exit.
  if (finalized || broken_) return;
  free_window();
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (rail_ != MPI_COMM_NULL) MPI_Comm_free(&rail_);
}

void HierCommunicator::free_window() {
  if (window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
  capacity_ = 0;
  shared_.clear();
  sums_ = nullptr;
}

bool HierCommunicator::room_for(std::size_t count, std::uint64_t seq) {
  // Open MPI's shared windows live in /dev/shm (osc_sm_backing_directory), often 64 MiB in
  // a container: the node's m + 1 buffers must fit beside what it holds, this window's own
  // bytes, freed first, counted free.
  const auto bytes = [&](std::size_t floats) {
    return static_cast<double>(local_size_ + 1) * static_cast<double>(floats) * sizeof(float);
  };
  struct statvfs disk {};
  double free = bytes(count);
  if (statvfs("/dev/shm", &disk) == 0)
    free =
        static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize) + bytes(capacity_);
  int room = free >= bytes(count) ? 1 : 0;
  std::vector<MPI_Request> request(1);
  check(MPI_Iallreduce(MPI_IN_PLACE, &room, 1, MPI_INT, MPI_MIN, comm_, request.data()),
        "MPI_Iallreduce", "allreduce", seq);
  wait_all(request, "allreduce", seq);
  if (room == 1 || !required_) return room == 1;
  throw CommunicatorError(fmt::format(
      "communicator hier: allreduce #{} on rank {} of {}: a node has no room in /dev/shm for "
      "the shared window of {} floats ({:.1f} MB for its {} ranks and the sums; this node has "
      "{:.1f} MB free): give the nodes a larger /dev/shm (docker run --shm-size), or use "
      "smaller buckets (--bucket-mb) or --comm ring",
      seq, rank_, size_, count, bytes(count) / 1e6, local_size_, free / 1e6));
}

void HierCommunicator::reserve(std::size_t count, std::uint64_t seq) {
  if (count <= capacity_) return;
  free_window();
  std::vector<float*> members;
  window_ = allocate_window(node_, local_rank_ == 0 ? 2 * count : count, members, "allreduce", seq);
  shared_.assign(members.begin(), members.end());
  sums_ = members[0] + count;
  capacity_ = count;
}

void HierCommunicator::node_barrier(std::uint64_t seq) const {
  window_barrier(window_, node_, seq);
}

void HierCommunicator::sum(float* buffer, std::size_t count, std::uint64_t seq, bool bf16) {
  if (!hierarchical_) {
    RingCommunicator::sum(buffer, count, seq, bf16);
    return;
  }
  // (Every rank takes the same branch: capacity_ and no_room_ follow agreed decisions.)
  if (count >= no_room_ || (count > capacity_ && !room_for(count, seq))) {
    no_room_ = std::min(no_room_, count);
    RingCommunicator::sum(buffer, count, seq, bf16);
    return;
  }
  try {
    reserve(count, seq);
    std::memcpy(const_cast<float*>(shared_[static_cast<std::size_t>(local_rank_)]), buffer,
                count * sizeof(float));
    node_barrier(seq);
    slice_sum(count, seq, bf16);
    node_barrier(seq);
    std::memcpy(buffer, sums_, count * sizeof(float));
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void HierCommunicator::slice_sum(std::size_t count, std::uint64_t seq, bool bf16) {
  const int m = local_size_, k = nodes_, j = node_index_, l = local_rank_;
  const std::vector<const float*>& values = shared_;
  const auto segment = [&](int g) {
    return part(count, static_cast<std::size_t>(size_), static_cast<std::size_t>(g));
  };
  // Slice l of node b's block.
  const auto slice = [&](std::size_t b) {
    const int first = static_cast<int>(b) * m;
    const Range block{segment(first).begin, segment(first + m - 1).end};
    const Range mine = part(block.size(), static_cast<std::size_t>(m), static_cast<std::size_t>(l));
    return Range{block.begin + mine.begin, block.begin + mine.end};
  };
  if (k == 1) {
    // One node: every chain from rank g round to rank g - 1 here.
    const Range mine = slice(0);
    for (int g = 0; g < m; ++g) {
      const Range s = intersect(mine, segment(g));
      chain(sums_, s, g, m, true, bf16, values);
      chain(sums_, s, 0, g, false, bf16, values);
      if (bf16) {
        for (std::size_t i = s.begin; i < s.end; ++i)
          sums_[i] = from_bf16(to_bf16(sums_[i]));
      }
    }
    return;
  }
  RingPass pass;
  pass.comm = rail_;
  pass.rank = j;
  pass.size = k;
  pass.left_peer = (j + k - 1) % k * m + l;
  pass.right_peer = (j + 1) % k * m + l;
  pass.buffer = sums_;
  pass.part_range = slice;
  // Block 0 is the longest, and so is its slice l.
  pass.longest = slice(0).size();
  if (pass.longest == 0) return;  // the same on every rank of this rail
  pass.reduce_steps = k;
  pass.steps = 2 * k - 1;
  pass.bf16 = bf16;
  // Step 0 sends this node's block: segment j m + g through ranks g .. m - 1.
  pass.before_send = [&](int step, Range chunk) {
    if (step != 0) return;
    for (int g = 0; g < m; ++g)
      chain(sums_, intersect(chunk, segment(j * m + g)), g, m, true, bf16, values);
  };
  // Another node's block through all the ranks here; this node's own block, back after k
  // steps, through ranks 0 .. g - 1 for segment j m + g.
  pass.reduce = [&](int step, Range chunk, const float* in) {
    if (chunk.size() == 0) return;
    std::memcpy(sums_ + chunk.begin, in, chunk.size() * sizeof(float));
    if (((j - step - 1) % k + k) % k != j) {
      chain(sums_, chunk, 0, m, false, bf16, values);
      return;
    }
    for (int g = 1; g < m; ++g)
      chain(sums_, intersect(chunk, segment(j * m + g)), 0, g, false, bf16, values);
  };
  run(pass, seq);
}

}  // namespace

std::unique_ptr<Communicator> make_hier_communicator(const CommOptions& options, bool required) {
  return std::make_unique<HierCommunicator>(options, required);
}

}  // namespace hn::detail
