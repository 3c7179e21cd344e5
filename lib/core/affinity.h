// Which cores a thread may run on: the process's own share (what taskset, a cpuset or an MPI
// launcher's binding left it), the CPU driver's `cores` option in the list form of taskset
// and /sys ("0-5,8"), and binding a thread to such a set.
//
// The Runtime gives each CPU driver beside a GPU or another CPU driver a set of its own
// (runtime.h, provide), so that their teams do not wait on each other's threads, nor on the
// core an accelerator's host thread spins on.
#pragma once

#include <string>
#include <vector>

namespace hn::detail {

// The cores the calling thread may run on, ascending: the process's own set unless the
// thread was bound (sched_getaffinity; where that fails, every core of
// std::thread::hardware_concurrency). Never empty.
std::vector<int> allowed_cores();

// "0-3,6" for {0, 1, 2, 3, 6} (ascending, no repeats); "" for none.
std::string format_cores(const std::vector<int>& cores);

// The cores of a list as format_cores writes it (single cores and ranges "a-b", comma
// separated, in any order), ascending without repeats. Anything else, an empty list, or a
// core beyond the machine's is an hn::Error naming `what` and the text.
std::vector<int> parse_cores(const std::string& text, const std::string& what);

// The cores of `teams` teams side by side from `allowed` (ascending), the last `reserved`
// left out (an accelerator's driver thread each) while a core remains for the teams: equal
// runs in order, the cores that do not divide evenly unused; where there are more teams than
// cores, the last ones share the last core.
std::vector<std::vector<int>> share_cores(const std::vector<int>& allowed, int teams, int reserved);

// Binds the calling thread to `cores` (non-empty). False when the system refuses (none of
// them available to the process); the thread's set is then unchanged.
bool bind_this_thread(const std::vector<int>& cores);

// True on the Runtime's own device threads (worker.h), which the library may bind; false
// on the program's threads, whose affinity the library leaves as it is.
bool on_library_thread();
void mark_library_thread();

}  // namespace hn::detail
