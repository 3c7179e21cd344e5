// Softmax over the channel axis on the CPU. With inner == 1 (a classifier's output) each
// row is one contiguous vector; otherwise the channel loop runs over vectors of pixels.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>

namespace hn::detail::cpu {

namespace {

constexpr index_t kTile = 512;  // pixels per task when inner > 1
constexpr index_t kCostExp = 16;

// body(base, len): a run of `len` pixels of one outer index, starting at offset `base` of
// channel 0; channel c of the run is at base + c * inner.
template <class Body>
void for_runs(Parallel& par, const AxisShape& s, const Body& body) {
  const index_t tiles = (s.inner + kTile - 1) / kTile;
  const index_t len = std::min(s.inner, kTile);
  par.for_range(s.outer * tiles, s.channels * len * kCostExp, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t o = item / tiles, i0 = (item % tiles) * kTile;
      body(o * s.channels * s.inner + i0, std::min(kTile, s.inner - i0));
    }
  });
}

}  // namespace

void softmax_forward(Parallel& par, const AxisShape& s, const float* x, float* y) {
  const index_t stride = s.inner;
  for_runs(par, s, [&](index_t base, index_t len) {
    if (len == 1 && stride == 1) {
      const ConstArray in(x + base, s.channels);
      Array out(y + base, s.channels);
      out = (in - in.maxCoeff()).exp();
      out /= out.sum();
      return;
    }
    Eigen::ArrayXf top = ConstArray(x + base, len), total(len);
    for (index_t c = 1; c < s.channels; ++c)
      top = top.max(ConstArray(x + base + c * stride, len));
    total.setZero();
    for (index_t c = 0; c < s.channels; ++c) {
      Array out(y + base + c * stride, len);
      out = (ConstArray(x + base + c * stride, len) - top).exp();
      total += out;
    }
    for (index_t c = 0; c < s.channels; ++c)
      Array(y + base + c * stride, len) /= total;
  });
}

void softmax_backward(Parallel& par, const AxisShape& s, const float* y, const float* dy,
                      float* dx) {
  const index_t stride = s.inner;
  for_runs(par, s, [&](index_t base, index_t len) {
    if (len == 1 && stride == 1) {
      const ConstArray out(y + base, s.channels), grad(dy + base, s.channels);
      const float dot = (grad * out).sum();
      Array(dx + base, s.channels) = out * (grad - dot);
      return;
    }
    Eigen::ArrayXf dot = Eigen::ArrayXf::Zero(len);
    for (index_t c = 0; c < s.channels; ++c) {
      dot += ConstArray(dy + base + c * stride, len) * ConstArray(y + base + c * stride, len);
    }
    for (index_t c = 0; c < s.channels; ++c) {
      const index_t at = base + c * stride;
      Array(dx + at, len) = ConstArray(y + at, len) * (ConstArray(dy + at, len) - dot);
    }
  });
}

}  // namespace hn::detail::cpu
