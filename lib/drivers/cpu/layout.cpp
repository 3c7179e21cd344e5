// nChw16c and nChw8c activations on the CPU (Layout in shapes.h): pooling and the
// per-channel calls on blocks of B = 16 or 8 channels, where each pixel's B values are one
// vector (AVX-512's or AVX2's). The pooling scans
// windows in Caffe's order with the same strict maximum and adds in the same order as
// pooling.cpp's planes, so it gives the same bits as those on NCHW; bias_backward sums in
// double, as on NCHW.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include <algorithm>
#include <cfloat>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace hn::detail::cpu {

namespace {

// Window bounds of one output coordinate, following Caffe (as pooling.cpp).
struct Span {
  index_t start, end, size;  // size: the average's divisor along this axis
};

Span max_span(index_t out, index_t stride, index_t pad, index_t kernel, index_t in) {
  const index_t start = out * stride - pad;
  return {std::max<index_t>(start, 0), std::min(start + kernel, in), 0};
}

// The divisor: the window clipped to the padded input (Caffe's), or to the input without
// `include_pad`.
Span avg_span(index_t out, index_t stride, index_t pad, index_t kernel, index_t in,
              bool include_pad) {
  const index_t start = out * stride - pad;
  const index_t end = std::min(start + kernel, in + pad);
  const index_t lo = std::max<index_t>(start, 0), hi = std::min(end, in);
  return {lo, hi, include_pad ? end - start : hi - lo};
}

// body(block) for every [height][width][B] block of (image, B channels).
template <index_t kBlock, class Body>
void for_blocks(Parallel& par, const PoolShape& s, index_t cost, const Body& body) {
  par.for_range(s.batch * (s.channels / kBlock), cost * kBlock, [&](index_t first, index_t last) {
    for (index_t b = first; b < last; ++b)
      body(b);
  });
}

// The maximum of the B channels of pixels [h.start, h.end) x [w.start, w.end) of a
// [height][width][B] block and each one's first argmax (pixel index), or -FLT_MAX and -1
// for an empty window.
template <index_t kBlock>
void max_window_blocked(const float* in, index_t width, Span h, Span w, float* y,
                        std::int32_t* arg) {
#if defined(__AVX512F__)
  if constexpr (kBlock == 16) {
    __m512 best = _mm512_set1_ps(-FLT_MAX);
    __m512i where = _mm512_set1_epi32(-1);
    for (index_t ih = h.start; ih < h.end; ++ih) {
      for (index_t iw = w.start; iw < w.end; ++iw) {
        const index_t pixel = ih * width + iw;
        const __m512 v = _mm512_loadu_ps(in + pixel * kBlock);
        const __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        best = _mm512_mask_blend_ps(greater, best, v);
        where = _mm512_mask_blend_epi32(greater, where, _mm512_set1_epi32(static_cast<int>(pixel)));
      }
    }
    _mm512_storeu_ps(y, best);
    _mm512_storeu_si512(arg, where);
    return;
  }
#endif
#if defined(__AVX2__)
  if constexpr (kBlock == 8) {
    __m256 best = _mm256_set1_ps(-FLT_MAX);
    __m256 where = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (index_t ih = h.start; ih < h.end; ++ih) {
      for (index_t iw = w.start; iw < w.end; ++iw) {
        const index_t pixel = ih * width + iw;
        const __m256 v = _mm256_loadu_ps(in + pixel * kBlock);
        const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, v, greater);
        where = _mm256_blendv_ps(
            where, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(pixel))), greater);
      }
    }
    _mm256_storeu_ps(y, best);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(arg), _mm256_castps_si256(where));
    return;
  }
#endif
  float best[kBlock];
  std::int32_t where[kBlock];
  for (index_t l = 0; l < kBlock; ++l) {
    best[l] = -FLT_MAX;
    where[l] = -1;
  }
  for (index_t ih = h.start; ih < h.end; ++ih) {
    for (index_t iw = w.start; iw < w.end; ++iw) {
      const index_t pixel = ih * width + iw;
      const float* v = in + pixel * kBlock;
      for (index_t l = 0; l < kBlock; ++l) {
        const bool greater = v[l] > best[l];
        best[l] = greater ? v[l] : best[l];
        where[l] = greater ? static_cast<std::int32_t>(pixel) : where[l];
      }
    }
  }
  std::copy(best, best + kBlock, y);
  std::copy(where, where + kBlock, arg);
}

index_t window_cost(const PoolShape& s) {
  return s.out_h() * s.out_w() * s.kernel_h * s.kernel_w + s.height * s.width;
}

// For every [height][width][B] block b: start(b), then body(b, h, w, o) for each output
// pixel in order, with its window's spans (Caffe's max or average rule) and its offset o in
// the output.
template <index_t kBlock, bool kAverage, class Start, class Body>
void for_windows(Parallel& par, const PoolShape& s, const Start& start, const Body& body) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), out_block = out_h * out_w * kBlock;
  const auto span = [&s](index_t out, index_t stride, index_t pad, index_t kernel, index_t in) {
    return kAverage ? avg_span(out, stride, pad, kernel, in, s.count_include_pad)
                    : max_span(out, stride, pad, kernel, in);
  };
  for_blocks<kBlock>(par, s, window_cost(s), [&](index_t b) {
    start(b);
    for (index_t oh = 0; oh < out_h; ++oh) {
      const Span h = span(oh, s.stride_h, s.pad_h, s.kernel_h, s.height);
      for (index_t ow = 0; ow < out_w; ++ow) {
        const Span w = span(ow, s.stride_w, s.pad_w, s.kernel_w, s.width);
        body(b, h, w, b * out_block + (oh * out_w + ow) * kBlock);
      }
    }
  });
}

void no_start(index_t) {}

template <index_t kBlock>
void pool_max_forward_blocked_b(Parallel& par, const PoolShape& s, const float* x, float* y,
                                std::int32_t* mask) {
  const index_t in_block = s.height * s.width * kBlock;
  for_windows<kBlock, false>(par, s, no_start, [&](index_t b, Span h, Span w, index_t o) {
    max_window_blocked<kBlock>(x + b * in_block, s.width, h, w, y + o, mask + o);
  });
}

template <index_t kBlock>
void pool_max_backward_blocked_b(Parallel& par, const PoolShape& s, const float* dy,
                                 const std::int32_t* mask, float* dx) {
  const index_t in_plane = s.height * s.width, out_plane = s.out_h() * s.out_w();
  for_blocks<kBlock>(par, s, in_plane + out_plane, [&](index_t b) {
    float* grad = dx + b * in_plane * kBlock;
    const float* out_grad = dy + b * out_plane * kBlock;
    const std::int32_t* arg = mask + b * out_plane * kBlock;
    std::fill(grad, grad + in_plane * kBlock, 0.0f);
    for (index_t i = 0; i < out_plane * kBlock; ++i) {
      // A window with no input above -FLT_MAX has no argmax (-1) and passes nothing back.
      if (arg[i] >= 0 && arg[i] < in_plane) grad[arg[i] * kBlock + i % kBlock] += out_grad[i];
    }
  });
}

template <index_t kBlock>
void pool_avg_forward_blocked_b(Parallel& par, const PoolShape& s, const float* x, float* y) {
  const index_t in_block = s.height * s.width * kBlock;
  for_windows<kBlock, true>(par, s, no_start, [&](index_t b, Span h, Span w, index_t o) {
    const float* in = x + b * in_block;
    float total[kBlock] = {};
    for (index_t ih = h.start; ih < h.end; ++ih) {
      for (index_t iw = w.start; iw < w.end; ++iw) {
        const float* v = in + (ih * s.width + iw) * kBlock;
        for (index_t l = 0; l < kBlock; ++l)
          total[l] += v[l];
      }
    }
    const float size = static_cast<float>(h.size * w.size);
    for (index_t l = 0; l < kBlock; ++l)
      y[o + l] = total[l] / size;
  });
}

template <index_t kBlock>
void pool_avg_backward_blocked_b(Parallel& par, const PoolShape& s, const float* dy, float* dx) {
  const index_t in_block = s.height * s.width * kBlock;
  const auto start = [&](index_t b) {
    std::fill(dx + b * in_block, dx + (b + 1) * in_block, 0.0f);
  };
  for_windows<kBlock, true>(par, s, start, [&](index_t b, Span h, Span w, index_t o) {
    float* grad = dx + b * in_block;
    const float size = static_cast<float>(h.size * w.size);
    float share[kBlock];
    for (index_t l = 0; l < kBlock; ++l)
      share[l] = dy[o + l] / size;
    for (index_t ih = h.start; ih < h.end; ++ih) {
      for (index_t iw = w.start; iw < w.end; ++iw) {
        float* v = grad + (ih * s.width + iw) * kBlock;
        for (index_t l = 0; l < kBlock; ++l)
          v[l] += share[l];
      }
    }
  });
}

// ---- per-channel calls: rows of [inner][B] per (outer, block of B channels) -----------

template <index_t kBlock>
void scale_channels_blocked_b(Parallel& par, const AxisShape& s, const float* scale, const float* x,
                              float* y) {
  const index_t blocks = s.channels / kBlock, row = s.inner * kBlock;
  par.for_range(s.outer * blocks, row, [&](index_t first, index_t last) {
    for (index_t r = first; r < last; ++r) {
      const float* factors = scale + (r % blocks) * kBlock;
      const float* in = x + r * row;
      float* out = y + r * row;
      for (index_t i = 0; i < s.inner; ++i)
        for (index_t l = 0; l < kBlock; ++l)
          out[i * kBlock + l] = in[i * kBlock + l] * factors[l];
    }
  });
}

template <index_t kBlock>
void bias_forward_blocked_b(Parallel& par, const AxisShape& s, const float* bias, float* y) {
  const index_t blocks = s.channels / kBlock, row = s.inner * kBlock;
  par.for_range(s.outer * blocks, row, [&](index_t first, index_t last) {
    for (index_t r = first; r < last; ++r) {
      const float* b = bias + (r % blocks) * kBlock;
      float* out = y + r * row;
      for (index_t i = 0; i < s.inner; ++i)
        for (index_t l = 0; l < kBlock; ++l)
          out[i * kBlock + l] += b[l];
    }
  });
}

// dbias = beta * dbias + the sums of the runs, each run's address given by run(at, length)
// for its offset in the tensor (dy itself, or dy masked first into dx). Tasks own blocks of
// channels; each walks the outer rows in order (sums in double, as on NCHW), so the sums
// are the same on any thread count.
template <index_t kBlock, class Run>
void sum_blocked_runs(Parallel& par, const AxisShape& s, float beta, float* dbias,
                      const Run& run_at) {
  const index_t blocks = s.channels / kBlock, row = s.inner * kBlock;
  par.for_range(blocks, s.outer * row, [&](index_t first, index_t last) {
    for (index_t b = first; b < last; ++b) {
      double acc[kBlock] = {};
      for (index_t o = 0; o < s.outer; ++o) {
        const float* run = run_at((o * blocks + b) * row, row);
        for (index_t i = 0; i < s.inner; ++i)
          for (index_t l = 0; l < kBlock; ++l)
            acc[l] += static_cast<double>(run[i * kBlock + l]);
      }
      for (index_t l = 0; l < kBlock; ++l) {
        const float total = static_cast<float>(acc[l]);
        float& out = dbias[b * kBlock + l];
        out = beta == 0.0f ? total : beta * out + total;
      }
    }
  });
}

template <index_t kBlock>
void bias_backward_blocked_b(Parallel& par, const AxisShape& s, const float* dy, float beta,
                             float* dbias) {
  sum_blocked_runs<kBlock>(par, s, beta, dbias, [dy](index_t at, index_t) { return dy + at; });
}

// Each run masked first, then summed from the cache: bias_backward's bits on the masked dx.
template <index_t kBlock>
void relu_backward_bias_blocked_b(Parallel& par, const AxisShape& s, float slope, const float* y,
                                  const float* dy, float* dx, float* dbias) {
  sum_blocked_runs<kBlock>(par, s, 1.0f, dbias, [&](index_t at, index_t length) {
    relu_backward_run(length, slope, y + at, dy + at, dx + at);
    return static_cast<const float*>(dx + at);
  });
}

// Runs body(std::integral_constant<index_t, B>) for the layout's block B.
template <class Body>
void with_block(Layout layout, const Body& body) {
  if (layout == Layout::nchw8c) return body(std::integral_constant<index_t, 8>());
  body(std::integral_constant<index_t, 16>());
}

}  // namespace

void pool_max_forward_blocked(Parallel& par, const PoolShape& s, const float* x, float* y,
                              std::int32_t* mask) {
  with_block(s.layout,
             [&](auto b) { pool_max_forward_blocked_b<decltype(b)::value>(par, s, x, y, mask); });
}

void pool_max_backward_blocked(Parallel& par, const PoolShape& s, const float* dy,
                               const std::int32_t* mask, float* dx) {
  with_block(s.layout, [&](auto b) {
    pool_max_backward_blocked_b<decltype(b)::value>(par, s, dy, mask, dx);
  });
}

void pool_avg_forward_blocked(Parallel& par, const PoolShape& s, const float* x, float* y) {
  with_block(s.layout,
             [&](auto b) { pool_avg_forward_blocked_b<decltype(b)::value>(par, s, x, y); });
}

void pool_avg_backward_blocked(Parallel& par, const PoolShape& s, const float* dy, float* dx) {
  with_block(s.layout,
             [&](auto b) { pool_avg_backward_blocked_b<decltype(b)::value>(par, s, dy, dx); });
}

void scale_channels_blocked(Parallel& par, const AxisShape& s, const float* scale, const float* x,
                            float* y) {
  with_block(s.layout,
             [&](auto b) { scale_channels_blocked_b<decltype(b)::value>(par, s, scale, x, y); });
}

void bias_forward_blocked(Parallel& par, const AxisShape& s, const float* bias, float* y) {
  with_block(s.layout,
             [&](auto b) { bias_forward_blocked_b<decltype(b)::value>(par, s, bias, y); });
}

void bias_backward_blocked(Parallel& par, const AxisShape& s, const float* dy, float beta,
                           float* dbias) {
  with_block(s.layout,
             [&](auto b) { bias_backward_blocked_b<decltype(b)::value>(par, s, dy, beta, dbias); });
}

void relu_backward_bias_blocked(Parallel& par, const AxisShape& s, float slope, const float* y,
                                const float* dy, float* dx, float* dbias) {
  with_block(s.layout, [&](auto b) {
    relu_backward_bias_blocked_b<decltype(b)::value>(par, s, slope, y, dy, dx, dbias);
  });
}

}  // namespace hn::detail::cpu
