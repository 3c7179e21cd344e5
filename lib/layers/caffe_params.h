// Reading Caffe's LayerParameter into the layers' parameter structs: the small rules every
// layer's converter shares (lib/layers/*.cpp, each type's entry in the layer registry).
#pragma once

#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/convolution.h"
#include "lib/layers/loss.h"

namespace hn::detail {

namespace pb = hybridnn::proto;

inline std::string who(const pb::LayerParameter& p) {
  return fmt::format("layer '{}' ({})", p.name(), p.type());
}

// uint32 fields that Caffe casts to int32 (concat_dim, slice_dim, top_k).
inline int to_int(const pb::LayerParameter& p, const char* field, std::uint32_t value) {
  HN_CHECK(value <= static_cast<std::uint32_t>(INT_MAX), "{}: {} {} does not fit an int32", who(p),
           field, value);
  return static_cast<int>(value);
}

template <class Repeated>
inline std::vector<index_t> to_indices(const Repeated& values) {
  return std::vector<index_t>(values.begin(), values.end());
}

// Caffe's ConvolutionParameter (Convolution's and Deconvolution's), with Caffe's presence
// rules for the _h/_w pairs (lib/layers/convolution.cpp).
ConvolutionParams convolution_params(const pb::LayerParameter& p);

// Outputs of a layer whose output count follows its tops; a LayerParameter without tops (built
// in code) gets the layer's own default.
inline int outputs_or(const pb::LayerParameter& p, int fallback) {
  return p.top_size() > 0 ? p.top_size() : fallback;
}

inline LossParams loss_params(const pb::LayerParameter& p) {
  const pb::LossParameter& l = p.loss_param();
  LossParams out;
  if (l.has_ignore_label()) out.ignore_label = l.ignore_label();
  if (l.has_normalize()) out.normalize = l.normalize();
  if (l.has_normalization()) {
    switch (l.normalization()) {
      case pb::LossParameter::FULL:
        out.normalization = LossNormalization::full;
        break;
      case pb::LossParameter::VALID:
        out.normalization = LossNormalization::valid;
        break;
      case pb::LossParameter::BATCH_SIZE:
        out.normalization = LossNormalization::batch_size;
        break;
      case pb::LossParameter::NONE:
        out.normalization = LossNormalization::none;
        break;
    }
  }
  return out;
}

// Scale's fillers run inside the layer, which knows constants only.
inline float constant_filler(const pb::LayerParameter& p, const char* field,
                             const pb::FillerParameter& filler) {
  HN_CHECK(filler.type() == "constant",
           "{}: {} type '{}' is not supported (Scale takes constant fillers only)", who(p), field,
           filler.type());
  return filler.value();
}

}  // namespace hn::detail
