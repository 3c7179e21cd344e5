// 1x1 convolutions on NCHW operands (conv_pointwise_plain.h). With stride 1 an image's
// channel is a plane of pixels, and every direction is a GEMM per image:
//   forward:         y[o][p] = sum_c w[o][c] x[c][p]          rows o, vectors of pixels p
//   data gradient:   dx[c][p] = sum_o w[o][c] dy[o][p]        rows c, vectors of pixels p
//   weight gradient: dw[o][c] += sum_(n, p) dy[o][p] x[c][p]  rows o, vectors of inputs c
// The forward and the data gradient read x (dy) in place: a tile of 2 vectors of pixels
// passes every panel of packed weights (12 rows x 2 vectors of accumulators on AVX-512, 6 x 2
// on AVX2, as the blocked kernels of conv_pointwise.cpp). The tiles run along the batch's
// pixels image after image, so 7x7 planes fill them too; a tile that crosses images is
// gathered into a buffer first. The weight gradient reads x transposed to pixel-major
// (pixel_major.h), per image and panel of inputs, and dy's rows in place.
//
// Why: oneDNN 2.6 runs these layers with its GEMM-based NCHW kernel or reorders them to
// nChw16c and back at every call. On ShuffleNet v2's shapes (batch 32, a 2-core Xeon) its
// forward ran at 150-160 GFLOP/s and its weight gradient at 80-120, this file's at 200-240 and
// 200-260 where the prototypes measured them.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_pointwise_plain.h"

#include <algorithm>
#include <cstring>

#include "lib/core/check.h"
#include "lib/drivers/cpu/parallel.h"
#include "lib/drivers/cpu/pixel_major.h"
#include "lib/drivers/cpu/simd.h"

namespace hn::detail::cpu {

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
using V = Lanes<kLanes>::type;
constexpr int kRows = kLanes == 16 ? 12 : 6;  // rows of the register block
constexpr int kVectors = 2;                   // vectors per row
// Pixels of a forward or data-gradient tile; inputs of a weight-gradient panel.
constexpr index_t kTile = kVectors * kLanes;
// The weight gradient's groups of images, each summed on its own and added in order: a
// function of the batch only, so that the sums are the same whatever the thread count.
constexpr index_t kImageGroups = 4;

// acc = the tile's product with one panel: sum over i < k of panel[i * kRows + r] *
// b[i * b_step + j * kLanes]. Where `next` is not null, the next tile's rows (next + i *
// b_step) are fetched meanwhile: a tile's rows lie a plane apart, and the first panel to
// read them had waited on each (the kernel ran at half its speed on ShuffleNet's 56x56).
template <bool Fetch>
inline void panel_product(const float* panel, index_t k, const float* b, index_t b_step,
                          const float* next, V (&acc)[kRows][kVectors]) {
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kVectors; ++j)
      acc[r][j] = V{};
  }
  for (index_t i = 0; i < k; ++i) {
    if constexpr (Fetch) {
      for (index_t l = 0; l < kTile; l += 16)
        __builtin_prefetch(next + i * b_step + l);
    }
    V bv[kVectors];
    for (int j = 0; j < kVectors; ++j)
      std::memcpy(&bv[j], b + i * b_step + j * kLanes, sizeof(V));
    const float* a = panel + i * kRows;
    for (int r = 0; r < kRows; ++r) {
      const float av = a[r];
      for (int j = 0; j < kVectors; ++j)
        acc[r][j] += av * bv[j];
    }
  }
}

// The pieces of pixels [q0, q1) of the batch's planes: image n, pixels [p, p + count) of its
// plane, at offset `at` of the tile; f(n, p, count, at) for each.
template <class F>
void for_pieces(index_t q0, index_t q1, index_t plane, const F& f) {
  for (index_t q = q0; q < q1;) {
    const index_t n = q / plane, p = q % plane;
    const index_t count = std::min(plane - p, q1 - q);
    f(n, p, count, q - q0);
    q += count;
  }
}

// out[n][o][p] = sum_i packed(o, i) in[n][i][p] (+ bias[o], + residual, activation) for
// images n, outputs o < outputs and the pixels p of their planes; in has k channels.
struct Product {
  index_t plane, k, outputs;
  const float* in;
  const float* packed;
  const float* bias;
  const float* residual;
  const Activation& activation;
  float* out;

  // The pixels [begin, end) of the batch's planes, image after image, in tiles from begin.
  void run(index_t begin, index_t end) const {
    thread_local std::vector<float> gathered;
    alignas(64) float block[kRows * kTile];
    const index_t panels = (outputs + kRows - 1) / kRows;
    for (index_t q0 = begin; q0 < end; q0 += kTile) {
      const index_t q1 = std::min(end, q0 + kTile);
      const index_t n0 = q0 / plane, p0 = q0 % plane;
      // In place where the tile is whole and inside one image; else gathered, zeros after
      // the range's last pixel.
      const bool inside = q1 - q0 == kTile && p0 + kTile <= plane;
      const float* b = in + n0 * k * plane + p0;
      index_t b_step = plane;
      if (!inside) {
        gathered.assign(static_cast<std::size_t>(k * kTile), 0.0f);
        for_pieces(q0, q1, plane, [&](index_t n, index_t p, index_t count, index_t at) {
          for (index_t i = 0; i < k; ++i) {
            std::memcpy(gathered.data() + i * kTile + at, in + (n * k + i) * plane + p,
                        sizeof(float) * static_cast<std::size_t>(count));
          }
        });
        b = gathered.data();
        b_step = kTile;
      }
      // The next tile, where it is this range's and lies in place as this one.
      const bool fetch = inside && q1 + kTile <= end && p0 + 2 * kTile <= plane;
      for (index_t panel = 0; panel < panels; ++panel) {
        const index_t o0 = panel * kRows;
        const int rows = static_cast<int>(std::min<index_t>(kRows, outputs - o0));
        V acc[kRows][kVectors];
        if (panel == 0 && fetch) {
          panel_product<true>(packed + o0 * k, k, b, b_step, b + kTile, acc);
        } else {
          panel_product<false>(packed + o0 * k, k, b, b_step, nullptr, acc);
        }
        if (inside) {
          store(acc, rows, o0, out + (n0 * outputs + o0) * plane + p0);
        } else {
          scatter(acc, rows, o0, q0, q1, block);
        }
      }
    }
  }

  // The block's rows (+ bias, + residual, activated) into y's rows at `to`, a plane apart.
  void store(const V (&acc)[kRows][kVectors], int rows, index_t o0, float* to) const {
    const float* add = residual != nullptr ? residual + (to - out) : nullptr;
    for (int r = 0; r < rows; ++r) {
      const float shift = bias != nullptr ? bias[o0 + r] : 0.0f;
      for (int j = 0; j < kVectors; ++j) {
        V value = acc[r][j] + shift;
        const index_t at = r * plane + j * kLanes;
        if (add != nullptr) {
          V more;
          std::memcpy(&more, add + at, sizeof(V));
          value += more;
        }
        activate(value, activation);
        std::memcpy(to + at, &value, sizeof(V));
      }
    }
  }

  // The same for a gathered tile (pixels [q0, q1)), through `block`.
  void scatter(const V (&acc)[kRows][kVectors], int rows, index_t o0, index_t q0, index_t q1,
               float* block) const {
    for (int r = 0; r < rows; ++r) {
      const float shift = bias != nullptr ? bias[o0 + r] : 0.0f;
      for (int j = 0; j < kVectors; ++j) {
        const V value = acc[r][j] + shift;
        std::memcpy(block + r * kTile + j * kLanes, &value, sizeof(V));
      }
    }
    for_pieces(q0, q1, plane, [&](index_t n, index_t p, index_t count, index_t at) {
      for (int r = 0; r < rows; ++r) {
        const index_t offset = (n * outputs + o0 + r) * plane + p;
        for (index_t i = 0; i < count; ++i) {
          float value = block[r * kTile + at + i];
          if (residual != nullptr) value += residual[offset + i];
          activate(value, activation);
          out[offset + i] = value;
        }
      }
    });
  }
};

// Product::run over every image of the batch.
void product(Parallel& par, index_t batch, const Product& product) {
  const index_t total = batch * product.plane, tiles = (total + kTile - 1) / kTile;
  // Items: runs of consecutive tiles, four per thread, so that each thread writes y's rows
  // in long runs (interleaved runs of 5 tiles had halved the speed where y leaves the cache).
  const index_t span = std::max<index_t>(1, tiles / (4 * par.threads()));
  const index_t items = (tiles + span - 1) / span;
  par.for_range(items, span * kTile * product.k * product.outputs / 4,
                [&](index_t first, index_t last) {
                  product.run(first * span * kTile, std::min(total, last * span * kTile));
                });
}

// c[r][j] += sum over pixels p < plane of dy[r * plane + p] * xt[p * kTile + j * kLanes], for R
// rows of c (c_row floats apart): one image's weight gradient for R outputs and one panel of
// inputs.
template <int R>
void gradient_rows(const float* dy, index_t plane, const float* xt, float* c, index_t c_row) {
  V acc[R][kVectors];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kVectors; ++j)
      std::memcpy(&acc[r][j], c + r * c_row + j * kLanes, sizeof(V));
  }
  for (index_t p = 0; p < plane; ++p) {
    V bv[kVectors];
    for (int j = 0; j < kVectors; ++j)
      std::memcpy(&bv[j], xt + p * kTile + j * kLanes, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const float av = dy[r * plane + p];
      for (int j = 0; j < kVectors; ++j)
        acc[r][j] += av * bv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kVectors; ++j)
      std::memcpy(c + r * c_row + j * kLanes, &acc[r][j], sizeof(V));
  }
}

// gradient_rows<rows> for rows from 1 to R.
template <int R>
void gradient_block(int rows, const float* dy, index_t plane, const float* xt, float* c,
                    index_t c_row) {
  if constexpr (R > 1) {
    if (rows < R) return gradient_block<R - 1>(rows, dy, plane, xt, c, c_row);
  }
  gradient_rows<R>(dy, plane, xt, c, c_row);
}

// The weight gradient's (and the bias gradient's) sums per group of images, in `partials`:
// group g's dw[o][c] at g * count + o * width + c, then each group's dbias[o].
struct WeightSums {
  index_t batch, channels, outputs, plane, panels, width, groups, count;
  bool bias;  // whether the bias gradient is summed too
  const float* x;
  const float* dy;
  float* partials;

  WeightSums(const LoweringShape& shape, index_t out_channels, const float* x_in,
             const float* dy_in, bool with_bias, std::vector<float>& storage)
      : batch(shape.batch),
        channels(shape.channels),
        outputs(out_channels),
        plane(shape.height * shape.width),
        panels((channels + kTile - 1) / kTile),
        width(panels * kTile),
        groups(std::min(batch, kImageGroups)),
        count(outputs * width),
        bias(with_bias),
        x(x_in),
        dy(dy_in) {
    storage.assign(static_cast<std::size_t>(groups * (count + (with_bias ? outputs : 0))), 0.0f);
    partials = storage.data();
  }

  index_t first_image(index_t g) const { return g * batch / groups; }

  // Image n's terms for the panels of inputs [p0, p1), added to group g's sums: each panel's
  // inputs transposed to pixel-major rows of kTile, dy's rows read in place.
  void add_image(index_t g, index_t n, index_t p0, index_t p1) const {
    thread_local std::vector<float> xt;
    xt.resize(static_cast<std::size_t>(plane * kTile));
    const float* grad = dy + n * outputs * plane;
    for (index_t panel = p0; panel < p1; ++panel) {
      const index_t c0 = panel * kTile;
      for (index_t l = 0; l < kTile; l += kPixelMajorLanes) {
        const index_t lanes = std::clamp<index_t>(channels - c0 - l, 0, kPixelMajorLanes);
        const float* planes = lanes > 0 ? x + (n * channels + c0 + l) * plane : x;
        to_pixel_major(planes, plane, lanes, xt.data() + l, kTile);
      }
      float* sums = partials + g * count + c0;
      for (index_t o0 = 0; o0 < outputs; o0 += kRows) {
        const int rows = static_cast<int>(std::min<index_t>(kRows, outputs - o0));
        gradient_block<kRows>(rows, grad + o0 * plane, plane, xt.data(), sums + o0 * width, width);
      }
    }
  }

  // Image n's dy summed per output, added to group g's bias sums (nothing without a bias).
  void add_bias(index_t g, index_t n) const {
    if (!bias) return;
    float* sums = partials + groups * count + g * outputs;
    for (index_t o = 0; o < outputs; ++o) {
      const float* row = dy + (n * outputs + o) * plane;
      V acc{};
      index_t p = 0;
      for (; p + kLanes <= plane; p += kLanes) {
        V v;
        std::memcpy(&v, row + p, sizeof(V));
        acc += v;
      }
      float sum = 0.0f;
      for (int l = 0; l < kLanes; ++l)
        sum += acc[l];
      for (; p < plane; ++p)
        sum += row[p];
      sums[o] += sum;
    }
  }

  // dweights (and dbias) += the groups' sums, in group order.
  void finish(Parallel& par, float* dweights, float* dbias) const {
    par.for_range(outputs, channels * groups, [&](index_t first, index_t last) {
      for (index_t o = first; o < last; ++o) {
        for (index_t c = 0; c < channels; ++c) {
          float sum = partials[o * width + c];
          for (index_t g = 1; g < groups; ++g)
            sum += partials[g * count + o * width + c];
          dweights[o * channels + c] += sum;
        }
        if (dbias == nullptr) continue;
        float sum = partials[groups * count + o];
        for (index_t g = 1; g < groups; ++g)
          sum += partials[groups * count + g * outputs + o];
        dbias[o] += sum;
      }
    });
  }
};

}  // namespace

bool pointwise_plain_supported(const LoweringShape& s) {
  return s.groups == 1 && s.kernel_h == 1 && s.kernel_w == 1 && s.pad_h == 0 && s.pad_w == 0 &&
         s.dilation_h == 1 && s.dilation_w == 1 && s.stride_h == 1 && s.stride_w == 1 &&
         s.layout == Layout::nchw && s.out_layout == Layout::nchw;
}

std::size_t pointwise_plain_packed_count(const LoweringShape& shape, index_t out_channels,
                                         bool data_gradient) {
  const index_t rows = data_gradient ? shape.channels : out_channels;
  const index_t k = data_gradient ? out_channels : shape.channels;
  return static_cast<std::size_t>((rows + kRows - 1) / kRows * kRows * k);
}

void pointwise_plain_pack(Parallel& par, const LoweringShape& shape, index_t out_channels,
                          const float* weights, bool data_gradient, float* packed) {
  const index_t channels = shape.channels;
  // Rows o with reduction c (forward), or rows c with reduction o (data gradient).
  const index_t rows = data_gradient ? channels : out_channels;
  const index_t k = data_gradient ? out_channels : channels;
  const index_t panels = (rows + kRows - 1) / kRows;
  par.for_range(panels, k * kRows, [&](index_t first, index_t last) {
    for (index_t panel = first; panel < last; ++panel) {
      float* to = packed + panel * kRows * k;
      for (index_t i = 0; i < k; ++i) {
        for (index_t r = 0; r < kRows; ++r) {
          const index_t row = panel * kRows + r;
          float value = 0.0f;
          if (row < rows) {
            value = data_gradient ? weights[i * channels + row] : weights[row * channels + i];
          }
          to[i * kRows + r] = value;
        }
      }
    }
  });
}

void pointwise_plain_forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                             const float* x, const float* packed, const float* bias,
                             const float* residual, const Activation& activation, float* y) {
  product(par, shape.batch,
          Product{shape.height * shape.width, shape.channels, out_channels, x, packed, bias,
                  residual, activation, y});
}

void pointwise_plain_backward_data(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                   const float* packed, const float* dy, float* dx) {
  const Activation none;
  product(par, shape.batch,
          Product{shape.height * shape.width, out_channels, shape.channels, dy, packed, nullptr,
                  nullptr, none, dx});
}

void pointwise_plain_backward_weights(Parallel& par, const LoweringShape& shape,
                                      index_t out_channels, const float* x, const float* dy,
                                      float* dweights, float* dbias, std::vector<float>& partials) {
  const WeightSums sums(shape, out_channels, x, dy, dbias != nullptr, partials);
  // Items: a group of images and a panel of inputs (the bias with the first panel).
  par.for_range(sums.groups * sums.panels,
                shape.batch / sums.groups * sums.plane * kTile * out_channels / 4,
                [&](index_t first, index_t last) {
                  for (index_t item = first; item < last; ++item) {
                    const index_t g = item / sums.panels, panel = item % sums.panels;
                    for (index_t n = sums.first_image(g); n < sums.first_image(g + 1); ++n) {
                      sums.add_image(g, n, panel, panel + 1);
                      if (panel == 0) sums.add_bias(g, n);
                    }
                  }
                });
  sums.finish(par, dweights, dbias);
}

void pointwise_plain_backward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                              const float* x, const float* packed, const float* dy, float* dx,
                              float* dweights, float* dbias, std::vector<float>& partials,
                              const ReluMask* mask) {
  const WeightSums sums(shape, out_channels, x, dy, dbias != nullptr, partials);
  const Activation none;
  const Product data{sums.plane, out_channels, shape.channels, dy, packed,
                     nullptr,    nullptr,      none,           dx};
  const index_t image = out_channels * sums.plane;  // floats of an image's dy
  // Items: a group of images, image after image: its dy read from memory by the weight
  // gradient's first panel (or the mask), from cache by the rest, the bias and the data
  // gradient.
  par.for_range(sums.groups,
                shape.batch / sums.groups * sums.plane * out_channels * 2 * shape.channels,
                [&](index_t first, index_t last) {
                  for (index_t g = first; g < last; ++g) {
                    for (index_t n = sums.first_image(g); n < sums.first_image(g + 1); ++n) {
                      if (mask != nullptr) {
                        relu_backward_run(image, mask->slope, mask->y + n * image,
                                          mask->dy + n * image, mask->dy + n * image);
                      }
                      sums.add_image(g, n, 0, sums.panels);
                      sums.add_bias(g, n);
                      data.run(n * sums.plane, (n + 1) * sums.plane);
                    }
                  }
                });
  sums.finish(par, dweights, dbias);
}

}  // namespace hn::detail::cpu
