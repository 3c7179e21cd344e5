// `hybridnn`: the command-line tool, as Caffe's `caffe` (train, test, time, device_query)
// plus convert. The commands are the library's (lib/tool/, hn_tool_main in the C ABI, which
// `python3 -m hybridnn` calls too); the executable adds what only a program of its own may
// do: line-buffered stdout, the OpenMP spin bound below, and ending every rank under mpirun
// when one fails.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "lib/tool/tool_main.h"

namespace {
// OpenMP's idle threads (libgomp, under oneDNN and the CPU driver's loops) spin about
// 300,000 times before they sleep. On an idle machine that saves a wake-up between the
// small parallel regions of a training step; on a shared one the spinning takes the time a
// competing process, or this process's own other thread, needs: LeNet training beside a
// process that keeps one of 2 cores busy ran at 1,600-2,500 images/s against 3,300-3,400
// with 1,000 spins (7,200 idle either way; docs/benchmarks.md, "Under load"). libgomp
// reads GOMP_SPINCOUNT once, when it is loaded, before main (and an environment set from
// .preinit_array is replaced by libc's own right after): so the tool runs itself again with
// it set. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
void bound_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 0) != 0) return;
  execv("/proc/self/exe", argv);
  // Not reached unless exec failed: run on with OpenMP's default.
}

}  // namespace

int main(int argc, char** argv) {
  bound_openmp_spinning(argv);
  // Progress lines reach a pipe (a test, `tee`) as they are printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A rank that fails ends every rank at once (hn_tool_main, for other programs, leaves
  // them to their collectives' deadlines).
  return hn::tool::main(argc, argv, hn::tool::OnRankError::end_every_rank);
}
