// Eigen for the CPU kernels. GCC 12.2's AVX-512 intrinsic headers trip -Wuninitialized
// inside their own _mm512_undefined_* helpers once Eigen's packet code inlines them (GCC
// bug 105593, fixed in 12.3); the warning is silenced for those headers only, so this must
// be the first inclusion of <immintrin.h> in a translation unit.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <Eigen/Core>

namespace hn::detail::cpu {

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace hn::detail::cpu
