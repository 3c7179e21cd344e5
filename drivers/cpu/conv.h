// The CPU driver's direct convolution: oneDNN's convolution primitives on NCHW tensors and
// plain [out][in/groups][kh][kw] weights, with primitives cached per shape (creating one
// costs far more than running a small one).
#pragma once

#include <memory>

#include "hybridnn/shapes.h"

namespace hn::detail::cpu {

class DirectConvolution {
 public:
  // True when this build has oneDNN; without it every call below throws hn::Error.
  static bool available();

  DirectConvolution();
  ~DirectConvolution();
  DirectConvolution(const DirectConvolution&) = delete;
  DirectConvolution& operator=(const DirectConvolution&) = delete;

  void forward(int threads, const LoweringShape& shape, index_t out_channels, const float* x,
               const float* weights, const float* bias, float* y);
  void backward_data(int threads, const LoweringShape& shape, index_t out_channels,
                     const float* weights, const float* dy, float* dx);
  // Adds to dweights and, when not null, to dbias.
  void backward_weights(int threads, const LoweringShape& shape, index_t out_channels,
                        const float* x, const float* dy, float* dweights, float* dbias);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hn::detail::cpu
