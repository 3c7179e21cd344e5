// The ring's pipeline (ring.cpp), shared by the `ring` backend and the `hier` backend's ring
// of node leaders (hier.cpp). Internal to comm.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lib/comm/mpi_communicator.h"

namespace hn::detail {

// Element range [begin, end).
struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};

// Part `i` of `parts` near-equal parts of [0, count): the first count % parts one longer.
inline Range part(std::size_t count, std::size_t parts, std::size_t i) {
  const std::size_t base = count / parts, extra = count % parts;
  const std::size_t begin = i * base + std::min(i, extra);
  return Range{begin, begin + base + (i < extra ? 1 : 0)};
}

// BF16 (the upper half of an FP32) rounded to nearest, ties to even; NaN stays NaN.
inline std::uint16_t to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float from_bf16(std::uint16_t half) {
  const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The partial sums of out[range] extended through members [from, to) of `values` in order,
// each member's values added to the partial sum (rounded to BF16 first, as a hop of the
// ring sends it); `fresh`: the chain starts at `from`, whose values are copied.
inline void chain(float* out, Range range, int from, int to, bool fresh, bool bf16,
                  const std::vector<const float*>& values) {
  float* o = out + range.begin;
  const std::size_t n = range.size();
  if (n == 0) return;
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

// One pipelined pass round a ring of `size` members of `comm` (this process is `rank`).
// The buffer is cut into `size` parts, every part into the same number of chunks; at step t
// each member sends chunk c of part (rank - t) to its right neighbour and receives chunk c of
// part (rank - t - 1) from its left, each chunk going on to its next step as soon as its
// previous one has arrived and been handled, `chunks_in_flight` chunks at once. The first
// `reduce_steps` steps reduce what arrives (the `reduce` hook, into `buffer`); the later
// ones gather it (copied into `buffer`). With `bf16`, every send carries BF16 and, at step
// `reduce_steps`, the member's finished part is first rounded to BF16 in place, so that every
// member holds the same bits.
struct RingPass {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  // The neighbours as ranks of the communicator, for errors.
  int left_peer = 0, right_peer = 0;
  float* buffer = nullptr;
  std::function<Range(std::size_t part)> part_range;
  // The longest part's length.
  std::size_t longest = 0;
  int reduce_steps = 0, steps = 0;
  bool bf16 = false;
  // Called before a chunk of `buffer` is sent at a step (may be empty).
  std::function<void(int step, Range chunk)> before_send;
  // The left neighbour's values of `chunk` (decoded from BF16) into buffer[chunk].
  std::function<void(int step, Range chunk, const float* in)> reduce;
};

// The `ring` backend: the allreduce is one RingPass over all ranks (reduce-scatter, then
// allgather); broadcast, allgather and barrier are MPI's (MpiCommunicator).
//
// With every rank on one node, shared_buffer() gives memory in an MPI-3 shared window, and
// the allreduce of a buffer there sends no message: each rank sums its own segment through
// every rank's buffer in the ring's order (the same chains, the same bits) and writes the
// sums into all of them, between two barriers of the node.
class RingCommunicator : public MpiCommunicator {
 public:
  explicit RingCommunicator(const CommOptions& options, const char* backend = "ring")
      : MpiCommunicator(options, backend) {}
  ~RingCommunicator() override;
  std::string name() const override { return "ring"; }

  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override;
  void allreduce_bf16(Driver& driver, float* data, std::size_t count, ReduceOp op) override;
  bool compresses() const override { return true; }
  float* shared_buffer(std::size_t count) override;

 protected:
  // The sum over the ranks of `count` (> 0) floats of host memory, in place, in the flat
  // ring's order (collective `seq`).
  virtual void sum(float* buffer, std::size_t count, std::uint64_t seq, bool bf16);
  void run(const RingPass& pass, std::uint64_t seq);
  // Where [buffer, buffer + count) lies inside this rank's shared buffer: its offset there;
  // else kNotShared.
  static constexpr std::size_t kNotShared = SIZE_MAX;
  std::size_t shared_offset(const float* buffer, std::size_t count) const;
  // The sum of the `count` floats at `offset` of every rank's shared buffer, in place.
  void sum_shared(std::size_t offset, std::size_t count, std::uint64_t seq, bool bf16);
  // An MPI-3 shared window over `node` with `floats` floats of this rank's, locked for
  // passive access; every member's memory in `members` (by rank in `node`). Errors name the
  // collective `what` (#seq).
  MPI_Win allocate_window(MPI_Comm node, std::size_t floats, std::vector<float*>& members,
                          const char* what, std::uint64_t seq) const;
  // Returns once every member of `node` has called it (against the deadline of allreduce
  // #seq); what each wrote to `window` before it, every member sees after it.
  void window_barrier(MPI_Win window, MPI_Comm node, std::uint64_t seq) const;

 private:
  // The staging of incoming chunks, and of BF16 on the wire both ways, kept between calls.
  std::vector<float> staging_;
  std::vector<std::uint16_t> wire_in_, wire_out_;
  // The shared buffers: the ranks (all of one node), the window, every rank's buffer.
  MPI_Comm shared_node_ = MPI_COMM_NULL;
  MPI_Win shared_window_ = MPI_WIN_NULL;
  std::vector<float*> shared_;
  std::size_t shared_count_ = 0;
  bool shared_asked_ = false, shared_broken_ = false;
  void reduce(Driver& driver, float* data, std::size_t count, ReduceOp op, bool bf16);
};

}  // namespace hn::detail
