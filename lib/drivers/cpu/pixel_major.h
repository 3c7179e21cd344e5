// Transposes between NCHW planes and pixel-major buffers ([pixel][16 channels]) for the CPU
// driver's own kernels that run their vectors across channels on NCHW operands
// (conv_depthwise.cpp, conv_pointwise_plain.cpp): 16 x 16 tiles with AVX-512 shuffles
// where the build has them, element by element elsewhere.
#pragma once

#include "lib/core/shapes.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace hn::detail::cpu {

// Channels per pixel-major row.
constexpr index_t kPixelMajorLanes = 16;

#if defined(__AVX512F__)
// r[i] becomes column i of the 16 x 16 matrix whose rows r holds. (The masked forms with
// every lane set: the plain intrinsics start from _mm512_undefined_ps, which GCC 12 reports
// as maybe uninitialised where they are inlined.)
inline void transpose16(__m512 r[16]) {
  constexpr __mmask16 all = 0xffff;
  constexpr __mmask8 all8 = 0xff;
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = r[2 * i], b = r[2 * i + 1];
    t[2 * i] = _mm512_mask_unpacklo_ps(a, all, a, b);
    t[2 * i + 1] = _mm512_mask_unpackhi_ps(a, all, a, b);
  }
  const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
  for (int i = 0; i < 4; ++i) {
    const __m512d a = pd(t[4 * i]), b = pd(t[4 * i + 2]);
    const __m512d c = pd(t[4 * i + 1]), d = pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(a, all8, a, b));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(a, all8, a, b));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(c, all8, c, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(c, all8, c, d));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      const __m512 a = r[8 * i + j], b = r[8 * i + j + 4];
      t[8 * i + j] = _mm512_mask_shuffle_f32x4(a, all, a, b, 0x88);
      t[8 * i + j + 4] = _mm512_mask_shuffle_f32x4(a, all, a, b, 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    const __m512 a = t[j], b = t[j + 8];
    r[j] = _mm512_mask_shuffle_f32x4(a, all, a, b, 0x88);
    r[j + 8] = _mm512_mask_shuffle_f32x4(a, all, a, b, 0xdd);
  }
}

// Pixels p0 .. p0 + 15 of `lanes` NCHW planes (lane l at planes + l * plane; lanes from
// `lanes` on zero) as 16 pixel-major rows: r[i] is pixel p0 + i.
inline void load_pixels(const float* planes, index_t plane, index_t p0, index_t lanes,
                        __m512 r[16]) {
  for (index_t l = 0; l < 16; ++l)
    r[l] = l < lanes ? _mm512_loadu_ps(planes + l * plane + p0) : _mm512_setzero_ps();
  transpose16(r);
}

// Where pixels p0 .. p0 + 15 of an image `width` pixels wide lie in a padded one of `padded_width`
// columns (pixel (h, w) at (h + top) * padded_width + w + left): at[i], in pixels. They run
// along a row and on into the next ones.
inline void padded_pixels(index_t p0, index_t width, index_t top, index_t left,
                          index_t padded_width, index_t at[16]) {
  index_t w = p0 % width;
  index_t offset = (p0 / width + top) * padded_width + w + left;
  for (index_t i = 0; i < 16; ++i) {
    at[i] = offset++;
    if (++w == width) {
      w = 0;
      offset += padded_width - width;
    }
  }
}

// The reverse: 16 pixel-major rows (r[i], pixel p0 + i) into the first `lanes` planes.
inline void store_pixels(__m512 r[16], index_t plane, index_t p0, index_t lanes, float* planes) {
  transpose16(r);
  for (index_t l = 0; l < lanes; ++l)
    _mm512_storeu_ps(planes + l * plane + p0, r[l]);
}
#endif

// `lanes` (<= 16) NCHW planes of `plane` pixels (lane l at planes + l * plane) into the
// pixel-major rows out + p * stride (16 floats each, stride >= 16); lanes from `lanes` on
// are zero.
inline void to_pixel_major(const float* planes, index_t plane, index_t lanes, float* out,
                           index_t stride = kPixelMajorLanes) {
  constexpr index_t L = kPixelMajorLanes;
  index_t p0 = 0;
#if defined(__AVX512F__)
  for (; p0 + L <= plane; p0 += L) {
    __m512 r[L];
    load_pixels(planes, plane, p0, lanes, r);
    for (index_t i = 0; i < L; ++i)
      _mm512_storeu_ps(out + (p0 + i) * stride, r[i]);
  }
#endif
  for (index_t p = p0; p < plane; ++p) {
    for (index_t l = 0; l < L; ++l)
      out[p * stride + l] = l < lanes ? planes[l * plane + p] : 0.0f;
  }
}

// The same into a padded pixel-major image of `padded_width` columns: pixel (h, w) of the
// height x width planes at out + ((h + top) * padded_width + w + left) * 16. The margins are
// not written.
inline void to_pixel_major_padded(const float* planes, index_t height, index_t width, index_t lanes,
                                  float* out, index_t top, index_t left, index_t padded_width) {
  constexpr index_t L = kPixelMajorLanes;
  const index_t plane = height * width;
  index_t p0 = 0;
#if defined(__AVX512F__)
  for (; p0 + L <= plane; p0 += L) {
    __m512 r[L];
    load_pixels(planes, plane, p0, lanes, r);
    index_t at[L];
    padded_pixels(p0, width, top, left, padded_width, at);
    for (index_t i = 0; i < L; ++i)
      _mm512_storeu_ps(out + at[i] * L, r[i]);
  }
#endif
  for (index_t p = p0; p < plane; ++p) {
    float* to = out + ((p / width + top) * padded_width + p % width + left) * L;
    for (index_t l = 0; l < L; ++l)
      to[l] = l < lanes ? planes[l * plane + p] : 0.0f;
  }
}

// The reverse for the first `lanes` lanes: pixel-major rows (in + p * 16) into NCHW planes.
inline void from_pixel_major(const float* in, index_t plane, index_t lanes, float* planes) {
  constexpr index_t L = kPixelMajorLanes;
  index_t p0 = 0;
#if defined(__AVX512F__)
  for (; p0 + L <= plane; p0 += L) {
    __m512 r[L];
    for (index_t i = 0; i < L; ++i)
      r[i] = _mm512_loadu_ps(in + (p0 + i) * L);
    store_pixels(r, plane, p0, lanes, planes);
  }
#endif
  for (index_t l = 0; l < lanes; ++l) {
    for (index_t p = p0; p < plane; ++p)
      planes[l * plane + p] = in[p * L + l];
  }
}

// The reverse of to_pixel_major_padded for the first `lanes` lanes: the height x width pixels
// of a padded pixel-major image (pixel (h, w) at in + ((h + top) * padded_width + w + left) *
// 16) into NCHW planes.
inline void from_pixel_major_padded(const float* in, index_t height, index_t width, index_t lanes,
                                    float* planes, index_t top, index_t left,
                                    index_t padded_width) {
  constexpr index_t L = kPixelMajorLanes;
  const index_t plane = height * width;
  index_t p0 = 0;
#if defined(__AVX512F__)
  for (; p0 + L <= plane; p0 += L) {
    __m512 r[L];
    index_t at[L];
    padded_pixels(p0, width, top, left, padded_width, at);
    for (index_t i = 0; i < L; ++i)
      r[i] = _mm512_loadu_ps(in + at[i] * L);
    store_pixels(r, plane, p0, lanes, planes);
  }
#endif
  for (index_t l = 0; l < lanes; ++l) {
    for (index_t p = p0; p < plane; ++p)
      planes[l * plane + p] = in[((p / width + top) * padded_width + p % width + left) * L + l];
  }
}

}  // namespace hn::detail::cpu
