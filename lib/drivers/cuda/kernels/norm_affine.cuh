// Bodies of the CUDA driver's fused per-channel normalisation (norm_affine_forward and
// norm_affine_backward: BatchNorm with stored statistics, Scale and ReLU in one pass each
// way). Plain C++ with HN_HOST_DEVICE, tested on the host.
//
// Each element rounds as the unfused sequence of calls did (Driver::do_norm_affine_*: add,
// multiply, multiply, add, ReLU), one operation at a time: nvcc would otherwise contract a
// product and a sum into one FMA. The backward's sums are deterministic as bias_backward's
// are: each channel's terms are cut into a number of blocks that depends on the shape alone,
// every thread of a block sums a fixed strided set of its block's terms in double, the block
// combines them in a fixed tree (tree_step), and the blocks' partials are added in order.
#pragma once

#include "lib/core/philox.h"
#include "lib/core/shapes.h"
#include "lib/drivers/cuda/kernels/reductions.cuh"

namespace hn::detail::cuda {

HN_HOST_DEVICE inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

HN_HOST_DEVICE inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// The per-channel vectors of norm_affine_forward (beta may be null) and its ReLU.
struct NormAffineForward {
  const float* shift = nullptr;
  const float* inv_std = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  bool relu = false;
  float slope = 0.0f;
};

// One value x of channel c: its normalised value (into *normalised) and y.
HN_HOST_DEVICE inline float norm_affine_value(const NormAffineForward& p, index_t c, float x,
                                              float* normalised) {
  const float n = mul_rn(add_rn(x, p.shift[c]), p.inv_std[c]);
  *normalised = n;
  float v = mul_rn(n, p.gamma[c]);
  if (p.beta != nullptr) v = add_rn(v, p.beta[c]);
  if (p.relu && !(v > 0.0f)) v = mul_rn(p.slope, v);
  return v;
}

// Element i of an NCHW (outer, channels, inner) tensor; normalised may be null.
HN_HOST_DEVICE inline void norm_affine_forward_element(index_t i, const AxisShape& s,
                                                       const NormAffineForward& p, const float* x,
                                                       float* normalised, float* y) {
  float n = 0.0f;
  const float v = norm_affine_value(p, (i / s.inner) % s.channels, x[i], &n);
  if (normalised != nullptr) normalised[i] = n;
  y[i] = v;
}

// norm_affine_backward's operands. normalised is null unless dgamma is wanted, y unless
// relu; dx may be null (then dx_scale is not read) and may be dy.
struct NormAffineBackward {
  const float* dy = nullptr;
  const float* y = nullptr;
  const float* normalised = nullptr;
  const float* dx_scale = nullptr;
  bool relu = false;
  float slope = 0.0f;
  float* dx = nullptr;
};

// A thread's sums of dz and of dz * normalised.
struct NormSums {
  double dz = 0.0;
  double dz_normalised = 0.0;
};

// Terms (outer * inner of a channel) per block of the backward's first pass, and at most this
// many blocks per channel: ResNet-50's 32x64x112x112 gets 49 blocks per channel, not one.
constexpr index_t kNormTermsPerBlock = 8192;
constexpr index_t kNormMaxBlocksPerChannel = 128;

HN_HOST_DEVICE inline index_t norm_blocks_per_channel(const AxisShape& s) {
  const index_t blocks = (s.outer * s.inner + kNormTermsPerBlock - 1) / kNormTermsPerBlock;
  return blocks < 1 ? 1 : (blocks > kNormMaxBlocksPerChannel ? kNormMaxBlocksPerChannel : blocks);
}

// Block b's terms [*first, *last) of a channel's outer * inner (term j is (j / inner, j % inner)).
HN_HOST_DEVICE inline void norm_block_terms(const AxisShape& s, index_t b, index_t* first,
                                            index_t* last) {
  const index_t terms = s.outer * s.inner;
  const index_t blocks = norm_blocks_per_channel(s);
  const index_t chunk = (terms + blocks - 1) / blocks;
  *first = b * chunk < terms ? b * chunk : terms;
  *last = *first + chunk < terms ? *first + chunk : terms;
}

// Thread `thread` of block b of channel c: writes dx of its terms (first + thread, then every
// kReduceThreads-th) and returns their sums, in that order. Each element is read before dx is
// written, so dx may be dy.
HN_HOST_DEVICE inline NormSums norm_affine_backward_partial(const AxisShape& s,
                                                            const NormAffineBackward& p, index_t c,
                                                            index_t b, int thread) {
  NormSums sums;
  index_t first = 0, last = 0;
  norm_block_terms(s, b, &first, &last);
  index_t j = first + thread;
  if (j >= last) return sums;
  const index_t inner = s.inner, plane = s.channels * s.inner;
  const index_t step_o = kReduceThreads / inner, step_r = kReduceThreads % inner;
  index_t o = j / inner, r = j % inner;
  const float scale = p.dx != nullptr ? p.dx_scale[c] : 0.0f;
  for (; j < last; j += kReduceThreads) {
    const index_t i = o * plane + c * inner + r;
    float dz = p.dy[i];
    if (p.relu && !(p.y[i] > 0.0f)) dz = mul_rn(dz, p.slope);
    sums.dz += static_cast<double>(dz);
    if (p.normalised != nullptr) {
      sums.dz_normalised += static_cast<double>(mul_rn(dz, p.normalised[i]));
    }
    if (p.dx != nullptr) p.dx[i] = mul_rn(dz, scale);
    o += step_o;
    r += step_r;
    if (r >= inner) {
      r -= inner;
      ++o;
    }
  }
  return sums;
}

// Second pass, channel c: adds its blocks' partials (pairs of dz and dz * normalised, block
// by block) in order to dbeta[c] and dgamma[c] (either may be null), as bias_backward with
// beta 1 does.
HN_HOST_DEVICE inline void norm_affine_backward_finish(index_t c, index_t blocks,
                                                       const double* partials, float* dgamma,
                                                       float* dbeta) {
  double dz = 0.0, dz_normalised = 0.0;
  for (index_t b = 0; b < blocks; ++b) {
    dz += partials[2 * (c * blocks + b)];
    dz_normalised += partials[2 * (c * blocks + b) + 1];
  }
  if (dbeta != nullptr) bias_backward_finish(c, dz, 1.0f, dbeta);
  if (dgamma != nullptr) bias_backward_finish(c, dz_normalised, 1.0f, dgamma);
}

}  // namespace hn::detail::cuda
