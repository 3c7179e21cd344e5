// The CPU driver's own direct convolution for layers with very few input channels (LeNet's
// conv1, ShuffleNet v2's), forward, data gradient and weight gradient on NCHW
// (conv_small.cpp).
#pragma once

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

class Parallel;

// Whether `shape` is computed here instead of by oneDNN: one group, a column stride of at
// most 4 (any row stride), no dilation, at most 4 input channels, kernel at most 11x5, rows
// of at least 8 outputs, a build with AVX-512, and no plain_kernel asked for (that is
// oneDNN's NCHW kernel).
bool small_conv_supported(const LoweringShape& shape);
// y = activation(x (*) weights + bias), overwriting y.
void small_conv_forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                        const float* x, const float* weights, const float* bias,
                        const Activation& activation, float* y);
// dx = the data gradient of dy, overwriting dx.
void small_conv_backward_data(Parallel& par, const LoweringShape& shape, index_t out_channels,
                              const float* weights, const float* dy, float* dx);
// Adds to dweights and, when not null, to dbias; the same sums whatever the thread count.
void small_conv_backward_weights(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                 const float* x, const float* dy, float* dweights, float* dbias);

}  // namespace hn::detail::cpu
