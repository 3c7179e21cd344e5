// Loss calls on the CPU: per-position softmax log-loss against integer labels (with
// Caffe's ignore_label) and element-wise sigmoid cross-entropy, over the driver's threads.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <atomic>
#include <cfloat>
#include <cmath>
#include <vector>

#include "lib/core/check.h"

namespace hn::detail::cpu {

namespace {

// Work units (see parallel.h), measured on 1 thread through the Driver API: a position of
// softmax_loss_forward ~8 ns (a strided gather and a log), an element of its backward
// ~1.2 ns, sigmoid cross-entropy ~2 ns forward and ~0.6 ns backward per element.
constexpr index_t kCostLossPosition = 96;
constexpr index_t kCostLossGradient = 14;
constexpr index_t kCostSigmoidLoss = 24;
constexpr index_t kCostSigmoidGradient = 8;

// What a float label means: a class index, ignored, or neither.
constexpr index_t kIgnored = -1;
constexpr index_t kInvalid = -2;

// Caffe's static_cast<int>(label), defined for every float: a value that does not
// truncate to an int (NaN, out of range) matches no class and no ignore_label.
bool label_as_int(float value, int& out) {
  if (!(value > -2147483648.0f && value < 2147483648.0f)) return false;
  out = static_cast<int>(value);
  return true;
}

index_t class_of(float label, index_t channels, bool has_ignore_label, int ignore_label) {
  int l = 0;
  if (!label_as_int(label, l)) return kInvalid;
  if (has_ignore_label && l == ignore_label) return kIgnored;
  return l >= 0 && l < channels ? l : kInvalid;
}

bool ignored_target(float target, bool has_ignore_label, int ignore_label) {
  int t = 0;
  return has_ignore_label && label_as_int(target, t) && t == ignore_label;
}

// The first invalid label position seen by any task: tasks may finish in any order, so
// the error names the smallest position, as a serial loop would.
class FirstInvalid {
 public:
  explicit FirstInvalid(index_t none) : none_(none), first_(none) {}
  void note(index_t position) {
    index_t seen = first_.load(std::memory_order_relaxed);
    while (position < seen && !first_.compare_exchange_weak(seen, position)) {
    }
  }
  void throw_if_any(const char* call, const AxisShape& s, const float* label) const {
    const index_t p = first_.load();
    if (p == none_) return;
    fail("{}: label {} at position (outer {}, inner {}) is outside [0, {}) ({})", call, label[p],
         p / s.inner, p % s.inner, s.channels, s.to_string());
  }

 private:
  index_t none_;
  std::atomic<index_t> first_;
};

}  // namespace

void softmax_loss_forward(Parallel& par, const AxisShape& s, const float* prob, const float* label,
                          bool has_ignore_label, int ignore_label, float* loss, float* valid) {
  const index_t positions = s.outer * s.inner;
  FirstInvalid invalid(positions);
  par.for_range(positions, kCostLossPosition, [&](index_t first, index_t last) {
    for (index_t p = first; p < last; ++p) {
      const index_t l = class_of(label[p], s.channels, has_ignore_label, ignore_label);
      if (l < 0) {
        if (l == kInvalid) invalid.note(p);
        loss[p] = valid[p] = 0.0f;
        continue;
      }
      const index_t o = p / s.inner, i = p % s.inner;
      loss[p] = -std::log(std::max(prob[(o * s.channels + l) * s.inner + i], FLT_MIN));
      valid[p] = 1.0f;
    }
  });
  invalid.throw_if_any("softmax_loss_forward", s, label);
}

void softmax_loss_backward(Parallel& par, const AxisShape& s, const float* prob, const float* label,
                           bool has_ignore_label, int ignore_label, float scale, float* dx) {
  FirstInvalid invalid(s.outer * s.inner);
  // Task o owns row o: its labels decoded once, then the channels in memory order. Each
  // element reads prob before writing dx, so dx may alias prob.
  par.for_range(
      s.outer, s.channels * s.inner * kCostLossGradient, [&](index_t first, index_t last) {
        std::vector<index_t> classes(static_cast<std::size_t>(s.inner));
        for (index_t o = first; o < last; ++o) {
          for (index_t i = 0; i < s.inner; ++i) {
            classes[i] =
                class_of(label[o * s.inner + i], s.channels, has_ignore_label, ignore_label);
            if (classes[i] == kInvalid) invalid.note(o * s.inner + i);
          }
          for (index_t c = 0; c < s.channels; ++c) {
            const float* src = prob + (o * s.channels + c) * s.inner;
            float* dst = dx + (o * s.channels + c) * s.inner;
            for (index_t i = 0; i < s.inner; ++i) {
              const index_t l = classes[i];
              dst[i] = l < 0 ? 0.0f : scale * (src[i] - (c == l ? 1.0f : 0.0f));
            }
          }
        }
      });
  invalid.throw_if_any("softmax_loss_backward", s, label);
}

namespace {

// Zeroes the ignored elements of up to two outputs, after the vectorised arithmetic.
void zero_ignored(index_t n, const float* target, int ignore_label, float* a, float* b) {
  for (index_t i = 0; i < n; ++i) {
    if (ignored_target(target[i], true, ignore_label)) {
      a[i] = 0.0f;
      if (b != nullptr) b[i] = 0.0f;
    }
  }
}

}  // namespace

void sigmoid_cross_entropy_forward(Parallel& par, index_t n, const float* x, const float* target,
                                   bool has_ignore_label, int ignore_label, float* loss,
                                   float* valid) {
  par.for_range(n, kCostSigmoidLoss, [&](index_t i, index_t last) {
    const index_t len = last - i;
    const ConstArray logits(x + i, len), t(target + i, len);
    // Caffe's stable form: max(x, 0) - x t + log(1 + exp(-|x|)).
    Array(loss + i, len) = logits.max(0.0f) - logits * t + (-logits.abs()).exp().log1p();
    Array(valid + i, len).setOnes();
    if (has_ignore_label) zero_ignored(len, target + i, ignore_label, loss + i, valid + i);
  });
}

void sigmoid_cross_entropy_backward(Parallel& par, index_t n, const float* x, const float* target,
                                    bool has_ignore_label, int ignore_label, float scale,
                                    float* dx) {
  par.for_range(n, kCostSigmoidGradient, [&](index_t i, index_t last) {
    const index_t len = last - i;
    const ConstArray logits(x + i, len), t(target + i, len);
    Array(dx + i, len) = scale * (1.0f / (1.0f + (-logits).exp()) - t);
    if (has_ignore_label) zero_ignored(len, target + i, ignore_label, dx + i, nullptr);
  });
}

}  // namespace hn::detail::cpu
