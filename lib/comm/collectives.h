// Helpers of the collectives of unequal blocks (collectives.cpp), for the backends.
#pragma once

#include <cstddef>
#include <vector>

#include "lib/comm/comm.h"

namespace hn::detail {

// Throws hn::Error naming the communicator, `what` and the rank unless `counts` has one
// entry per rank.
void check_block_counts(const Communicator& comm, const char* what,
                        const std::vector<std::size_t>& counts);
// Where rank `rank`'s block starts: the sum of the counts before it.
std::size_t block_offset(const std::vector<std::size_t>& counts, int rank);

}  // namespace hn::detail
