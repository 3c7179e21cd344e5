// The CPU driver's own 1x1 convolutions on NCHW operands (conv_pointwise_plain.cpp), the
// NCHW side of Lowering::pointwise (conv_pointwise.h): ShuffleNet v2's 58 to 232 channels and
// every other layer whose channel counts are no multiple of a block, whose blobs stay NCHW.
#pragma once

#include <vector>

#include "lib/core/shapes.h"

namespace hn::detail::cpu {

class Parallel;

// Whether `shape` runs here: one group, a 1x1 kernel, stride 1, no padding or dilation, x and
// y NCHW.
bool pointwise_plain_supported(const LoweringShape& shape);

// The weights as the forward (`data_gradient` false) or the data gradient reads them: panels
// of pointwise_plain_rows() rows (outputs, or inputs), each row's reduction in order.
std::size_t pointwise_plain_packed_count(const LoweringShape& shape, index_t out_channels,
                                         bool data_gradient);
void pointwise_plain_pack(Parallel& par, const LoweringShape& shape, index_t out_channels,
                          const float* weights, bool data_gradient, float* packed);

// y = conv(x) + bias [+ residual, laid out as y, when not null], then `activation`; `packed`
// from pointwise_plain_pack(..., false).
void pointwise_plain_forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                             const float* x, const float* packed, const float* bias,
                             const float* residual, const Activation& activation, float* y);
// dx = the data gradient (overwritten); `packed` from pointwise_plain_pack(..., true).
void pointwise_plain_backward_data(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                   const float* packed, const float* dy, float* dx);
// Adds to dweights and, when not null, to dbias. The sums have a fixed order whatever the
// thread count (per group of images, added in order); `partials` is scratch kept between calls.
void pointwise_plain_backward_weights(Parallel& par, const LoweringShape& shape,
                                      index_t out_channels, const float* x, const float* dy,
                                      float* dweights, float* dbias, std::vector<float>& partials);

// The rectifier's gradient applied to dy image by image before pointwise_plain_backward reads
// it: dy = dy * (y > 0 ? 1 : slope), written back in place (`dy` is the memory of the call's
// dy, which it then reads).
struct ReluMask {
  const float* y = nullptr;
  float slope = 0.0f;
  float* dy = nullptr;
};

// Both at once: dx = the data gradient (overwritten), and adds the weight gradient to
// dweights and, when not null, the bias gradient to dbias, image after image, so that each
// image's dy is read from memory once for all three (the separate calls read all of dy
// three times: layers of few channels wait on memory, not on arithmetic). The same sums as
// the separate calls.
// With `mask`, each image's dy is first masked (ReluMask).
void pointwise_plain_backward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                              const float* x, const float* packed, const float* dy, float* dx,
                              float* dweights, float* dbias, std::vector<float>& partials,
                              const ReluMask* mask = nullptr);

}  // namespace hn::detail::cpu
