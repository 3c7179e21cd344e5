// Internal helpers shared by the loss, accuracy and batch-norm layers: single floats moved
// between the host and a driver (the loss value, the loss weight in the output's diff,
// BatchNorm's moving-average factor), and the label-gradient refusal.
#pragma once

#include <string>

#include "lib/core/check.h"
#include "lib/layers/layer.h"

namespace hn::detail {

inline float read_scalar(Driver& driver, const float* src) {
  float value = 0.0f;
  driver.copy_to_host(&value, src, sizeof(float));
  return value;
}

inline void write_scalar(Driver& driver, float value, float* dst) {
  driver.copy_from_host(dst, &value, sizeof(float));
}

// Caffe aborts when asked to back-propagate into labels; this throws instead.
inline void check_no_label_gradient(const std::string& who, const LayerSlice& slice) {
  HN_CHECK(slice.propagate_down.size() < 2 || !slice.propagate_down[1],
           "{}: cannot back-propagate to the label input (input 1)", who);
}

}  // namespace hn::detail
