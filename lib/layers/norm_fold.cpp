// A BatchNorm and a Scale folded into the convolution before them: the derived weights
// and the chain rule back (lib/layers/norm_fold.h).
#include "lib/layers/norm_fold.h"

namespace hn {

namespace {

// The channel vectors: -mean, 1 / std, g = gamma / std, and t = b - mean.
struct Channels {
  const float *neg_mean, *inv_std, *g, *t;
};

Channels channels_of(const float* channels, index_t outputs) {
  return Channels{channels, channels + outputs, channels + 2 * outputs, channels + 3 * outputs};
}

}  // namespace

void norm_fold_forward(Driver& driver, const NormFoldSources& s, StoredFactor& factor,
                       float* channels, float* folded_weights, float* folded_bias) {
  const index_t c = s.outputs;
  float* neg_mean = channels;
  float* inv_std = channels + c;
  float* g = channels + 2 * c;
  float* t = channels + 3 * c;
  batch_norm_stored_statistics(driver, c, s.eps, s.mean_sum, s.variance_sum, s.factor, factor,
                               neg_mean, inv_std);
  driver.mul(c, s.gamma, inv_std, g);
  driver.scale_channels(AxisShape{1, c, s.per_output}, g, s.weights, folded_weights);
  if (s.bias != nullptr) {
    driver.lincomb(c, 1.0f, s.bias, 1.0f, neg_mean, t);
  } else {
    driver.copy(t, neg_mean, static_cast<std::size_t>(c) * sizeof(float));
  }
  driver.mul(c, t, g, folded_bias);
  if (s.beta != nullptr) driver.axpy(c, 1.0f, s.beta, folded_bias);
}

void norm_fold_backward(Driver& driver, const NormFoldSources& s, const float* channels,
                        float* dfolded_weights, const float* dfolded_bias, float* scratch,
                        float* dweights, float* dbias, float* dgamma, float* dbeta) {
  const index_t c = s.outputs;
  const index_t count = c * s.per_output;
  const Channels k = channels_of(channels, c);
  float* dots = scratch;
  float* tmp = scratch + c;
  // One pass over the weights: the rows' sums of W dW' (as a Scale's sums of dy times the
  // normalised values) and dW' scaled by g in place.
  if (dgamma != nullptr) driver.fill(c, 0.0f, dots);
  if (dgamma != nullptr || dweights != nullptr) {
    driver.norm_affine_backward(AxisShape{1, c, s.per_output}, dfolded_weights, nullptr, s.weights,
                                k.g, false, 0.0f, dgamma != nullptr ? dots : nullptr, nullptr,
                                dweights != nullptr ? dfolded_weights : nullptr);
  }
  if (dgamma != nullptr) {
    // (sum_k W dW' + t db') / std
    driver.mul(c, k.t, dfolded_bias, tmp);
    driver.lincomb(c, 1.0f, dots, 1.0f, tmp, dots);
    driver.mul(c, k.inv_std, dots, dots);
    driver.axpy(c, 1.0f, dots, dgamma);
  }
  if (dbeta != nullptr) driver.axpy(c, 1.0f, dfolded_bias, dbeta);
  if (dbias != nullptr) {
    driver.mul(c, k.g, dfolded_bias, tmp);
    driver.axpy(c, 1.0f, tmp, dbias);
  }
  if (dweights != nullptr) driver.axpy(count, 1.0f, dfolded_weights, dweights);
}

}  // namespace hn
