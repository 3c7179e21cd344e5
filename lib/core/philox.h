// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), the
// counter-based generator behind dropout masks. Element i of a draw uses counter
// (offset + i), so every driver, thread and batch slice computes the same number for the
// same element. Host and device code share this header.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HN_HOST_DEVICE __host__ __device__
#else
#define HN_HOST_DEVICE
#endif

namespace hn::detail {

HN_HOST_DEVICE inline std::uint32_t philox_mulhilo(std::uint32_t a, std::uint32_t b,
                                                   std::uint32_t* hi) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  *hi = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
}

// First 32-bit word of Philox4x32-10 for counter `counter` and key `seed`.
HN_HOST_DEVICE inline std::uint32_t philox_bits(std::uint64_t seed, std::uint64_t counter) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter);
  std::uint32_t c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed);
  std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    const std::uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0;
    const std::uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// Uniform float in [0, 1) with 24 random bits (exact in float on every device).
HN_HOST_DEVICE inline float philox_uniform(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<float>(philox_bits(seed, counter) >> 8) * (1.0f / 16777216.0f);
}

// A 64-bit seed derived from two (a run's seed and an iteration, a layer, a blob...): two
// Philox draws keyed by `a` at counter `b`, for every stream the library derives.
inline std::uint64_t mix_seeds(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t low = philox_bits(a, b);
  const std::uint64_t high = philox_bits(a ^ 0x9E3779B97F4A7C15ull, b);
  return (high << 32) | low;
}

}  // namespace hn::detail
