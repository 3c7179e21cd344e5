// The Communicator's collectives of unequal blocks (allgatherv, reduce_scatterv) in terms of
// its equal ones, for the backends that have no better way: padded blocks through
// allgather, and an allreduce of which each rank keeps its block.
#include "lib/comm/collectives.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/driver.h"
#include "lib/core/tensor.h"

namespace hn {
namespace detail {

void check_block_counts(const Communicator& comm, const char* what,
                        const std::vector<std::size_t>& counts) {
  HN_CHECK(counts.size() == static_cast<std::size_t>(comm.size()),
           "communicator {}: {} on rank {} got {} block counts for {} ranks", comm.name(), what,
           comm.rank(), counts.size(), comm.size());
}

std::size_t block_offset(const std::vector<std::size_t>& counts, int rank) {
  return std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
}

}  // namespace detail

void Communicator::allgatherv(Driver& driver, const float* sent,
                              const std::vector<std::size_t>& counts, float* received) {
  detail::check_block_counts(*this, "allgatherv", counts);
  const std::size_t widest = *std::max_element(counts.begin(), counts.end());
  if (widest == 0) return;
  const auto own = counts[static_cast<std::size_t>(rank())];
  Tensor padded(Shape{static_cast<index_t>(widest)});
  Tensor all(Shape{static_cast<index_t>(widest * counts.size())});
  float* block = static_cast<float*>(padded.data().overwrite(driver));
  if (own > 0) driver.copy(block, sent, own * sizeof(float));
  if (own < widest) driver.fill(static_cast<index_t>(widest - own), 0.0f, block + own);
  float* gathered = static_cast<float*>(all.data().overwrite(driver));
  allgather(driver, block, widest, gathered);
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > 0)
      driver.copy(received + offset, gathered + r * widest, counts[r] * sizeof(float));
    offset += counts[r];
  }
}

void Communicator::reduce_scatterv(Driver& driver, const float* data,
                                   const std::vector<std::size_t>& counts, float* received,
                                   ReduceOp op) {
  detail::check_block_counts(*this, "reduce_scatterv", counts);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  if (total == 0) return;
  Tensor copy(Shape{static_cast<index_t>(total)});
  float* sums = static_cast<float*>(copy.data().overwrite(driver));
  driver.copy(sums, data, total * sizeof(float));
  allreduce(driver, sums, total, op);
  const auto own = counts[static_cast<std::size_t>(rank())];
  if (own > 0)
    driver.copy(received, sums + detail::block_offset(counts, rank()), own * sizeof(float));
}

}  // namespace hn
