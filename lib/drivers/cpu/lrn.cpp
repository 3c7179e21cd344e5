// Local response normalisation on the CPU. Across channels: tasks own (image, run of
// pixels) tiles and hold the tile's squares for every channel, so each window sum reads
// cached data; on blocked tensors a tile is each block's run of pixels, and a
// window of channels may reach into the neighbouring blocks (same sums in the same order,
// so the same bits as on NCHW). Within a channel: Caffe's average pooling of x^2 (pooling.cpp), per
// plane.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

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

// Runs body(first, len, scratch) for every (image, run of pixels) tile of a blocked tensor
// (B channels a block); first is the offset of the tile's pixel run in its image's first
// block; the tile of block b is first + b * plane * B .. + len * B.
template <index_t kBlock, class Body>
void for_blocked_tiles(Parallel& par, const LrnShape& s, index_t cost_per_float, index_t arrays,
                       const Body& body) {
  const index_t plane = s.height * s.width, tiles = (plane + kTile - 1) / kTile;
  par.for_range(
      s.batch * tiles, s.channels * kTile * cost_per_float, [&](index_t first, index_t last) {
        std::vector<float> scratch(static_cast<std::size_t>(arrays * s.channels * kTile));
        for (index_t item = first; item < last; ++item) {
          const index_t n = item / tiles, p0 = (item % tiles) * kTile;
          body(n * s.channels * plane + p0 * kBlock, std::min(kTile, plane - p0), scratch.data());
        }
      });
}

// Window sums of a blocked tile: `rows` holds the tile's blocks one after the other (len
// pixels x B channels each); out (len x B, for block b) = for each pixel and channel c of
// the block, the sum of channels [c - pre, c + pre] (clipped) in channel order, as
// window_sum adds them (leading and trailing zeros in place of the clipped channels change
// no bit).
// A window reaches into the neighbouring blocks only (LrnShape::validate: pre <= B).
template <index_t kBlock>
void blocked_window_sum(const float* rows, index_t blocks, index_t len, index_t b, index_t pre,
                        float* out) {
  const float* mid = rows + b * len * kBlock;
  const float* prev = b > 0 ? mid - len * kBlock : nullptr;
  const float* next = b + 1 < blocks ? mid + len * kBlock : nullptr;
  float ext[3 * kBlock];
  for (index_t i = 0; i < len; ++i) {
    for (index_t j = 0; j < pre; ++j) {
      ext[j] = prev != nullptr ? prev[i * kBlock + kBlock - pre + j] : 0.0f;
      ext[pre + kBlock + j] = next != nullptr ? next[i * kBlock + j] : 0.0f;
    }
    for (index_t l = 0; l < kBlock; ++l)
      ext[pre + l] = mid[i * kBlock + l];
    float* sum = out + i * kBlock;
    for (index_t l = 0; l < kBlock; ++l)
      sum[l] = ext[l];
    for (index_t d = 1; d <= 2 * pre; ++d)
      for (index_t l = 0; l < kBlock; ++l)
        sum[l] += ext[l + d];
  }
}

// lrn_forward / lrn_backward across channels on blocked tensors (scale blocked too).
template <index_t kBlock>
void lrn_forward_blocked(Parallel& par, const LrnShape& s, const float* x, float* y, float* scale) {
  const index_t pre = (s.size - 1) / 2, blocks = s.channels / kBlock,
                block = s.height * s.width * kBlock;
  const float alpha_over_size = s.alpha / static_cast<float>(s.size);
  for_blocked_tiles<kBlock>(
      par, s, s.size + kCostPow, 1, [&](index_t first, index_t len, float* squares) {
        const index_t n = len * kBlock;
        for (index_t b = 0; b < blocks; ++b)
          Array(squares + b * n, n) = ConstArray(x + first + b * block, n).square();
        for (index_t b = 0; b < blocks; ++b) {
          const index_t at = first + b * block;
          blocked_window_sum<kBlock>(squares, blocks, len, b, pre, scale + at);
          Array sc(scale + at, n);
          sc = s.k + alpha_over_size * sc;
          Array out(y + at, n);
          pow_minus_beta(sc, s.beta, out);
          out *= ConstArray(x + at, n);
        }
      });
}

template <index_t kBlock>
void lrn_backward_blocked(Parallel& par, const LrnShape& s, const float* x, const float* y,
                          const float* scale, const float* dy, float* dx) {
  const index_t pre = (s.size - 1) / 2, blocks = s.channels / kBlock,
                block = s.height * s.width * kBlock;
  const float coeff = 2.0f * s.alpha * s.beta / static_cast<float>(s.size);
  for_blocked_tiles<kBlock>(
      par, s, s.size + kCostPow, 1, [&](index_t first, index_t len, float* ratios) {
        const index_t n = len * kBlock;
        // All ratios first: dx may alias dy.
        for (index_t b = 0; b < blocks; ++b) {
          const index_t at = first + b * block;
          Array(ratios + b * n, n) =
              ConstArray(dy + at, n) * ConstArray(y + at, n) / ConstArray(scale + at, n);
        }
        Eigen::ArrayXf window(n), powered(n);
        for (index_t b = 0; b < blocks; ++b) {
          const index_t at = first + b * block;
          blocked_window_sum<kBlock>(ratios, blocks, len, b, pre, window.data());
          pow_minus_beta(ConstArray(scale + at, n), s.beta, Array(powered.data(), n));
          Array(dx + at, n) =
              ConstArray(dy + at, n) * powered - coeff * ConstArray(x + at, n) * window;
        }
      });
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
  if (s.layout == Layout::nchw16c) return lrn_forward_blocked<16>(par, s, x, y, scale);
  if (s.layout == Layout::nchw8c) return lrn_forward_blocked<8>(par, s, x, y, scale);
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
  if (s.layout == Layout::nchw16c) return lrn_backward_blocked<16>(par, s, x, y, scale, dy, dx);
  if (s.layout == Layout::nchw8c) return lrn_backward_blocked<8>(par, s, x, y, scale, dy, dx);
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
