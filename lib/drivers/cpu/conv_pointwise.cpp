// 1x1 convolutions on blocked operands (conv_pointwise.h). In nChw(B)c a pixel's B channels
// of one block are contiguous, so every direction is a GEMM whose operands already lie as a
// packed GEMM reads them, without im2col or packing of the activations:
//   forward:         y[o][p] = sum_c w[o][c] x[c][s p]      rows p, vectors of B outputs o
//   data gradient:   dx[c][s p] = sum_o w[o][c] dy[o][p]    rows p, vectors of B inputs c
//   weight gradient: dw[o][c] += sum_(n, p) dy[o][p] x[c][s p]   rows o, vectors of B inputs c
// (s p: pixel p's place in the strided image), on one register-blocked kernel: 6 rows x 2
// vectors of accumulators (12 of AVX2's 16 registers), each step of the reduction one
// broadcast per row and one vector load per column; where stride 1 puts the rows B floats
// apart on both sides, one base pointer addresses them all and AVX-512 takes 12 rows x 2
// vectors (24 of its 32 registers; the pointer per row had kept it at 6: ResNet-50's 1x1
// forward layers, as the tuner measured them on the Xeon, 767 ms in all before, 689 after).
// The weights are packed by panels of 2B outputs once per weights version. oneDNN 2.6's
// jit_1x1:avx2 kernels ran ResNet-50's 1x1 weight gradients at 0.64-0.92 of the sgemm peak and
// their data gradients at 0.64-1.0 on a 2-core AVX2 EPYC (batch 32), the strided layers lowest.
#include "lib/drivers/cpu/conv_pointwise.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cpu/conv_pointwise_plain.h"
#include "lib/drivers/cpu/parallel.h"
#include "lib/drivers/cpu/simd.h"

namespace hn::detail::cpu {

namespace {

constexpr int kRows = 6;  // rows of the kernel's block (outputs, or weights' rows)

// A tensor laid out as the output y, added to it before the activation (a residual block's
// sum): its value for y's element at p is at(p). None where `r` is null.
struct Residual {
  const float* y = nullptr;
  const float* r = nullptr;
  const float* at(const float* p) const { return r + (p - y); }
};

// The block's end: each accumulator + its vector's bias [+ the residual], activated, stored
// at out(r, j) (row r, vector j). Shared by the forward and data-gradient kernels.
template <int B, int R, int NV, class V, class Out>
void store_rows(const V (&acc)[R][NV], const float* bias, const Residual& residual,
                const Activation& activation, const Out& out) {
  for (int j = 0; j < NV; ++j) {
    V shift{};
    if (bias != nullptr) std::memcpy(&shift, bias + j * B, sizeof(V));
    for (int r = 0; r < R; ++r) {
      V value = acc[r][j] + shift;
      float* to = out(r, j);
      if (residual.r != nullptr) {
        V add;
        std::memcpy(&add, residual.at(to), sizeof(V));
        value += add;
      }
      activate(value, activation);
      std::memcpy(to, &value, sizeof(V));
    }
  }
}

// y rows (+ bias, activation) = A B for R rows and NV vectors of B lanes, the reduction over
// input channels in blocks of B: row r's channel i * B + q at a[r][i * a_block + q], the
// weights packed as rows of NV vectors (b + (i * B + q) * NV * B); the result's row r,
// vector j at c[r] + c_offset + j * c_vector. The forward and the data gradient.
template <int B, int R, int NV>
void channels_kernel(const float* const* a_rows, index_t blocks, index_t a_block, const float* b,
                     float* const* c_rows, index_t c_offset, index_t c_vector, const float* bias,
                     const Residual& residual, const Activation& activation) {
  using V = typename Lanes<B>::type;
  const float* a[R];
  for (int r = 0; r < R; ++r)
    a[r] = a_rows[r];
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j)
      acc[r][j] = V{};
  }
  for (index_t i = 0; i < blocks; ++i) {
    // The rows' next block of channels lies a plane away: fetched while this one computes
    // (the forward ran at half the speed without, waiting on them).
    for (int r = 0; r < R; ++r)
      __builtin_prefetch(a[r] + a_block);
    for (int q = 0; q < B; ++q) {
      V bv[NV];
      for (int j = 0; j < NV; ++j)
        std::memcpy(&bv[j], b + (q * NV + j) * B, sizeof(V));
      for (int r = 0; r < R; ++r) {
        const float av = a[r][q];
        for (int j = 0; j < NV; ++j)
          acc[r][j] += av * bv[j];
      }
    }
    b += B * NV * B;
    for (int r = 0; r < R; ++r)
      a[r] += a_block;
  }
  store_rows<B>(acc, bias, residual, activation,
                [&](int r, int j) { return c_rows[r] + c_offset + j * c_vector; });
}

// channels_kernel where the rows lie B floats apart on both sides (row r's channels at
// a + r * B, its outputs at c + r * B: the consecutive pixels of a stride-1 forward or data
// gradient in nChw(B)c), so that one base register addresses every row and R can go past
// the general kernel's 6 rows (AVX-512's 32 registers hold 12 rows x 2 vectors).
template <int B, int R, int NV>
void dense_kernel(const float* a0, index_t blocks, index_t a_block, const float* b, float* c0,
                  index_t c_vector, const float* bias, const Residual& residual,
                  const Activation& activation) {
  using V = typename Lanes<B>::type;
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j)
      acc[r][j] = V{};
  }
  const float* a = a0;
  for (index_t i = 0; i < blocks; ++i) {
    // As channels_kernel: the next block of channels lies a plane away.
    for (int r = 0; r < R * B; r += 16)
      __builtin_prefetch(a + a_block + r);
    for (int q = 0; q < B; ++q) {
      V bv[NV];
      for (int j = 0; j < NV; ++j)
        std::memcpy(&bv[j], b + (q * NV + j) * B, sizeof(V));
      for (int r = 0; r < R; ++r) {
        const float av = a[r * B + q];
        for (int j = 0; j < NV; ++j)
          acc[r][j] += av * bv[j];
      }
    }
    b += B * NV * B;
    a += a_block;
  }
  store_rows<B>(acc, bias, residual, activation,
                [&](int r, int j) { return c0 + r * B + j * c_vector; });
}

// Where a weight gradient's x lies for pixels_kernel: vector j of pixel (m, p) at
// b + m * image + p * pixel + j * vector (x in place, or packed).
struct XWalk {
  const float* b;
  index_t image, pixel, vector;
};

// c rows += A B for R rows and NV vectors of B lanes, the reduction over `images` x `pixels`:
// row r's pixel (m, p) at a[r][m * a_image + p * B], B's vectors as `x` says; row r's vector
// j at c[r] + j * B. The weight gradient (a: dy's outputs, b: x's inputs).
template <int B, int R, int NV>
void pixels_kernel(const float* const* a_rows, index_t images, index_t pixels, index_t a_image,
                   const XWalk& x, float* const* c_rows) {
  using V = typename Lanes<B>::type;
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j)
      std::memcpy(&acc[r][j], c_rows[r] + j * B, sizeof(V));
  }
  for (index_t m = 0; m < images; ++m) {
    const float* a[R];
    for (int r = 0; r < R; ++r)
      a[r] = a_rows[r] + m * a_image;
    const float* b = x.b + m * x.image;
    for (index_t p = 0; p < pixels; ++p) {
      V bv[NV];
      for (int j = 0; j < NV; ++j)
        std::memcpy(&bv[j], b + j * x.vector, sizeof(V));
      b += x.pixel;
      for (int r = 0; r < R; ++r) {
        const float av = a[r][p * B];
        for (int j = 0; j < NV; ++j)
          acc[r][j] += av * bv[j];
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j)
      std::memcpy(c_rows[r] + j * B, &acc[r][j], sizeof(V));
  }
}

// Calls kernel.template run<R, NV>() for `rows` (1 to R) and NV vectors.
template <int R, int NV, class Kernel>
void run_rows(int rows, const Kernel& kernel) {
  if constexpr (R == 1) {
    kernel.template run<1, NV>();
  } else {
    if (rows == R) return kernel.template run<R, NV>();
    run_rows<R - 1, NV>(rows, kernel);
  }
}

// Calls kernel.template run<R, NV>() for `rows` (1 to MaxRows) and `vectors` (1 or 2).
template <int MaxRows, class Kernel>
void dispatch(int rows, int vectors, const Kernel& kernel) {
  if (vectors == 2) {
    run_rows<MaxRows, 2>(rows, kernel);
  } else {
    run_rows<MaxRows, 1>(rows, kernel);
  }
}

// The arguments of channels_kernel, for dispatch().
template <int B>
struct ChannelsProduct {
  const float* const* a;
  index_t blocks, a_block;
  const float* b;
  float* const* c;
  index_t c_offset, c_vector;
  const float* bias;
  const Residual* residual;
  const Activation* activation;
  template <int R, int NV>
  void run() const {
    channels_kernel<B, R, NV>(a, blocks, a_block, b, c, c_offset, c_vector, bias, *residual,
                              *activation);
  }
};

// The arguments of dense_kernel, for dispatch().
template <int B>
struct DenseProduct {
  const float* a;
  index_t blocks, a_block;
  const float* b;
  float* c;
  index_t c_vector;
  const float* bias;
  const Residual* residual;
  const Activation* activation;
  template <int R, int NV>
  void run() const {
    dense_kernel<B, R, NV>(a, blocks, a_block, b, c, c_vector, bias, *residual, *activation);
  }
};

// Rows of dense_kernel's block: 12 x 2 vectors of AVX-512's 32 registers, 6 x 2 of AVX2's
// 16 (as the general kernel).
template <int B>
constexpr int kDenseRows = B == 16 ? 12 : 6;

// The arguments of pixels_kernel, for dispatch().
template <int B>
struct PixelsProduct {
  const float* const* a;
  index_t images, pixels, a_image;
  XWalk x;
  float* const* c;
  template <int R, int NV>
  void run() const {
    pixels_kernel<B, R, NV>(a, images, pixels, a_image, x, c);
  }
};

// Outputs [n0, n0 + width) of `count` form a panel: 2B wide but the last, which may be B.
index_t panel_width(index_t n0, index_t count, index_t b) {
  return std::min(2 * b, count - n0);
}

// packed[n0 * k + i * width + (n - n0)] = value(i, n) for each panel [n0, n0 + width) of the
// n outputs and i < k (a panel's rows of the reduction in order).
template <class Value>
void pack(Parallel& par, index_t k, index_t n, index_t b, const Value& value, float* packed) {
  const index_t panels = (n + 2 * b - 1) / (2 * b);
  par.for_range(panels, k * 2 * b * 4, [&](index_t first, index_t last) {
    for (index_t panel = first; panel < last; ++panel) {
      const index_t n0 = panel * 2 * b, width = panel_width(n0, n, b);
      float* to = packed + n0 * k;
      for (index_t i = 0; i < k; ++i) {
        for (index_t j = 0; j < width; ++j)
          to[i * width + j] = value(i, n0 + j);
      }
    }
  });
}

// An image tensor in a blocked layout of B lanes: image n's block of channels [c0, c0 + B)
// at data + (n * channels + c0) * height * width, pixel (h, w) of it B floats at
// (h * width + w) * B.
struct Image {
  const float* data;
  index_t channels, height, width;
  index_t plane() const { return height * width; }
  const float* at(index_t n, index_t h, index_t w, index_t b) const {
    return data + n * channels * plane() + (h * width + w) * b;
  }
};

// out[k][(s_out h, s_out w)] = sum_i packed-weights(i, k) in[i][(s_in h, s_in w)] (+ bias,
// + residual, activation) over the grid_h x grid_w pixels (h, w): the forward (s_in the
// stride, s_out 1) and the data gradient (s_in 1, s_out the stride, the pixels no tap
// reaches set to zero).
template <int B>
void multiply(Parallel& par, const Image& in, index_t s_in, const Image& out, index_t s_out,
              index_t batch, index_t grid_h, index_t grid_w, const float* packed, const float* bias,
              const Residual& residual, const Activation& activation) {
  const index_t k = in.channels, outputs = out.channels;
  const index_t panels = (outputs + 2 * B - 1) / (2 * B);
  // Items: an image's rows (about 96 pixels: their inputs stay in L2 while every panel of
  // weights passes them) and, where that makes few items (batch 1), groups of panels.
  const index_t item_rows = std::min(grid_h, std::max<index_t>(1, (96 + grid_w - 1) / grid_w));
  const index_t row_items = batch * ((grid_h + item_rows - 1) / item_rows);
  const index_t groups =
      std::clamp<index_t>((4 * par.threads() + row_items - 1) / row_items, 1, panels);
  const index_t group_panels = (panels + groups - 1) / groups;
  const bool zero_rest = s_out > 1;
  float* const out_data = const_cast<float*>(out.data);
  par.for_range(row_items * groups, item_rows * grid_w * k * group_panels * 2 * B / 3,
                [&](index_t first, index_t last) {
                  thread_local std::vector<const float*> a;
                  thread_local std::vector<float*> c;
                  for (index_t item = first; item < last; ++item) {
                    const index_t g = item % groups, row_item = item / groups;
                    const index_t per_image = (grid_h + item_rows - 1) / item_rows;
                    const index_t n = row_item / per_image;
                    const index_t h0 = row_item % per_image * item_rows;
                    const index_t h1 = std::min(grid_h, h0 + item_rows);
                    const index_t p0 = g * group_panels, p1 = std::min(panels, p0 + group_panels);
                    if (p0 >= p1) continue;
                    const index_t o_begin = p0 * 2 * B, o_end = std::min(outputs, p1 * 2 * B);
                    if (zero_rest) {
                      // The rows of out this item's pixels lie in, for its panels' blocks.
                      const index_t r0 = h0 * s_out;
                      const index_t r1 = h1 == grid_h ? out.height : h1 * s_out;
                      for (index_t o = o_begin; o < o_end; o += B) {
                        float* rows = out_data + (out.at(n, r0, 0, B) - out.data) + o * out.plane();
                        std::memset(rows, 0, sizeof(float) * (r1 - r0) * out.width * B);
                      }
                    }
                    const index_t pixels = (h1 - h0) * grid_w;
                    if (s_in == 1 && s_out == 1) {
                      // The item's pixels lie B floats apart in both (rows h0 to h1 of one
                      // image, one after the other).
                      const float* a0 = in.at(n, h0, 0, B);
                      float* c0 = out_data + (out.at(n, h0, 0, B) - out.data);
                      for (index_t panel = p0; panel < p1; ++panel) {
                        const index_t o0 = panel * 2 * B, width = panel_width(o0, outputs, B);
                        constexpr int R = kDenseRows<B>;
                        for (index_t r0 = 0; r0 < pixels; r0 += R) {
                          const DenseProduct<B> product{a0 + r0 * B,
                                                        k / B,
                                                        in.plane() * B,
                                                        packed + o0 * k,
                                                        c0 + o0 * out.plane() + r0 * B,
                                                        out.plane() * B,
                                                        bias != nullptr ? bias + o0 : nullptr,
                                                        &residual,
                                                        &activation};
                          dispatch<R>(static_cast<int>(std::min<index_t>(R, pixels - r0)),
                                      static_cast<int>(width / B), product);
                        }
                      }
                      continue;
                    }
                    a.resize(pixels);
                    c.resize(pixels);
                    for (index_t p = 0; p < pixels; ++p) {
                      const index_t h = h0 + p / grid_w, w = p % grid_w;
                      a[p] = in.at(n, h * s_in, w * s_in, B);
                      c[p] = out_data + (out.at(n, h * s_out, w * s_out, B) - out.data);
                    }
                    for (index_t panel = p0; panel < p1; ++panel) {
                      const index_t o0 = panel * 2 * B, width = panel_width(o0, outputs, B);
                      ChannelsProduct<B> product{
                          nullptr,         k / B,
                          in.plane() * B,  packed + o0 * k,
                          nullptr,         o0 * out.plane(),
                          out.plane() * B, bias != nullptr ? bias + o0 : nullptr,
                          &residual,       &activation};
                      for (index_t r0 = 0; r0 < pixels; r0 += kRows) {
                        product.a = a.data() + r0;
                        product.c = c.data() + r0;
                        dispatch<kRows>(static_cast<int>(std::min<index_t>(kRows, pixels - r0)),
                                        static_cast<int>(width / B), product);
                      }
                    }
                  }
                });
}

// A weight gradient's reduction: dweights[o][c] += sum over pixels of dy[o][p] x[c][s p].
template <int B>
struct WeightGradient {
  const Image& x;
  const Image& dy;
  index_t stride;

  index_t channels() const { return x.channels; }
  index_t outputs() const { return dy.channels; }
  // Rows (outputs) of the register block: AVX-512's 16 lanes take 8 x 2 vectors (16 of its 32
  // registers; 8 broadcasts and 2 loads per 16 multiply-adds). Measured on ResNet-50's 1x1
  // layers (2-core Xeon, batch 32, 2 threads, one run): 6 rows ran at 1.18-1.48x oneDNN's time,
  // 8 at 1.06-1.31x, 12 at 1.01-1.64x. AVX2's 16 registers keep 6 x 2.
  static constexpr int kWgRows = B == 16 ? 8 : kRows;
  index_t c_panels() const { return (channels() + 2 * B - 1) / (2 * B); }
  index_t o_groups() const { return (outputs() + kWgRows - 1) / kWgRows; }

  // Adds the sums over images [n_begin, n_end) for panels of inputs [c_begin, c_end) and
  // groups of outputs [g_begin, g_end) to `target` (rows of channels() floats). The
  // reduction in steps of about 2048 / B pixels (a panel's x for a step, 16 KB packed, stays
  // in L1 while every output of a block passes it: one load and store of each accumulator
  // per step), the outputs in blocks whose dy for a step is about 128 KB (in L2 while every
  // panel passes it). A step is rows of one image, or whole images where they are smaller.
  void add(index_t n_begin, index_t n_end, index_t c_begin, index_t c_end, index_t g_begin,
           index_t g_end, float* target, std::vector<float>& packed) const {
    const index_t step = 2048 / B, plane = dy.plane();
    const index_t step_rows =
        std::clamp<index_t>(step / std::max<index_t>(1, dy.width), 1, dy.height);
    const index_t step_images =
        plane >= step ? 1 : std::clamp<index_t>(step / plane, 1, n_end - n_begin);
    const index_t block_groups = std::max<index_t>(1, 32768 / (step * kWgRows));
    const float* a[kWgRows];
    float* c[kWgRows];
    for (index_t block = g_begin; block < g_end; block += block_groups) {
      const index_t block_end = std::min(g_end, block + block_groups);
      for (index_t n = n_begin; n < n_end; n += step_images) {
        const index_t images = std::min(step_images, n_end - n);
        const index_t rows = images > 1 ? dy.height : step_rows;
        for (index_t h0 = 0; h0 < dy.height; h0 += rows) {
          const index_t h1 = std::min(dy.height, h0 + rows), pixels = (h1 - h0) * dy.width;
          PixelsProduct<B> product{a, images, pixels, outputs() * plane, {}, c};
          for (index_t panel = c_begin; panel < c_end; ++panel) {
            const index_t c0 = panel * 2 * B, width = panel_width(c0, channels(), B);
            if (stride == 1) {
              // In place: each of the panel's blocks one run of pixels, read in order.
              product.x = {x.at(n, h0, 0, B) + c0 * x.plane(), channels() * x.plane(), B,
                           x.plane() * B};
            } else {
              // The strided pixels packed: whole cache lines read once, in order.
              product.x = {pack_x(n, images, h0, h1, c0, width, packed), pixels * width, width, B};
            }
            for (index_t g = block; g < block_end; ++g) {
              const index_t o0 = g * kWgRows;
              const int count = static_cast<int>(std::min<index_t>(kWgRows, outputs() - o0));
              for (int r = 0; r < count; ++r) {
                const index_t o = o0 + r;
                a[r] = dy.at(n, h0, 0, B) + o / B * plane * B + o % B;
                c[r] = target + o * channels() + c0;
              }
              dispatch<kWgRows>(count, static_cast<int>(width / B), product);
            }
          }
        }
      }
    }
  }

  // x's inputs [c0, c0 + width) under dy's rows [h0, h1) of images [n, n + images), packed
  // as [image][pixel][width]: read in order and whole cache lines, where the stride skips
  // pixels and a panel's blocks lie a plane apart.
  const float* pack_x(index_t n, index_t images, index_t h0, index_t h1, index_t c0, index_t width,
                      std::vector<float>& packed) const {
    packed.resize(static_cast<std::size_t>(images * (h1 - h0) * dy.width * width));
    float* to = packed.data();
    for (index_t m = 0; m < images; ++m) {
      for (index_t h = h0; h < h1; ++h) {
        for (index_t w = 0; w < dy.width; ++w) {
          const float* from = x.at(n + m, h * stride, w * stride, B) + c0 * x.plane();
          for (index_t j = 0; j < width; j += B)
            std::memcpy(to + j, from + j * x.plane(), B * sizeof(float));
          to += width;
        }
      }
    }
    return packed.data();
  }
};

// Weights up to this many bytes have their gradient summed per group of images into partial
// sums, added in order at the end (each thread reads its images' x and dy once); larger ones
// are cut by their inputs or outputs among the threads (each reads all of dy: of ResNet-50's
// 1x1 layers, those with large weights have small images).
constexpr std::size_t kPartialsBytes = std::size_t{1} << 20;
// The groups of images of the partial sums: a function of the batch only, so that the sums
// are the same whatever the thread count.
constexpr index_t kImageGroups = 4;

// dweights[o][c] += sum over images and pixels of dy[o][p] x[c][s p].
template <int B>
void weight_gradient(Parallel& par, const Image& x, const Image& dy, index_t stride, index_t batch,
                     float* dweights, std::vector<float>& partials) {
  const WeightGradient<B> wg{x, dy, stride};
  const index_t count = wg.channels() * wg.outputs();
  const index_t groups = std::min(batch, kImageGroups);
  if (static_cast<std::size_t>(count) * sizeof(float) <= kPartialsBytes && groups > 1) {
    partials.assign(static_cast<std::size_t>(groups * count), 0.0f);
    par.for_range(groups, index_t{1} << 30, [&](index_t first, index_t last) {
      thread_local std::vector<float> packed;
      for (index_t g = first; g < last; ++g) {
        wg.add(g * batch / groups, (g + 1) * batch / groups, 0, wg.c_panels(), 0, wg.o_groups(),
               partials.data() + g * count, packed);
      }
    });
    par.for_range(count, groups * 4, [&](index_t first, index_t last) {
      for (index_t i = first; i < last; ++i) {
        float sum = partials[static_cast<std::size_t>(i)];
        for (index_t g = 1; g < groups; ++g)
          sum += partials[static_cast<std::size_t>(g * count + i)];
        dweights[i] += sum;
      }
    });
    return;
  }
  // Each thread one part of dweights over every image and pixel: contiguous panels of
  // inputs, or groups of outputs where there are too few.
  const index_t threads = par.threads(), c_panels = wg.c_panels(), o_groups = wg.o_groups();
  const bool by_inputs = c_panels >= threads || c_panels >= o_groups;
  const index_t parts = std::min(threads, by_inputs ? c_panels : o_groups);
  par.for_range(parts, index_t{1} << 30, [&](index_t first, index_t last) {
    thread_local std::vector<float> packed;
    for (index_t part = first; part < last; ++part) {
      const index_t units = by_inputs ? c_panels : o_groups;
      const index_t u0 = part * units / parts, u1 = (part + 1) * units / parts;
      if (by_inputs) {
        wg.add(0, batch, u0, u1, 0, o_groups, dweights, packed);
      } else {
        wg.add(0, batch, 0, c_panels, u0, u1, dweights, packed);
      }
    }
  });
}

// dbias[o] += the sum of dy's channel o over the images and pixels, in that order.
template <int B>
void bias_gradient(Parallel& par, const Image& dy, index_t batch, float* dbias) {
  using V = typename Lanes<B>::type;
  par.for_range(dy.channels / B, batch * dy.plane() * B, [&](index_t first, index_t last) {
    for (index_t block = first; block < last; ++block) {
      V sum{};
      for (index_t n = 0; n < batch; ++n) {
        const float* from = dy.at(n, 0, 0, B) + block * B * dy.plane();
        for (index_t p = 0; p < dy.plane(); ++p) {
          V v;
          std::memcpy(&v, from + p * B, sizeof(V));
          sum += v;
        }
      }
      for (int l = 0; l < B; ++l)
        dbias[block * B + l] += sum[l];
    }
  });
}

void check_supported(const char* call, const LoweringShape& shape, index_t out_channels) {
  HN_CHECK(pointwise_supported(shape, out_channels),
           "{} (pointwise): needs one group, a 1x1 kernel, no padding or dilation, and x and y "
           "in one blocked layout with channel counts that are multiples of its block, or both "
           "NCHW with stride 1, got {} with {} outputs, x in {} and y in {}",
           call, shape.to_string(), out_channels, layout_name(shape.layout),
           layout_name(shape.out_layout));
}

}  // namespace

bool pointwise_supported(const LoweringShape& s, index_t out_channels) {
  if (pointwise_plain_supported(s)) return true;
  const index_t block = layout_block(s.layout);
  return s.groups == 1 && s.kernel_h == 1 && s.kernel_w == 1 && s.pad_h == 0 && s.pad_w == 0 &&
         s.dilation_h == 1 && s.dilation_w == 1 && s.stride_h >= 1 && s.stride_h == s.stride_w &&
         (block == 8 || block == 16) && s.out_layout == s.layout && s.channels % block == 0 &&
         out_channels % block == 0;
}

const float* PointwiseConvolution::packed(Parallel& par, const LoweringShape& shape,
                                          index_t out_channels, const float* weights,
                                          bool data_gradient) {
  if (shape.layout == Layout::nchw) {  // conv_pointwise_plain.h's panels (tags 2 and 3)
    const std::pair<float*, bool> kept =
        weights_.get(weights, data_gradient ? 3 : 2, shape.weights_version,
                     pointwise_plain_packed_count(shape, out_channels, data_gradient));
    if (!kept.second) {
      pointwise_plain_pack(par, shape, out_channels, weights, data_gradient, kept.first);
    }
    return kept.first;
  }
  const index_t b = layout_block(shape.layout), channels = shape.channels;
  const std::pair<float*, bool> kept =
      weights_.get(weights, data_gradient ? 1 : 0, shape.weights_version,
                   static_cast<std::size_t>(channels * out_channels));
  float* const buffer = kept.first;
  if (kept.second) return buffer;
  if (data_gradient) {  // rows o, panels of inputs c
    pack(
        par, out_channels, channels, b,
        [&](index_t o, index_t c) { return weights[o * channels + c]; }, buffer);
  } else {  // rows c, panels of outputs o
    pack(
        par, channels, out_channels, b,
        [&](index_t c, index_t o) { return weights[o * channels + c]; }, buffer);
  }
  return buffer;
}

void PointwiseConvolution::forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                   const float* x, const float* weights, const float* bias,
                                   float* y, const Activation& activation, const float* residual) {
  check_supported("conv_forward", shape, out_channels);
  const float* w = packed(par, shape, out_channels, weights, false);
  if (shape.layout == Layout::nchw) {
    return pointwise_plain_forward(par, shape, out_channels, x, w, bias, residual, activation, y);
  }
  const Image in{x, shape.channels, shape.height, shape.width};
  const Image out{y, out_channels, shape.out_h(), shape.out_w()};
  const Residual sum{y, residual};
  if (layout_block(shape.layout) == 16) {
    multiply<16>(par, in, shape.stride_h, out, 1, shape.batch, out.height, out.width, w, bias, sum,
                 activation);
  } else {
    multiply<8>(par, in, shape.stride_h, out, 1, shape.batch, out.height, out.width, w, bias, sum,
                activation);
  }
}

void PointwiseConvolution::backward_data(Parallel& par, const LoweringShape& shape,
                                         index_t out_channels, const float* weights,
                                         const float* dy, float* dx) {
  check_supported("conv_backward_data", shape, out_channels);
  const float* w = packed(par, shape, out_channels, weights, true);
  if (shape.layout == Layout::nchw) {
    return pointwise_plain_backward_data(par, shape, out_channels, w, dy, dx);
  }
  const Image in{dy, out_channels, shape.out_h(), shape.out_w()};
  const Image out{dx, shape.channels, shape.height, shape.width};
  if (layout_block(shape.layout) == 16) {
    multiply<16>(par, in, 1, out, shape.stride_h, shape.batch, in.height, in.width, w, nullptr,
                 Residual{}, Activation{});
  } else {
    multiply<8>(par, in, 1, out, shape.stride_h, shape.batch, in.height, in.width, w, nullptr,
                Residual{}, Activation{});
  }
}

void PointwiseConvolution::backward_weights(Parallel& par, const LoweringShape& shape,
                                            index_t out_channels, const float* x, const float* dy,
                                            float* dweights, float* dbias) {
  check_supported("conv_backward_weights", shape, out_channels);
  if (shape.layout == Layout::nchw) {
    return pointwise_plain_backward_weights(par, shape, out_channels, x, dy, dweights, dbias,
                                            partials_);
  }
  const Image in{x, shape.channels, shape.height, shape.width};
  const Image grad{dy, out_channels, shape.out_h(), shape.out_w()};
  if (layout_block(shape.layout) == 16) {
    weight_gradient<16>(par, in, grad, shape.stride_h, shape.batch, dweights, partials_);
    if (dbias != nullptr) bias_gradient<16>(par, grad, shape.batch, dbias);
  } else {
    weight_gradient<8>(par, in, grad, shape.stride_h, shape.batch, dweights, partials_);
    if (dbias != nullptr) bias_gradient<8>(par, grad, shape.batch, dbias);
  }
}

void PointwiseConvolution::backward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                    const float* x, const float* weights, const float* dy,
                                    float* dx, float* dweights, float* dbias) {
  if (one_pass(shape, dx, dweights)) {
    check_supported("conv_backward", shape, out_channels);
    const float* w = packed(par, shape, out_channels, weights, true);
    return pointwise_plain_backward(par, shape, out_channels, x, w, dy, dx, dweights, dbias,
                                    partials_);
  }
  if (dweights != nullptr) backward_weights(par, shape, out_channels, x, dy, dweights, dbias);
  if (dx != nullptr) backward_data(par, shape, out_channels, weights, dy, dx);
}

bool PointwiseConvolution::one_pass(const LoweringShape& shape, const float* dx,
                                    const float* dweights) {
  return dx != nullptr && dweights != nullptr && shape.layout == Layout::nchw;
}

void PointwiseConvolution::backward_relu(Parallel& par, const LoweringShape& shape,
                                         index_t out_channels, const float* x, const float* weights,
                                         const float* y, float slope, float* dy, float* dx,
                                         float* dweights, float* dbias) {
  check_supported("conv_backward_relu", shape, out_channels);
  HN_CHECK(one_pass(shape, dx, dweights),
           "conv_backward_relu (pointwise): fused on NCHW operands with dx and dweights only");
  const float* w = packed(par, shape, out_channels, weights, true);
  const ReluMask mask{y, slope, dy};
  pointwise_plain_backward(par, shape, out_channels, x, w, dy, dx, dweights, dbias, partials_,
                           &mask);
}

}  // namespace hn::detail::cpu
