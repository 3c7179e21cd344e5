// A BatchNorm on stored statistics and a per-channel Scale after a convolution, folded into
// the convolution's weights and bias (Layer::fold_norm; the Net derives them,
// net_fusion.cpp). With z = W x + b the convolution's output,
//   y = gamma * (z - mean) / std + beta = W' x + b',
//   W' = W * g (row o of W times g[o]),  b' = beta + (b - mean) * g,  g = gamma / std,
// so the convolution computes y at once, bias and rectifier in its call, with no pass over
// y. Backward, the convolution's gradients of W' and b' give the sources' by the chain rule:
//   dW = g * dW',  db = g * db',  dbeta = db',
//   dgamma = (sum over k of W[o][k] dW'[o][k] + (b - mean) * db') / std,
// the last the sum of dy * (z - mean) / std that the Scale computes, read from the weight
// gradient instead of a pass over z. Only the rounding differs from the layers apart.
#pragma once

#include "lib/layers/batch_norm_layer.h"
#include "lib/layers/layer.h"

namespace hn {

// The folded layers' values, on one driver. `weights` is [outputs][per_output].
struct NormFoldSources {
  index_t outputs = 0, per_output = 0;
  float eps = 0.0f;
  const float* weights = nullptr;
  const float* bias = nullptr;  // the convolution's own, or null
  const float* gamma = nullptr;
  const float* beta = nullptr;             // the Scale's bias, or null
  Operand mean_sum, variance_sum, factor;  // the BatchNorm's three blobs
};

// Floats of the channel vectors norm_fold_forward leaves for norm_fold_backward.
inline index_t norm_fold_channel_floats(index_t outputs) {
  return 4 * outputs;
}

// W' and b' into `folded_weights` and `folded_bias`; `channels` (norm_fold_channel_floats)
// keeps what backward needs.
void norm_fold_forward(Driver& driver, const NormFoldSources& sources, StoredFactor& factor,
                       float* channels, float* folded_weights, float* folded_bias);

// The sources' gradients, ADDED to the non-null ones of dweights, dbias, dgamma and dbeta
// (Caffe accumulates), from the convolution's gradients of W' and b'; `channels` as the
// forward left them, `scratch` 2 * outputs floats. dfolded_weights is left scaled by g.
void norm_fold_backward(Driver& driver, const NormFoldSources& sources, const float* channels,
                        float* dfolded_weights, const float* dfolded_bias, float* scratch,
                        float* dweights, float* dbias, float* dgamma, float* dbeta);

}  // namespace hn
