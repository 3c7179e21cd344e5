// Local response normalisation with Caffe's LRNParameter: ACROSS_CHANNELS and
// WITHIN_CHANNEL (the formulas are in lib/core/shapes.h, LrnShape).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct LrnParams {
  index_t local_size = 5;  // odd
  float alpha = 1.0f;
  float beta = 0.75f;
  float k = 1.0f;  // ACROSS_CHANNELS only (WITHIN_CHANNEL uses 1, as Caffe does)
  LrnRegion norm_region = LrnRegion::across_channels;
};

// Input and output N x C x H x W. The per-element scale computed by forward is a state
// tensor shaped like the input, read again by backward.
std::unique_ptr<Layer> make_lrn_layer(std::string name, LrnParams params = {});

}  // namespace hn
