// Caffe's fillers (constant, uniform, gaussian with optional sparsity, xavier, msra,
// bilinear, positive_unitball) on host memory. Random draws come from Philox keyed by a seed
// and the element's index, so a filled tensor depends on the seed only, not on the order in
// which tensors are filled.
#pragma once

#include <cstdint>

#include "hybridnn.pb.h"
#include "lib/core/tensor.h"

namespace hn::detail {

// Fills `count` = shape.count() floats at `data` per `filler`. Throws hn::Error for an
// unknown filler type or a shape the filler cannot take (bilinear needs 4 axes, square
// kernels); `who` prefixes the message ("layer 'conv1' (Convolution) weights").
void fill(const hybridnn::proto::FillerParameter& filler, const Shape& shape, float* data,
          std::uint64_t seed, const std::string& who);

}  // namespace hn::detail
