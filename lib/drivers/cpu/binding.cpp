// bind_team (binding.h): once per thread, driver and team size, on Linux's thread affinity.
#include "lib/drivers/cpu/binding.h"

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
  if (cores.empty() || (bound.set == set && bound.team >= threads)) return;
  if (on_library_thread()) bind_this_thread(cores);
#ifdef _OPENMP
  // A team's threads stay in the calling thread's pool between parallel regions, as
  // denormals.cpp relies on too; those of a larger team later are the same ones and more.
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    if (omp_get_thread_num() != 0) bind_this_thread(cores);
  }
#endif
  bound = {set, threads};
}

}  // namespace hn::detail::cpu
