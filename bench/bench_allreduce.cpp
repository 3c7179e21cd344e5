// hybridnn-bench allreduce: the ring allreduce against MPI's, in the same run, under mpirun.
// For each size from --min to --max bytes (x4): the `ring` and `mpi` communicators (the
// latter MPI_Iallreduce, waited for against its deadline) and MPI_Allreduce called directly
// (blocking, as an MPI program would), taking turns run by run: each one's mean time over
// the iterations (each run's time its slowest rank's), algbw = bytes / time and busbw =
// algbw * 2 (n - 1) / n (nccl-tests' columns), the median run's time and busbw, and #wrong:
// elements differing from the exact sum of integer-valued inputs, over all ranks. Rank 0
// prints one JSON line per size and way, then ring's median busbw over the best of MPI's two
// (a median: a preempted run of a shared machine moves a mean by tens of percent). A
// fourth way, ring_bf16, is the ring with BF16 on the wire (allreduce_bf16: half the bytes),
// its busbw counted in the FP32 bytes reduced and its #wrong the elements further than BF16's
// rounding (n x 2^-8 relative) from the exact sum. A fifth, hier, is the hierarchical
// allreduce (the ring's sums node by node: the ranks of a node through shared memory, a ring
// of node leaders between nodes) on the nodes MPI finds, or on nodes of --ranks-per-node
// ranks simulated on one machine; its ratios are to the ring and to MPI. A sixth,
// ring_shared, is the ring communicator's allreduce of a buffer in its shared memory
// (Communicator::shared_buffer, where every rank is on one node: no message, each rank sums
// its segment through the others' buffers), the values written there before the clock
// starts, as the Solver's gradient buckets are packed there; a seventh, ring_shared_copies,
// counts copying the values in and the sums out too (what a bucket of one parameter, which
// would otherwise be reduced where it lies, pays). Both are absent (null ratios) where the
// ranks span nodes or /dev/shm lacks the room. --busy-threads N runs N threads of
// arithmetic on every rank throughout (the overlapped backward's compute, which the
// collective shares the cores with in training).
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#if HYBRIDNN_WITH_MPI
#include <mpi.h>
#endif

#include "bench/bench_common.h"
#include "lib/comm/comm.h"
#include "lib/core/runtime.h"

namespace hn::bench {

namespace {

std::size_t parse_bytes(const std::string& text) {
  std::size_t end = 0;
  const double number = std::stod(text, &end);
  const std::string unit = text.substr(end);
  const double scale = unit == "K" || unit == "KiB"   ? 1024.0
                       : unit == "M" || unit == "MiB" ? 1024.0 * 1024
                       : unit == "G" || unit == "GiB" ? 1024.0 * 1024 * 1024
                                                      : 1.0;
  if (!unit.empty() && scale == 1.0) throw UsageError{"allreduce: bad size '" + text + "'"};
  return static_cast<std::size_t>(number * scale);
}

// Threads that keep a core busy with arithmetic until destroyed.
class BusyThreads {
 public:
  explicit BusyThreads(int count) {
    for (int t = 0; t < count; ++t)
      threads_.emplace_back([this] {
        float x = 1.0f;
        while (!stop_.load(std::memory_order_relaxed))
          for (int i = 0; i < 4096; ++i)
            x = x * 0.999999f + 1e-7f;
        sink_.store(x, std::memory_order_relaxed);
      });
  }
  ~BusyThreads() {
    stop_ = true;
    for (std::thread& thread : threads_)
      thread.join();
  }
  BusyThreads(const BusyThreads&) = delete;
  BusyThreads& operator=(const BusyThreads&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::atomic<float> sink_{0.0f};
  std::vector<std::thread> threads_;
};

}  // namespace

int run_allreduce(const std::vector<std::string>& args) {
  std::size_t min_bytes = 64 << 10, max_bytes = std::size_t{256} << 20;
  int iterations = 0;  // 0: by size
  int busy_threads = 0;
  CommOptions ring_options;  // --chunk-bytes, --chunks-in-flight: the ring's pipeline
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) throw UsageError{"allreduce: " + flag + " needs a value"};
    const std::string& value = args[++i];
    if (flag == "--min") {
      min_bytes = parse_bytes(value);
    } else if (flag == "--max") {
      max_bytes = parse_bytes(value);
    } else if (flag == "--iterations") {
      iterations = std::stoi(value);
    } else if (flag == "--chunk-bytes") {
      ring_options.chunk_bytes = parse_bytes(value);
    } else if (flag == "--chunks-in-flight") {
      ring_options.chunks_in_flight = std::stoi(value);
    } else if (flag == "--busy-threads") {
      busy_threads = std::stoi(value);
      if (busy_threads < 0) throw UsageError{"allreduce: --busy-threads must be 0 or more"};
    } else if (flag == "--ranks-per-node") {
      ring_options.ranks_per_node = std::stoi(value);
    } else {
      throw UsageError{"allreduce: unknown option '" + flag + "'"};
    }
  }
  const std::unique_ptr<Driver> host = make_driver(Device::parse("reference"));
  const std::unique_ptr<Communicator> ring = make_communicator("ring", ring_options);
  const std::unique_ptr<Communicator> mpi = make_communicator("mpi");
  const std::unique_ptr<Communicator> hier = make_communicator("hier", ring_options);
  const int n = ring->size(), rank = ring->rank();
  float* const shared = ring->shared_buffer(max_bytes / sizeof(float));
  const BusyThreads busy(busy_threads);
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    const int runs = iterations > 0
                         ? iterations
                         : static_cast<int>(std::clamp<std::size_t>((64u << 20) / bytes, 5, 50));
    std::vector<float> data(count);
    // The ways take turns, one allreduce each per round, so that all of them meet the same
    // moments of a shared machine; each run's time is its slowest rank's, and a way's
    // figures are the mean of its runs and, for the ratios, the median (a preempted run moves
    // a mean by tens of percent).
    constexpr int kWays = 7;
    // A way that does not run here (MPI_Allreduce without MPI, the shared ones without
    // shared memory).
    const auto absent = [&](int b) {
      return (b == 2 && !HYBRIDNN_WITH_MPI) || (b >= 5 && shared == nullptr);
    };
    std::vector<double> seconds(static_cast<std::size_t>(kWays * runs), 0.0);
    std::size_t wrong[kWays] = {0, 0, 0, 0, 0, 0, 0};
    for (int run = -1; run < runs; ++run) {  // run -1 warms up
      for (int b = 0; b < kWays; ++b) {
        if (absent(b)) continue;
        Communicator& comm = b == 0 || b == 3 || b >= 5 ? *ring : b == 4 ? *hier : *mpi;
        float* const values = b == 5 ? shared : data.data();
        for (std::size_t i = 0; i < count; ++i)
          values[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 31 + 1));
        mpi->barrier();
        const auto start = std::chrono::steady_clock::now();
        if (b == 6) {
          std::copy_n(data.data(), count, shared);
          comm.allreduce(*host, shared, count);
          std::copy_n(shared, count, data.data());
        } else if (b == 3) {
          comm.allreduce_bf16(*host, data.data(), count);
        } else if (b != 2) {
          comm.allreduce(*host, values, count);
        } else {
#if HYBRIDNN_WITH_MPI
          MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
#endif
        }
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (run >= 0) seconds[static_cast<std::size_t>(b * runs + run)] = took;
        for (std::size_t i = 0; i < count; ++i) {
          const float exact = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 31 + 1));
          wrong[b] +=
              b == 3 ? std::abs(values[i] - exact) > n * exact / 256.0f : values[i] != exact;
        }
      }
    }
    // Every rank's times and wrong counts, then each run's slowest rank.
    std::vector<float> mine(seconds.begin(), seconds.end());
    for (const std::size_t w : wrong)
      mine.push_back(static_cast<float>(w));
    std::vector<float> all(mine.size() * static_cast<std::size_t>(n));
    mpi->allgather(*host, mine.data(), mine.size(), all.data());
    double busbw[kWays] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int b = 0; b < kWays; ++b) {
      if (absent(b)) continue;
      const std::string way = b == 2   ? "MPI_Allreduce"
                              : b == 3 ? "ring_bf16"
                              : b == 4 ? hier->name()
                              : b == 5 ? "ring_shared"
                              : b == 6 ? "ring_shared_copies"
                              : b == 0 ? ring->name()
                                       : mpi->name();
      std::vector<double> slowest(static_cast<std::size_t>(runs), 0.0);
      double wrong_total = 0.0;
      for (int r = 0; r < n; ++r) {
        const float* theirs = all.data() + static_cast<std::size_t>(r) * mine.size();
        for (int run = 0; run < runs; ++run)
          slowest[static_cast<std::size_t>(run)] = std::max(
              slowest[static_cast<std::size_t>(run)], static_cast<double>(theirs[b * runs + run]));
        wrong_total += theirs[kWays * runs + b];
      }
      std::sort(slowest.begin(), slowest.end());
      const std::size_t half = slowest.size() / 2;
      const double median =
          slowest.size() % 2 == 1 ? slowest[half] : (slowest[half - 1] + slowest[half]) / 2.0;
      double mean = 0.0;
      for (const double t : slowest)
        mean += t / runs;
      const double algbw = static_cast<double>(bytes) / mean / 1e9;
      const double bus = 2.0 * (n - 1) / n;
      busbw[b] = static_cast<double>(bytes) / median / 1e9 * bus;
      if (rank == 0) {
        std::printf("%s\n",
                    fmt::format("{{\"bench\":\"allreduce\",\"way\":\"{}\",\"ranks\":{},"
                                "\"bytes\":{},\"iterations\":{},\"time_us\":{:.1f},"
                                "\"algbw_gbs\":{:.3f},\"busbw_gbs\":{:.3f},"
                                "\"median_time_us\":{:.1f},\"median_busbw_gbs\":{:.3f},"
                                "\"wrong\":{},\"busy_threads\":{}}}",
                                way, n, bytes, runs, mean * 1e6, algbw, algbw * bus, median * 1e6,
                                busbw[b], static_cast<long>(wrong_total), busy_threads)
                        .c_str());
      }
    }
    if (rank == 0) {
      const double best_mpi = std::max(busbw[1], busbw[2]);
      // One rank moves no bytes (busbw 0): its ratios are null, not NaN.
      const auto ratio = [](double a, double b) {
        return b > 0.0 ? fmt::format("{:.3f}", a / b) : std::string("null");
      };
      std::printf("%s\n", fmt::format("{{\"bench\":\"allreduce\",\"ranks\":{},\"bytes\":{},"
                                      "\"busy_threads\":{},\"ratio_ring_to_mpi_busbw\":{},"
                                      "\"ratio_ring_bf16_to_mpi_busbw\":{},"
                                      "\"ratio_hier_to_ring_busbw\":{},"
                                      "\"ratio_hier_to_mpi_busbw\":{},"
                                      "\"ratio_ring_shared_to_mpi_busbw\":{},"
                                      "\"ratio_ring_shared_copies_to_mpi_busbw\":{}}}",
                                      n, bytes, busy_threads, ratio(busbw[0], best_mpi),
                                      ratio(busbw[3], best_mpi), ratio(busbw[4], busbw[0]),
                                      ratio(busbw[4], best_mpi), ratio(busbw[5], best_mpi),
                                      ratio(busbw[6], best_mpi))
                              .c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace hn::bench
