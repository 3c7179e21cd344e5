// Element-wise calls, reductions, activations, bias, dropout and the Eltwise/Concat helpers
// on the CPU: Eigen array maps over contiguous chunks, chunks spread over the driver's threads
// when large enough.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "lib/core/philox.h"

namespace hn::detail::cpu {

namespace {

// Work units per element (see parallel.h): measured serial times per element relative to
// ReLU's (sigmoid ~0.3 ns, a Philox draw ~4 ns against ReLU's ~0.085 ns).
constexpr index_t kCostCopy = 1;
constexpr index_t kCostArith = 1;
constexpr index_t kCostTranscendental = 4;
constexpr index_t kCostPhilox = 48;
constexpr index_t kCostPow = 60;  // glibc powf, scalar: ~5 ns
// Reductions add fixed blocks in order, so their result is the same on any thread count.
constexpr index_t kReduceBlock = 1 << 14;

// Sum of term(i) over [first, last) in double, as the reference accumulates. Eight
// independent partial sums let the compiler vectorise the conversions and adds without
// reassociating (Eigen's cast<double>().sum() stays scalar here).
template <class Term>
double sum_double(index_t first, index_t last, const Term& term) {
  double partial[8] = {};
  index_t i = first;
  for (; i + 8 <= last; i += 8) {
    for (int j = 0; j < 8; ++j)
      partial[j] += term(i + j);
  }
  double tail = 0.0;
  for (; i < last; ++i)
    tail += term(i);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

// body(first, count) over chunks of [0, n).
template <class Body>
void for_chunks(Parallel& par, index_t n, index_t cost, const Body& body) {
  par.for_range(n, cost, [&](index_t first, index_t last) { body(first, last - first); });
}

}  // namespace

void copy_bytes(Parallel& par, void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  const index_t chunks = static_cast<index_t>((bytes + kChunk - 1) / kChunk);
  par.for_range(chunks, kChunk / sizeof(float) * kCostCopy, [&](index_t first, index_t last) {
    const std::size_t begin = static_cast<std::size_t>(first) * kChunk;
    const std::size_t end = std::min(bytes, static_cast<std::size_t>(last) * kChunk);
    std::memmove(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                 end - begin);
  });
}

void fill(Parallel& par, index_t n, float value, float* x) {
  for_chunks(par, n, kCostCopy,
             [&](index_t i, index_t len) { Array(x + i, len).setConstant(value); });
}

void scale(Parallel& par, index_t n, float alpha, float* x) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) { Array(x + i, len) *= alpha; });
}

void axpy(Parallel& par, index_t n, float alpha, const float* x, float* y) {
  for_chunks(par, n, kCostArith,
             [&](index_t i, index_t len) { Array(y + i, len) += alpha * ConstArray(x + i, len); });
}

void lincomb(Parallel& par, index_t n, float alpha, const float* a, float beta, const float* b,
             float* y) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    Array(y + i, len) = alpha * ConstArray(a + i, len) + beta * ConstArray(b + i, len);
  });
}

void axpby(Parallel& par, index_t n, float alpha, const float* x, float beta, float* y) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    Array out(y + i, len);
    if (beta == 0.0f) {
      out = alpha * ConstArray(x + i, len);  // y is not read: NaN in y must not survive
    } else {
      out = alpha * ConstArray(x + i, len) + beta * out;
    }
  });
}

void mul(Parallel& par, index_t n, const float* a, const float* b, float* y) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    Array(y + i, len) = ConstArray(a + i, len) * ConstArray(b + i, len);
  });
}

void add_scalar(Parallel& par, index_t n, float alpha, float* x) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) { Array(x + i, len) += alpha; });
}

namespace {

// std::pow per element: Caffe's powx semantics for every base (negative bases with integer
// exponents included), which Eigen's vectorised pow does not promise.
void powx_run(index_t n, const float* x, float exponent, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = std::pow(x[i], exponent);
}

}  // namespace

void powx(Parallel& par, index_t n, const float* x, float exponent, float* y) {
  for_chunks(par, n, kCostPow,
             [&](index_t i, index_t len) { powx_run(len, x + i, exponent, y + i); });
}

void copy_strided(Parallel& par, index_t rows, index_t cols, const float* src, index_t src_ld,
                  float* dst, index_t dst_ld) {
  if (src_ld == cols && dst_ld == cols) {
    copy_bytes(par, dst, src, sizeof(float) * static_cast<std::size_t>(rows * cols));
    return;
  }
  par.for_range(rows, cols * kCostCopy, [&](index_t first, index_t last) {
    for (index_t r = first; r < last; ++r)
      std::memcpy(dst + r * dst_ld, src + r * src_ld, sizeof(float) * cols);
  });
}

// One parallel range over every row of every image.
void copy_strided_batched(Parallel& par, index_t batch, index_t rows, index_t cols,
                          const float* src, index_t src_ld, index_t src_stride, float* dst,
                          index_t dst_ld, index_t dst_stride) {
  if (batch == 1 || (src_stride == rows * src_ld && dst_stride == rows * dst_ld)) {
    copy_strided(par, batch == 1 ? rows : batch * rows, cols, src, src_ld, dst, dst_ld);
    return;
  }
  if (rows == 0) return;
  par.for_range(batch * rows, cols * kCostCopy, [&](index_t first, index_t last) {
    for (index_t i = first; i < last; ++i) {
      const index_t b = i / rows, r = i % rows;
      std::memcpy(dst + b * dst_stride + r * dst_ld, src + b * src_stride + r * src_ld,
                  sizeof(float) * cols);
    }
  });
}

void scale_channels(Parallel& par, const AxisShape& s, const float* scale, const float* x,
                    float* y) {
  if (s.inner == 1) {
    const ConstArray factors(scale, s.channels);
    par.for_range(s.outer, s.channels * kCostArith, [&](index_t first, index_t last) {
      for (index_t o = first; o < last; ++o) {
        Array(y + o * s.channels, s.channels) =
            ConstArray(x + o * s.channels, s.channels) * factors;
      }
    });
    return;
  }
  par.for_range(s.outer * s.channels, s.inner * kCostArith, [&](index_t first, index_t last) {
    for (index_t row = first; row < last; ++row) {
      Array(y + row * s.inner, s.inner) =
          ConstArray(x + row * s.inner, s.inner) * scale[row % s.channels];
    }
  });
}

namespace {

// Caffe's Eltwise MAX: input 1 takes input 0's place unless input 0 is greater (ties go to
// 1, as `a > b ? 0 : 1`); later inputs only where strictly greater.
void max_accumulate_run(index_t n, const float* x, std::int32_t index, float* y,
                        std::int32_t* mask) {
  const bool second = index == 1;
  for (index_t i = 0; i < n; ++i) {
    const bool greater = second ? !(y[i] > x[i]) : x[i] > y[i];
    y[i] = greater ? x[i] : y[i];
    mask[i] = greater ? index : mask[i];
  }
}

void max_select_run(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                    float* dx) {
  for (index_t i = 0; i < n; ++i)
    dx[i] = mask[i] == index ? dy[i] : 0.0f;
}

}  // namespace

void max_accumulate(Parallel& par, index_t n, const float* x, std::int32_t index, float* y,
                    std::int32_t* mask) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    if (index == 0) {  // y and mask are not read: they may hold anything
      std::memmove(y + i, x + i, sizeof(float) * len);
      std::fill(mask + i, mask + i + len, 0);
    } else {
      max_accumulate_run(len, x + i, index, y + i, mask + i);
    }
  });
}

void max_select(Parallel& par, index_t n, const std::int32_t* mask, std::int32_t index,
                const float* dy, float* dx) {
  for_chunks(par, n, kCostArith,
             [&](index_t i, index_t len) { max_select_run(len, mask + i, index, dy + i, dx + i); });
}

float dot(Parallel& par, index_t n, const float* x, const float* y) {
  return static_cast<float>(
      par.sum_blocks(n, kReduceBlock, kCostArith, [x, y](index_t first, index_t last) {
        return sum_double(first, last,
                          [x, y](index_t i) { return static_cast<double>(x[i]) * y[i]; });
      }));
}

float asum(Parallel& par, index_t n, const float* x) {
  return static_cast<float>(
      par.sum_blocks(n, kReduceBlock, kCostArith, [x](index_t first, index_t last) {
        return sum_double(first, last,
                          [x](index_t i) { return std::abs(static_cast<double>(x[i])); });
      }));
}

float sum(Parallel& par, index_t n, const float* x) {
  return static_cast<float>(
      par.sum_blocks(n, kReduceBlock, kCostArith, [x](index_t first, index_t last) {
        return sum_double(first, last, [x](index_t i) { return static_cast<double>(x[i]); });
      }));
}

void bias_forward(Parallel& par, const AxisShape& s, const float* bias, float* y) {
  if (s.inner == 1) {
    // Fully connected: add the bias vector to each row.
    const ConstArray b(bias, s.channels);
    par.for_range(s.outer, s.channels * kCostArith, [&](index_t first, index_t last) {
      for (index_t o = first; o < last; ++o) {
        Array(y + o * s.channels, s.channels) += b;
      }
    });
    return;
  }
  par.for_range(s.outer * s.channels, s.inner * kCostArith, [&](index_t first, index_t last) {
    for (index_t row = first; row < last; ++row) {
      Array(y + row * s.inner, s.inner) += bias[row % s.channels];
    }
  });
}

namespace {

// dbias = beta * dbias + the sums of each channel's runs, each run's address given by
// run_at(offset) for its offset in the tensor (dy itself, or dy masked first into dx).
// Tasks own blocks of channels; each walks the outer rows in order, so the sums are the
// same on any thread count.
template <class Run>
void sum_channel_runs(Parallel& par, const AxisShape& s, float beta, float* dbias,
                      const Run& run_at) {
  par.for_range(s.channels, s.outer * s.inner, [&](index_t first, index_t last) {
    std::vector<double> acc(static_cast<std::size_t>(last - first), 0.0);
    for (index_t o = 0; o < s.outer; ++o) {
      for (index_t c = first; c < last; ++c) {
        const float* run = run_at((o * s.channels + c) * s.inner);
        acc[c - first] +=
            sum_double(0, s.inner, [run](index_t i) { return static_cast<double>(run[i]); });
      }
    }
    for (index_t c = first; c < last; ++c) {
      const float total = static_cast<float>(acc[c - first]);
      dbias[c] = beta == 0.0f ? total : beta * dbias[c] + total;
    }
  });
}

}  // namespace

void bias_backward(Parallel& par, const AxisShape& s, const float* dy, float beta, float* dbias) {
  sum_channel_runs(par, s, beta, dbias, [dy](index_t at) { return dy + at; });
}

// Each run masked first, then summed from the cache: bias_backward's bits on the masked dx.
void relu_backward_bias(Parallel& par, const AxisShape& s, float slope, const float* y,
                        const float* dy, float* dx, float* dbias) {
  sum_channel_runs(par, s, 1.0f, dbias, [&](index_t at) {
    relu_backward_run(s.inner, slope, y + at, dy + at, dx + at);
    return static_cast<const float*>(dx + at);
  });
}

// ReLU and dropout are plain loops over one chunk, in functions of their own: Eigen 3.4's
// select() is not vectorised, and inside a lambda run in parallel the compiler must assume a
// float store may overwrite a captured float (slope, scale, ratio) and stays scalar. Built
// for AVX2 without AVX-512, gcc 12 still made branches of their choices, scalar loops that
// mispredict on every other sign (MobileNet v1's ReLU gradients at a quarter of the memory's
// speed): there they run on 8-float vectors, the same multiplies, so the same bits as the
// scalar tail. (With AVX-512 gcc vectorises them with masks.)
void relu_backward_run(index_t n, float slope, const float* x, const float* dy, float* dx) {
  index_t i = 0;
#if defined(__AVX__) && !defined(__AVX512F__)
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f),
               factor = _mm256_set1_ps(slope);
  for (; i + 8 <= n; i += 8) {
    const __m256 positive = _mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_GT_OQ);
    _mm256_storeu_ps(
        dx + i, _mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_blendv_ps(factor, one, positive)));
  }
#endif
  for (; i < n; ++i)
    dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : slope);
}

namespace {

void relu_forward_run(index_t n, float slope, const float* x, float* y) {
  index_t i = 0;
#if defined(__AVX__) && !defined(__AVX512F__)
  const __m256 zero = _mm256_setzero_ps(), factor = _mm256_set1_ps(slope);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
    _mm256_storeu_ps(y + i, _mm256_blendv_ps(_mm256_mul_ps(factor, v), v, positive));
  }
#endif
  for (; i < n; ++i)
    y[i] = x[i] > 0.0f ? x[i] : slope * x[i];
}

void clip_forward_run(index_t n, float lo, float hi, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

void clip_backward_run(index_t n, float lo, float hi, const float* x, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i)
    dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
}

// Eltwise SUM + ReLU (a residual block's end, conv_forward_residual's second half). Built
// for AVX2 without AVX-512, gcc's branches mispredicted here as in relu_backward_run; so 8-float
// vectors there, the last few values through the same vector code on a padded copy (not a
// scalar tail, which gcc may contract into an FMA differently), so that every value gets the
// same bits wherever a chunk or a slice of the batch ends. y may be a or b.
void lincomb_relu_run(index_t n, float alpha, const float* a, float beta, const float* b,
                      float slope, float* y) {
#if defined(__AVX__) && !defined(__AVX512F__)
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta), zero = _mm256_setzero_ps(),
               factor = _mm256_set1_ps(slope);
  const auto eight = [&](const float* pa, const float* pb, float* py) {
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(va, _mm256_loadu_ps(pa)),
                                   _mm256_mul_ps(vb, _mm256_loadu_ps(pb)));
    const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
    _mm256_storeu_ps(py, _mm256_blendv_ps(_mm256_mul_ps(factor, v), v, positive));
  };
  index_t i = 0;
  for (; i + 8 <= n; i += 8)
    eight(a + i, b + i, y + i);
  if (i < n) {
    float ta[8] = {}, tb[8] = {}, ty[8];
    const std::size_t rest = static_cast<std::size_t>(n - i) * sizeof(float);
    std::memcpy(ta, a + i, rest);
    std::memcpy(tb, b + i, rest);
    eight(ta, tb, ty);
    std::memcpy(y + i, ty, rest);
  }
#else
  for (index_t i = 0; i < n; ++i) {
    const float v = alpha * a[i] + beta * b[i];
    y[i] = v > 0.0f ? v : slope * v;
  }
#endif
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// Dropout's draws 8 at a time in AVX2 builds: gcc 12 leaves philox_bits's 32 x 32 -> 64-bit
// products scalar there (with AVX-512 it vectorises them), and SqueezeNet's drop9 (2.8 M
// floats at batch 32) took 30 ms forward against 6.9 in the AVX-512 build on the same Zen 4.
// _mm256_mul_epu32 multiplies the even lanes; the odd ones, shifted down, make a second call.
// Integer arithmetic, then the scalar code's exact conversion and power-of-two multiply: the
// same bits as philox_uniform, lane by lane.
void philox_mulhilo8(__m256i m, __m256i x, __m256i* lo, __m256i* hi) {
  const __m256i even = _mm256_mul_epu32(x, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// philox_uniform(seed, counter[l]) for the 8 lanes l.
__m256 philox_uniform8(std::uint64_t seed, const std::uint64_t (&counter)[8]) {
  alignas(32) std::uint32_t low[8], high[8];
  for (int l = 0; l < 8; ++l) {
    low[l] = static_cast<std::uint32_t>(counter[l]);
    high[l] = static_cast<std::uint32_t>(counter[l] >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(low));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(high));
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m256i lo0, hi0, lo1, hi1;
    philox_mulhilo8(m0, c0, &lo0, &hi0);
    philox_mulhilo8(m1, c2, &lo1, &hi1);
    const __m256i n0 =
        _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    const __m256i n2 =
        _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 8)),
                       _mm256_set1_ps(1.0f / 16777216.0f));
}

// 8 consecutive elements of dropout's output and mask from their draws.
void dropout8(__m256 draw, float ratio, float s, const float* x, float* y, float* mask) {
  const __m256 keep = _mm256_cmp_ps(draw, _mm256_set1_ps(ratio), _CMP_GE_OQ);
  _mm256_storeu_ps(mask, _mm256_and_ps(keep, _mm256_set1_ps(1.0f)));
  _mm256_storeu_ps(y, _mm256_and_ps(keep, _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_set1_ps(s))));
}
#endif

// Bitwise identical on every driver: keep = u >= ratio and y = x * s, the reference's float
// expressions.
void dropout_forward_run(index_t first, index_t n, float ratio, float s, std::uint64_t seed,
                         std::uint64_t offset, const float* x, float* y, float* mask) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  for (; n >= 8; first += 8, n -= 8) {
    std::uint64_t counter[8];
    for (int l = 0; l < 8; ++l)
      counter[l] = offset + static_cast<std::uint64_t>(first + l);
    dropout8(philox_uniform8(seed, counter), ratio, s, x + first, y + first, mask + first);
  }
#endif
  for (index_t i = first; i < first + n; ++i) {
    const bool keep = philox_uniform(seed, offset + static_cast<std::uint64_t>(i)) >= ratio;
    mask[i] = keep ? 1.0f : 0.0f;
    y[i] = keep ? x[i] * s : 0.0f;
  }
}

// One plane of blocked channels: `inner` pixels of `block` channels each, channel q's
// counters running along the pixels from base + q * inner.
void dropout_plane_run(index_t inner, index_t block, float ratio, float s, std::uint64_t seed,
                       std::uint64_t base, const float* x, float* y, float* mask) {
  for (index_t i = 0; i < inner; ++i) {
    index_t q = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (; q + 8 <= block; q += 8) {
      std::uint64_t counter[8];
      for (int l = 0; l < 8; ++l)
        counter[l] = base + static_cast<std::uint64_t>((q + l) * inner + i);
      const index_t at = i * block + q;
      dropout8(philox_uniform8(seed, counter), ratio, s, x + at, y + at, mask + at);
    }
#endif
    for (; q < block; ++q) {
      const index_t at = i * block + q;
      const bool keep =
          philox_uniform(seed, base + static_cast<std::uint64_t>(q * inner + i)) >= ratio;
      mask[at] = keep ? 1.0f : 0.0f;
      y[at] = keep ? x[at] * s : 0.0f;
    }
  }
}

void dropout_backward_run(index_t n, float s, const float* mask, const float* dy, float* dx) {
  index_t i = 0;
#if defined(__AVX__) && !defined(__AVX512F__)  // as relu_backward_run
  const __m256 zero = _mm256_setzero_ps(), scale = _mm256_set1_ps(s);
  for (; i + 8 <= n; i += 8) {
    const __m256 kept = _mm256_cmp_ps(_mm256_loadu_ps(mask + i), zero, _CMP_NEQ_UQ);
    _mm256_storeu_ps(dx + i, _mm256_and_ps(kept, _mm256_mul_ps(_mm256_loadu_ps(dy + i), scale)));
  }
#endif
  for (; i < n; ++i)
    dx[i] = mask[i] != 0.0f ? dy[i] * s : 0.0f;
}

}  // namespace

void relu_forward(Parallel& par, index_t n, float slope, const float* x, float* y) {
  for_chunks(par, n, kCostArith,
             [&](index_t i, index_t len) { relu_forward_run(len, slope, x + i, y + i); });
}

void relu_backward(Parallel& par, index_t n, float slope, const float* x, const float* dy,
                   float* dx) {
  for_chunks(par, n, kCostArith,
             [&](index_t i, index_t len) { relu_backward_run(len, slope, x + i, dy + i, dx + i); });
}

void clip_forward(Parallel& par, index_t n, float lo, float hi, const float* x, float* y) {
  for_chunks(par, n, kCostArith,
             [&](index_t i, index_t len) { clip_forward_run(len, lo, hi, x + i, y + i); });
}

void clip_backward(Parallel& par, index_t n, float lo, float hi, const float* x, const float* dy,
                   float* dx) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    clip_backward_run(len, lo, hi, x + i, dy + i, dx + i);
  });
}

void lincomb_relu(Parallel& par, index_t n, float alpha, const float* a, float beta, const float* b,
                  float slope, float* y) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    lincomb_relu_run(len, alpha, a + i, beta, b + i, slope, y + i);
  });
}

void sigmoid_forward(Parallel& par, index_t n, const float* x, float* y) {
  for_chunks(par, n, kCostTranscendental, [&](index_t i, index_t len) {
    Array(y + i, len) = 1.0f / (1.0f + (-ConstArray(x + i, len)).exp());
  });
}

void swish_forward(Parallel& par, index_t n, float beta, const float* x, float* y) {
  for_chunks(par, n, kCostTranscendental, [&](index_t i, index_t len) {
    const ConstArray in(x + i, len);
    Array(y + i, len) = in / (1.0f + (-beta * in).exp());
  });
}

void swish_backward(Parallel& par, index_t n, float beta, const float* x, const float* dy,
                    float* dx) {
  for_chunks(par, n, kCostTranscendental, [&](index_t i, index_t len) {
    const ConstArray in(x + i, len);
    const auto s = 1.0f / (1.0f + (-beta * in).exp());
    Array(dx + i, len) = ConstArray(dy + i, len) * (s + beta * in * s * (1.0f - s));
  });
}

void sigmoid_backward(Parallel& par, index_t n, const float* y, const float* dy, float* dx) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    const ConstArray out(y + i, len);
    Array(dx + i, len) = ConstArray(dy + i, len) * out * (1.0f - out);
  });
}

void tanh_forward(Parallel& par, index_t n, const float* x, float* y) {
  for_chunks(par, n, kCostTranscendental,
             [&](index_t i, index_t len) { Array(y + i, len) = ConstArray(x + i, len).tanh(); });
}

void tanh_backward(Parallel& par, index_t n, const float* y, const float* dy, float* dx) {
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    const ConstArray out(y + i, len);
    Array(dx + i, len) = ConstArray(dy + i, len) * (1.0f - out.square());
  });
}

void dropout_forward(Parallel& par, index_t n, float ratio, std::uint64_t seed,
                     std::uint64_t offset, const float* x, float* y, float* mask) {
  const float s = 1.0f / (1.0f - ratio);
  for_chunks(par, n, kCostPhilox, [&](index_t i, index_t len) {
    dropout_forward_run(i, len, ratio, s, seed, offset, x, y, mask);
  });
}

void dropout_forward_layout(Parallel& par, const AxisShape& shape, float ratio, std::uint64_t seed,
                            std::uint64_t offset, const float* x, float* y, float* mask) {
  if (shape.layout == Layout::nchw) {
    dropout_forward(par, shape.count(), ratio, seed, offset, x, y, mask);
    return;
  }
  // Blocked: plane p = o * (channels / block) + b holds channels b * block .. + block of
  // image o, pixel by pixel; its channel q draws from offset + (o * channels + b * block +
  // q) * inner, which is offset + (p * block + q) * inner.
  const index_t block = layout_block(shape.layout);
  const index_t plane = shape.inner * block;
  const float s = 1.0f / (1.0f - ratio);
  par.for_range(shape.outer * (shape.channels / block), plane * kCostPhilox,
                [&](index_t first, index_t last) {
                  for (index_t p = first; p < last; ++p) {
                    const auto base = offset + static_cast<std::uint64_t>(p * plane);
                    dropout_plane_run(shape.inner, block, ratio, s, seed, base, x + p * plane,
                                      y + p * plane, mask + p * plane);
                  }
                });
}

void dropout_backward(Parallel& par, index_t n, float ratio, const float* mask, const float* dy,
                      float* dx) {
  const float s = 1.0f / (1.0f - ratio);
  for_chunks(par, n, kCostArith, [&](index_t i, index_t len) {
    dropout_backward_run(len, s, mask + i, dy + i, dx + i);
  });
}

}  // namespace hn::detail::cpu
