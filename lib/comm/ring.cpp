// The `ring` backend: our allreduce over non-blocking MPI point-to-point; broadcast,
// allgather and barrier are MPI's (MpiCommunicator).
//
// The buffer is cut into `size` segments (the first count % size one element longer) and
// every segment into the same number of chunks. Reduce-scatter then allgather, 2 (n - 1)
// steps: at reduce-scatter step t rank r sends segment r - t to its right neighbour and
// adds segment r - t - 1 from its left one into its own; after n - 1 steps it holds the full
// sum of segment r + 1, which the allgather steps pass round the ring. The steps run per
// chunk, not per segment: a chunk goes on to its next step as soon as its previous one has
// arrived (and, in reduce-scatter, been added), so reducing one chunk overlaps moving the
// others and the allgather of early chunks overlaps the reduce-scatter of late ones (Gloo's
// allreduce_ring_chunked, NCCL's ring). `chunks_in_flight` chunks move at once.
//
// Every element of segment g is summed in ring order starting at rank g + 1, whatever the
// timing: the order depends only on (count, size), every rank ends with the same bits, and a
// rerun reproduces them.
//
// allreduce_bf16 runs the same ring with BF16 on the wire (half the bytes): each hop of the
// reduce-scatter sends the partial sum rounded to BF16 (to nearest, ties to even) and the
// receiver adds it to its own FP32 values; the rank that completes a segment rounds it to
// BF16 before the allgather passes it on, so every rank holds the same bits. The order and
// the roundings depend only on (count, size), as above.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lib/comm/mpi.h"
#include "lib/comm/mpi_communicator.h"
#include "lib/core/check.h"

namespace hn::detail {

namespace {

// Element range [begin, end) of part `i` of `parts` near-equal parts of [0, count).
struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
Range part(std::size_t count, std::size_t parts, std::size_t i) {
  const std::size_t base = count / parts, extra = count % parts;
  const std::size_t begin = i * base + std::min(i, extra);
  return Range{begin, begin + base + (i < extra ? 1 : 0)};
}

// BF16 (the upper half of an FP32) rounded to nearest, ties to even; NaN stays NaN.
std::uint16_t to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t half) {
  const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

class RingCommunicator final : public MpiCommunicator {
 public:
  using MpiCommunicator::MpiCommunicator;
  std::string name() const override { return "ring"; }

  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    reduce(driver, data, count, op, false);
  }
  void allreduce_bf16(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    reduce(driver, data, count, op, true);
  }
  bool compresses() const override { return true; }

 private:
  void reduce(Driver& driver, float* data, std::size_t count, ReduceOp op, bool bf16) {
    const std::uint64_t seq = next_sequence();
    agree_count("allreduce", seq, count);
    HostFloats host(driver, data, count);
    if (size_ > 1 && count > 0) ring(host.get(), count, seq, bf16);
    if (op == ReduceOp::average && size_ > 1) {
      const float scale = 1.0f / static_cast<float>(size_);
      float* values = host.get();
      for (std::size_t i = 0; i < count; ++i)
        values[i] *= scale;
    }
    host.write_back();
  }

  void ring(float* buffer, std::size_t count, std::uint64_t seq, bool bf16);
};

void RingCommunicator::ring(float* buffer, std::size_t count, std::uint64_t seq, bool bf16) {
  const int n = size_, r = rank_;
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const int steps = 2 * (n - 1);
  // Chunks per segment: about chunk_bytes each (default: a quarter of a segment, between
  // 64 KiB and 1 MiB), few enough that every (chunk, step) has a tag of its own.
  const std::size_t segment = (count + static_cast<std::size_t>(n) - 1) / n;
  std::size_t chunk_bytes = options_.chunk_bytes;
  if (chunk_bytes == 0)
    chunk_bytes = std::clamp<std::size_t>(segment * sizeof(float) / 4, 64 << 10, 1 << 20);
  std::size_t chunks =
      std::max<std::size_t>(1, (segment * sizeof(float) + chunk_bytes - 1) / chunk_bytes);
  chunks = std::min<std::size_t>(chunks, static_cast<std::size_t>(32767 / steps));
  chunks = std::max<std::size_t>(chunks, (segment + kMpiMaxCount - 1) / kMpiMaxCount);
  const auto segment_of = [&](int step, bool sending) {
    // Reduce-scatter step t: send r - t, receive r - t - 1; allgather step s = t - (n - 1):
    // send r + 1 - s, receive r - s.
    const int s = step - (n - 1);
    const int g =
        step < n - 1 ? (sending ? r - step : r - step - 1) : (sending ? r + 1 - s : r - s);
    return static_cast<std::size_t>(((g % n) + n) % n);
  };
  const auto chunk_range = [&](std::size_t g, std::size_t c) {
    const Range seg = part(count, static_cast<std::size_t>(n), g);
    const Range in = part(seg.size(), chunks, c);
    return Range{seg.begin + in.begin, seg.begin + in.end};
  };
  const std::size_t max_chunk = (segment + chunks - 1) / chunks;
  const int slots = static_cast<int>(
      std::min<std::size_t>(chunks, static_cast<std::size_t>(options_.chunks_in_flight)));

  // Per slot: the chunk it carries, its step, the receive in progress, the sends not yet
  // known complete, and the reduce-scatter staging of its incoming chunk.
  struct Slot {
    std::size_t chunk = 0;
    int step = 0;
    std::vector<MPI_Request> sends;
  };
  std::vector<Slot> slot(static_cast<std::size_t>(slots));
  std::vector<MPI_Request> receives(static_cast<std::size_t>(slots), MPI_REQUEST_NULL);
  std::vector<float> incoming(bf16 ? 0 : static_cast<std::size_t>(slots) * max_chunk);
  // With BF16 on the wire every chunk goes through a slot's staging, both ways.
  std::vector<std::uint16_t> wire_in(bf16 ? static_cast<std::size_t>(slots) * max_chunk : 0),
      wire_out(wire_in.size());
  const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
  const auto tag = [&](std::size_t c, int step) { return static_cast<int>(c) * steps + step; };

  const auto post = [&](int i) {
    Slot& s = slot[static_cast<std::size_t>(i)];
    const Range to = chunk_range(segment_of(s.step, false), s.chunk);
    const std::size_t staging = static_cast<std::size_t>(i) * max_chunk;
    void* destination = buffer + to.begin;
    if (bf16) {
      destination = wire_in.data() + staging;
      // The slot's outgoing staging is rewritten below.
      wait_all(s.sends, "allreduce", seq, right);
      s.sends.clear();
    } else if (s.step < n - 1) {
      destination = incoming.data() + staging;
    } else {
      // The allgather writes the final sums over memory an earlier send may still read.
      wait_all(s.sends, "allreduce", seq, right);
      s.sends.clear();
    }
    check(MPI_Irecv(destination, static_cast<int>(to.size()), type, left, tag(s.chunk, s.step),
                    comm_, &receives[static_cast<std::size_t>(i)]),
          "MPI_Irecv", "allreduce", seq);
    const Range from = chunk_range(segment_of(s.step, true), s.chunk);
    const void* source = buffer + from.begin;
    if (bf16) {
      float* values = buffer + from.begin;
      std::uint16_t* out = wire_out.data() + staging;
      if (s.step == n - 1) {
        // This rank's finished sums: kept as every other rank will receive them.
        for (std::size_t k = 0; k < from.size(); ++k) {
          out[k] = to_bf16(values[k]);
          values[k] = from_bf16(out[k]);
        }
      } else {
        for (std::size_t k = 0; k < from.size(); ++k)
          out[k] = to_bf16(values[k]);
      }
      source = out;
    }
    s.sends.emplace_back();
    check(MPI_Isend(source, static_cast<int>(from.size()), type, right, tag(s.chunk, s.step), comm_,
                    &s.sends.back()),
          "MPI_Isend", "allreduce", seq);
  };

  std::size_t next_chunk = 0;
  int active = 0;
  for (int i = 0; i < slots; ++i) {
    slot[static_cast<std::size_t>(i)] = Slot{next_chunk++, 0, {}};
    post(i);
    ++active;
  }
  while (active > 0) {
    const int i = wait_any(receives, "allreduce", seq, left);
    Slot& s = slot[static_cast<std::size_t>(i)];
    const Range to = chunk_range(segment_of(s.step, false), s.chunk);
    float* out = buffer + to.begin;
    const std::size_t staging = static_cast<std::size_t>(i) * max_chunk;
    if (s.step < n - 1) {
      // Reduce-scatter: add the left neighbour's partial sum into ours.
      if (bf16) {
        const std::uint16_t* in = wire_in.data() + staging;
        for (std::size_t k = 0; k < to.size(); ++k)
          out[k] += from_bf16(in[k]);
      } else {
        const float* in = incoming.data() + staging;
        for (std::size_t k = 0; k < to.size(); ++k)
          out[k] += in[k];
      }
    } else if (bf16) {
      // Allgather: the finished sums, as their owner keeps them.
      const std::uint16_t* in = wire_in.data() + staging;
      for (std::size_t k = 0; k < to.size(); ++k)
        out[k] = from_bf16(in[k]);
    }
    if (++s.step < steps) {
      post(i);
    } else if (next_chunk < chunks) {
      wait_all(s.sends, "allreduce", seq, right);
      s.sends.clear();
      s.chunk = next_chunk++;
      s.step = 0;
      post(i);
    } else {
      --active;
    }
  }
  for (Slot& s : slot)
    wait_all(s.sends, "allreduce", seq, right);
}

}  // namespace

std::unique_ptr<Communicator> make_ring_communicator(const CommOptions& options) {
  return std::make_unique<RingCommunicator>(options);
}

}  // namespace hn::detail
