// The `ring` backend: our allreduce over non-blocking MPI point-to-point; broadcast,
// allgather and barrier are MPI's (MpiCommunicator). The pipeline (RingPass, ring.h) also
// runs the `hier` backend's ring of node leaders (hier.cpp).
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
// Every element of segment g is summed in ring order starting at rank g, whatever the
// timing: ((x_g + x_(g+1)) + x_(g+2)) + ... + x_(g-1), indices mod n. The order depends only
// on (count, size), every rank ends with the same bits, and a rerun reproduces them.
//
// allreduce_bf16 runs the same ring with BF16 on the wire (half the bytes): each hop of the
// reduce-scatter sends the partial sum rounded to BF16 (to nearest, ties to even) and the
// receiver adds it to its own FP32 values; the rank that completes a segment rounds it to
// BF16 before the allgather passes it on, so every rank holds the same bits. The order and
// the roundings depend only on (count, size), as above.
#include "lib/comm/ring.h"

#include <mpi.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lib/comm/mpi.h"

namespace hn::detail {

namespace {

// The ring's default chunk (CommOptions::chunk_bytes 0).
constexpr std::size_t kDefaultChunkBytes = std::size_t{256} << 10;

// `buffer`'s memory for at least `count` elements, kept between calls (a vector made per
// call cost its zeroing and, past malloc's mmap threshold, its page faults every time).
template <typename T>
T* grown(std::vector<T>& buffer, std::size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace

void RingCommunicator::allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) {
  reduce(driver, data, count, op, false);
}

void RingCommunicator::allreduce_bf16(Driver& driver, float* data, std::size_t count, ReduceOp op) {
  reduce(driver, data, count, op, true);
}

void RingCommunicator::reduce(Driver& driver, float* data, std::size_t count, ReduceOp op,
                              bool bf16) {
  const std::uint64_t seq = next_sequence();
  HostFloats host(driver, data, count);
  // Every rank's place in its shared buffer (0: outside it, k: at offset k - 1) is agreed
  // with the count, so that all ranks take the same path.
  const std::size_t offset = count > 0 ? shared_offset(host.get(), count) : kNotShared;
  const std::uint64_t place = offset == kNotShared ? 0 : offset + 1;
  agree_count("allreduce", seq, count, place << 1,
              "in their places in the shared buffer (0: outside it, k: at offset k - 1)");
  if (size_ > 1 && count > 0 && offset != kNotShared) {
    sum_shared(offset, count, seq, bf16);
  } else if (size_ > 1 && count > 0) {
    sum(host.get(), count, seq, bf16);
  }
  if (op == ReduceOp::average && size_ > 1) {
    const float scale = 1.0f / static_cast<float>(size_);
    float* values = host.get();
    for (std::size_t i = 0; i < count; ++i)
      values[i] *= scale;
  }
  host.write_back();
}

void RingCommunicator::sum(float* buffer, std::size_t count, std::uint64_t seq, bool bf16) {
  const int n = size_;
  RingPass pass;
  pass.comm = comm_;
  pass.rank = rank_;
  pass.size = n;
  pass.left_peer = (rank_ + n - 1) % n;
  pass.right_peer = (rank_ + 1) % n;
  pass.buffer = buffer;
  pass.part_range = [count, n](std::size_t g) {
    return part(count, static_cast<std::size_t>(n), g);
  };
  pass.longest = (count + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
  pass.reduce_steps = n - 1;
  pass.steps = 2 * (n - 1);
  pass.bf16 = bf16;
  // Add the left neighbour's partial sum into ours.
  pass.reduce = [buffer](int, Range chunk, const float* in) {
    float* out = buffer + chunk.begin;
    for (std::size_t k = 0; k < chunk.size(); ++k)
      out[k] += in[k];
  };
  run(pass, seq);
}

void RingCommunicator::run(const RingPass& pass, std::uint64_t seq) {
  const int n = pass.size, r = pass.rank, steps = pass.steps;
  const bool bf16 = pass.bf16;
  float* const buffer = pass.buffer;
  // Chunks per part: about chunk_bytes each (default 256 KiB: on 2 and 4 ranks over shared
  // memory the best of 64 KiB to 1 MiB and of a quarter of a part, at 1-64 MiB:
  // docs/benchmarks.md), few enough that every (chunk, step) has a tag of its own.
  std::size_t chunk_bytes = options_.chunk_bytes;
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  std::size_t chunks =
      std::max<std::size_t>(1, (pass.longest * sizeof(float) + chunk_bytes - 1) / chunk_bytes);
  chunks = std::min<std::size_t>(chunks, static_cast<std::size_t>(32767 / steps));
  chunks = std::max<std::size_t>(chunks, (pass.longest + kMpiMaxCount - 1) / kMpiMaxCount);
  // Step t: send part r - t, receive part r - t - 1.
  const auto part_of = [&](int step, bool sending) {
    const int g = r - step - (sending ? 0 : 1);
    return static_cast<std::size_t>(((g % n) + n) % n);
  };
  const auto chunk_range = [&](std::size_t g, std::size_t c) {
    const Range whole = pass.part_range(g);
    const Range in = part(whole.size(), chunks, c);
    return Range{whole.begin + in.begin, whole.begin + in.end};
  };
  const std::size_t max_chunk = (pass.longest + chunks - 1) / chunks;
  const int slots = static_cast<int>(
      std::min<std::size_t>(chunks, static_cast<std::size_t>(options_.chunks_in_flight)));

  // Per slot: the chunk it carries, its step, and the sends not yet known complete with the
  // parts they read.
  struct Slot {
    std::size_t chunk = 0;
    int step = 0;
    std::vector<MPI_Request> sends;
    std::vector<std::size_t> sent_parts;
  };
  std::vector<Slot> slot(static_cast<std::size_t>(slots));
  std::vector<MPI_Request> receives(static_cast<std::size_t>(slots), MPI_REQUEST_NULL);
  // The staging of the incoming chunks of the reduce steps, per slot.
  float* const incoming = grown(staging_, static_cast<std::size_t>(slots) * max_chunk);
  // With BF16 on the wire every chunk goes through a slot's staging, both ways.
  const std::size_t wire_count = bf16 ? static_cast<std::size_t>(slots) * max_chunk : 0;
  std::uint16_t* const wire_in = grown(wire_in_, wire_count);
  std::uint16_t* const wire_out = grown(wire_out_, wire_count);
  const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
  const auto tag = [&](std::size_t c, int step) { return static_cast<int>(c) * steps + step; };
  const auto settle = [&](Slot& s) {
    wait_all(s.sends, "allreduce", seq, pass.right_peer);
    s.sends.clear();
    s.sent_parts.clear();
  };
  // Before buffer[part g] is written: the slot's sends still reading it completed.
  const auto settle_part = [&](Slot& s, std::size_t g) {
    if (std::find(s.sent_parts.begin(), s.sent_parts.end(), g) != s.sent_parts.end()) settle(s);
  };

  const auto post = [&](int i) {
    Slot& s = slot[static_cast<std::size_t>(i)];
    const Range to = chunk_range(part_of(s.step, false), s.chunk);
    const std::size_t staging = static_cast<std::size_t>(i) * max_chunk;
    void* destination = buffer + to.begin;
    if (bf16 || s.step >= pass.reduce_steps) {
      // The slot's outgoing staging is rewritten below; the gather writes the final values
      // over memory an earlier send may still read.
      settle(s);
      if (bf16) destination = wire_in + staging;
    } else {
      destination = incoming + staging;
    }
    check(MPI_Irecv(destination, static_cast<int>(to.size()), type, (r + n - 1) % n,
                    tag(s.chunk, s.step), pass.comm, &receives[static_cast<std::size_t>(i)]),
          "MPI_Irecv", "allreduce", seq);
    const std::size_t g = part_of(s.step, true);
    const Range from = chunk_range(g, s.chunk);
    if (pass.before_send) {
      settle_part(s, g);
      pass.before_send(s.step, from);
    }
    const void* source = buffer + from.begin;
    if (bf16) {
      float* values = buffer + from.begin;
      std::uint16_t* out = wire_out + staging;
      if (s.step == pass.reduce_steps) {
        // This member's finished sums: kept as every other member will receive them.
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
    s.sent_parts.push_back(g);
    check(MPI_Isend(source, static_cast<int>(from.size()), type, (r + 1) % n, tag(s.chunk, s.step),
                    pass.comm, &s.sends.back()),
          "MPI_Isend", "allreduce", seq);
  };

  std::size_t next_chunk = 0;
  int active = 0;
  for (int i = 0; i < slots; ++i) {
    slot[static_cast<std::size_t>(i)] = Slot{next_chunk++, 0, {}, {}};
    post(i);
    ++active;
  }
  while (active > 0) {
    const int i = wait_any(receives, "allreduce", seq, pass.left_peer);
    Slot& s = slot[static_cast<std::size_t>(i)];
    const std::size_t g = part_of(s.step, false);
    const Range to = chunk_range(g, s.chunk);
    const std::size_t staging = static_cast<std::size_t>(i) * max_chunk;
    if (s.step < pass.reduce_steps) {
      float* in = incoming + staging;
      if (bf16) {
        const std::uint16_t* wire = wire_in + staging;
        for (std::size_t k = 0; k < to.size(); ++k)
          in[k] = from_bf16(wire[k]);
      }
      settle_part(s, g);
      pass.reduce(s.step, to, in);
    } else if (bf16) {
      // Gather: the finished sums, as their owner keeps them.
      const std::uint16_t* wire = wire_in + staging;
      float* out = buffer + to.begin;
      for (std::size_t k = 0; k < to.size(); ++k)
        out[k] = from_bf16(wire[k]);
    }
    if (++s.step < steps) {
      post(i);
    } else if (next_chunk < chunks) {
      settle(s);
      s.chunk = next_chunk++;
      s.step = 0;
      post(i);
    } else {
      --active;
    }
  }
  for (Slot& s : slot)
    wait_all(s.sends, "allreduce", seq, pass.right_peer);
}

RingCommunicator::~RingCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After a failed collective the other ranks may be gone: freeing the window (a collective
  // of the node) could wait for them forever, so it is left to the exit.
  if (finalized || shared_broken_) return;
  if (shared_window_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(shared_window_);
    MPI_Win_free(&shared_window_);
  }
  if (shared_node_ != MPI_COMM_NULL) MPI_Comm_free(&shared_node_);
}

float* RingCommunicator::shared_buffer(std::size_t count) {
  if (shared_asked_ || size_ == 1) return nullptr;
  shared_asked_ = true;
  const std::uint64_t seq = next_sequence();
  // The smallest of each value over all ranks (of a negated one: the largest).
  const auto agree = [&](long long* values, int n) {
    std::vector<MPI_Request> request(1);
    check(MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_LONG_LONG, MPI_MIN, comm_, request.data()),
          "MPI_Iallreduce", "shared_buffer", seq);
    wait_all(request, "shared_buffer", seq);
  };
  try {
    // Every rank here (waited for against the deadline) with the same count, before the
    // blocking calls below.
    long long counts[2] = {static_cast<long long>(count), -static_cast<long long>(count)};
    agree(counts, 2);
    if (counts[0] <= 0 || counts[0] != -counts[1]) return nullptr;
    // The ranks that share this node's memory: all of them, and room for every rank's buffer
    // in /dev/shm, where Open MPI's shared windows live (often 64 MiB in a container).
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared_node_),
          "MPI_Comm_split_type", "shared_buffer", seq);
    check(MPI_Comm_set_errhandler(shared_node_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler",
          "shared_buffer", seq);
    int node_size = 0;
    MPI_Comm_size(shared_node_, &node_size);
    const double bytes = static_cast<double>(size_) * static_cast<double>(count) * sizeof(float);
    struct statvfs disk {};
    const bool room =
        statvfs("/dev/shm", &disk) != 0 ||
        static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize) >= bytes;
    long long fits = node_size == size_ && room ? 1 : 0;
    agree(&fits, 1);
    if (fits == 0) {
      MPI_Comm_free(&shared_node_);
      return nullptr;
    }
    shared_window_ = allocate_window(shared_node_, count, shared_, "shared_buffer", seq);
    shared_count_ = count;
    return shared_[static_cast<std::size_t>(rank_)];
  } catch (...) {
    shared_broken_ = true;
    throw;
  }
}

MPI_Win RingCommunicator::allocate_window(MPI_Comm node, std::size_t floats,
                                          std::vector<float*>& members, const char* what,
                                          std::uint64_t seq) const {
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  float* base = nullptr;
  MPI_Win window = MPI_WIN_NULL;
  const int code = MPI_Win_allocate_shared(static_cast<MPI_Aint>(floats * sizeof(float)),
                                           sizeof(float), info, node, &base, &window);
  MPI_Info_free(&info);
  check(code, "MPI_Win_allocate_shared", what, seq);
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, window), "MPI_Win_lock_all", what, seq);
  int size = 0;
  MPI_Comm_size(node, &size);
  members.assign(static_cast<std::size_t>(size), nullptr);
  for (int r = 0; r < size; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* pointer = nullptr;
    check(MPI_Win_shared_query(window, r, &bytes, &unit, &pointer), "MPI_Win_shared_query", what,
          seq);
    members[static_cast<std::size_t>(r)] = static_cast<float*>(pointer);
  }
  return window;
}

std::size_t RingCommunicator::shared_offset(const float* buffer, std::size_t count) const {
  if (shared_count_ == 0) return kNotShared;
  // Compared as addresses: the buffer may be any memory.
  const auto begin = reinterpret_cast<std::uintptr_t>(shared_[static_cast<std::size_t>(rank_)]);
  const auto at = reinterpret_cast<std::uintptr_t>(buffer);
  if (at < begin || (at - begin) % sizeof(float) != 0) return kNotShared;
  const std::size_t offset = (at - begin) / sizeof(float);
  return offset < shared_count_ && count <= shared_count_ - offset ? offset : kNotShared;
}

void RingCommunicator::window_barrier(MPI_Win window, MPI_Comm node, std::uint64_t seq) const {
  MPI_Win_sync(window);
  std::vector<MPI_Request> request(1);
  check(MPI_Ibarrier(node, request.data()), "MPI_Ibarrier", "allreduce", seq);
  wait_all(request, "allreduce", seq, kNodeRanks);
  MPI_Win_sync(window);
}

void RingCommunicator::sum_shared(std::size_t offset, std::size_t count, std::uint64_t seq,
                                  bool bf16) {
  const int n = size_;
  std::vector<const float*> values(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    values[static_cast<std::size_t>(r)] = shared_[static_cast<std::size_t>(r)] + offset;
  // Segment r of the ring's parts, whose chain there starts at rank r, for this rank r: the
  // chain from this rank round to the one before it, a piece at a time into a buffer in
  // cache, then into every rank's buffer. No other rank reads or writes this segment.
  const Range mine = part(count, static_cast<std::size_t>(n), static_cast<std::size_t>(rank_));
  constexpr std::size_t kPiece = 4096;
  float piece[kPiece];
  std::vector<const float*> at(static_cast<std::size_t>(n));
  try {
    window_barrier(shared_window_, shared_node_, seq);  // every rank's values are in
    for (std::size_t begin = mine.begin; begin < mine.end; begin += kPiece) {
      const Range range{0, std::min(mine.end - begin, kPiece)};
      for (std::size_t r = 0; r < at.size(); ++r)
        at[r] = values[r] + begin;
      chain(piece, range, rank_, n, true, bf16, at);
      chain(piece, range, 0, rank_, false, bf16, at);
      if (bf16) {
        for (std::size_t i = 0; i < range.end; ++i)
          piece[i] = from_bf16(to_bf16(piece[i]));
      }
      for (int r = 0; r < n; ++r) {
        std::memcpy(shared_[static_cast<std::size_t>(r)] + offset + begin, piece,
                    range.end * sizeof(float));
      }
    }
    window_barrier(shared_window_, shared_node_, seq);  // every segment is out
  } catch (...) {
    shared_broken_ = true;
    throw;
  }
}

std::unique_ptr<Communicator> make_ring_communicator(const CommOptions& options) {
  return std::make_unique<RingCommunicator>(options);
}

}  // namespace hn::detail
