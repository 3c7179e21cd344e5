// The CPU driver's Winograd convolution F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2016): 3x3 stride-1 layers as 36 GEMMs on transformed
// 6x6 input tiles, forward, data gradient and weight gradient, on NCHW or blocked operands
// (conv_winograd.cpp). Asked for through LoweringShape::winograd (Lowering::winograd).
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/shapes.h"
#include "lib/drivers/cpu/weights_cache.h"

namespace hn::detail::cpu {

class Parallel;

// Whether `shape` can run here: a 3x3 kernel, stride 1, no dilation, padding at most 2 each
// way (the data gradient pads dy by 2 - pad); with several groups, each group's channels
// whole blocks of a blocked layout (each group runs as a convolution of its own on views).
bool winograd_supported(const LoweringShape& shape, index_t out_channels);

// Results are the same whatever the thread count: every sum has a fixed order.
class WinogradConvolution {
 public:
  // y = conv(x, weights) + bias, then `activation`.
  void forward(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* x,
               const float* weights, const float* bias, float* y, const Activation& activation);
  // dx = the data gradient (overwritten).
  void backward_data(Parallel& par, const LoweringShape& shape, index_t out_channels,
                     const float* weights, const float* dy, float* dx);
  // Adds to dweights and, when not null, to dbias.
  void backward_weights(Parallel& par, const LoweringShape& shape, index_t out_channels,
                        const float* x, const float* dy, float* dweights, float* dbias);

 private:
  // One group's input and output channel counts.
  struct Group {
    index_t channels, outputs;
  };
  // A group's transformed weights (`weights` at the group's), kept between calls by their
  // address, direction and version (LoweringShape::weights_version; 0 = unknown, transformed
  // every call), for vectors of `b` lanes.
  const float* transformed(Parallel& par, index_t b, const Group& group, const float* weights,
                           std::uint64_t version, bool data_gradient);
  WeightsCache weights_{std::size_t{256} << 20};
  std::vector<float> v_, m_, s_;  // scratch, reused between calls
};

}  // namespace hn::detail::cpu
