// Bodies of the CUDA loss kernels: softmax log-loss against integer labels (Caffe's
// ignore_label) and element-wise sigmoid cross-entropy. Plain C++ with HN_HOST_DEVICE,
// tested on the host.
//
// A label outside [0, channels) cannot throw on the GPU. The kernels mark it instead: each
// launch has a LabelError record in device memory; an invalid position lowers
// `current` (atomicMin), and a one-thread settle kernel that follows on the stream copies
// the first invalid position of the first failing launch, its label value and the call's
// shape into the record's report fields, while the label memory is certainly still alive.
// The driver reads the record at its next synchronising call and throws hn::Error there.
#pragma once

#include <math.h>

#include <cfloat>
#include <cstdint>

#include "lib/core/philox.h"
#include "lib/core/shapes.h"

namespace hn::detail::cuda {

constexpr unsigned long long kNoLabelError = ~0ull;

enum class LossCall : std::int32_t { softmax_loss_forward = 0, softmax_loss_backward = 1 };

// Device-resident; all fields start at kNoLabelError / zero (see reset_label_error).
struct LabelError {
  unsigned long long current;      // smallest invalid position of the launch under way
  unsigned long long position;     // the first reported error: its position,
  float label;                     // its label value,
  std::int32_t call;               // its LossCall,
  index_t outer, channels, inner;  // and the shape of that call
};

HN_HOST_DEVICE inline void reset_label_error(LabelError* e) {
  e->current = kNoLabelError;
  e->position = kNoLabelError;
  e->label = 0.0f;
  e->call = 0;
  e->outer = e->channels = e->inner = 0;
}

// What a float label means: a class index, ignored, or neither.
constexpr index_t kIgnoredLabel = -1;
constexpr index_t kInvalidLabel = -2;

// Caffe's static_cast<int>(label), defined for every float: a value that does not truncate
// to an int (NaN, out of range) matches no class and no ignore_label.
HN_HOST_DEVICE inline bool label_as_int(float value, int* out) {
  if (!(value > -2147483648.0f && value < 2147483648.0f)) return false;
  *out = static_cast<int>(value);
  return true;
}

HN_HOST_DEVICE inline index_t label_class(float label, index_t channels, bool has_ignore_label,
                                          int ignore_label) {
  int l = 0;
  if (!label_as_int(label, &l)) return kInvalidLabel;
  if (has_ignore_label && l == ignore_label) return kIgnoredLabel;
  return l >= 0 && l < channels ? l : kInvalidLabel;
}

// Position p in [0, outer * inner). Returns false (and writes loss = valid = 0) when the
// label is invalid, for the kernel to report.
HN_HOST_DEVICE inline bool softmax_loss_forward_position(index_t p, const AxisShape& s,
                                                         const float* prob, const float* label,
                                                         bool has_ignore_label, int ignore_label,
                                                         float* loss, float* valid) {
  const index_t l = label_class(label[p], s.channels, has_ignore_label, ignore_label);
  if (l < 0) {
    loss[p] = valid[p] = 0.0f;
    return l == kIgnoredLabel;
  }
  const index_t o = p / s.inner, i = p % s.inner;
  loss[p] = -logf(fmaxf(prob[(o * s.channels + l) * s.inner + i], FLT_MIN));
  valid[p] = 1.0f;
  return true;
}

// Element j in [0, outer * channels * inner): dx = scale * (prob - onehot(label)), 0 where
// ignored; in place (dx == prob) is safe. Returns false when the label of j's position is
// invalid; *position receives that position.
HN_HOST_DEVICE inline bool softmax_loss_backward_element(index_t j, const AxisShape& s,
                                                         const float* prob, const float* label,
                                                         bool has_ignore_label, int ignore_label,
                                                         float scale, float* dx,
                                                         index_t* position) {
  const index_t i = j % s.inner, c = (j / s.inner) % s.channels, o = j / (s.inner * s.channels);
  *position = o * s.inner + i;
  const index_t l = label_class(label[*position], s.channels, has_ignore_label, ignore_label);
  dx[j] = l < 0 ? 0.0f : scale * (prob[j] - (c == l ? 1.0f : 0.0f));
  return l != kInvalidLabel;
}

// Run by one thread after a loss launch: keeps the first failing launch's first position.
HN_HOST_DEVICE inline void settle_label_error(LabelError* e, const float* label, LossCall call,
                                              const AxisShape& s) {
  if (e->current != kNoLabelError && e->position == kNoLabelError) {
    e->position = e->current;
    e->label = label[e->current];
    e->call = static_cast<std::int32_t>(call);
    e->outer = s.outer;
    e->channels = s.channels;
    e->inner = s.inner;
  }
  e->current = kNoLabelError;
}

HN_HOST_DEVICE inline bool ignored_target(float target, bool has_ignore_label, int ignore_label) {
  int t = 0;
  return has_ignore_label && label_as_int(target, &t) && t == ignore_label;
}

// Caffe's stable form: max(x, 0) - x t + log(1 + exp(-|x|)).
HN_HOST_DEVICE inline void sigmoid_cross_entropy_forward_element(index_t i, const float* x,
                                                                 const float* target,
                                                                 bool has_ignore_label,
                                                                 int ignore_label, float* loss,
                                                                 float* valid) {
  if (ignored_target(target[i], has_ignore_label, ignore_label)) {
    loss[i] = valid[i] = 0.0f;
    return;
  }
  loss[i] = fmaxf(x[i], 0.0f) - x[i] * target[i] + log1pf(expf(-fabsf(x[i])));
  valid[i] = 1.0f;
}

HN_HOST_DEVICE inline void sigmoid_cross_entropy_backward_element(index_t i, const float* x,
                                                                  const float* target,
                                                                  bool has_ignore_label,
                                                                  int ignore_label, float scale,
                                                                  float* dx) {
  dx[i] = ignored_target(target[i], has_ignore_label, ignore_label)
              ? 0.0f
              : scale * (1.0f / (1.0f + expf(-x[i])) - target[i]);
}

}  // namespace hn::detail::cuda
