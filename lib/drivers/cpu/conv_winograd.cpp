// Winograd F(4x4, 3x3) on the CPU (conv_winograd.h). With the transforms of Lavin and Gray
// (interpolation points 0, 1, -1, 2, -2 and infinity)
//   y tile (4x4) = A^T [ (G g G^T) . (B^T d B) ] A      for a 6x6 input tile d,
// summed over input channels. Per chunk of tiles:
//   1. V[p][t][c] = (B^T d B)[p] for every tile t, input channel c and point p (36 points);
//   2. M[p][t][o] = sum_c V[p][t][c] U[p][c][o], one GEMM per point on the driver's sgemm,
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
// compile each to the build's instruction set (-march=native).
#include "lib/drivers/cpu/conv_winograd.h"

#include <algorithm>
#include <cstring>

#include "lib/core/check.h"
#include "lib/drivers/cpu/parallel.h"

namespace hn::detail::cpu {

namespace {

constexpr int kAlpha = 6;    // input tile side
constexpr int kPoints = 36;  // kAlpha * kAlpha
constexpr int kTile = 4;     // output tile side

// The transformed tiles of one chunk (V and M) take at most about this many bytes, unless
// that leaves fewer than kMinChunkTiles tiles: the GEMMs' rows (their B operand, U, is
// packed again by every call).
constexpr std::size_t kChunkBytes = std::size_t{8} << 20;
constexpr index_t kMinChunkTiles = 96;

template <int B>
struct Lanes;
template <>
struct Lanes<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Lanes<16> {
  typedef float type __attribute__((vector_size(64)));
};

// An image tensor in one of the layouts (shapes.h).
struct View {
  const float* data;
  Layout layout;
  index_t channels, height, width;

  index_t offset(index_t n, index_t c, index_t h, index_t w) const {
    return layout_offset(layout, channels, height, width, n, c, h, w);
  }
};

// Loads channels [c0, c0 + B) of pixel (h, w) of image n into v: zero outside the image
// and past the channels.
template <int B, class V>
inline void load(const View& t, index_t n, index_t c0, index_t h, index_t w, V& v) {
  if (h < 0 || h >= t.height || w < 0 || w >= t.width) {
    v = V{};
    return;
  }
  if (layout_block(t.layout) >= B) {
    // Blocked with a block of at least B (channels are a multiple of it): B consecutive.
    std::memcpy(&v, t.data + t.offset(n, c0, h, w), sizeof v);
    return;
  }
  for (int l = 0; l < B; ++l) {
    const index_t c = c0 + l;
    v[l] = c < t.channels ? t.data[t.offset(n, c, h, w)] : 0.0f;
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

// Phase 1: V[p][t - t0][c] (rows of `ld` floats) for tiles [t0, t1) and channel blocks.
template <int B>
void input_transform(Parallel& par, const View& in, const Tiling& tl, index_t t0, index_t t1,
                     index_t ld, float* v) {
  using V = typename Lanes<B>::type;
  const index_t blocks = ld / B, tiles = t1 - t0, point_stride = tiles * ld;
  par.for_range(tiles * blocks, 60 * B, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t t = t0 + item / blocks, c0 = item % blocks * B;
      index_t n, h0, w0;
      tl.locate(t, n, h0, w0);
      V d[kPoints], r[kPoints];
      for (int i = 0; i < kAlpha; ++i) {
        for (int j = 0; j < kAlpha; ++j)
          load<B>(in, n, c0, h0 - tl.pad_h + i, w0 - tl.pad_w + j, d[i * kAlpha + j]);
      }
      for (int j = 0; j < kAlpha; ++j)
        bt6(d + j, kAlpha, r + j, kAlpha);  // columns
      for (int i = 0; i < kAlpha; ++i)
        bt6(r + i * kAlpha, 1, d + i * kAlpha, 1);  // rows
      float* at = v + (t - t0) * ld + c0;
      for (int p = 0; p < kPoints; ++p)
        std::memcpy(at + p * point_stride, &d[p], sizeof(V));
    }
  });
}

// Phase 1 of the weight gradient for dy: E[p][t - t0][o] = (A e A^T)[p] of dy's 4x4 tiles.
template <int B>
void gradient_transform(Parallel& par, const View& dy, const Tiling& tl, index_t t0, index_t t1,
                        index_t ld, float* e) {
  using V = typename Lanes<B>::type;
  const index_t blocks = ld / B, tiles = t1 - t0, point_stride = tiles * ld;
  par.for_range(tiles * blocks, 40 * B, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t t = t0 + item / blocks, c0 = item % blocks * B;
      index_t n, h0, w0;
      tl.locate(t, n, h0, w0);
      V d[kTile * kTile], r[kAlpha * kTile], out[kPoints];
      for (int i = 0; i < kTile; ++i) {
        for (int j = 0; j < kTile; ++j)
          load<B>(dy, n, c0, h0 + i, w0 + j, d[i * kTile + j]);
      }
      for (int j = 0; j < kTile; ++j)
        a4(d + j, kTile, r + j, kTile);  // columns: 4 -> 6 rows
      for (int i = 0; i < kAlpha; ++i)
        a4(r + i * kTile, 1, out + i * kAlpha, 1);  // rows: 4 -> 6
      float* at = e + (t - t0) * ld + c0;
      for (int p = 0; p < kPoints; ++p)
        std::memcpy(at + p * point_stride, &out[p], sizeof(V));
    }
  });
}

struct Epilogue {
  const float* bias = nullptr;
  Activation activation;
};

// Phase 3: out's tiles [t0, t1) = A^T M A (+ bias, activation), M[p][t - t0][o] in rows of
// `ld` floats.
template <int B>
void output_transform(Parallel& par, const float* m, index_t ld, const Tiling& tl, index_t t0,
                      index_t t1, const Epilogue& epilogue, float* out_data, Layout layout,
                      index_t channels) {
  using V = typename Lanes<B>::type;
  const View out{out_data, layout, channels, tl.out_h, tl.out_w};
  const index_t blocks = round_up(channels, B) / B, tiles = t1 - t0, point_stride = tiles * ld;
  const bool contiguous = layout_block(layout) >= B;
  par.for_range(tiles * blocks, 50 * B, [&](index_t first, index_t last) {
    for (index_t item = first; item < last; ++item) {
      const index_t t = t0 + item / blocks, c0 = item % blocks * B;
      index_t n, h0, w0;
      tl.locate(t, n, h0, w0);
      V d[kPoints], r[kAlpha * kTile], y[kTile * kTile];
      const float* at = m + (t - t0) * ld + c0;
      for (int p = 0; p < kPoints; ++p)
        std::memcpy(&d[p], at + p * point_stride, sizeof(V));
      for (int j = 0; j < kAlpha; ++j)
        at6(d + j, kAlpha, r + j, kAlpha);  // columns: 6 -> 4 rows (r is 4 x 6)
      for (int i = 0; i < kTile; ++i)
        at6(r + i * kAlpha, 1, y + i * kTile, 1);  // rows: 6 -> 4
      V bias{};
      if (epilogue.bias != nullptr) {
        for (int l = 0; l < B; ++l)
          bias[l] = c0 + l < channels ? epilogue.bias[c0 + l] : 0.0f;
      }
      const Activation& act = epilogue.activation;
      for (int i = 0; i < kTile && h0 + i < tl.out_h; ++i) {
        for (int j = 0; j < kTile && w0 + j < tl.out_w; ++j) {
          float lanes[B];
          V value = y[i * kTile + j] + bias;
          std::memcpy(lanes, &value, sizeof value);
          if (act.kind == Activation::Kind::relu) {
            for (int l = 0; l < B; ++l)
              lanes[l] = lanes[l] > 0.0f ? lanes[l] : lanes[l] * act.slope;
          } else if (act.kind == Activation::Kind::clip) {
            for (int l = 0; l < B; ++l) {
              // NaN stays NaN (Activation).
              const float x = lanes[l];
              lanes[l] = x < act.lo ? act.lo : x > act.hi ? act.hi : x;
            }
          }
          if (contiguous) {
            std::memcpy(out_data + out.offset(n, c0, h0 + i, w0 + j), lanes, sizeof lanes);
          } else {
            for (int l = 0; l < B && c0 + l < channels; ++l)
              out_data[out.offset(n, c0 + l, h0 + i, w0 + j)] = lanes[l];
          }
        }
      }
    }
  });
}

// Runs `gemm(p, threads)` for the 36 points: spread over the threads, each GEMM on one,
// with oneDNN; one after the other on every thread with OpenBLAS (which sets its thread
// count process-wide: no GEMMs from several threads at once). Either way each point's
// product is one GEMM call: the same sums whatever the thread count.
template <class Gemm>
void per_point(Parallel& par, Blas blas, index_t cost, const Gemm& gemm) {
  if (blas != Blas::onednn || par.threads() == 1) {
    for (int p = 0; p < kPoints; ++p)
      gemm(p, par.threads());
    return;
  }
  par.for_range(kPoints, cost, [&](index_t first, index_t last) {
    for (index_t p = first; p < last; ++p)
      gemm(static_cast<int>(p), 1);
  });
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

// A 3x3 convolution of `batch` images from `in` to `out` (out_channels in out_layout, the
// tiling's out_h x out_w), its kernels transformed to u ([36][round_up(in channels, B)]
// [round_up(out_channels, B)]).
template <int B>
void convolve(Parallel& par, Blas blas, const View& in, index_t batch, const Tiling& tl,
              const float* u, index_t out_channels, const Epilogue& epilogue, float* out,
              Layout out_layout, std::vector<float>& v, std::vector<float>& m) {
  const index_t cp = round_up(in.channels, B), kp = round_up(out_channels, B);
  const index_t total = batch * tl.per_image();
  const index_t chunk = chunk_tiles(total, kPoints * (cp + kp));
  v.resize(static_cast<std::size_t>(kPoints * chunk * cp));
  m.resize(static_cast<std::size_t>(kPoints * chunk * kp));
  for (index_t t0 = 0; t0 < total; t0 += chunk) {
    const index_t t1 = std::min(total, t0 + chunk), tiles = t1 - t0;
    input_transform<B>(par, in, tl, t0, t1, cp, v.data());
    per_point(par, blas, tiles * cp * kp / 8, [&](int p, int threads) {
      sgemm(blas, threads, false, false, tiles, kp, cp, 1.0f, v.data() + p * tiles * cp, cp,
            u + p * cp * kp, kp, 0.0f, m.data() + p * tiles * kp, kp);
    });
    output_transform<B>(par, m.data(), kp, tl, t0, t1, epilogue, out, out_layout, out_channels);
  }
}

// dweights += the weight gradient, from x (`in`) and dy, s receiving the per-point sums
// S[p][c][o] = sum over tiles of V[p][t][c] E[p][t][o].
template <int B>
void weight_gradient(Parallel& par, Blas blas, const View& in, const View& dy, index_t batch,
                     const Tiling& tl, float* dweights, std::vector<float>& v,
                     std::vector<float>& e, std::vector<float>& s) {
  const index_t cp = round_up(in.channels, B), kp = round_up(dy.channels, B);
  const index_t total = batch * tl.per_image();
  const index_t chunk = chunk_tiles(total, kPoints * (cp + kp));
  v.resize(static_cast<std::size_t>(kPoints * chunk * cp));
  e.resize(static_cast<std::size_t>(kPoints * chunk * kp));
  s.resize(static_cast<std::size_t>(kPoints * cp * kp));
  for (index_t t0 = 0; t0 < total; t0 += chunk) {
    const index_t t1 = std::min(total, t0 + chunk), tiles = t1 - t0;
    input_transform<B>(par, in, tl, t0, t1, cp, v.data());
    gradient_transform<B>(par, dy, tl, t0, t1, kp, e.data());
    const float beta = t0 == 0 ? 0.0f : 1.0f;
    per_point(par, blas, tiles * cp * kp / 8, [&](int p, int threads) {
      sgemm(blas, threads, true, false, cp, kp, tiles, 1.0f, v.data() + p * tiles * cp, cp,
            e.data() + p * tiles * kp, kp, beta, s.data() + p * cp * kp, kp);
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

// u[p][i][o] = (G g G^T)[p] for the kernel `kernel(o, i)` (9 floats, row-major, at a
// stride of `step` between taps: -1 for the kernel turned by 180 degrees), zero in the
// padding rows and columns (i >= inputs, o >= outputs) of the [ip][op] matrices.
template <class Kernel>
void transform_weights(Parallel& par, index_t inputs, index_t outputs, index_t ip, index_t op,
                       const Kernel& kernel, float* u) {
  par.for_range(ip, op * 100, [&](index_t first, index_t last) {
    for (index_t i = first; i < last; ++i) {
      for (index_t o = 0; o < op; ++o) {
        float out[kPoints] = {};
        if (i < inputs && o < outputs) {
          float g[9];
          kernel(o, i, g);
          float half[kAlpha][3];
          for (int a = 0; a < kAlpha; ++a) {
            for (int q = 0; q < 3; ++q)
              half[a][q] = kG[a][0] * g[q] + kG[a][1] * g[3 + q] + kG[a][2] * g[6 + q];
          }
          for (int a = 0; a < kAlpha; ++a) {
            for (int b = 0; b < kAlpha; ++b)
              out[a * kAlpha + b] =
                  half[a][0] * kG[b][0] + half[a][1] * kG[b][1] + half[a][2] * kG[b][2];
          }
        }
        for (int p = 0; p < kPoints; ++p)
          u[(p * ip + i) * op + o] = out[p];
      }
    }
  });
}

// The bytes of transformed weights kept between calls, all layers together; past it the
// cache starts again empty (a net's weights are transformed again at its next call).
constexpr std::size_t kMaxTransformedBytes = std::size_t{256} << 20;

}  // namespace

bool winograd_supported(const LoweringShape& s) {
  return s.groups == 1 && s.kernel_h == 3 && s.kernel_w == 3 && s.stride_h == 1 &&
         s.stride_w == 1 && s.dilation_h == 1 && s.dilation_w == 1 && s.pad_h >= 0 &&
         s.pad_h <= 2 && s.pad_w >= 0 && s.pad_w <= 2;
}

const float* WinogradConvolution::transformed(Parallel& par, const LoweringShape& shape,
                                              index_t out_channels, const float* weights,
                                              bool data_gradient) {
  const index_t b = lanes_for(shape.layout, shape.out_layout);
  const index_t channels = shape.channels;
  const index_t inputs = data_gradient ? out_channels : channels;
  const index_t outputs = data_gradient ? channels : out_channels;
  const index_t ip = round_up(inputs, b), op = round_up(outputs, b);
  const auto count = static_cast<std::size_t>(kPoints * ip * op);
  std::vector<float>* target = &u_;
  if (shape.weights_version != 0) {
    Transformed& kept = weights_[{weights, data_gradient}];
    if (kept.version == shape.weights_version && kept.u.size() == count) return kept.u.data();
    weights_bytes_ += count * sizeof(float) - kept.u.size() * sizeof(float);
    if (weights_bytes_ > kMaxTransformedBytes) {
      weights_.clear();
      weights_bytes_ = count * sizeof(float);
    }
    Transformed& fresh = weights_[{weights, data_gradient}];
    fresh.version = shape.weights_version;
    target = &fresh.u;
  }
  target->resize(count);
  if (data_gradient) {
    // Output channel c of the data gradient, input channel o: w[o][c] turned by 180 degrees.
    transform_weights(
        par, inputs, outputs, ip, op,
        [&](index_t c, index_t o, float* g) {
          const float* w = weights + (o * channels + c) * 9;
          for (int t = 0; t < 9; ++t)
            g[t] = w[8 - t];
        },
        target->data());
  } else {
    transform_weights(
        par, inputs, outputs, ip, op,
        [&](index_t o, index_t c, float* g) {
          std::memcpy(g, weights + (o * channels + c) * 9, 9 * sizeof(float));
        },
        target->data());
  }
  return target->data();
}

namespace {

void check_supported(const char* call, const LoweringShape& shape) {
  HN_CHECK(winograd_supported(shape),
           "{} (winograd): needs one group, a 3x3 kernel, stride 1, dilation 1 and padding at "
           "most 2, got {}",
           call, shape.to_string());
}

}  // namespace

void WinogradConvolution::forward(Parallel& par, Blas blas, const LoweringShape& shape,
                                  index_t out_channels, const float* x, const float* weights,
                                  const float* bias, float* y, const Activation& activation) {
  check_supported("conv_forward", shape);
  const float* u = transformed(par, shape, out_channels, weights, false);
  const View in{x, shape.layout, shape.channels, shape.height, shape.width};
  const Tiling tl = tiling(shape.out_h(), shape.out_w(), shape.pad_h, shape.pad_w);
  const Epilogue epilogue{bias, activation};
  if (lanes_for(shape.layout, shape.out_layout) == 16) {
    convolve<16>(par, blas, in, shape.batch, tl, u, out_channels, epilogue, y, shape.out_layout, v_,
                 m_);
  } else {
    convolve<8>(par, blas, in, shape.batch, tl, u, out_channels, epilogue, y, shape.out_layout, v_,
                m_);
  }
}

void WinogradConvolution::backward_data(Parallel& par, Blas blas, const LoweringShape& shape,
                                        index_t out_channels, const float* weights, const float* dy,
                                        float* dx) {
  check_supported("conv_backward_data", shape);
  const float* u = transformed(par, shape, out_channels, weights, true);
  const View in{dy, shape.out_layout, out_channels, shape.out_h(), shape.out_w()};
  const Tiling tl = tiling(shape.height, shape.width, 2 - shape.pad_h, 2 - shape.pad_w);
  if (lanes_for(shape.layout, shape.out_layout) == 16) {
    convolve<16>(par, blas, in, shape.batch, tl, u, shape.channels, Epilogue{}, dx, shape.layout,
                 v_, m_);
  } else {
    convolve<8>(par, blas, in, shape.batch, tl, u, shape.channels, Epilogue{}, dx, shape.layout, v_,
                m_);
  }
}

void WinogradConvolution::backward_weights(Parallel& par, Blas blas, const LoweringShape& shape,
                                           index_t out_channels, const float* x, const float* dy,
                                           float* dweights, float* dbias) {
  check_supported("conv_backward_weights", shape);
  const View in{x, shape.layout, shape.channels, shape.height, shape.width};
  const View grad{dy, shape.out_layout, out_channels, shape.out_h(), shape.out_w()};
  const Tiling tl = tiling(shape.out_h(), shape.out_w(), shape.pad_h, shape.pad_w);
  if (lanes_for(shape.layout, shape.out_layout) == 16) {
    weight_gradient<16>(par, blas, in, grad, shape.batch, tl, dweights, v_, m_, s_);
  } else {
    weight_gradient<8>(par, blas, in, grad, shape.batch, tl, dweights, v_, m_, s_);
  }
  if (dbias != nullptr) bias_gradient(par, grad, shape.batch, dbias);
}

}  // namespace hn::detail::cpu
