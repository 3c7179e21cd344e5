// Vectors of B floats for the CPU driver's own kernels (conv_winograd.cpp, conv_pointwise.cpp):
// GCC's vector types, compiled to the build's instruction set (-march=native): 8 lanes are
// one AVX2 register, 16 one AVX-512 register (two AVX2 ones without AVX-512).
#pragma once

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

template <int B>
struct Lanes;
template <>
struct Lanes<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Lanes<16> {
  typedef float type __attribute__((vector_size(64)));
};

// `activation` applied to each lane of v, in place (Activation's rules: a NaN stays NaN). By
// reference: a 16-lane vector passed by value would change the ABI without AVX-512.
template <class V>
inline void activate(V& v, const Activation& activation) {
  if (activation.kind == Activation::Kind::relu) {
    const V scaled = v * activation.slope;
    v = v > 0.0f ? v : scaled;
  } else if (activation.kind == Activation::Kind::clip) {
    // NaN stays NaN: both comparisons are false for it.
    v = v < activation.lo ? V{} + activation.lo : v;
    v = v > activation.hi ? V{} + activation.hi : v;
  }
}

}  // namespace hn::detail::cpu
