// Winograd F(4x4, 3x3) on the CPU (conv_winograd.h). With the transforms of Lavin and Gray
// (interpolation points 0, 1, -1, 2, -2 and infinity)
//   y tile (4x4) = A^T [ (G g G^T) . (B^T d B) ] A      for a 6x6 input tile d,
// summed over input channels. Per chunk of tiles:
//   1. V[p][t][c] = (B^T d B)[p] for every tile t, input channel c and point p (36 points);
//   2. M[p][t][o] = sum_c V[p][t][c] U[p][c][o], one GEMM per point (micro_kernel),
//      where U[p][c][o] = (G g G^T)[p] of output channel o's kernel for input channel c;
//   3. y tile = A^T M A, plus the bias and the activation.
// The data gradient is the same convolution of dy with each kernel turned by 180 degrees
// and input and output channels exchanged, padded by 2 - pad. The weight gradient is the
// adjoint of the forward in g:
//   dg = G^T [ sum over tiles of (B^T d B) . (A dy A^T) ] G,
// with the tile sum one GEMM per point (reduction over the tiles).
//
// Channels go in vectors of B lanes (8: one AVX2 register; 16: one AVX-512 register, the
// block of nChw8c / nChw16c, where a pixel's B channels are one load). GCC's vector types
// compile each to the build's instruction set (-march=native). The per-point products run
// on a register-blocked kernel of our own (micro_kernel) on U packed by panels of outputs
// once per weights version: 36 sgemm calls per chunk spent as long packing and starting as
// computing (ResNet-50's 3x3 layers at batch 32 on a 2-core AVX2 EPYC, nChw8c, forward:
// 47, 33, 32 and 56 ms with them, 33, 22, 36 and 42 ms with this; oneDNN's direct kernel
// 42-51, 43-53, 51-58 and 66-69 ms in the same runs).
#include "lib/drivers/cpu/conv_winograd.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "lib/core/check.h"
#include "lib/drivers/cpu/parallel.h"
#include "lib/drivers/cpu/simd.h"

namespace hn::detail::cpu {

namespace {

constexpr int kAlpha = 6;    // input tile side
constexpr int kPoints = 36;  // kAlpha * kAlpha
constexpr int kTile = 4;     // output tile side

// The transformed tiles of one chunk (V and M) take at most about this many bytes (in L3),
// unless that leaves fewer than kMinChunkTiles tiles: the products' rows, each point's U
// (up to 1 MB for 512 channels each way) read once per chunk.
constexpr std::size_t kChunkBytes = std::size_t{8} << 20;
constexpr index_t kMinChunkTiles = 96;

// An image tensor in one of the layouts (shapes.h), or one group's channels of one: `data`
// at the group's first channel, `channels` its count, `total` the tensor's (each image's
// stride). In a blocked layout a group is a view only when its channels are whole blocks.
struct View {
  const float* data;
  Layout layout;
  index_t channels, height, width;
  index_t total;

  index_t offset(index_t n, index_t c, index_t h, index_t w) const {
    return layout_offset(layout, total, height, width, n, c, h, w);
  }
};

// Channels [c0, c0 + B) of image n of a View: pixel (h, w), lane l at
// base[h * row + w * pixel + l * lane]. Blocked layouts with a block of at least B hold
// the B lanes together (lane 1: one vector load); NCHW holds them a plane apart.
struct Plane {
  const float* base;
  index_t row, pixel, lane, lanes;  // lanes: how many of the B exist (channels past the end)
  bool contiguous;
};

template <int B>
Plane plane_of(const View& t, index_t n, index_t c0) {
  const index_t block = layout_block(t.layout);
  if (block >= B) {
    return {t.data + t.offset(n, c0, 0, 0), t.width * block, block, 1, B, true};
  }
  // NCHW (a block smaller than B would be a mix of nChw8c and nChw16c, which
  // check_supported refused before any parallel loop).
  return {t.data + t.offset(n, c0, 0, 0),        t.width, 1, t.height * t.width,
          std::min<index_t>(B, t.channels - c0), false};
}

// The plane of channels [c0, c0 + B) from that of [0, B): blocks of B channels are B
// planes apart in NCHW and one B-blocked plane apart in nChw(B)c alike.
template <int B>
Plane plane_at(const Plane& first, const View& t, index_t c0) {
  Plane pl = first;
  pl.base += c0 * t.height * t.width;
  if (!pl.contiguous) pl.lanes = std::min<index_t>(B, t.channels - c0);
  return pl;
}

// Loads pixel (h, w) of `pl` into v, zero outside the image [0, height) x [0, width).
template <int B, class V>
inline void load_pixel(const Plane& pl, index_t height, index_t width, index_t h, index_t w, V& v) {
  v = V{};
  if (h < 0 || h >= height || w < 0 || w >= width) return;
  const float* at = pl.base + h * pl.row + w * pl.pixel;
  if (pl.contiguous) {
    std::memcpy(&v, at, sizeof v);
    return;
  }
  for (index_t l = 0; l < pl.lanes; ++l)
    v[l] = at[l * pl.lane];
}

// Loads the rows x cols pixels from (h0, w0) into d (row-major, `cols` per row), zero
// outside the image: one vector load each where the block lies inside a blocked image.
template <int B, class V>
inline void load_block(const Plane& pl, index_t height, index_t width, index_t h0, index_t w0,
                       int rows, int cols, V* d) {
  if (pl.contiguous && h0 >= 0 && w0 >= 0 && h0 + rows <= height && w0 + cols <= width) {
    const float* at = pl.base + h0 * pl.row + w0 * pl.pixel;
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols; ++j)
        std::memcpy(&d[i * cols + j], at + i * pl.row + j * pl.pixel, sizeof(V));
    }
    return;
  }
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j)
      load_pixel<B>(pl, height, width, h0 + i, w0 + j, d[i * cols + j]);
  }
}

// The 1-D transforms on 6 (or 4) values at stride `s`, into `r` at stride `rs`.
template <class V>
inline void bt6(const V* d, int s, V* r, int rs) {  // B^T d
  const V d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
  r[0] = 4.0f * d0 - 5.0f * d2 + d4;
  r[rs] = d4 + d3 - 4.0f * (d1 + d2);
  r[2 * rs] = d4 - d3 + 4.0f * (d1 - d2);
  r[3 * rs] = d4 - d2 + 2.0f * (d3 - d1);
  r[4 * rs] = d4 - d2 - 2.0f * (d3 - d1);
  r[5 * rs] = 4.0f * d1 - 5.0f * d3 + d5;
}

template <class V>
inline void at6(const V* m, int s, V* r, int rs) {  // A^T m: 6 -> 4
  const V m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
  const V a = m1 + m2, b = m1 - m2, c = m3 + m4, e = m3 - m4;
  r[0] = m0 + a + c;
  r[rs] = b + 2.0f * e;
  r[2 * rs] = a + 4.0f * c;
  r[3 * rs] = b + 8.0f * e + m5;
}

template <class V>
inline void a4(const V* e, int s, V* r, int rs) {  // A e: 4 -> 6
  const V e0 = e[0], e1 = e[s], e2 = e[2 * s], e3 = e[3 * s];
  const V even = e0 + 4.0f * e2, odd = 2.0f * e1 + 8.0f * e3;
  r[0] = e0;
  r[rs] = e0 + e1 + e2 + e3;
  r[2 * rs] = e0 - e1 + e2 - e3;
  r[3 * rs] = even + odd;
  r[4 * rs] = even - odd;
  r[5 * rs] = e3;
}

constexpr float kG[kAlpha][3] = {{0.25f, 0.0f, 0.0f},
                                 {-1.0f / 6, -1.0f / 6, -1.0f / 6},
                                 {-1.0f / 6, 1.0f / 6, -1.0f / 6},
                                 {1.0f / 24, 1.0f / 12, 1.0f / 6},
                                 {1.0f / 24, -1.0f / 12, 1.0f / 6},
                                 {0.0f, 0.0f, 1.0f}};

// The tiles of a convolution with a 3x3 kernel, stride 1, from `in` (padded by pad_h,
// pad_w) to an output of out_h x out_w: tile t of image n covers output rows
// [4 th, 4 th + 4) and columns [4 tw, 4 tw + 4), t = (n * tiles_h + th) * tiles_w + tw.
struct Tiling {
  index_t out_h, out_w, pad_h, pad_w, tiles_h, tiles_w;
  index_t per_image() const { return tiles_h * tiles_w; }
  void locate(index_t t, index_t& n, index_t& h0, index_t& w0) const {
    n = t / per_image();
    const index_t r = t % per_image();
    h0 = r / tiles_w * kTile;
    w0 = r % tiles_w * kTile;
  }
};

Tiling tiling(index_t out_h, index_t out_w, index_t pad_h, index_t pad_w) {
  return {out_h, out_w, pad_h, pad_w, (out_h + kTile - 1) / kTile, (out_w + kTile - 1) / kTile};
}

index_t round_up(index_t n, index_t b) {
  return (n + b - 1) / b * b;
}

// The transformed tiles of a chunk lie as [point][tile][channel], rows `ld` floats long (the
// channels rounded up to B): each point's matrix in order for its product (laid out
// [tile][point][channel], a point's rows 36 rows apart, the products ran at 0.6-0.7 of
// the speed). Tiles are ordered image, tile row, tile column; the transforms take a tile's
// channel blocks one after the other, so that rows are written whole.

// Phase 1: out[p][t - t0][c] for tiles [t0, t1) of `in`, channels in blocks of B: each
// tile's Side x Side pixels from (h0 - pad_h, w0 - pad_w), zero outside the image, through
// `pass` (a 1-D transform from Side values to 6), first down the columns, then along the
// rows. The input transform (6x6 tiles, B^T) and the weight gradient's transform of dy
// (4x4 tiles, A, no padding) alike.
template <int B, int Side, class Pass>
void tile_transform(Parallel& par, const View& in, const Tiling& tl, index_t pad_h, index_t pad_w,
                    index_t t0, index_t t1, index_t ld, float* out, const Pass& pass) {
  using V = typename Lanes<B>::type;
  const index_t blocks = ld / B, tiles = t1 - t0;
  // A tile's channel blocks one after the other: its rows are written whole (cache lines
  // half written by far-apart items were read back and written again).
  par.for_range(tiles, blocks * 15 * Side * B, [&](index_t first, index_t last) {
    for (index_t t = t0 + first; t < t0 + last; ++t) {
      index_t n, h0, w0;
      tl.locate(t, n, h0, w0);
      const Plane plane = plane_of<B>(in, n, 0);
      for (index_t c0 = 0; c0 < ld; c0 += B) {
        V d[Side * Side], r[kAlpha * Side], o[kPoints];
        load_block<B>(plane_at<B>(plane, in, c0), in.height, in.width, h0 - pad_h, w0 - pad_w, Side,
                      Side, d);
        for (int j = 0; j < Side; ++j)
          pass(d + j, Side, r + j, Side);  // columns: Side -> 6 rows
        for (int i = 0; i < kAlpha; ++i)
          pass(r + i * Side, 1, o + i * kAlpha, 1);  // rows: Side -> 6
        float* at = out + (t - t0) * ld + c0;
        for (int p = 0; p < kPoints; ++p)
          std::memcpy(at + p * tiles * ld, &o[p], sizeof(V));
      }
    }
  });
}

// Phase 1: V[p][t - t0][c] = (B^T d B)[p] of the 6x6 input tiles.
template <int B>
void input_transform(Parallel& par, const View& in, const Tiling& tl, index_t t0, index_t t1,
                     index_t ld, float* v) {
  using V = typename Lanes<B>::type;
  tile_transform<B, kAlpha>(
      par, in, tl, tl.pad_h, tl.pad_w, t0, t1, ld, v,
      [](const V* d, int step, V* r, int r_step) { bt6(d, step, r, r_step); });
}

// Phase 1 of the weight gradient for dy: E[p][t - t0][o] = (A e A^T)[p] of dy's 4x4 tiles.
template <int B>
void gradient_transform(Parallel& par, const View& dy, const Tiling& tl, index_t t0, index_t t1,
                        index_t ld, float* e) {
  using V = typename Lanes<B>::type;
  tile_transform<B, kTile>(par, dy, tl, 0, 0, t0, t1, ld, e,
                           [](const V* d, int step, V* r, int r_step) { a4(d, step, r, r_step); });
}

struct Epilogue {
  const float* bias = nullptr;
  Activation activation;
};

// Phase 3: out's tiles [t0, t1) = A^T M A (+ bias, activation), M[p][t - t0][o] in rows of
// `ld` floats.
template <int B>
void output_transform(Parallel& par, const float* m, index_t ld, const Tiling& tl, index_t t0,
                      index_t t1, const Epilogue& epilogue, const View& out) {
  using V = typename Lanes<B>::type;
  const index_t channels = out.channels;
  const index_t blocks = round_up(channels, B) / B, tiles = t1 - t0;
  const Activation& act = epilogue.activation;
  par.for_range(tiles, blocks * 50 * B, [&](index_t first, index_t last) {
    for (index_t t = t0 + first; t < t0 + last; ++t) {
      index_t n, h0, w0;
      tl.locate(t, n, h0, w0);
      const Plane plane = plane_of<B>(out, n, 0);
      const int rows = static_cast<int>(std::min<index_t>(kTile, tl.out_h - h0));
      const int cols = static_cast<int>(std::min<index_t>(kTile, tl.out_w - w0));
      for (index_t c0 = 0; c0 < blocks * B; c0 += B) {
        V d[kPoints], r[kAlpha * kTile], y[kTile * kTile];
        const float* at = m + (t - t0) * ld + c0;
        for (int p = 0; p < kPoints; ++p)
          std::memcpy(&d[p], at + p * tiles * ld, sizeof(V));
        for (int j = 0; j < kAlpha; ++j)
          at6(d + j, kAlpha, r + j, kAlpha);  // columns: 6 -> 4 rows (r is 4 x 6)
        for (int i = 0; i < kTile; ++i)
          at6(r + i * kAlpha, 1, y + i * kTile, 1);  // rows: 6 -> 4
        V bias{};
        if (epilogue.bias != nullptr) {
          for (int l = 0; l < B; ++l)
            bias[l] = c0 + l < channels ? epilogue.bias[c0 + l] : 0.0f;
        }
        const Plane pl = plane_at<B>(plane, out, c0);
        float* base = const_cast<float*>(pl.base);
        for (int i = 0; i < rows; ++i) {
          for (int j = 0; j < cols; ++j) {
            V value = y[i * kTile + j] + bias;
            activate(value, act);
            float* to = base + (h0 + i) * pl.row + (w0 + j) * pl.pixel;
            if (pl.contiguous) {
              std::memcpy(to, &value, sizeof value);
            } else {
              for (index_t l = 0; l < pl.lanes; ++l)
                to[l * pl.lane] = value[l];
            }
          }
        }
      }
    }
  });
}

// The per-point products, on a register-blocked kernel of our own instead of sgemm calls
// (36 small GEMMs per chunk: the calls' packing and start-up took as long as their
// arithmetic). C[r][o] (+)= sum_k A(r, k) B[k][o] for rows [0, R) and a panel of NV
// vectors of outputs: R x NV accumulators (6 x 2 on AVX2: 12 of its 16 registers), each k
// one load of B per vector and one broadcast of A per row. A(r, k) is a[r * a_row + k * a_k]
// (the forward's V rows, or the weight gradient's V read transposed), B row k is at
// b + k * b_k. The sums run over k in order: the same whatever the thread count.
template <int B, int R, int NV>
void micro_kernel(const float* a, index_t a_row, index_t a_k, const float* b, index_t b_k,
                  index_t k, float* c, index_t ldc, bool accumulate) {
  using V = typename Lanes<B>::type;
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) {
      if (accumulate) {
        std::memcpy(&acc[r][j], c + r * ldc + j * B, sizeof(V));
      } else {
        acc[r][j] = V{};
      }
    }
  }
  for (index_t i = 0; i < k; ++i) {
    V bv[NV];
    for (int j = 0; j < NV; ++j)
      std::memcpy(&bv[j], b + i * b_k + j * B, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const float av = a[r * a_row + i * a_k];
      for (int j = 0; j < NV; ++j)
        acc[r][j] += av * bv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j)
      std::memcpy(c + r * ldc + j * B, &acc[r][j], sizeof(V));
  }
}

constexpr int kRows = 6;  // rows of the kernel's block

template <int B, int NV>
void micro_rows(int rows, const float* a, index_t a_row, index_t a_k, const float* b, index_t b_k,
                index_t k, float* c, index_t ldc, bool accumulate) {
  switch (rows) {
    case 6:
      return micro_kernel<B, 6, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
    case 5:
      return micro_kernel<B, 5, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
    case 4:
      return micro_kernel<B, 4, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
    case 3:
      return micro_kernel<B, 3, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
    case 2:
      return micro_kernel<B, 2, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
    default:
      return micro_kernel<B, 1, NV>(a, a_row, a_k, b, b_k, k, c, ldc, accumulate);
  }
}

// Outputs [o0, o0 + width) of a row of `op` outputs form panel o0 / (2B): 2B wide but the
// last, which may be B.
index_t panel_width(index_t o0, index_t op, index_t b) {
  return std::min(2 * b, op - o0);
}

// The panels one call of group_product takes: their B operands (k x 2B floats each) about
// kGroupBytes together, kept in L2 while every block of rows passes them (each block of A,
// kRows x k, stays in L1 across the group's panels).
constexpr std::size_t kGroupBytes = std::size_t{128} << 10;

index_t group_panels(index_t k, index_t b) {
  return std::max<index_t>(
      1, static_cast<index_t>(kGroupBytes / sizeof(float) / static_cast<std::size_t>(k * 2 * b)));
}

// C[m][o0 .. o1) (+)= A B over the panels from o0 to o1 (each starting at a multiple of
// 2B): B operand of panel o at b + o * b_panel, its rows b_k apart (b_k 0: packed, rows
// the panel's width apart), C's at c + o.
template <int B>
void group_product(index_t m, index_t o0, index_t o1, index_t op, const float* a, index_t a_row,
                   index_t a_k, const float* b, index_t b_panel, index_t b_k, index_t k, float* c,
                   index_t ldc, bool accumulate) {
  for (index_t r0 = 0; r0 < m; r0 += kRows) {
    const int rows = static_cast<int>(std::min<index_t>(kRows, m - r0));
    for (index_t o = o0; o < o1; o += 2 * B) {
      const float* b_o = b + o * b_panel;
      float* c_o = c + r0 * ldc + o;
      const index_t width = panel_width(o, op, B);
      const index_t row = b_k != 0 ? b_k : width;
      if (width == 2 * B) {
        micro_rows<B, 2>(rows, a + r0 * a_row, a_row, a_k, b_o, row, k, c_o, ldc, accumulate);
      } else {
        micro_rows<B, 1>(rows, a + r0 * a_row, a_row, a_k, b_o, row, k, c_o, ldc, accumulate);
      }
    }
  }
}

// C[cp][o0 .. o1) (+)= A^T E for A (k x cp, rows a_k apart) and E (k x op, rows e_k apart),
// the weight gradient's reduction over the tiles. Both are packed first so that the
// kernel reads them in order: A's columns by kRows ([block][k][kRows]), each panel of E as
// [k][width] (read in place, every k of the kernel touched two new cache lines in rows up
// to 36 x 512 floats apart: half the forward's speed).
template <int B>
void transposed_product(index_t k, index_t cp, index_t op, index_t o0, index_t o1, const float* a,
                        index_t a_k, const float* e, index_t e_k, float* c, bool accumulate) {
  thread_local std::vector<float> a_packed, e_packed;
  const index_t blocks = (cp + kRows - 1) / kRows;
  a_packed.resize(static_cast<std::size_t>(blocks * k * kRows));
  e_packed.resize(static_cast<std::size_t>(k * (o1 - o0)));
  // Row by row (each read once, in order): A's blocks of columns, E's panels.
  for (index_t i = 0; i < k; ++i) {
    const float* row = a + i * a_k;
    for (index_t block = 0; block < blocks; ++block) {
      float* to = a_packed.data() + (block * k + i) * kRows;
      const index_t c0 = block * kRows, rows = std::min<index_t>(kRows, cp - c0);
      for (index_t r = 0; r < kRows; ++r)
        to[r] = r < rows ? row[c0 + r] : 0.0f;
    }
    for (index_t o = o0; o < o1; o += 2 * B) {
      const index_t width = panel_width(o, op, B);
      std::memcpy(e_packed.data() + (o - o0) * k + i * width, e + i * e_k + o,
                  static_cast<std::size_t>(width) * sizeof(float));
    }
  }
  for (index_t o = o0; o < o1; o += 2 * B) {
    const index_t width = panel_width(o, op, B);
    const float* panel = e_packed.data() + (o - o0) * k;
    for (index_t block = 0; block < blocks; ++block) {
      const index_t c0 = block * kRows;
      const int rows = static_cast<int>(std::min<index_t>(kRows, cp - c0));
      const float* a_block = a_packed.data() + block * k * kRows;
      if (width == 2 * B) {
        micro_rows<B, 2>(rows, a_block, 1, kRows, panel, width, k, c + c0 * op + o, op, accumulate);
      } else {
        micro_rows<B, 1>(rows, a_block, 1, kRows, panel, width, k, c + c0 * op + o, op, accumulate);
      }
    }
  }
}

// The chunk of tiles one pass transforms, for `floats_per_tile` floats of V and M per tile.
index_t chunk_tiles(index_t total, index_t floats_per_tile) {
  const auto fit =
      static_cast<index_t>(kChunkBytes / sizeof(float) / static_cast<std::size_t>(floats_per_tile));
  return std::min(total, std::max(fit, kMinChunkTiles));
}

// The block (lanes per vector) for operands in these layouts: the blocked layout's block
// when either is blocked, else this build's vector width.
index_t lanes_for(Layout a, Layout b) {
  const index_t block = std::max(layout_block(a), layout_block(b));
  if (block > 1) return block;
#ifdef __AVX512F__
  return 16;
#else
  return 8;
#endif
}

// A 3x3 convolution of `batch` images from `in` to `out` (the tiling's out_h x out_w), its
// kernels transformed to u ([36][round_up(in channels, B)][round_up(out channels, B)]).
template <int B>
void convolve(Parallel& par, const View& in, index_t batch, const Tiling& tl, const float* u,
              const Epilogue& epilogue, const View& out, std::vector<float>& v,
              std::vector<float>& m) {
  const index_t cp = round_up(in.channels, B), kp = round_up(out.channels, B);
  const index_t total = batch * tl.per_image();
  const index_t chunk = chunk_tiles(total, kPoints * (cp + kp));
  v.resize(static_cast<std::size_t>(kPoints * chunk * cp));
  m.resize(static_cast<std::size_t>(kPoints * chunk * kp));
  for (index_t t0 = 0; t0 < total; t0 += chunk) {
    const index_t t1 = std::min(total, t0 + chunk), tiles = t1 - t0;
    input_transform<B>(par, in, tl, t0, t1, cp, v.data());
    // Per point and group of panels of outputs (u packed by panels, transform_weights: panel
    // o's [cp][width] at u + p * cp * kp + o * cp).
    const index_t step = group_panels(cp, B) * 2 * B, groups = (kp + step - 1) / step;
    par.for_range(kPoints * groups, tiles * cp * step / 4, [&](index_t first, index_t last) {
      for (index_t item = first; item < last; ++item) {
        const index_t p = item / groups, o0 = item % groups * step;
        const index_t o1 = std::min(kp, o0 + step);
        group_product<B>(tiles, o0, o1, kp, v.data() + p * tiles * cp, cp, 1, u + p * cp * kp, cp,
                         0, cp, m.data() + p * tiles * kp, kp, false);
      }
    });
    output_transform<B>(par, m.data(), kp, tl, t0, t1, epilogue, out);
  }
}

// dweights += the weight gradient, from x (`in`) and dy, s receiving the per-point sums
// S[p][c][o] = sum over tiles of V[p][t][c] E[p][t][o].
template <int B>
void weight_gradient(Parallel& par, const View& in, const View& dy, index_t batch, const Tiling& tl,
                     float* dweights, std::vector<float>& v, std::vector<float>& e,
                     std::vector<float>& s) {
  const index_t cp = round_up(in.channels, B), kp = round_up(dy.channels, B);
  const index_t total = batch * tl.per_image();
  if (total == 0) return;  // nothing to add (s would hold an earlier call's sums)
  const index_t chunk = chunk_tiles(total, kPoints * (cp + kp));
  v.resize(static_cast<std::size_t>(kPoints * chunk * cp));
  e.resize(static_cast<std::size_t>(kPoints * chunk * kp));
  s.resize(static_cast<std::size_t>(kPoints * cp * kp));
  for (index_t t0 = 0; t0 < total; t0 += chunk) {
    const index_t t1 = std::min(total, t0 + chunk), tiles = t1 - t0;
    input_transform<B>(par, in, tl, t0, t1, cp, v.data());
    gradient_transform<B>(par, dy, tl, t0, t1, kp, e.data());
    // S[p] (cp x kp) += V[p]^T E[p], per point and group of panels of outputs.
    const index_t step = group_panels(tiles, B) * 2 * B, groups = (kp + step - 1) / step;
    par.for_range(kPoints * groups, tiles * cp * step / 4, [&](index_t first, index_t last) {
      for (index_t item = first; item < last; ++item) {
        const index_t p = item / groups, o0 = item % groups * step;
        transposed_product<B>(tiles, cp, kp, o0, std::min(kp, o0 + step), v.data() + p * tiles * cp,
                              cp, e.data() + p * tiles * kp, kp, s.data() + p * cp * kp, t0 > 0);
      }
    });
  }
  // dg = G^T S G per (output, input) channel pair.
  const index_t channels = in.channels, outputs = dy.channels;
  par.for_range(outputs, channels * 200, [&](index_t first, index_t last) {
    for (index_t o = first; o < last; ++o) {
      for (index_t c = 0; c < channels; ++c) {
        float sum[kPoints], half[3][kAlpha];
        for (int p = 0; p < kPoints; ++p)
          sum[p] = s[static_cast<std::size_t>((p * cp + c) * kp + o)];
        for (int r = 0; r < 3; ++r) {
          for (int b = 0; b < kAlpha; ++b) {
            float acc = 0.0f;
            for (int a = 0; a < kAlpha; ++a)
              acc += kG[a][r] * sum[a * kAlpha + b];
            half[r][b] = acc;
          }
        }
        float* dw = dweights + (o * channels + c) * 9;
        for (int r = 0; r < 3; ++r) {
          for (int q = 0; q < 3; ++q) {
            float acc = 0.0f;
            for (int b = 0; b < kAlpha; ++b)
              acc += half[r][b] * kG[b][q];
            dw[r * 3 + q] += acc;
          }
        }
      }
    }
  });
}

// dbias[o] += the sum of dy's channel o over the images and pixels, in that order.
void bias_gradient(Parallel& par, const View& dy, index_t batch, float* dbias) {
  const index_t plane = dy.height * dy.width;
  par.for_range(dy.channels, batch * plane, [&](index_t first, index_t last) {
    for (index_t o = first; o < last; ++o) {
      float sum = 0.0f;
      for (index_t n = 0; n < batch; ++n) {
        for (index_t h = 0; h < dy.height; ++h) {
          for (index_t w = 0; w < dy.width; ++w)
            sum += dy.data[dy.offset(n, o, h, w)];
        }
      }
      dbias[o] += sum;
    }
  });
}

// u[p] = (G g G^T)[p] for the kernel `kernel(o, i, g)` (9 floats, row-major) of each output
// o and input i, zero in the padding (i >= inputs, o >= outputs), packed for the products:
// point p's [ip][op] matrix as panels of 2B outputs (B for the last of an odd count), panel
// o0's [ip][width] at u + p * ip * op + o0 * ip. Vectors of B outputs at a time.
template <int B, class Kernel>
void transform_weights(Parallel& par, index_t inputs, index_t outputs, index_t ip, index_t op,
                       const Kernel& kernel, float* u) {
  using V = typename Lanes<B>::type;
  const index_t blocks = op / B;
  par.for_range(ip * blocks, 300 * B, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t i = item / blocks, o = item % blocks * B;
      V g[9] = {};
      if (i < inputs) {
        for (int l = 0; l < B && o + l < outputs; ++l) {
          float taps[9];
          kernel(o + l, i, taps);
          for (int t = 0; t < 9; ++t)
            g[t][l] = taps[t];
        }
      }
      V half[kAlpha][3], out[kPoints];
      for (int a = 0; a < kAlpha; ++a) {
        for (int q = 0; q < 3; ++q)
          half[a][q] = kG[a][0] * g[q] + kG[a][1] * g[3 + q] + kG[a][2] * g[6 + q];
      }
      for (int a = 0; a < kAlpha; ++a) {
        for (int b = 0; b < kAlpha; ++b) {
          out[a * kAlpha + b] =
              half[a][0] * kG[b][0] + half[a][1] * kG[b][1] + half[a][2] * kG[b][2];
        }
      }
      const index_t o0 = o / (2 * B) * (2 * B), width = panel_width(o0, op, B);
      float* at = u + o0 * ip + i * width + (o - o0);
      for (int p = 0; p < kPoints; ++p)
        std::memcpy(at + p * ip * op, &out[p], sizeof(V));
    }
  });
}

}  // namespace

bool winograd_supported(const LoweringShape& s, index_t out_channels) {
  if (s.groups < 1 || s.channels % s.groups != 0 || out_channels % s.groups != 0) return false;
  const index_t in_per_group = s.channels / s.groups, out_per_group = out_channels / s.groups;
  return s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 && s.stride_w == 1 &&
         s.dilation_h == 1 && s.dilation_w == 1 && s.pad_h >= 0 && s.pad_h <= 2 && s.pad_w >= 0 &&
         s.pad_w <= 2 &&
         (s.groups == 1 || (in_per_group % layout_block(s.layout) == 0 &&
                            out_per_group % layout_block(s.out_layout) == 0));
}

const float* WinogradConvolution::transformed(Parallel& par, index_t b, const Group& group,
                                              const float* weights, std::uint64_t version,
                                              bool data_gradient) {
  const index_t channels = group.channels;
  const index_t inputs = data_gradient ? group.outputs : channels;
  const index_t outputs = data_gradient ? channels : group.outputs;
  const index_t ip = round_up(inputs, b), op = round_up(outputs, b);
  // Not a structured binding: lambdas below capture u (C++17 lets no lambda capture one).
  const std::pair<float*, bool> kept = weights_.get(weights, data_gradient ? 1 : 0, version,
                                                    static_cast<std::size_t>(kPoints * ip * op));
  float* const u = kept.first;
  if (kept.second) return u;
  const auto transform = [&](const auto& kernel) {
    if (b == 16) {
      transform_weights<16>(par, inputs, outputs, ip, op, kernel, u);
    } else {
      transform_weights<8>(par, inputs, outputs, ip, op, kernel, u);
    }
  };
  if (data_gradient) {
    // Output channel c of the data gradient, input channel o: w[o][c] turned by 180 degrees.
    transform([&](index_t c, index_t o, float* g) {
      const float* w = weights + (o * channels + c) * 9;
      for (int t = 0; t < 9; ++t)
        g[t] = w[8 - t];
    });
  } else {
    transform([&](index_t o, index_t c, float* g) {
      std::memcpy(g, weights + (o * channels + c) * 9, 9 * sizeof(float));
    });
  }
  return u;
}

namespace {

void check_supported(const char* call, const LoweringShape& shape, index_t out_channels) {
  HN_CHECK(winograd_supported(shape, out_channels),
           "{} (winograd): needs a 3x3 kernel, stride 1, dilation 1, padding at most 2 and, "
           "with groups on blocked operands, whole blocks of channels per group; got {}, {} "
           "outputs",
           call, shape.to_string(), out_channels);
  const index_t in_block = layout_block(shape.layout), out_block = layout_block(shape.out_layout);
  HN_CHECK(in_block == 1 || out_block == 1 || in_block == out_block,
           "{} (winograd): x in {} and y in {}: one blocked layout or NCHW on either side, not "
           "two blocks ({})",
           call, layout_name(shape.layout), layout_name(shape.out_layout), shape.to_string());
}

// Group g's channels of a tensor of `total` channels in `layout`.
View group_view(const float* data, Layout layout, index_t total, index_t height, index_t width,
                index_t groups, index_t g) {
  const index_t per_group = total / groups;
  return {data + g * per_group * height * width, layout, per_group, height, width, total};
}

}  // namespace

// Each group is a convolution of its own on views of x and y (whole blocks of channels in a
// blocked layout), with its kernels transformed and kept apart (their own address).
void WinogradConvolution::forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                  const float* x, const float* weights, const float* bias, float* y,
                                  const Activation& activation) {
  check_supported("conv_forward", shape, out_channels);
  const index_t b = lanes_for(shape.layout, shape.out_layout), groups = shape.groups;
  const Group group{shape.channels / groups, out_channels / groups};
  const Tiling tl = tiling(shape.out_h(), shape.out_w(), shape.pad_h, shape.pad_w);
  for (index_t g = 0; g < groups; ++g) {
    const float* u = transformed(par, b, group, weights + g * group.outputs * group.channels * 9,
                                 shape.weights_version, false);
    const View in =
        group_view(x, shape.layout, shape.channels, shape.height, shape.width, groups, g);
    const View out =
        group_view(y, shape.out_layout, out_channels, shape.out_h(), shape.out_w(), groups, g);
    const Epilogue epilogue{bias != nullptr ? bias + g * group.outputs : nullptr, activation};
    if (b == 16) {
      convolve<16>(par, in, shape.batch, tl, u, epilogue, out, v_, m_);
    } else {
      convolve<8>(par, in, shape.batch, tl, u, epilogue, out, v_, m_);
    }
  }
}

void WinogradConvolution::backward_data(Parallel& par, const LoweringShape& shape,
                                        index_t out_channels, const float* weights, const float* dy,
                                        float* dx) {
  check_supported("conv_backward_data", shape, out_channels);
  const index_t b = lanes_for(shape.layout, shape.out_layout), groups = shape.groups;
  const Group group{shape.channels / groups, out_channels / groups};
  const Tiling tl = tiling(shape.height, shape.width, 2 - shape.pad_h, 2 - shape.pad_w);
  for (index_t g = 0; g < groups; ++g) {
    const float* u = transformed(par, b, group, weights + g * group.outputs * group.channels * 9,
                                 shape.weights_version, true);
    const View in =
        group_view(dy, shape.out_layout, out_channels, shape.out_h(), shape.out_w(), groups, g);
    const View out =
        group_view(dx, shape.layout, shape.channels, shape.height, shape.width, groups, g);
    if (b == 16) {
      convolve<16>(par, in, shape.batch, tl, u, Epilogue{}, out, v_, m_);
    } else {
      convolve<8>(par, in, shape.batch, tl, u, Epilogue{}, out, v_, m_);
    }
  }
}

void WinogradConvolution::backward_weights(Parallel& par, const LoweringShape& shape,
                                           index_t out_channels, const float* x, const float* dy,
                                           float* dweights, float* dbias) {
  check_supported("conv_backward_weights", shape, out_channels);
  const index_t b = lanes_for(shape.layout, shape.out_layout), groups = shape.groups;
  const index_t per_group = out_channels / groups * (shape.channels / groups) * 9;
  const Tiling tl = tiling(shape.out_h(), shape.out_w(), shape.pad_h, shape.pad_w);
  for (index_t g = 0; g < groups; ++g) {
    const View in =
        group_view(x, shape.layout, shape.channels, shape.height, shape.width, groups, g);
    const View grad =
        group_view(dy, shape.out_layout, out_channels, shape.out_h(), shape.out_w(), groups, g);
    if (b == 16) {
      weight_gradient<16>(par, in, grad, shape.batch, tl, dweights + g * per_group, v_, m_, s_);
    } else {
      weight_gradient<8>(par, in, grad, shape.batch, tl, dweights + g * per_group, v_, m_, s_);
    }
  }
  if (dbias != nullptr) {
    const View grad{dy, shape.out_layout, out_channels, shape.out_h(), shape.out_w(), out_channels};
    bias_gradient(par, grad, shape.batch, dbias);
  }
}

}  // namespace hn::detail::cpu
