// The CPU driver's threading: loops on the driver's thread count that stay serial when the
// job is too small to repay waking the other threads.
//
// They run on OpenMP, the runtime oneDNN (Debian's build) runs its GEMMs and convolutions
// on, so that one pool of threads does all the driver's work. With the loops on a TBB arena
// beside oneDNN's OpenMP team, each runtime's idle threads spin on the cores the other one
// needs: LeNet training at batch 64 on the 2-core development machine took 29 ms per
// iteration at 2 threads against 12 at 1 (OMP_WAIT_POLICY unset). Builds without OpenMP
// (-fopenmp) keep the TBB arena.
#pragma once

#include <algorithm>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#else
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

// Work is counted in units of about 0.1 ns: one float streamed through an element-wise
// loop from L2 (ReLU runs at ~0.085 ns per element on the 2-core development machine).
// Measured there with scratch benchmarks through the Driver API: waking the second thread
// and joining it costs 5-10 us, so a job goes parallel only above ~25 us of serial work
// (2^18 units; ReLU on 262144 floats: 36 us serial, 13 us on 2 threads; on 131072 floats
// 11 us either way), and chunks hold ~6 us of work so that a late thread finds work.
inline constexpr index_t kMinParallelWork = index_t{1} << 18;
inline constexpr index_t kGrainWork = index_t{1} << 16;

class Parallel {
 public:
#ifdef _OPENMP
  explicit Parallel(int threads) : threads_(threads) {}
#else
  explicit Parallel(int threads) : threads_(threads), arena_(threads) {}
#endif
  Parallel(const Parallel&) = delete;
  Parallel& operator=(const Parallel&) = delete;

  int threads() const {
    return threads_;
  }

  // Calls body(begin, end) on disjoint ranges covering [0, items), each item costing
  // about `cost` work units. Serial (one call, on the calling thread) when the
  // whole job is small or the driver has one thread.
  template <class Body>
  void for_range(index_t items, index_t cost, const Body& body) {
    if (items <= 0) return;
    cost = std::max<index_t>(cost, 1);
    if (threads_ <= 1 || items == 1 || items * cost < kMinParallelWork) {
      body(index_t{0}, items);
      return;
    }
    const index_t grain = std::max<index_t>(1, kGrainWork / cost);
#ifdef _OPENMP
    // Chunks of `grain` items handed out dynamically: a thread that starts late (the
    // machine is shared) takes fewer. The bodies never throw.
    const index_t chunks = (items + grain - 1) / grain;
    const int team = static_cast<int>(std::min<index_t>(threads_, chunks));
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
    for (index_t c = 0; c < chunks; ++c) {
      body(c * grain, std::min(items, (c + 1) * grain));
    }
#else
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<index_t>(0, items, grain),
          [&](const tbb::blocked_range<index_t>& range) { body(range.begin(), range.end()); });
    });
#endif
  }

  // Sum of partial(begin, end) over fixed blocks of `block` items, added in block order:
  // the result does not depend on the thread count or on scheduling.
  template <class Partial>
  double sum_blocks(index_t items, index_t block, index_t cost, const Partial& partial) {
    if (items <= 0) return 0.0;
    const index_t blocks = (items + block - 1) / block;
    std::vector<double> partials(static_cast<std::size_t>(blocks));
    for_range(blocks, block * cost, [&](index_t first, index_t last) {
      for (index_t b = first; b < last; ++b) {
        partials[b] = partial(b * block, std::min(items, (b + 1) * block));
      }
    });
    double total = 0.0;
    for (const double p : partials)
      total += p;
    return total;
  }

 private:
  int threads_;
#ifndef _OPENMP
  tbb::task_arena arena_;
#endif
};

}  // namespace hn::detail::cpu
