// The CPU driver's threads bound to its cores (its option `cores`, affinity.h): the team
// that computes for a thread is bound the first time that thread calls the driver, and again
// only when it calls a driver with other cores or a larger team.
#pragma once

#include <cstdint>
#include <vector>

namespace hn::detail::cpu {

// Binds the OpenMP threads of the calling thread's team of `threads` to `cores`, and the
// calling thread itself when it is one of the library's device threads (affinity.h,
// on_library_thread): a program's own thread keeps the affinity it has. `set` names the
// set (one per driver) so that repeated calls cost a comparison. Builds without OpenMP
// bind the calling device thread only (their TBB threads are left to the system).
void bind_team(std::uint64_t set, const std::vector<int>& cores, int threads);

}  // namespace hn::detail::cpu
