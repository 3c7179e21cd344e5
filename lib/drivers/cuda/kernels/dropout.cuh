// Per-element bodies of the CUDA dropout kernels. The mask comes from Philox on
// (seed, offset + i) and the scale is the float 1.0f / (1.0f - ratio), so the GPU's mask and
// output are bitwise equal to every other driver's.
#pragma once

#include <cstdint>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

HN_HOST_DEVICE inline float dropout_scale(float ratio) {
  return 1.0f / (1.0f - ratio);
}

HN_HOST_DEVICE inline void dropout_forward_element(index_t i, float ratio, float scale,
                                                   std::uint64_t seed, std::uint64_t offset,
                                                   const float* x, float* y, float* mask) {
  const bool keep = philox_uniform(seed, offset + static_cast<std::uint64_t>(i)) >= ratio;
  const float v = x[i];
  mask[i] = keep ? 1.0f : 0.0f;
  y[i] = keep ? v * scale : 0.0f;
}

HN_HOST_DEVICE inline void dropout_backward_element(index_t i, float scale, const float* mask,
                                                    const float* dy, float* dx) {
  dx[i] = mask[i] != 0.0f ? dy[i] * scale : 0.0f;
}

}  // namespace hn::detail::cuda
