// BatchNorm on stored statistics, Scale and ReLU in one pass each way (norm_affine_forward
// and norm_affine_backward, driver_calls.def), on NCHW, nChw16c and nChw8c. All are runs of
// 16-float vectors whose lanes share fixed channel parameters: on NCHW a run is one channel
// of one image (every lane the same channel), on the blocked layouts a run is one image's
// block of B channels (lane l is channel B b + l % B). Backward tasks own channels (NCHW) or blocks
// and walk the images in order, summing each run in float vectors and the runs in double, so the
// sums are the same on any thread count. AVX-512 runs a vector of 16 lanes at once, AVX2
// two halves of 8 (the tail of a run scalar); the plain C++ fallback is scalar.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace hn::detail::cpu {

namespace {

constexpr index_t kLanes = 16;

// Per-lane parameters of a run: the B channels of a block (twice for B = 8), or one channel
// 16 times.
struct LaneParams {
  float shift[kLanes], inv_std[kLanes], gamma[kLanes], beta[kLanes];
};

struct LaneSums {
  double dz[kLanes] = {}, dz_n[kLanes] = {};
};

#if !defined(__AVX512F__)

// Elements [first, last) of a run, one at a time: the plain fallback's whole run, the tail
// of AVX2's.
void forward_elements(const float* x, index_t first, index_t last, const LaneParams& p, bool relu,
                      float slope, float* normalised, float* y) {
  for (index_t i = first; i < last; ++i) {
    const index_t l = i % kLanes;
    const float n = (x[i] + p.shift[l]) * p.inv_std[l];
    if (normalised != nullptr) normalised[i] = n;
    float v = n * p.gamma[l] + p.beta[l];
    if (relu && !(v > 0.0f)) v *= slope;
    y[i] = v;
  }
}

void backward_elements(const float* dy, const float* y, const float* normalised, index_t first,
                       index_t last, const float* dx_scale, bool relu, float slope, LaneSums* sums,
                       float* dx) {
  for (index_t i = first; i < last; ++i) {
    const index_t l = i % kLanes;
    const float dz = relu && !(y[i] > 0.0f) ? dy[i] * slope : dy[i];
    if (sums != nullptr) {
      sums->dz[l] += dz;
      if (normalised != nullptr) sums->dz_n[l] += static_cast<double>(dz) * normalised[i];
    }
    if (dx != nullptr) dx[i] = dz * dx_scale[l];
  }
}

#endif

#if defined(__AVX512F__)

__mmask16 tail_mask(index_t left) {
  return left >= kLanes ? static_cast<__mmask16>(0xFFFF)
                        : static_cast<__mmask16>((1u << static_cast<unsigned>(left)) - 1u);
}

void forward_run(const float* x, index_t length, const LaneParams& p, bool relu, float slope,
                 float* normalised, float* y) {
  const __m512 shift = _mm512_loadu_ps(p.shift), inv_std = _mm512_loadu_ps(p.inv_std);
  const __m512 gamma = _mm512_loadu_ps(p.gamma), beta = _mm512_loadu_ps(p.beta);
  const __m512 slopes = _mm512_set1_ps(slope), zero = _mm512_setzero_ps();
  for (index_t i = 0; i < length; i += kLanes) {
    const __mmask16 m = tail_mask(length - i);
    const __m512 n = _mm512_mul_ps(_mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), shift), inv_std);
    if (normalised != nullptr) _mm512_mask_storeu_ps(normalised + i, m, n);
    __m512 v = _mm512_add_ps(_mm512_mul_ps(n, gamma), beta);
    if (relu) {
      const __mmask16 positive = _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
      v = _mm512_mask_blend_ps(positive, _mm512_mul_ps(v, slopes), v);
    }
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

// Sums of dz and dz * normalised over the run, per lane, into `sums`; dx = dz * dx_scale.
// Floats add up chunks of 64 vectors, doubles the chunks.
void backward_run(const float* dy, const float* y, const float* normalised, index_t length,
                  const float* dx_scale, bool relu, float slope, LaneSums* sums, float* dx) {
  constexpr index_t kChunk = 64 * kLanes;
  const __m512 scale = dx_scale != nullptr ? _mm512_loadu_ps(dx_scale) : _mm512_setzero_ps();
  const __m512 slopes = _mm512_set1_ps(slope), zero = _mm512_setzero_ps();
  for (index_t start = 0; start < length; start += kChunk) {
    const index_t end = std::min(length, start + kChunk);
    __m512 sum_dz = zero, sum_dz_n = zero;
    for (index_t i = start; i < end; i += kLanes) {
      const __mmask16 m = tail_mask(end - i);
      __m512 dz = _mm512_maskz_loadu_ps(m, dy + i);
      if (relu) {
        const __mmask16 positive =
            _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m, y + i), zero, _CMP_GT_OQ);
        dz = _mm512_mask_blend_ps(positive, _mm512_mul_ps(dz, slopes), dz);
      }
      if (sums != nullptr) {
        sum_dz = _mm512_add_ps(sum_dz, dz);
        if (normalised != nullptr)
          sum_dz_n = _mm512_fmadd_ps(dz, _mm512_maskz_loadu_ps(m, normalised + i), sum_dz_n);
      }
      if (dx != nullptr) _mm512_mask_storeu_ps(dx + i, m, _mm512_mul_ps(dz, scale));
    }
    if (sums == nullptr) continue;
    alignas(64) float a[kLanes], b[kLanes];
    _mm512_store_ps(a, sum_dz);
    _mm512_store_ps(b, sum_dz_n);
    for (index_t l = 0; l < kLanes; ++l) {
      sums->dz[l] += a[l];
      sums->dz_n[l] += b[l];
    }
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

// AVX2: a 16-lane vector is two 8-float halves; the tail of a run (under 16 floats) is
// scalar, with the same per-lane formulas.
void forward_run(const float* x, index_t length, const LaneParams& p, bool relu, float slope,
                 float* normalised, float* y) {
  const __m256 shift[2] = {_mm256_loadu_ps(p.shift), _mm256_loadu_ps(p.shift + 8)};
  const __m256 inv_std[2] = {_mm256_loadu_ps(p.inv_std), _mm256_loadu_ps(p.inv_std + 8)};
  const __m256 gamma[2] = {_mm256_loadu_ps(p.gamma), _mm256_loadu_ps(p.gamma + 8)};
  const __m256 beta[2] = {_mm256_loadu_ps(p.beta), _mm256_loadu_ps(p.beta + 8)};
  const __m256 slopes = _mm256_set1_ps(slope), zero = _mm256_setzero_ps();
  index_t i = 0;
  for (; i + kLanes <= length; i += kLanes) {
    for (int h = 0; h < 2; ++h) {
      const index_t at = i + 8 * h;
      const __m256 n = _mm256_mul_ps(_mm256_add_ps(_mm256_loadu_ps(x + at), shift[h]), inv_std[h]);
      if (normalised != nullptr) _mm256_storeu_ps(normalised + at, n);
      __m256 v = _mm256_add_ps(_mm256_mul_ps(n, gamma[h]), beta[h]);
      if (relu) {
        const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
        v = _mm256_blendv_ps(_mm256_mul_ps(v, slopes), v, positive);
      }
      _mm256_storeu_ps(y + at, v);
    }
  }
  forward_elements(x, i, length, p, relu, slope, normalised, y);
}

// As the AVX-512 version: float sums over chunks of 64 16-lane vectors, doubles over chunks.
void backward_run(const float* dy, const float* y, const float* normalised, index_t length,
                  const float* dx_scale, bool relu, float slope, LaneSums* sums, float* dx) {
  constexpr index_t kChunk = 64 * kLanes;
  const __m256 zero = _mm256_setzero_ps(), slopes = _mm256_set1_ps(slope);
  const __m256 scale[2] = {dx_scale != nullptr ? _mm256_loadu_ps(dx_scale) : zero,
                           dx_scale != nullptr ? _mm256_loadu_ps(dx_scale + 8) : zero};
  const index_t whole = length - length % kLanes;
  for (index_t start = 0; start < whole; start += kChunk) {
    const index_t end = std::min(whole, start + kChunk);
    __m256 sum_dz[2] = {zero, zero}, sum_dz_n[2] = {zero, zero};
    for (index_t i = start; i < end; i += kLanes) {
      for (int h = 0; h < 2; ++h) {
        const index_t at = i + 8 * h;
        __m256 dz = _mm256_loadu_ps(dy + at);
        if (relu) {
          const __m256 positive = _mm256_cmp_ps(_mm256_loadu_ps(y + at), zero, _CMP_GT_OQ);
          dz = _mm256_blendv_ps(_mm256_mul_ps(dz, slopes), dz, positive);
        }
        if (sums != nullptr) {
          sum_dz[h] = _mm256_add_ps(sum_dz[h], dz);
          if (normalised != nullptr)
            sum_dz_n[h] = _mm256_fmadd_ps(dz, _mm256_loadu_ps(normalised + at), sum_dz_n[h]);
        }
        if (dx != nullptr) _mm256_storeu_ps(dx + at, _mm256_mul_ps(dz, scale[h]));
      }
    }
    if (sums == nullptr) continue;
    alignas(32) float a[kLanes], b[kLanes];
    for (int h = 0; h < 2; ++h) {
      _mm256_store_ps(a + 8 * h, sum_dz[h]);
      _mm256_store_ps(b + 8 * h, sum_dz_n[h]);
    }
    for (index_t l = 0; l < kLanes; ++l) {
      sums->dz[l] += a[l];
      sums->dz_n[l] += b[l];
    }
  }
  backward_elements(dy, y, normalised, whole, length, dx_scale, relu, slope, sums, dx);
}

#else

void forward_run(const float* x, index_t length, const LaneParams& p, bool relu, float slope,
                 float* normalised, float* y) {
  forward_elements(x, 0, length, p, relu, slope, normalised, y);
}

void backward_run(const float* dy, const float* y, const float* normalised, index_t length,
                  const float* dx_scale, bool relu, float slope, LaneSums* sums, float* dx) {
  backward_elements(dy, y, normalised, 0, length, dx_scale, relu, slope, sums, dx);
}

#endif

// Lane l of a run that starts at channel `first`: channel first + l % block (block 1 on
// NCHW: every lane is `first`).
void fill_lanes(const float* values, index_t first, index_t block, float fallback, float* lanes) {
  for (index_t l = 0; l < kLanes; ++l)
    lanes[l] = values == nullptr ? fallback : values[first + l % block];
}

}  // namespace

void norm_affine_forward(Parallel& par, const AxisShape& s, const float* x, const float* shift,
                         const float* inv_std, const float* gamma, const float* beta, bool relu,
                         float slope, float* normalised, float* y) {
  const index_t block = layout_block(s.layout);
  const index_t groups = s.channels / block;  // runs per image
  const index_t length = s.inner * block;
  par.for_range(s.outer * groups, length, [&](index_t first, index_t last) {
    LaneParams p;
    for (index_t r = first; r < last; ++r) {
      const index_t channel = (r % groups) * block;
      fill_lanes(shift, channel, block, 0.0f, p.shift);
      fill_lanes(inv_std, channel, block, 0.0f, p.inv_std);
      fill_lanes(gamma, channel, block, 0.0f, p.gamma);
      fill_lanes(beta, channel, block, 0.0f, p.beta);
      forward_run(x + r * length, length, p, relu, slope,
                  normalised != nullptr ? normalised + r * length : nullptr, y + r * length);
    }
  });
}

void norm_affine_backward(Parallel& par, const AxisShape& s, const float* dy, const float* y,
                          const float* normalised, const float* dx_scale, bool relu, float slope,
                          float* dgamma, float* dbeta, float* dx) {
  const index_t block = layout_block(s.layout);
  const index_t groups = s.channels / block;
  const index_t length = s.inner * block;
  const bool summing = dgamma != nullptr || dbeta != nullptr;
  par.for_range(groups, s.outer * length, [&](index_t first, index_t last) {
    for (index_t g = first; g < last; ++g) {
      const index_t channel = g * block;
      float scale[kLanes];
      fill_lanes(dx_scale, channel, block, 0.0f, scale);
      LaneSums sums;
      for (index_t o = 0; o < s.outer; ++o) {
        const index_t at = (o * groups + g) * length;
        backward_run(dy + at, relu ? y + at : nullptr,
                     dgamma != nullptr ? normalised + at : nullptr, length,
                     dx != nullptr ? scale : nullptr, relu, slope, summing ? &sums : nullptr,
                     dx != nullptr ? dx + at : nullptr);
      }
      if (!summing) continue;
      // Channel k of the run (k < block) is lanes k, k + block, ...: on NCHW all of them.
      for (index_t k = 0; k < block; ++k) {
        double total_dz = 0.0, total_dz_n = 0.0;
        for (index_t l = k; l < kLanes; l += block) {
          total_dz += sums.dz[l];
          total_dz_n += sums.dz_n[l];
        }
        if (dbeta != nullptr)
          dbeta[channel + k] = static_cast<float>(dbeta[channel + k] + total_dz);
        if (dgamma != nullptr)
          dgamma[channel + k] = static_cast<float>(dgamma[channel + k] + total_dz_n);
      }
    }
  });
}

}  // namespace hn::detail::cpu
