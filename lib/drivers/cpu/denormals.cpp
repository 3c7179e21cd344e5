// begin_flushing_denormals (denormals.h): MXCSR's flush-to-zero (bit 15) and denormals-are-zero
// (bit 6) on the calling thread for the length of a call, and once on the OpenMP team under it.
//
// Where the denormals came from in MobileNet v2: not from its activations (none of the blobs
// held one; scaling the input by 1e6 left the slowdown as it was) but from inside oneDNN
// 2.6's jit_dw:avx512_core forward kernel on random inputs of ordinary size: a lone depthwise
// 3x3 layer on bytes 0..255 ran 41 ms per call without the flags and 8 ms with them, on an
// Intel Xeon with AVX-512 (bench: `hybridnn time` on such a layer, LD_PRELOAD of a library
// setting the flags against none). The whole net forward at batch 32 from Python went from
// 375-510 ms to 160-220.
#include "lib/drivers/cpu/denormals.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HN_HAVE_MXCSR 1
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace hn::detail::cpu {

#ifdef HN_HAVE_MXCSR
namespace {

constexpr unsigned kFlushBits = 0x8040;  // FTZ | DAZ

struct ThreadState {
  int depth = 0;       // begin_flushing_denormals not yet ended on this thread
  unsigned saved = 0;  // the caller's MXCSR, restored by the outermost
  int team = 1;        // the largest OpenMP team of this thread's set to flush
};
thread_local ThreadState state;

}  // namespace

void begin_flushing_denormals(int threads) {
  if (state.depth++ > 0) return;
  state.saved = _mm_getcsr();
  _mm_setcsr(state.saved | kFlushBits);
#ifdef _OPENMP
  if (threads > state.team) {
    // A team's threads stay in the calling thread's pool between parallel regions; those of
    // a larger team later are the same ones and more.
#pragma omp parallel num_threads(threads)
    _mm_setcsr(_mm_getcsr() | kFlushBits);
    state.team = threads;
  }
#else
  (void)threads;
#endif
}

void end_flushing_denormals() noexcept {
  if (--state.depth == 0) _mm_setcsr(state.saved);
}

// The threads an earlier flushing call set: back to IEEE for a driver that keeps them.
void keep_denormals_on_team() {
#ifdef _OPENMP
  if (state.depth > 0 || state.team <= 1) return;
#pragma omp parallel num_threads(state.team)
  if (omp_get_thread_num() != 0) _mm_setcsr(_mm_getcsr() & ~kFlushBits);
  state.team = 1;
#endif
}

bool flushing_denormals() {
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
}

#else

void begin_flushing_denormals(int) {}
void end_flushing_denormals() noexcept {}
void keep_denormals_on_team() {}
bool flushing_denormals() {
  return false;
}

#endif

}  // namespace hn::detail::cpu
