// The CPU driver's own weight gradient for depthwise convolutions on NCHW and blocked
// operands (conv_depthwise.cpp).
#pragma once

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

class Parallel;

// Whether `shape` with `out_channels` is a depthwise convolution (one input and one output
// channel per group) with x and dy in NCHW, nChw8c or nChw16c (not both blocked unalike),
// which depthwise_backward_weights computes (plain_kernel or not: it reads every layout).
bool depthwise_own(const LoweringShape& shape, index_t out_channels);
// Adds to dweights ([channels][1][kernel_h][kernel_w]) and, when not null, to dbias; each
// channel's sums in one fixed order, whatever the thread count.
void depthwise_backward_weights(Parallel& par, const LoweringShape& shape, const float* x,
                                const float* dy, float* dweights, float* dbias);

}  // namespace hn::detail::cpu
