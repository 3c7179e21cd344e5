// bind_team (binding.h): once per thread, driver and team size, on Linux's thread affinity.
#include "lib/drivers/cpu/binding.h"

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lib/core/affinity.h"

namespace hn::detail::cpu {
namespace {

struct Bound {
  std::uint64_t set = 0;  // the driver's set last bound from this thread (0: none)
  int team = 0;           // the team size bound with it
};
thread_local Bound bound;

}  // namespace

void bind_team(std::uint64_t set, const std::vector<int>& cores, int threads) {
  if (cores.empty() || (bound.set == set && bound.team >= threads)) {
    return;
  }
  // A team's threads stay in the calling thread's pool between parallel regions, as
  // denormals.cpp relies on too; those of a larger team later are the same ones and more.
  // The region comes before the calling thread is bound, even for a team of one: LLVM's
  // OpenMP runtime takes the mask of the thread it starts on for the whole process's and
  // sets every thread it meets first (the program's too) to that mask, so a bound thread
  // must not be the first it meets (a program's main thread came back from a driver call
  // bound to a driver's cores in the clang build).
#ifdef _OPENMP
#pragma omp parallel num_threads(std::max(1, threads))
  if (omp_get_thread_num() != 0) bind_this_thread(cores);
#endif
  if (on_library_thread()) bind_this_thread(cores);
  bound = {set, threads};
}

}  // namespace hn::detail::cpu
