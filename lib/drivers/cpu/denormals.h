// Denormal floats flushed to zero during the CPU driver's calls (its option denormals=flush,
// the default): results too small for a normal float come out as zero (FTZ) and inputs of
// that size are read as zero (DAZ), as TensorFlow's CPU kernels run. On Intel cores an
// operation on a denormal takes a microcode assist of about a hundred cycles: oneDNN 2.6's
// AVX-512 depthwise kernel on a 56x56, 144-channel layer at batch 32 took 41 ms against 8
// with the flags set, on ordinary data (denormals.cpp says what was measured); AMD's EPYCs
// showed no difference. What the flags change is below 1.2e-38 in magnitude.
#pragma once

namespace hn::detail::cpu {

// From begin_flushing_denormals to the matching end_flushing_denormals, the calling thread
// flushes denormals; the end restores the caller's own setting. Nested pairs on one thread
// are counted: the outermost sets and restores. The OpenMP threads that compute for this
// thread (the driver's `threads`, the team oneDNN and the driver's loops use) are set to
// flush the first time a team of that size is asked for, and keep flushing afterwards: the
// caller's own thread is the one whose state a program sees come back. Nothing is set where
// the CPU has no MXCSR (non-x86 builds) or the build has no OpenMP (its TBB threads keep
// IEEE denormals).
void begin_flushing_denormals(int threads);
void end_flushing_denormals() noexcept;
// For a call of a driver that keeps denormals (denormals=keep): where an earlier flushing
// call of this thread set its OpenMP threads to flush, they are set back to IEEE (the
// calling thread's own setting is the caller's, untouched).
void keep_denormals_on_team();

// Whether the calling thread flushes denormals now (tests).
bool flushing_denormals();

}  // namespace hn::detail::cpu
