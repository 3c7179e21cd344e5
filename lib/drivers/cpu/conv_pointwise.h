// The CPU driver's own 1x1 convolutions on blocked operands (nChw8c, nChw16c): forward, data
// gradient and weight gradient as GEMMs read in place, on a register-blocked kernel
// (conv_pointwise.cpp). Asked for through LoweringShape::pointwise (Lowering::pointwise).
#pragma once

#include <vector>

#include "lib/core/shapes.h"
#include "lib/drivers/cpu/weights_cache.h"

namespace hn::detail::cpu {

class Parallel;

// Whether `shape` with `out_channels` outputs can run here: one group, a 1x1 kernel, no
// padding or dilation, and x and y in the same blocked layout with both channel counts
// multiples of its block (any stride), or x and y NCHW with stride 1 (conv_pointwise_plain.h).
bool pointwise_supported(const LoweringShape& shape, index_t out_channels);

// Results are the same whatever the thread count: every sum has a fixed order.
class PointwiseConvolution {
 public:
  // y = conv(x, weights) + bias [+ residual, laid out as y, when not null], then
  // `activation`: all in the kernel's last step, while each block of y is in registers.
  void forward(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* x,
               const float* weights, const float* bias, float* y, const Activation& activation,
               const float* residual = nullptr);
  // dx = the data gradient (overwritten).
  void backward_data(Parallel& par, const LoweringShape& shape, index_t out_channels,
                     const float* weights, const float* dy, float* dx);
  // Adds to dweights and, when not null, to dbias.
  void backward_weights(Parallel& par, const LoweringShape& shape, index_t out_channels,
                        const float* x, const float* dy, float* dweights, float* dbias);
  // Both: dx (when not null) overwritten, dweights (when not null) and dbias added to. On NCHW
  // operands the two in one pass over dy (conv_pointwise_plain.h).
  void backward(Parallel& par, const LoweringShape& shape, index_t out_channels, const float* x,
                const float* weights, const float* dy, float* dx, float* dweights, float* dbias);
  // Whether backward (and backward_relu) compute these gradients in one pass over dy (NCHW
  // operands, dx and dweights both).
  static bool one_pass(const LoweringShape& shape, const float* dx, const float* dweights);
  // The rectifier's gradient on dy in place (dy * (y > 0 ? 1 : slope)), then backward, image
  // by image, where one_pass.
  void backward_relu(Parallel& par, const LoweringShape& shape, index_t out_channels,
                     const float* x, const float* weights, const float* y, float slope, float* dy,
                     float* dx, float* dweights, float* dbias);

 private:
  // The weights packed by panels of outputs (forward) or of inputs (data gradient).
  const float* packed(Parallel& par, const LoweringShape& shape, index_t out_channels,
                      const float* weights, bool data_gradient);
  WeightsCache weights_{std::size_t{256} << 20};
  std::vector<float> partials_;  // the weight gradient's partial sums, reused between calls
};

}  // namespace hn::detail::cpu
