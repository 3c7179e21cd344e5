// Local response normalisation on the CPU. Across channels: tasks own (image, run of
// pixels) tiles and hold the tile's squares for every channel, so each window sum reads
// cached data. Within a channel: Caffe's average pooling of x^2 (pooling.cpp), per plane.
#include "drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <vector>

namespace hn::detail::cpu {

namespace {

// Pixels per across-channel tile: channels * kTile floats of scratch stay in L1/L2.
constexpr index_t kTile = 256;
constexpr index_t kCostPow = 12;

// out = scale^-beta. Eigen's pow() is ~7 ns per element here; exp(-beta log) is ~1 ns and
// CaffeNet's beta = 0.75 is 1 / (sqrt(s) sqrt(sqrt(s))) at ~0.3 ns, each within a few ulp.
template <class Scale>
void pow_minus_beta(const Scale& scale, float beta, Array out) {
  if (beta == 0.75f) {
    out = scale.sqrt();
    out = 1.0f / (out * out.sqrt());
  } else {
    out = (-beta * scale.log()).exp();
  }
}

// Runs body(base, len, scratch) for every (image, pixel run) tile; base is the offset of
// the tile's first pixel in channel 0 of its image.
template <class Body>
void for_tiles(Parallel& par, const LrnShape& s, index_t cost_per_float, const Body& body) {
  const index_t plane = s.height * s.width, tiles = (plane + kTile - 1) / kTile;
  par.for_range(s.batch * tiles, s.channels * kTile * cost_per_float,
                [&](index_t first, index_t last) {
                  std::vector<float> scratch(static_cast<std::size_t>(s.channels * kTile));
                  for (index_t item = first; item < last; ++item) {
                    const index_t n = item / tiles, p0 = (item % tiles) * kTile;
                    body(n * s.channels * plane + p0, std::min(kTile, plane - p0), scratch.data());
                  }
                });
}

// out = sum of rows [c - pre, c + pre] (clipped) of a channels x len tile, in channel order.
void window_sum(const float* rows, index_t channels, index_t len, index_t c, index_t pre,
                Array out) {
  const index_t lo = std::max<index_t>(0, c - pre), hi = std::min(channels - 1, c + pre);
  out = ConstArray(rows + lo * len, len);
  for (index_t k = lo + 1; k <= hi; ++k)
    out += ConstArray(rows + k * len, len);
}

PoolShape within_channel_pool(const LrnShape& s) {
  PoolShape pool;
  pool.batch = 1;
  pool.channels = 1;
  pool.height = s.height;
  pool.width = s.width;
  pool.kernel_h = pool.kernel_w = s.size;
  pool.pad_h = pool.pad_w = (s.size - 1) / 2;
  return pool;
}

template <class Body>
void for_planes(Parallel& par, const LrnShape& s, index_t cost, const Body& body) {
  const index_t plane = s.height * s.width;
  par.for_range(s.batch * s.channels, cost, [&](index_t first, index_t last) {
    std::vector<float> scratch(static_cast<std::size_t>(3 * plane));
    for (index_t p = first; p < last; ++p)
      body(p * plane, scratch.data());
  });
}

}  // namespace

void lrn_forward(Parallel& par, const LrnShape& s, const float* x, float* y, float* scale) {
  const index_t plane = s.height * s.width;
  if (s.region == LrnRegion::across_channels) {
    const index_t pre = (s.size - 1) / 2;
    const float alpha_over_size = s.alpha / static_cast<float>(s.size);
    for_tiles(par, s, s.size + kCostPow, [&](index_t base, index_t len, float* squares) {
      for (index_t c = 0; c < s.channels; ++c) {
        Array(squares + c * len, len) = ConstArray(x + base + c * plane, len).square();
      }
      for (index_t c = 0; c < s.channels; ++c) {
        const index_t at = base + c * plane;
        Array sc(scale + at, len);
        window_sum(squares, s.channels, len, c, pre, sc);
        sc = s.k + alpha_over_size * sc;
        Array out(y + at, len);
        pow_minus_beta(sc, s.beta, out);
        out *= ConstArray(x + at, len);
      }
    });
    return;
  }
  const PoolShape pool = within_channel_pool(s);
  for_planes(par, s, plane * (s.size * s.size + kCostPow), [&](index_t at, float* scratch) {
    Array squares(scratch, plane);
    squares = ConstArray(x + at, plane).square();
    avg_pool_plane_forward(pool, scratch, scale + at);
    Array sc(scale + at, plane);
    sc = 1.0f + s.alpha * sc;
    Array out(y + at, plane);
    pow_minus_beta(sc, s.beta, out);
    out *= ConstArray(x + at, plane);
  });
}

void lrn_backward(Parallel& par, const LrnShape& s, const float* x, const float* y,
                  const float* scale, const float* dy, float* dx) {
  const index_t plane = s.height * s.width;
  if (s.region == LrnRegion::across_channels) {
    const index_t pre = (s.size - 1) / 2;
    const float coeff = 2.0f * s.alpha * s.beta / static_cast<float>(s.size);
    for_tiles(par, s, s.size + kCostPow, [&](index_t base, index_t len, float* ratios) {
      // All ratios first: dx may alias dy.
      for (index_t c = 0; c < s.channels; ++c) {
        const index_t at = base + c * plane;
        Array(ratios + c * len, len) =
            ConstArray(dy + at, len) * ConstArray(y + at, len) / ConstArray(scale + at, len);
      }
      Eigen::ArrayXf window(len), powered(len);
      for (index_t c = 0; c < s.channels; ++c) {
        const index_t at = base + c * plane;
        window_sum(ratios, s.channels, len, c, pre, Array(window.data(), len));
        pow_minus_beta(ConstArray(scale + at, len), s.beta, Array(powered.data(), len));
        Array(dx + at, len) =
            ConstArray(dy + at, len) * powered - coeff * ConstArray(x + at, len) * window;
      }
    });
    return;
  }
  // dx_j = dy_j scale_j^-beta + 2 x_j sum_{i: j in window(i)} t_i / pool_size_i with
  // t_i = -beta alpha dy_i x_i scale_i^(-beta-1); the sum is average pooling's backward.
  const PoolShape pool = within_channel_pool(s);
  for_planes(par, s, plane * (s.size * s.size + kCostPow), [&](index_t at, float* scratch) {
    Array powered(scratch, plane), t(scratch + plane, plane), spread(scratch + 2 * plane, plane);
    const ConstArray sc(scale + at, plane), in(x + at, plane), grad(dy + at, plane);
    pow_minus_beta(sc, s.beta, powered);
    t = (-s.beta * s.alpha) * grad * in * powered / sc;
    avg_pool_plane_backward(pool, t.data(), spread.data());
    Array(dx + at, plane) = grad * powered + 2.0f * in * spread;
  });
}

}  // namespace hn::detail::cpu
