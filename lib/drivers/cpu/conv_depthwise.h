// The CPU driver's own depthwise convolutions (conv_depthwise.cpp): the weight gradient on
// NCHW and blocked operands, and the forward and data gradient on NCHW ones.
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

// Whether the driver's NCHW kernels for `shape` (LoweringShape::plain_kernel, the tuner's
// direct_plain) are the ones below: a depthwise convolution whose x and y are both NCHW,
// which oneDNN 2.6 runs with its GEMM-based kernel there (its depthwise kernel takes blocked
// operands, reordered in and out at every call: ShuffleNet v2's 58 to 232 channels).
bool depthwise_plain(const LoweringShape& shape, index_t out_channels);
// y = x (*) weights (+ bias), overwriting y; x and y NCHW, weights [channels][1][kh][kw].
void depthwise_forward(Parallel& par, const LoweringShape& shape, const float* x,
                       const float* weights, const float* bias, float* y);
// dx = the data gradient of dy, overwriting dx (0 where no output reads x).
void depthwise_backward_data(Parallel& par, const LoweringShape& shape, const float* weights,
                             const float* dy, float* dx);

}  // namespace hn::detail::cpu
