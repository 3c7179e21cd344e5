// The reference kernels, part 1: GEMM, lowering, convolution, element-wise calls,
// reductions and activations as naive single-thread loops in the style of Caffe's CPU
// code, written to be obviously correct rather than fast (oneDNN's ref_ primitives play
// the same part). Sums run in double and each loop follows the formula documented in
// driver_calls.def / shapes.h. They are the reference driver's arithmetic, the oracle of
// every driver test, and the generic implementation of the optional calls.
#include "lib/core/ref_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace hn::ref {

// ---- GEMM ---------------------------------------------------------------------------

void gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
          const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
          index_t ldc) {
  // op(A)[i][p] and op(B)[p][j] read from the matrices as stored.
  const auto op_a = [&](index_t i, index_t p) {
    return trans_a == Transpose::yes ? a[p * lda + i] : a[i * lda + p];
  };
  const auto op_b = [&](index_t p, index_t j) {
    return trans_b == Transpose::yes ? b[j * ldb + p] : b[p * ldb + j];
  };
  // Each product C[i][j] sums its terms in the order of p. Row by row of B where B's rows
  // are contiguous (the sums of a row of C side by side), term by term otherwise.
  std::vector<double> row(trans_b == Transpose::yes ? 0 : static_cast<std::size_t>(n));
  for (index_t i = 0; i < m; ++i) {
    if (trans_b == Transpose::no) {
      std::fill(row.begin(), row.end(), 0.0);
      for (index_t p = 0; p < k; ++p) {
        const double a_ip = op_a(i, p);
        const float* b_row = b + p * ldb;
        for (index_t j = 0; j < n; ++j)
          row[static_cast<std::size_t>(j)] += a_ip * b_row[j];
      }
    }
    for (index_t j = 0; j < n; ++j) {
      double product = 0.0;
      if (trans_b == Transpose::no) {
        product = row[static_cast<std::size_t>(j)];
      } else {
        for (index_t p = 0; p < k; ++p)
          product += static_cast<double>(op_a(i, p)) * op_b(p, j);
      }
      float& out = c[i * ldc + j];
      // beta == 0 must not read C: it may hold NaN or garbage.
      const double prior = beta == 0.0f ? 0.0 : static_cast<double>(beta) * out;
      out = static_cast<float>(alpha * product + prior);
    }
  }
}

// ---- lowering -----------------------------------------------------------------------

// Calls visit(image index or -1 when in the padding, column-matrix index) for every
// element of the lowered matrix, so im2col and col2im share one statement of the layout.
template <class Visit>
static void for_each_lowered(const LoweringShape& s, Visit visit) {
  const index_t out_h = s.out_h(), out_w = s.out_w(), cols = s.cols();
  for (index_t c = 0; c < s.channels; ++c) {
    for (index_t kh = 0; kh < s.kernel_h; ++kh) {
      for (index_t kw = 0; kw < s.kernel_w; ++kw) {
        const index_t row = (c * s.kernel_h + kh) * s.kernel_w + kw;
        for (index_t n = 0; n < s.batch; ++n) {
          for (index_t oh = 0; oh < out_h; ++oh) {
            for (index_t ow = 0; ow < out_w; ++ow) {
              const index_t col = (n * out_h + oh) * out_w + ow;
              const index_t h = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
              const index_t w = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
              const bool inside = h >= 0 && h < s.height && w >= 0 && w < s.width;
              const index_t pixel =
                  inside ? ((n * s.channels + c) * s.height + h) * s.width + w : -1;
              visit(pixel, row * cols + col);
            }
          }
        }
      }
    }
  }
}

void im2col(const LoweringShape& shape, const float* images, float* columns) {
  for_each_lowered(shape, [&](index_t pixel, index_t entry) {
    columns[entry] = pixel >= 0 ? images[pixel] : 0.0f;
  });
}

void col2im(const LoweringShape& shape, const float* columns, float* images) {
  std::fill(images, images + shape.image_count(), 0.0f);
  for_each_lowered(shape, [&](index_t pixel, index_t entry) {
    if (pixel >= 0) images[pixel] += columns[entry];
  });
}

void swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) {
  for (index_t i = 0; i < d0; ++i) {
    for (index_t j = 0; j < d1; ++j) {
      for (index_t r = 0; r < inner; ++r) {
        dst[(j * d0 + i) * inner + r] = src[(i * d1 + j) * inner + r];
      }
    }
  }
}

// Calls visit(products index, output index) for every product term that lands in the
// output (CcT lowering type 3, documented in driver.h), so lift and lift_backward share
// one statement of the layout.
template <class Visit>
static void for_each_lifted(const LoweringShape& s, index_t out_channels, Visit visit) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  const index_t product_cols = out_channels * s.kernel_h * s.kernel_w;
  for (index_t n = 0; n < s.batch; ++n) {
    for (index_t co = 0; co < out_channels; ++co) {
      for (index_t oh = 0; oh < out_h; ++oh) {
        for (index_t ow = 0; ow < out_w; ++ow) {
          const index_t out = ((n * out_channels + co) * out_h + oh) * out_w + ow;
          for (index_t kh = 0; kh < s.kernel_h; ++kh) {
            for (index_t kw = 0; kw < s.kernel_w; ++kw) {
              const index_t h = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
              const index_t w = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
              if (h < 0 || h >= s.height || w < 0 || w >= s.width) continue;
              const index_t row = (n * s.height + h) * s.width + w;
              const index_t col = (co * s.kernel_h + kh) * s.kernel_w + kw;
              visit(row * product_cols + col, out);
            }
          }
        }
      }
    }
  }
}

void lift(const LoweringShape& shape, index_t out_channels, const float* products, float* y) {
  const index_t count = shape.batch * out_channels * shape.out_h() * shape.out_w();
  std::vector<double> total(static_cast<std::size_t>(count), 0.0);
  for_each_lifted(shape, out_channels,
                  [&](index_t product, index_t out) { total[out] += products[product]; });
  for (index_t i = 0; i < count; ++i)
    y[i] = static_cast<float>(total[i]);
}

void lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                   float* products_diff) {
  const index_t count =
      shape.batch * shape.height * shape.width * out_channels * shape.kernel_h * shape.kernel_w;
  std::fill(products_diff, products_diff + count, 0.0f);
  for_each_lifted(shape, out_channels,
                  [&](index_t product, index_t out) { products_diff[product] = dy[out]; });
}

// ---- direct convolution -------------------------------------------------------------

// Calls visit(x index, x step, weights index, y index, count) for every run of products
// x[x index + i * x step] * weights[weights index] that land in y[y index + i], i < count: one
// run per (n, co, ci, kh, kw, oh), over the output columns whose input column is inside the
// image, so the three convolution calls share one statement of the layout and their inner
// loops are the runs (contiguous in y; under AddressSanitizer a call per product was 95 %
// of ResNet-50's zoo test). The loops go over n, co, ci, kh, kw, oh, ow, with kh and kw
// descending when kKernelDescending: each output's terms then come in the order of the
// loops over n, co, oh, ow, ci, kh, kw (each input's for the data gradient, each weight's
// for the weight gradient), the order the sums below were first written in.
template <bool kKernelDescending, class Visit>
static void for_each_conv_run(const LoweringShape& s, index_t out_channels, Visit visit) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  const index_t in_per_group = s.channels / s.groups, out_per_group = out_channels / s.groups;
  const index_t plane = s.height * s.width, kernel = s.kernel_h * s.kernel_w;
  for (index_t n = 0; n < s.batch; ++n) {
    for (index_t co = 0; co < out_channels; ++co) {
      const index_t g = co / out_per_group;
      const index_t x_group = (n * s.channels + g * in_per_group) * plane;
      const index_t y_channel = (n * out_channels + co) * out_h * out_w;
      for (index_t ci = 0; ci < in_per_group; ++ci) {
        const index_t x_plane = x_group + ci * plane;
        const index_t w_plane = (co * in_per_group + ci) * kernel;
        for (index_t i = 0; i < s.kernel_h; ++i) {
          const index_t kh = kKernelDescending ? s.kernel_h - 1 - i : i;
          for (index_t j = 0; j < s.kernel_w; ++j) {
            const index_t kw = kKernelDescending ? s.kernel_w - 1 - j : j;
            // The output columns ow with 0 <= ow * stride - pad + kw * dilation < width.
            const index_t offset = kw * s.dilation_w - s.pad_w;
            const index_t first = offset >= 0 ? 0 : (-offset + s.stride_w - 1) / s.stride_w;
            const index_t last_input = s.width - 1 - offset;  // ow * stride <= this
            if (last_input < 0) continue;
            const index_t end = std::min(out_w, last_input / s.stride_w + 1);
            if (first >= end) continue;
            const index_t wi = w_plane + kh * s.kernel_w + kw;
            for (index_t oh = 0; oh < out_h; ++oh) {
              const index_t h = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
              if (h < 0 || h >= s.height) continue;
              visit(x_plane + h * s.width + first * s.stride_w + offset, s.stride_w, wi,
                    y_channel + oh * out_w + first, end - first);
            }
          }
        }
      }
    }
  }
}

static index_t conv_out_count(const LoweringShape& s, index_t out_channels) {
  return s.batch * out_channels * s.out_h() * s.out_w();
}
static index_t conv_weight_count(const LoweringShape& s, index_t out_channels) {
  return out_channels * (s.channels / s.groups) * s.kernel_h * s.kernel_w;
}

void conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                  const float* weights, const float* bias, float* y) {
  const index_t count = conv_out_count(shape, out_channels);
  const index_t plane = shape.out_h() * shape.out_w();
  std::vector<double> total(static_cast<std::size_t>(count), 0.0);
  if (bias != nullptr) {
    for (index_t i = 0; i < count; ++i)
      total[i] = bias[(i / plane) % out_channels];
  }
  double* sums = total.data();
  for_each_conv_run<false>(shape, out_channels,
                           [&](index_t xi, index_t step, index_t wi, index_t yi, index_t run) {
                             const float w = weights[wi];
                             double* out = sums + yi;
                             const float* in = x + xi;
                             for (index_t i = 0; i < run; ++i)
                               out[i] += static_cast<double>(in[i * step]) * w;
                           });
  for (index_t i = 0; i < count; ++i)
    y[i] = static_cast<float>(total[i]);
}

void conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                        const float* dy, float* dx) {
  const index_t count = shape.image_count();
  std::vector<double> total(static_cast<std::size_t>(count), 0.0);
  double* sums = total.data();
  for_each_conv_run<true>(shape, out_channels,
                          [&](index_t xi, index_t step, index_t wi, index_t yi, index_t run) {
                            const float w = weights[wi];
                            double* out = sums + xi;
                            const float* in = dy + yi;
                            for (index_t i = 0; i < run; ++i)
                              out[i * step] += static_cast<double>(in[i]) * w;
                          });
  for (index_t i = 0; i < count; ++i)
    dx[i] = static_cast<float>(total[i]);
}

void conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                           const float* dy, float* dweights, float* dbias) {
  const index_t count = conv_weight_count(shape, out_channels);
  std::vector<double> total(static_cast<std::size_t>(count), 0.0);
  double* sums = total.data();
  for_each_conv_run<false>(shape, out_channels,
                           [&](index_t xi, index_t step, index_t wi, index_t yi, index_t run) {
                             double sum = sums[wi];
                             const float* in = x + xi;
                             const float* grad = dy + yi;
                             for (index_t i = 0; i < run; ++i)
                               sum += static_cast<double>(in[i * step]) * grad[i];
                             sums[wi] = sum;
                           });
  for (index_t i = 0; i < count; ++i)
    dweights[i] = static_cast<float>(dweights[i] + total[i]);
  if (dbias == nullptr) return;
  const index_t plane = shape.out_h() * shape.out_w();
  std::vector<double> bias_total(static_cast<std::size_t>(out_channels), 0.0);
  const index_t out_count = conv_out_count(shape, out_channels);
  for (index_t i = 0; i < out_count; ++i)
    bias_total[(i / plane) % out_channels] += dy[i];
  for (index_t c = 0; c < out_channels; ++c)
    dbias[c] = static_cast<float>(dbias[c] + bias_total[c]);
}

void conv_backward(const LoweringShape& shape, index_t out_channels, const float* x,
                   const float* weights, const float* dy, float* dx, float* dweights,
                   float* dbias) {
  if (dweights != nullptr) conv_backward_weights(shape, out_channels, x, dy, dweights, dbias);
  if (dx != nullptr) conv_backward_data(shape, out_channels, weights, dy, dx);
}

void conv_backward_relu(const LoweringShape& shape, index_t out_channels, const float* x,
                        const float* weights, const float* y, float negative_slope, float* dy,
                        float* dx, float* dweights, float* dbias) {
  relu_backward(conv_out_count(shape, out_channels), negative_slope, y, dy, dy);
  conv_backward(shape, out_channels, x, weights, dy, dx, dweights, dbias);
}

namespace {

// y = activation(y) in place on n floats (nothing for none).
void activate(index_t n, const Activation& activation, float* y) {
  if (activation.kind == Activation::Kind::relu) relu_forward(n, activation.slope, y, y);
  if (activation.kind == Activation::Kind::clip)
    clip_forward(n, activation.lo, activation.hi, y, y);
}

}  // namespace

void conv_forward_activation(const LoweringShape& shape, index_t out_channels, const float* x,
                             const float* weights, const float* bias, const Activation& activation,
                             float* y) {
  conv_forward(shape, out_channels, x, weights, bias, y);
  activate(conv_out_count(shape, out_channels), activation, y);
}

void conv_forward_residual(const LoweringShape& shape, index_t out_channels, const float* x,
                           const float* weights, const float* bias, const float* residual,
                           const Activation& activation, float* y) {
  conv_forward(shape, out_channels, x, weights, bias, y);
  const index_t n = conv_out_count(shape, out_channels);
  for (index_t i = 0; i < n; ++i)
    y[i] += residual[i];
  activate(n, activation, y);
}

// ---- element-wise -------------------------------------------------------------------

void fill(index_t n, float value, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] = value;
}
void scale(index_t n, float alpha, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] *= alpha;
}
void axpy(index_t n, float alpha, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}
void lincomb(index_t n, float alpha, const float* a, float beta, const float* b, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = alpha * a[i] + beta * b[i];
}
void lincomb_relu(index_t n, float alpha, const float* a, float beta, const float* b, float slope,
                  float* y) {
  for (index_t i = 0; i < n; ++i) {
    const float v = alpha * a[i] + beta * b[i];
    y[i] = v > 0.0f ? v : slope * v;
  }
}
void axpby(index_t n, float alpha, const float* x, float beta, float* y) {
  for (index_t i = 0; i < n; ++i) {
    // beta == 0 must not read y.
    y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
  }
}
void mul(index_t n, const float* a, const float* b, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = a[i] * b[i];
}

void add_scalar(index_t n, float alpha, float* x) {
  for (index_t i = 0; i < n; ++i)
    x[i] += alpha;
}
void powx(index_t n, const float* x, float exponent, float* y) {
  for (index_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>(std::pow(static_cast<double>(x[i]), static_cast<double>(exponent)));
  }
}
void copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                  index_t dst_ld) {
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c = 0; c < cols; ++c)
      dst[r * dst_ld + c] = src[r * src_ld + c];
  }
}
void copy_strided_batched(index_t batch, index_t rows, index_t cols, const float* src,
                          index_t src_ld, index_t src_stride, float* dst, index_t dst_ld,
                          index_t dst_stride) {
  for (index_t b = 0; b < batch; ++b)
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c)
        dst[b * dst_stride + r * dst_ld + c] = src[b * src_stride + r * src_ld + c];
}
void scale_channels(const AxisShape& shape, const float* scale, const float* x, float* y) {
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t c = 0; c < shape.channels; ++c) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t at = (o * shape.channels + c) * shape.inner + i;
        y[at] = x[at] * scale[c];
      }
    }
  }
}
void max_accumulate(index_t n, const float* x, std::int32_t index, float* y, std::int32_t* mask) {
  for (index_t i = 0; i < n; ++i) {
    // Caffe's rule: input 1 wins ties with input 0; later inputs need to be greater.
    if (index == 0 || (index == 1 ? !(y[i] > x[i]) : x[i] > y[i])) {
      y[i] = x[i];
      mask[i] = index;
    }
  }
}
void max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                float* dx) {
  for (index_t i = 0; i < n; ++i)
    dx[i] = mask[i] == index ? dy[i] : 0.0f;
}

// ---- reductions ---------------------------------------------------------------------

float dot(index_t n, const float* x, const float* y) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += static_cast<double>(x[i]) * y[i];
  return static_cast<float>(total);
}
float asum(index_t n, const float* x) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += std::abs(static_cast<double>(x[i]));
  return static_cast<float>(total);
}
float sum(index_t n, const float* x) {
  double total = 0.0;
  for (index_t i = 0; i < n; ++i)
    total += x[i];
  return static_cast<float>(total);
}

void bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias) {
  for (index_t c = 0; c < shape.channels; ++c) {
    double total = 0.0;
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        total += dy[(o * shape.channels + c) * shape.inner + i];
      }
    }
    // beta == 0 must not read dbias.
    const double prior = beta == 0.0f ? 0.0 : static_cast<double>(beta) * dbias[c];
    dbias[c] = static_cast<float>(prior + total);
  }
}

void relu_backward_bias(const AxisShape& shape, float negative_slope, const float* y,
                        const float* dy, float* dx, float* dbias) {
  relu_backward(shape.count(), negative_slope, y, dy, dx);
  bias_backward(shape, dx, 1.0f, dbias);
}

// ---- per-channel normalisation --------------------------------------------------------

void norm_affine_forward(const AxisShape& shape, const float* x, const float* shift,
                         const float* inv_std, const float* gamma, const float* beta, bool relu,
                         float slope, float* normalised, float* y) {
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t c = 0; c < shape.channels; ++c) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t at = (o * shape.channels + c) * shape.inner + i;
        const float n = (x[at] + shift[c]) * inv_std[c];
        if (normalised != nullptr) normalised[at] = n;
        float v = n * gamma[c] + (beta != nullptr ? beta[c] : 0.0f);
        if (relu && !(v > 0.0f)) v *= slope;
        y[at] = v;
      }
    }
  }
}

void norm_affine_backward(const AxisShape& shape, const float* dy, const float* y,
                          const float* normalised, const float* dx_scale, bool relu, float slope,
                          float* dgamma, float* dbeta, float* dx) {
  for (index_t c = 0; c < shape.channels; ++c) {
    double sum_dz = 0.0, sum_dz_n = 0.0;
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t at = (o * shape.channels + c) * shape.inner + i;
        const float dz = relu && !(y[at] > 0.0f) ? dy[at] * slope : dy[at];
        sum_dz += dz;
        if (dgamma != nullptr) sum_dz_n += static_cast<double>(dz) * normalised[at];
        if (dx != nullptr) dx[at] = dz * dx_scale[c];
      }
    }
    if (dgamma != nullptr) dgamma[c] = static_cast<float>(dgamma[c] + sum_dz_n);
    if (dbeta != nullptr) dbeta[c] = static_cast<float>(dbeta[c] + sum_dz);
  }
}

// ---- activations --------------------------------------------------------------------

void bias_forward(const AxisShape& shape, const float* bias, float* y) {
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t c = 0; c < shape.channels; ++c) {
      for (index_t i = 0; i < shape.inner; ++i) {
        y[(o * shape.channels + c) * shape.inner + i] += bias[c];
      }
    }
  }
}

void relu_forward(index_t n, float negative_slope, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = x[i] > 0.0f ? x[i] : negative_slope * x[i];
}
void relu_backward(index_t n, float negative_slope, const float* x, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i)
    dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : negative_slope);
}

void clip_forward(index_t n, float lo, float hi, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}
void clip_backward(index_t n, float lo, float hi, const float* x, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i)
    dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
}

void swish_forward(index_t n, float beta, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(v / (1.0 + std::exp(-static_cast<double>(beta) * v)));
  }
}
void swish_backward(index_t n, float beta, const float* x, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(beta) * v));
    dx[i] = static_cast<float>(static_cast<double>(dy[i]) * (s + beta * v * s * (1.0 - s)));
  }
}

void sigmoid_forward(index_t n, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i) {
    y[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
  }
}
void sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i) {
    dx[i] = static_cast<float>(static_cast<double>(dy[i]) * y[i] * (1.0 - y[i]));
  }
}
void tanh_forward(index_t n, const float* x, float* y) {
  for (index_t i = 0; i < n; ++i)
    y[i] = static_cast<float>(std::tanh(static_cast<double>(x[i])));
}
void tanh_backward(index_t n, const float* y, const float* dy, float* dx) {
  for (index_t i = 0; i < n; ++i) {
    dx[i] =
        static_cast<float>(static_cast<double>(dy[i]) * (1.0 - static_cast<double>(y[i]) * y[i]));
  }
}

}  // namespace hn::ref
