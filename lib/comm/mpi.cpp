// The `mpi` backend: MPI's own collectives, started non-blocking and waited for against the
// deadline. MPI is initialised (MPI_THREAD_MULTIPLE when the library has it) by the first
// MPI communicator and finalised at exit, unless the program did either itself.
#include "lib/comm/mpi.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "lib/comm/collectives.h"
#include "lib/comm/mpi_communicator.h"
#include "lib/core/check.h"

namespace hn::detail {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommunicatorError(
      fmt::format("MPI: {} failed: {}", call, std::string(text, static_cast<std::size_t>(length))));
}

namespace {

// Initialises MPI once; finalises it at exit when this library initialised it.
void ensure_mpi() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  });
}

int as_count(std::size_t count, const char* what) {
  HN_CHECK(count <= kMpiMaxCount, "{}: {} floats is more than one MPI call carries ({})", what,
           count, kMpiMaxCount);
  return static_cast<int>(count);
}

}  // namespace

HostFloats::HostFloats(Driver& driver, float* data, std::size_t count, bool overwritten)
    : driver_(driver), data_(data), count_(count), host_(data) {
  driver.synchronize();
  if (driver.capabilities().host_addressable || count == 0) return;
  copy_.resize(count);
  if (!overwritten) driver.copy_to_host(copy_.data(), data, count * sizeof(float));
  host_ = copy_.data();
}

void HostFloats::write_back() {
  if (host_ != data_) driver_.copy_from_host(data_, host_, count_ * sizeof(float));
}

MpiCommunicator::MpiCommunicator(const CommOptions& options, const char* backend)
    : options_(options), backend_(backend) {
  ensure_mpi();
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // MPI_Comm_dup would wait for every rank without a deadline.
  std::vector<MPI_Request> request(1);
  check(MPI_Comm_idup(MPI_COMM_WORLD, &comm_, request.data()), "MPI_Comm_idup", "startup", 0);
  wait_all(request, "startup", 0);
  // MPI's default handler (MPI_ERRORS_ARE_FATAL) ends every rank on an error such as a
  // truncated message; returned, each becomes a CommunicatorError naming the collective.
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "startup", 0);
  agree_backend();
  find_nodes();
  starting_ = false;
}

std::string MpiCommunicator::label() const {
  return starting_ ? std::string(backend_) : name();
}

void MpiCommunicator::agree_backend() {
  if (size_ == 1) return;
  constexpr std::size_t kName = 16;
  std::array<char, kName> mine{};
  std::strncpy(mine.data(), backend_, kName - 1);
  std::vector<char> all(kName * static_cast<std::size_t>(size_));
  std::vector<MPI_Request> request(1);
  check(MPI_Iallgather(mine.data(), kName, MPI_CHAR, all.data(), kName, MPI_CHAR, comm_,
                       request.data()),
        "MPI_Iallgather", "startup", 0);
  wait_all(request, "startup", 0);
  std::string differ;
  for (int r = 0; r < size_; ++r) {
    const char* theirs = all.data() + kName * static_cast<std::size_t>(r);
    if (std::strncmp(theirs, mine.data(), kName) != 0)
      differ += fmt::format("{}rank {}: {}", differ.empty() ? "" : ", ", r,
                            std::string(theirs, strnlen(theirs, kName)));
  }
  if (differ.empty()) return;
  throw CommunicatorError(fmt::format(
      "communicator {}: startup on rank {} of {}: the ranks asked for different communicators "
      "(this rank {}; {}): every rank must pass the same --comm",
      backend_, rank_, size_, backend_, differ));
}

void MpiCommunicator::find_nodes() {
  node_of_.assign(static_cast<std::size_t>(size_), 0);
  if (size_ == 1) return;
  // Every rank has arrived (agree_backend): MPI_Comm_split_type cannot wait without end.
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type", "startup", 0);
  // A node is named by its first rank (of comm_).
  MPI_Group node_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(node, &node_group);
  MPI_Comm_group(comm_, &group);
  int first = 0, leader = rank_;
  MPI_Group_translate_ranks(node_group, 1, &first, group, &leader);
  MPI_Group_free(&node_group);
  MPI_Group_free(&group);
  MPI_Comm_free(&node);
  std::vector<MPI_Request> request(1);
  check(MPI_Iallgather(&leader, 1, MPI_INT, node_of_.data(), 1, MPI_INT, comm_, request.data()),
        "MPI_Iallgather", "startup", 0);
  wait_all(request, "startup", 0);
  spans_nodes_ = std::any_of(node_of_.begin(), node_of_.end(),
                             [&](int other) { return other != node_of_.front(); });
}

void MpiCommunicator::check(int code, const char* call, const char* what, std::uint64_t seq) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail_with(fmt::format("communicator {}: {} #{} on rank {} of {}: {} failed: {}", label(), what,
                        seq, rank_, size_, call,
                        std::string(text, static_cast<std::size_t>(length))));
}

void MpiCommunicator::fail_with(const std::string& message) const {
  if (failed_.empty() && !starting_) failed_ = message;
  throw CommunicatorError(message);
}

void MpiCommunicator::agree_count(const char* what, std::uint64_t seq, std::size_t count,
                                  std::uint64_t shape, const char* shape_what) const {
  if (size_ == 1) return;
  // The largest and, negated, the smallest count and digest of all ranks in one MPI_MAX.
  const auto value = static_cast<long long>(count);
  const auto digest = static_cast<long long>(shape >> 1);
  long long bounds[4] = {value, -value, digest, -digest};
  std::vector<MPI_Request> request(1);
  check(MPI_Iallreduce(MPI_IN_PLACE, bounds, 4, MPI_LONG_LONG, MPI_MAX, comm_, request.data()),
        "MPI_Iallreduce", what, seq);
  wait_all(request, what, seq);
  if (bounds[0] == -bounds[1] && bounds[2] == -bounds[3]) return;
  if (bounds[0] == -bounds[1]) {
    throw CommunicatorError(fmt::format(
        "communicator {}: {} #{} on rank {} of {}: the ranks passed {} floats each but differ "
        "{} (this rank {}; among all ranks {} to {}); every rank must pass the same",
        name(), what, seq, rank_, size_, count, shape_what, digest, -bounds[3], bounds[2]));
  }
  throw CommunicatorError(fmt::format(
      "communicator {}: {} #{} on rank {} of {}: the ranks passed different sizes (this rank {} "
      "floats{}{}; among all ranks {} to {}); every rank must pass the same",
      name(), what, seq, rank_, size_, count, shape != 0 ? " " : "", shape != 0 ? shape_what : "",
      -bounds[1], bounds[0]));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::uint64_t MpiCommunicator::next_sequence() {
  if (!failed_.empty()) {
    throw CommunicatorError(
        fmt::format("communicator {}: rank {} of {} takes no collective after a failed one, whose "
                    "transfers may still be under way (make a new communicator): {}",
                    name(), rank_, size_, failed_));
  }
  return ++sequence_;
}

void MpiCommunicator::timed_out(const char* what, std::uint64_t seq, int peer) const {
  if (peer < 0 && size_ == 2) peer = 1 - rank_;  // a collective of two waits on the other
  const std::string waited =
      peer >= 0 ? fmt::format(
                      "rank {} did not arrive (it, or a rank it waits for, died, stopped "
                      "or is not running the same collectives)",
                      peer)
      : peer == kNodeRanks ? std::string(
                                 "one of the other ranks of this node did not arrive (it died, "
                                 "stopped or is not running the same collectives)")
                           : fmt::format(
                                 "one of the other {} ranks did not arrive (it died, stopped or is "
                                 "not running the same collectives)",
                                 size_ - 1);
  fail_with(fmt::format("communicator {}: {} #{} on rank {} of {} timed out after {} s: {}",
                        label(), what, seq, rank_, size_, options_.timeout_seconds, waited));
}

void MpiCommunicator::abort(int exit_code) noexcept {
  // MPI_Abort tells mpirun, which ends every rank; should mpirun be out of reach (a cut
  // link), this process still ends.
  std::thread([exit_code] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::_Exit(exit_code);
  }).detach();
  MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void MpiCommunicator::pause(std::chrono::steady_clock::time_point start, const char* what,
                            std::uint64_t seq, int peer) const {
  const auto waited = std::chrono::steady_clock::now() - start;
  if (waited > std::chrono::duration<double>(options_.timeout_seconds)) timed_out(what, seq, peer);
  // Over shared memory MPI moves the bytes only while both sides poll: sleeping there slows
  // 1-16 MiB allreduces 2-4x. From another node the kernel or the NIC moves them, and a
  // thread that only yields loses the CPU to busy compute threads (the overlapped
  // backward): past a spin of 1 ms, waits on another node sleep, and the scheduler wakes them
  // ahead of the compute.
  const bool remote = peer >= 0 && peer < size_ ? node_of_[static_cast<std::size_t>(peer)] !=
                                                      node_of_[static_cast<std::size_t>(rank_)]
                                                : peer != kNodeRanks && spans_nodes_;
  if (!remote || waited < kSpinBeforeSleep)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(kSleep);
}

void MpiCommunicator::wait_all(std::vector<MPI_Request>& requests, const char* what,
                               std::uint64_t seq, int peer) const {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    check(
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
        "MPI_Testall", what, seq);
    if (done) return;
    pause(start, what, seq, peer);
  }
}

int MpiCommunicator::wait_any(std::vector<MPI_Request>& requests, const char* what,
                              std::uint64_t seq, int peer) const {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int index = MPI_UNDEFINED, done = 0;
    check(MPI_Testany(static_cast<int>(requests.size()), requests.data(), &index, &done,
                      MPI_STATUS_IGNORE),
          "MPI_Testany", what, seq);
    if (done && index != MPI_UNDEFINED) return index;
    HN_CHECK(!done, "communicator {}: {} #{} waits on no request", name(), what, seq);
    pause(start, what, seq, peer);
  }
}

void MpiCommunicator::allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) {
  const std::uint64_t seq = next_sequence();
  agree_count("allreduce", seq, count);
  HostFloats host(driver, data, count);
  float* values = host.get();
  for (std::size_t done = 0; done < count; done += kMpiMaxCount) {
    std::vector<MPI_Request> request(1);
    check(MPI_Iallreduce(MPI_IN_PLACE, values + done,
                         as_count(std::min(kMpiMaxCount, count - done), "allreduce"), MPI_FLOAT,
                         MPI_SUM, comm_, request.data()),
          "MPI_Iallreduce", "allreduce", seq);
    wait_all(request, "allreduce", seq);
  }
  if (op == ReduceOp::average) {
    const float scale = 1.0f / static_cast<float>(size_);
    for (std::size_t i = 0; i < count; ++i)
      values[i] *= scale;
  }
  host.write_back();
}

void MpiCommunicator::broadcast(Driver& driver, float* data, std::size_t count, int root) {
  const std::uint64_t seq = next_sequence();
  HN_CHECK(root >= 0 && root < size_, "communicator {}: broadcast from rank {} of {}", name(), root,
           size_);
  agree_count("broadcast", seq, count, static_cast<std::uint64_t>(root) << 1);
  HostFloats host(driver, data, count);
  std::vector<MPI_Request> request(1);
  check(
      MPI_Ibcast(host.get(), as_count(count, "broadcast"), MPI_FLOAT, root, comm_, request.data()),
      "MPI_Ibcast", "broadcast", seq);
  wait_all(request, "broadcast", seq);
  host.write_back();
}

void MpiCommunicator::allgather(Driver& driver, const float* sent, std::size_t count,
                                float* received) {
  const std::uint64_t seq = next_sequence();
  agree_count("allgather", seq, count);
  HostFloats out(driver, received, count * static_cast<std::size_t>(size_), true);
  HostFloats in(driver, const_cast<float*>(sent), count);
  std::vector<MPI_Request> request(1);
  const int n = as_count(count, "allgather");
  check(MPI_Iallgather(in.get(), n, MPI_FLOAT, out.get(), n, MPI_FLOAT, comm_, request.data()),
        "MPI_Iallgather", "allgather", seq);
  wait_all(request, "allgather", seq);
  out.write_back();
}

namespace {

// MPI's int counts and displacements of the blocks; throws when the whole is more than one
// MPI call carries.
std::pair<std::vector<int>, std::vector<int>> mpi_blocks(const std::vector<std::size_t>& counts,
                                                         const char* what) {
  std::vector<int> lengths, displacements;
  std::size_t offset = 0;
  for (const std::size_t count : counts) {
    lengths.push_back(as_count(count, what));
    displacements.push_back(as_count(offset, what));
    offset += count;
  }
  as_count(offset, what);
  return {lengths, displacements};
}

// A digest of every rank's block count (FNV-1a), equal on ranks that agree on all of them.
std::uint64_t blocks_digest(const std::vector<std::size_t>& counts) {
  std::uint64_t digest = 1469598103934665603ull;
  for (const std::size_t count : counts)
    digest = (digest ^ count) * 1099511628211ull;
  return digest | 2;  // never 0 (the digest field is shifted right once)
}

}  // namespace

void MpiCommunicator::allgatherv(Driver& driver, const float* sent,
                                 const std::vector<std::size_t>& counts, float* received) {
  const std::uint64_t seq = next_sequence();
  check_block_counts(*this, "allgatherv", counts);
  const auto [lengths, displacements] = mpi_blocks(counts, "allgatherv");
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  agree_count("allgatherv", seq, total, blocks_digest(counts));
  HostFloats out(driver, received, total, true);
  HostFloats in(driver, const_cast<float*>(sent), counts[static_cast<std::size_t>(rank_)]);
  std::vector<MPI_Request> request(1);
  check(MPI_Iallgatherv(in.get(), lengths[static_cast<std::size_t>(rank_)], MPI_FLOAT, out.get(),
                        lengths.data(), displacements.data(), MPI_FLOAT, comm_, request.data()),
        "MPI_Iallgatherv", "allgatherv", seq);
  wait_all(request, "allgatherv", seq);
  out.write_back();
}

void MpiCommunicator::reduce_scatterv(Driver& driver, const float* data,
                                      const std::vector<std::size_t>& counts, float* received,
                                      ReduceOp op) {
  const std::uint64_t seq = next_sequence();
  check_block_counts(*this, "reduce_scatterv", counts);
  const auto lengths = mpi_blocks(counts, "reduce_scatterv").first;
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::size_t own = counts[static_cast<std::size_t>(rank_)];
  agree_count("reduce_scatterv", seq, total, blocks_digest(counts));
  HostFloats in(driver, const_cast<float*>(data), total);
  HostFloats out(driver, received, own, true);
  std::vector<MPI_Request> request(1);
  check(MPI_Ireduce_scatter(in.get(), out.get(), lengths.data(), MPI_FLOAT, MPI_SUM, comm_,
                            request.data()),
        "MPI_Ireduce_scatter", "reduce_scatterv", seq);
  wait_all(request, "reduce_scatterv", seq);
  if (op == ReduceOp::average) {
    const float scale = 1.0f / static_cast<float>(size_);
    float* values = out.get();
    for (std::size_t i = 0; i < own; ++i)
      values[i] *= scale;
  }
  out.write_back();
}

void MpiCommunicator::barrier() {
  const std::uint64_t seq = next_sequence();
  std::vector<MPI_Request> request(1);
  check(MPI_Ibarrier(comm_, request.data()), "MPI_Ibarrier", "barrier", seq);
  wait_all(request, "barrier", seq);
}

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace hn::detail
