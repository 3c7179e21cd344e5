// The `hier` backend (and `auto`): the flat ring's sums, bit for bit, computed node by node.
//
// The flat ring (ring.cpp) sums segment g of N as the chain ((x_g + x_(g+1)) + ...) + x_(g-1)
// round the ranks. Where the ranks are numbered node by node (node j holds ranks j m ..
// j m + m - 1, Open MPI's default --map-by slot), that chain visits the nodes one after
// the other, so it can be computed without a message between two ranks of one node:
//
// * the ranks of a node put their buffers in an MPI-3 shared window (one copy in), and the
//   node's leader (its first rank) reads them there;
// * block j, node j's m segments, starts at node j: segment j m + l is summed through the
//   node's ranks l .. m - 1; then the leaders' ring (RingPass over one rank per node) takes
//   every block one node on per step, and each node's leader extends every segment of it
//   through all its ranks in order; after k steps (k nodes) block j is back at node j, whose
//   ranks 0 .. l - 1 end segment j m + l; the leaders' ring then passes the finished blocks
//   round (k - 1 steps) and every rank copies the node's sums out of the window.
//
// A bucket's critical path crosses the network 2 k - 1 times instead of 2 (N - 1), in
// pipelined chunks as the ring's; the bytes on each link between nodes are about the flat
// ring's (2 x count). With BF16 on the wire each extension rounds the partial sum to BF16
// before adding the next rank's values, as the flat ring's hops do, and the finished sums
// are rounded once: the flat ring's bits again.
//
// Where the ranks are not numbered node by node the chain alternates nodes at every rank:
// `hier` refuses it (naming the mapping), `auto` runs the flat ring. `auto` also runs the
// flat ring on one node or with one rank per node, where the hierarchy gains nothing.
#include <fmt/format.h>
#include <mpi.h>

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
  // The window holds `count` floats per rank of the node.
  void reserve(std::size_t count, std::uint64_t seq);
  void free_window();
  void node_barrier(std::uint64_t seq) const;
  // The leader's part: the node's sums into sums_, the local ranks' values in `values`.
  void leader_sum(const std::vector<const float*>& values, std::size_t count, std::uint64_t seq,
                  bool bf16);

  std::string name_;
  bool hierarchical_ = false;
  bool broken_ = false;
  MPI_Comm node_ = MPI_COMM_NULL, leaders_ = MPI_COMM_NULL;
  int local_rank_ = 0, local_size_ = 1, node_index_ = 0, nodes_ = 1;
  MPI_Win window_ = MPI_WIN_NULL;
  std::size_t capacity_ = 0;
  // In the window: every non-leader's copy of its buffer (entry l for local rank l; the
  // leader reads its own buffer), and the node's sums (the leader's part).
  std::vector<float*> shared_;
  float* sums_ = nullptr;
};

// The partial sums of out[range] extended through local ranks [from, to) in order, each
// rank's values added to the partial sum (rounded to BF16 first, as a hop of the flat ring
// sends it); `fresh`: the chain starts at `from`, whose values are copied.
void chain(float* out, Range range, int from, int to, bool fresh, bool bf16,
           const std::vector<const float*>& values) {
  float* o = out + range.begin;
  const std::size_t n = range.size();
  for (int l = from; l < to; ++l) {
    const float* v = values[static_cast<std::size_t>(l)] + range.begin;
    if (fresh && l == from) {
      std::memcpy(o, v, n * sizeof(float));
    } else if (bf16) {
      for (std::size_t k = 0; k < n; ++k)
        o[k] = from_bf16(to_bf16(o[k])) + v[k];
    } else {
      for (std::size_t k = 0; k < n; ++k)
        o[k] += v[k];
    }
  }
}

HierCommunicator::HierCommunicator(const CommOptions& options, bool required)
    : RingCommunicator(options), name_(required ? "hier" : "auto") {
  try {
    find_nodes(required);
  } catch (...) {
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
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
  hierarchical_ = fault.empty() && (required || (nodes_ > 1 && m > 1));
  name_ = hierarchical_ ? "hier" : "ring";
  if (!hierarchical_) {
    MPI_Comm_free(&node_);
    return;
  }
  check(MPI_Comm_split(comm_, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders_),
        "MPI_Comm_split", "startup", 0);
  if (leaders_ != MPI_COMM_NULL) {
    check(MPI_Comm_set_errhandler(leaders_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
          "startup", 0);
  }
}

HierCommunicator::~HierCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After a failed collective the node's other ranks may be gone: freeing the window (a
  // collective of the node) could wait for them forever, so it is left to the exit.
  if (finalized || broken_) return;
  free_window();
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
}

void HierCommunicator::free_window() {
  if (window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
  capacity_ = 0;
  shared_.clear();
  sums_ = nullptr;
}

void HierCommunicator::reserve(std::size_t count, std::uint64_t seq) {
  if (count <= capacity_) return;
  free_window();
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  float* base = nullptr;
  const int code = MPI_Win_allocate_shared(static_cast<MPI_Aint>(count * sizeof(float)),
                                           sizeof(float), info, node_, &base, &window_);
  MPI_Info_free(&info);
  check(code, "MPI_Win_allocate_shared", "allreduce", seq);
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_), "MPI_Win_lock_all", "allreduce", seq);
  shared_.assign(static_cast<std::size_t>(local_size_), nullptr);
  for (int l = 0; l < local_size_; ++l) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* pointer = nullptr;
    check(MPI_Win_shared_query(window_, l, &bytes, &unit, &pointer), "MPI_Win_shared_query",
          "allreduce", seq);
    shared_[static_cast<std::size_t>(l)] = static_cast<float*>(pointer);
  }
  sums_ = shared_[0];
  capacity_ = count;
}

void HierCommunicator::node_barrier(std::uint64_t seq) const {
  MPI_Win_sync(window_);
  std::vector<MPI_Request> request(1);
  check(MPI_Ibarrier(node_, request.data()), "MPI_Ibarrier", "allreduce", seq);
  wait_all(request, "allreduce", seq);
  MPI_Win_sync(window_);
}

void HierCommunicator::sum(float* buffer, std::size_t count, std::uint64_t seq, bool bf16) {
  if (!hierarchical_) {
    RingCommunicator::sum(buffer, count, seq, bf16);
    return;
  }
  try {
    reserve(count, seq);
    if (local_rank_ != 0)
      std::memcpy(shared_[static_cast<std::size_t>(local_rank_)], buffer, count * sizeof(float));
    node_barrier(seq);
    if (local_rank_ == 0) {
      std::vector<const float*> values(shared_.begin(), shared_.end());
      values[0] = buffer;
      leader_sum(values, count, seq, bf16);
    }
    node_barrier(seq);
    std::memcpy(buffer, sums_, count * sizeof(float));
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void HierCommunicator::leader_sum(const std::vector<const float*>& values, std::size_t count,
                                  std::uint64_t seq, bool bf16) {
  const int m = local_size_, k = nodes_, j = node_index_;
  const auto segment = [&](int g) {
    return part(count, static_cast<std::size_t>(size_), static_cast<std::size_t>(g));
  };
  if (k == 1) {
    // One node: every chain from rank l round to rank l - 1 here.
    for (int l = 0; l < m; ++l) {
      const Range s = segment(l);
      chain(sums_, s, l, m, true, bf16, values);
      chain(sums_, s, 0, l, false, bf16, values);
      if (bf16) {
        for (std::size_t i = s.begin; i < s.end; ++i)
          sums_[i] = from_bf16(to_bf16(sums_[i]));
      }
    }
    return;
  }
  RingPass pass;
  pass.comm = leaders_;
  pass.rank = j;
  pass.size = k;
  pass.left_peer = (j + k - 1) % k * m;
  pass.right_peer = (j + 1) % k * m;
  pass.buffer = sums_;
  pass.part_range = [&](std::size_t b) {
    const int first = static_cast<int>(b) * m;
    return Range{segment(first).begin, segment(first + m - 1).end};
  };
  pass.longest = pass.part_range(0).size();
  pass.reduce_steps = k;
  pass.steps = 2 * k - 1;
  pass.bf16 = bf16;
  // Step 0 sends this node's block: segment j m + l through ranks l .. m - 1.
  pass.before_send = [&](int step, Range chunk) {
    if (step != 0) return;
    for (int l = 0; l < m; ++l)
      chain(sums_, intersect(chunk, segment(j * m + l)), l, m, true, bf16, values);
  };
  // Another node's block through all the ranks here; this node's own block, back after k
  // steps, through ranks 0 .. l - 1 for segment j m + l.
  pass.reduce = [&](int step, Range chunk, const float* in) {
    std::memcpy(sums_ + chunk.begin, in, chunk.size() * sizeof(float));
    if (((j - step - 1) % k + k) % k != j) {
      chain(sums_, chunk, 0, m, false, bf16, values);
      return;
    }
    for (int l = 1; l < m; ++l)
      chain(sums_, intersect(chunk, segment(j * m + l)), 0, l, false, bf16, values);
  };
  run(pass, seq);
}

}  // namespace

std::unique_ptr<Communicator> make_hier_communicator(const CommOptions& options, bool required) {
  return std::make_unique<HierCommunicator>(options, required);
}

}  // namespace hn::detail
