// The reference driver: naive single-thread loops in the style of Caffe's CPU code, written
// to be obviously correct rather than fast. It is the oracle of every driver test, so sums
// run in double and each loop follows the formula documented in driver.h / shapes.h.
#include "drivers/reference/reference_driver.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/philox.h"

namespace hn::detail {

namespace {

constexpr std::size_t kAlignment = 64;

// A pooling window clipped to the image, and the divisor Caffe uses for it.
struct Window {
  index_t h_begin, h_end, w_begin, w_end;
  index_t pool_size;
};

// Caffe's MAX pooling window: clipped to the image on both sides.
Window max_window(const PoolShape& s, index_t oh, index_t ow) {
  const index_t h_begin = oh * s.stride_h - s.pad_h, w_begin = ow * s.stride_w - s.pad_w;
  const index_t h_end = std::min(h_begin + s.kernel_h, s.height);
  const index_t w_end = std::min(w_begin + s.kernel_w, s.width);
  Window win{std::max<index_t>(h_begin, 0), h_end, std::max<index_t>(w_begin, 0), w_end, 0};
  win.pool_size = (win.h_end - win.h_begin) * (win.w_end - win.w_begin);
  return win;
}

// Caffe's AVE pooling window: the divisor counts the window clipped only at height + pad
// (so padding cells count, except past the bottom/right padding); the sum runs over the
// window clipped to the image.
Window avg_window(const PoolShape& s, index_t oh, index_t ow) {
  const index_t h_begin = oh * s.stride_h - s.pad_h, w_begin = ow * s.stride_w - s.pad_w;
  const index_t h_end = std::min(h_begin + s.kernel_h, s.height + s.pad_h);
  const index_t w_end = std::min(w_begin + s.kernel_w, s.width + s.pad_w);
  const index_t pool_size = (h_end - h_begin) * (w_end - w_begin);
  return Window{std::max<index_t>(h_begin, 0), std::min(h_end, s.height),
                std::max<index_t>(w_begin, 0), std::min(w_end, s.width), pool_size};
}

// The AVE pooling that Caffe's WITHIN_CHANNEL LRN runs on x^2: size x size, stride 1,
// pad (size - 1) / 2, so the output plane has the input's height and width.
PoolShape within_channel_pool(const LrnShape& s) {
  PoolShape pool;
  pool.batch = 1;
  pool.channels = 1;
  pool.height = s.height;
  pool.width = s.width;
  pool.kernel_h = pool.kernel_w = s.size;
  pool.stride_h = pool.stride_w = 1;
  pool.pad_h = pool.pad_w = (s.size - 1) / 2;
  return pool;
}

// Caffe's static_cast<int>(label), defined for every float: values that do not truncate
// to an int (NaN, out of range) have none.
std::optional<int> label_as_int(float value) {
  if (!(value > -2147483648.0f && value < 2147483648.0f)) return std::nullopt;
  return static_cast<int>(value);
}

class ReferenceDriver final : public Driver {
 public:
  ReferenceDriver(const Device& device, bool separate_memory)
      : Driver(device), separate_memory_(separate_memory) {}

  ~ReferenceDriver() override {
    // Buffers should be gone by now; free whatever is still live rather than leak it.
    for (const auto& [start, bytes] : allocations_) {
      static_cast<void>(bytes);
      std::free(reinterpret_cast<void*>(start));
    }
  }

  Capabilities capabilities() const override {
    Capabilities caps;
    caps.host_addressable = !separate_memory_;
    caps.gemm = caps.lowering = caps.elementwise = caps.reductions = true;
    caps.activations = caps.pooling = caps.lrn = caps.softmax = caps.dropout = true;
    caps.losses = caps.convolution = caps.solver_update = true;
    return caps;
  }

  // With separate memory the driver is a space of its own: host addresses are foreign.
  MemorySpace memory_space() const override {
    return separate_memory_ ? static_cast<MemorySpace>(this) : host_space();
  }

  std::string description() const override {
    return name() + ": naive single-thread loops, " +
           (separate_memory_ ? "separate memory space (models a device)" : "host memory");
  }

  bool owns(const void* address, std::size_t bytes) const override {
    if (!separate_memory_) return true;
    const auto start = reinterpret_cast<std::uintptr_t>(address);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.upper_bound(start);
    if (it == allocations_.begin()) return false;
    --it;  // the last allocation starting at or before `address`
    const std::uintptr_t offset = start - it->first;
    return offset <= it->second && bytes <= it->second - offset;
  }

 protected:
  // ---- memory -------------------------------------------------------------------------

  void* do_allocate(std::size_t bytes) override {
    HN_CHECK(bytes <= std::numeric_limits<std::size_t>::max() - kAlignment,
             "allocate on {}: {} bytes is too large", name(), bytes);
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    std::unique_ptr<void, decltype(&std::free)> memory(std::aligned_alloc(kAlignment, rounded),
                                                       &std::free);
    HN_CHECK(memory != nullptr, "allocate on {}: out of host memory for {} bytes", name(), bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      allocations_.emplace(reinterpret_cast<std::uintptr_t>(memory.get()), bytes);
    }
    return memory.release();
  }

  // Frees only what this driver allocated: a foreign address is ignored, never freed.
  void do_deallocate(void* address) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(address));
      if (it == allocations_.end()) return;
      allocations_.erase(it);
    }
    std::free(address);
  }

  // The memory is host RAM in both modes; separate mode only separates the address space.
  void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void do_copy(void* dst, const void* src, std::size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void do_synchronize() override {}

  // ---- GEMM ---------------------------------------------------------------------------

  void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
               const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
               index_t ldc) override {
    // op(A)[i][p] and op(B)[p][j] read from the matrices as stored.
    const auto op_a = [&](index_t i, index_t p) {
      return trans_a == Transpose::yes ? a[p * lda + i] : a[i * lda + p];
    };
    const auto op_b = [&](index_t p, index_t j) {
      return trans_b == Transpose::yes ? b[j * ldb + p] : b[p * ldb + j];
    };
    for (index_t i = 0; i < m; ++i) {
      for (index_t j = 0; j < n; ++j) {
        double product = 0.0;
        for (index_t p = 0; p < k; ++p) {
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

  void do_im2col(const LoweringShape& shape, const float* images, float* columns) override {
    for_each_lowered(shape, [&](index_t pixel, index_t entry) {
      columns[entry] = pixel >= 0 ? images[pixel] : 0.0f;
    });
  }

  void do_col2im(const LoweringShape& shape, const float* columns, float* images) override {
    std::fill(images, images + shape.image_count(), 0.0f);
    for_each_lowered(shape, [&](index_t pixel, index_t entry) {
      if (pixel >= 0) images[pixel] += columns[entry];
    });
  }

  void do_swap_axes(index_t d0, index_t d1, index_t inner, const float* src, float* dst) override {
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

  void do_lift(const LoweringShape& shape, index_t out_channels, const float* products,
               float* y) override {
    const index_t count = shape.batch * out_channels * shape.out_h() * shape.out_w();
    std::vector<double> total(static_cast<std::size_t>(count), 0.0);
    for_each_lifted(shape, out_channels,
                    [&](index_t product, index_t out) { total[out] += products[product]; });
    for (index_t i = 0; i < count; ++i)
      y[i] = static_cast<float>(total[i]);
  }

  void do_lift_backward(const LoweringShape& shape, index_t out_channels, const float* dy,
                        float* products_diff) override {
    const index_t count =
        shape.batch * shape.height * shape.width * out_channels * shape.kernel_h * shape.kernel_w;
    std::fill(products_diff, products_diff + count, 0.0f);
    for_each_lifted(shape, out_channels,
                    [&](index_t product, index_t out) { products_diff[product] = dy[out]; });
  }

  // ---- direct convolution -------------------------------------------------------------

  // Calls visit(x index, weights index, y index) for every product x * w that lands in an
  // output, so the three convolution calls share one statement of the layout.
  template <class Visit>
  static void for_each_conv_term(const LoweringShape& s, index_t out_channels, Visit visit) {
    const index_t out_h = s.out_h(), out_w = s.out_w();
    const index_t in_per_group = s.channels / s.groups, out_per_group = out_channels / s.groups;
    for (index_t n = 0; n < s.batch; ++n) {
      for (index_t co = 0; co < out_channels; ++co) {
        const index_t g = co / out_per_group;
        for (index_t oh = 0; oh < out_h; ++oh) {
          for (index_t ow = 0; ow < out_w; ++ow) {
            const index_t out = ((n * out_channels + co) * out_h + oh) * out_w + ow;
            for (index_t ci = 0; ci < in_per_group; ++ci) {
              const index_t c = g * in_per_group + ci;
              for (index_t kh = 0; kh < s.kernel_h; ++kh) {
                const index_t h = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
                if (h < 0 || h >= s.height) continue;
                for (index_t kw = 0; kw < s.kernel_w; ++kw) {
                  const index_t w = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
                  if (w < 0 || w >= s.width) continue;
                  visit(((n * s.channels + c) * s.height + h) * s.width + w,
                        ((co * in_per_group + ci) * s.kernel_h + kh) * s.kernel_w + kw, out);
                }
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

  void do_conv_forward(const LoweringShape& shape, index_t out_channels, const float* x,
                       const float* weights, const float* bias, float* y) override {
    const index_t count = conv_out_count(shape, out_channels);
    const index_t plane = shape.out_h() * shape.out_w();
    std::vector<double> total(static_cast<std::size_t>(count), 0.0);
    if (bias != nullptr) {
      for (index_t i = 0; i < count; ++i)
        total[i] = bias[(i / plane) % out_channels];
    }
    for_each_conv_term(shape, out_channels, [&](index_t xi, index_t wi, index_t yi) {
      total[yi] += static_cast<double>(x[xi]) * weights[wi];
    });
    for (index_t i = 0; i < count; ++i)
      y[i] = static_cast<float>(total[i]);
  }

  void do_conv_backward_data(const LoweringShape& shape, index_t out_channels, const float* weights,
                             const float* dy, float* dx) override {
    const index_t count = shape.image_count();
    std::vector<double> total(static_cast<std::size_t>(count), 0.0);
    for_each_conv_term(shape, out_channels, [&](index_t xi, index_t wi, index_t yi) {
      total[xi] += static_cast<double>(dy[yi]) * weights[wi];
    });
    for (index_t i = 0; i < count; ++i)
      dx[i] = static_cast<float>(total[i]);
  }

  void do_conv_backward_weights(const LoweringShape& shape, index_t out_channels, const float* x,
                                const float* dy, float* dweights, float* dbias) override {
    const index_t count = conv_weight_count(shape, out_channels);
    std::vector<double> total(static_cast<std::size_t>(count), 0.0);
    for_each_conv_term(shape, out_channels, [&](index_t xi, index_t wi, index_t yi) {
      total[wi] += static_cast<double>(x[xi]) * dy[yi];
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

  // ---- element-wise -------------------------------------------------------------------

  void do_fill(index_t n, float value, float* x) override {
    for (index_t i = 0; i < n; ++i)
      x[i] = value;
  }
  void do_scale(index_t n, float alpha, float* x) override {
    for (index_t i = 0; i < n; ++i)
      x[i] *= alpha;
  }
  void do_axpy(index_t n, float alpha, const float* x, float* y) override {
    for (index_t i = 0; i < n; ++i)
      y[i] += alpha * x[i];
  }
  void do_axpby(index_t n, float alpha, const float* x, float beta, float* y) override {
    for (index_t i = 0; i < n; ++i) {
      // beta == 0 must not read y.
      y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
    }
  }
  void do_mul(index_t n, const float* a, const float* b, float* y) override {
    for (index_t i = 0; i < n; ++i)
      y[i] = a[i] * b[i];
  }

  void do_add_scalar(index_t n, float alpha, float* x) override {
    for (index_t i = 0; i < n; ++i)
      x[i] += alpha;
  }
  void do_powx(index_t n, const float* x, float exponent, float* y) override {
    for (index_t i = 0; i < n; ++i) {
      y[i] = static_cast<float>(std::pow(static_cast<double>(x[i]), static_cast<double>(exponent)));
    }
  }
  void do_copy_strided(index_t rows, index_t cols, const float* src, index_t src_ld, float* dst,
                       index_t dst_ld) override {
    for (index_t r = 0; r < rows; ++r) {
      for (index_t c = 0; c < cols; ++c)
        dst[r * dst_ld + c] = src[r * src_ld + c];
    }
  }
  void do_scale_channels(const AxisShape& shape, const float* scale, const float* x,
                         float* y) override {
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t c = 0; c < shape.channels; ++c) {
        for (index_t i = 0; i < shape.inner; ++i) {
          const index_t at = (o * shape.channels + c) * shape.inner + i;
          y[at] = x[at] * scale[c];
        }
      }
    }
  }
  void do_max_accumulate(index_t n, const float* x, std::int32_t index, float* y,
                         std::int32_t* mask) override {
    for (index_t i = 0; i < n; ++i) {
      if (index == 0 || x[i] > y[i]) {  // strict: the first maximum wins
        y[i] = x[i];
        mask[i] = index;
      }
    }
  }
  void do_max_select(index_t n, const std::int32_t* mask, std::int32_t index, const float* dy,
                     float* dx) override {
    for (index_t i = 0; i < n; ++i)
      dx[i] = mask[i] == index ? dy[i] : 0.0f;
  }

  // ---- reductions ---------------------------------------------------------------------

  float do_dot(index_t n, const float* x, const float* y) override {
    double total = 0.0;
    for (index_t i = 0; i < n; ++i)
      total += static_cast<double>(x[i]) * y[i];
    return static_cast<float>(total);
  }
  float do_asum(index_t n, const float* x) override {
    double total = 0.0;
    for (index_t i = 0; i < n; ++i)
      total += std::abs(static_cast<double>(x[i]));
    return static_cast<float>(total);
  }
  float do_sum(index_t n, const float* x) override {
    double total = 0.0;
    for (index_t i = 0; i < n; ++i)
      total += x[i];
    return static_cast<float>(total);
  }

  void do_bias_backward(const AxisShape& shape, const float* dy, float beta,
                        float* dbias) override {
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

  // ---- activations --------------------------------------------------------------------

  void do_bias_forward(const AxisShape& shape, const float* bias, float* y) override {
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t c = 0; c < shape.channels; ++c) {
        for (index_t i = 0; i < shape.inner; ++i) {
          y[(o * shape.channels + c) * shape.inner + i] += bias[c];
        }
      }
    }
  }

  void do_relu_forward(index_t n, float negative_slope, const float* x, float* y) override {
    for (index_t i = 0; i < n; ++i)
      y[i] = x[i] > 0.0f ? x[i] : negative_slope * x[i];
  }
  void do_relu_backward(index_t n, float negative_slope, const float* x, const float* dy,
                        float* dx) override {
    for (index_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (x[i] > 0.0f ? 1.0f : negative_slope);
  }

  void do_sigmoid_forward(index_t n, const float* x, float* y) override {
    for (index_t i = 0; i < n; ++i) {
      y[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
    }
  }
  void do_sigmoid_backward(index_t n, const float* y, const float* dy, float* dx) override {
    for (index_t i = 0; i < n; ++i) {
      dx[i] = static_cast<float>(static_cast<double>(dy[i]) * y[i] * (1.0 - y[i]));
    }
  }
  void do_tanh_forward(index_t n, const float* x, float* y) override {
    for (index_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(std::tanh(static_cast<double>(x[i])));
  }
  void do_tanh_backward(index_t n, const float* y, const float* dy, float* dx) override {
    for (index_t i = 0; i < n; ++i) {
      dx[i] =
          static_cast<float>(static_cast<double>(dy[i]) * (1.0 - static_cast<double>(y[i]) * y[i]));
    }
  }

  // ---- pooling ------------------------------------------------------------------------

  void do_pool_max_forward(const PoolShape& shape, const float* x, float* y,
                           std::int32_t* mask) override {
    const index_t planes = shape.batch * shape.channels;
    const index_t in_plane = shape.height * shape.width;
    const index_t out_h = shape.out_h(), out_w = shape.out_w();
    for (index_t p = 0; p < planes; ++p) {
      const float* src = x + p * in_plane;
      for (index_t oh = 0; oh < out_h; ++oh) {
        for (index_t ow = 0; ow < out_w; ++ow) {
          const Window win = max_window(shape, oh, ow);
          float best = -FLT_MAX;
          index_t best_index = -1;
          for (index_t h = win.h_begin; h < win.h_end; ++h) {
            for (index_t w = win.w_begin; w < win.w_end; ++w) {
              if (src[h * shape.width + w] > best) {  // strict: the first maximum wins
                best = src[h * shape.width + w];
                best_index = h * shape.width + w;
              }
            }
          }
          const index_t out = (p * out_h + oh) * out_w + ow;
          y[out] = best;
          mask[out] = static_cast<std::int32_t>(best_index);
        }
      }
    }
  }

  void do_pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                            float* dx) override {
    const index_t planes = shape.batch * shape.channels;
    const index_t in_plane = shape.height * shape.width;
    const index_t out_plane = shape.out_h() * shape.out_w();
    std::fill(dx, dx + shape.in_count(), 0.0f);
    for (index_t p = 0; p < planes; ++p) {
      for (index_t out = 0; out < out_plane; ++out) {
        const std::int32_t from = mask[p * out_plane + out];
        if (from >= 0) dx[p * in_plane + from] += dy[p * out_plane + out];
      }
    }
  }

  void do_pool_avg_forward(const PoolShape& shape, const float* x, float* y) override {
    const index_t planes = shape.batch * shape.channels;
    const index_t in_plane = shape.height * shape.width;
    const index_t out_h = shape.out_h(), out_w = shape.out_w();
    for (index_t p = 0; p < planes; ++p) {
      const float* src = x + p * in_plane;
      for (index_t oh = 0; oh < out_h; ++oh) {
        for (index_t ow = 0; ow < out_w; ++ow) {
          const Window win = avg_window(shape, oh, ow);
          double total = 0.0;
          for (index_t h = win.h_begin; h < win.h_end; ++h) {
            for (index_t w = win.w_begin; w < win.w_end; ++w)
              total += src[h * shape.width + w];
          }
          y[(p * out_h + oh) * out_w + ow] = static_cast<float>(total / win.pool_size);
        }
      }
    }
  }

  void do_pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) override {
    const index_t planes = shape.batch * shape.channels;
    const index_t in_plane = shape.height * shape.width;
    const index_t out_h = shape.out_h(), out_w = shape.out_w();
    std::fill(dx, dx + shape.in_count(), 0.0f);
    for (index_t p = 0; p < planes; ++p) {
      float* dst = dx + p * in_plane;
      for (index_t oh = 0; oh < out_h; ++oh) {
        for (index_t ow = 0; ow < out_w; ++ow) {
          const Window win = avg_window(shape, oh, ow);
          const float share = dy[(p * out_h + oh) * out_w + ow] / static_cast<float>(win.pool_size);
          for (index_t h = win.h_begin; h < win.h_end; ++h) {
            for (index_t w = win.w_begin; w < win.w_end; ++w)
              dst[h * shape.width + w] += share;
          }
        }
      }
    }
  }

  // ---- LRN ----------------------------------------------------------------------------

  void do_lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) override {
    if (shape.region == LrnRegion::across_channels) {
      lrn_across_forward(shape, x, y, scale);
    } else {
      lrn_within_forward(shape, x, y, scale);
    }
  }

  void do_lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                       const float* dy, float* dx) override {
    if (shape.region == LrnRegion::across_channels) {
      lrn_across_backward(shape, x, y, scale, dy, dx);
    } else {
      lrn_within_backward(shape, x, scale, dy, dx);
    }
  }

  // ---- softmax ------------------------------------------------------------------------

  void do_softmax_forward(const AxisShape& shape, const float* x, float* y) override {
    const index_t stride = shape.inner;
    std::vector<double> e(static_cast<std::size_t>(shape.channels));
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t base = o * shape.channels * shape.inner + i;
        float max = x[base];
        for (index_t c = 1; c < shape.channels; ++c)
          max = std::max(max, x[base + c * stride]);
        double total = 0.0;
        for (index_t c = 0; c < shape.channels; ++c) {
          e[c] = std::exp(static_cast<double>(x[base + c * stride]) - max);
          total += e[c];
        }
        for (index_t c = 0; c < shape.channels; ++c) {
          y[base + c * stride] = static_cast<float>(e[c] / total);
        }
      }
    }
  }

  void do_softmax_backward(const AxisShape& shape, const float* y, const float* dy,
                           float* dx) override {
    const index_t stride = shape.inner;
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t base = o * shape.channels * shape.inner + i;
        double dot = 0.0;
        for (index_t c = 0; c < shape.channels; ++c) {
          dot += static_cast<double>(dy[base + c * stride]) * y[base + c * stride];
        }
        for (index_t c = 0; c < shape.channels; ++c) {
          const index_t at = base + c * stride;
          dx[at] = static_cast<float>(y[at] * (dy[at] - dot));
        }
      }
    }
  }

  // ---- dropout ------------------------------------------------------------------------

  void do_dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                          const float* x, float* y, float* mask) override {
    const float s = 1.0f / (1.0f - ratio);  // exactly this float expression on every driver
    for (index_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(seed, offset + static_cast<std::uint64_t>(i)) >= ratio;
      mask[i] = keep ? 1.0f : 0.0f;
      y[i] = keep ? x[i] * s : 0.0f;
    }
  }

  void do_dropout_backward(index_t n, float ratio, const float* mask, const float* dy,
                           float* dx) override {
    const float s = 1.0f / (1.0f - ratio);
    for (index_t i = 0; i < n; ++i)
      dx[i] = mask[i] != 0.0f ? dy[i] * s : 0.0f;
  }

  // ---- losses -------------------------------------------------------------------------

  // The class index of the label at position (o, i), or -1 when it is ignored; throws
  // when it is neither ignored nor a class.
  static index_t checked_label(const char* call, const AxisShape& shape, float value,
                               bool has_ignore_label, int ignore_label, index_t o, index_t i) {
    const std::optional<int> label = label_as_int(value);
    if (has_ignore_label && label == ignore_label) return -1;
    HN_CHECK(label && *label >= 0 && *label < shape.channels,
             "{}: label {} at position (outer {}, inner {}) is outside [0, {}) ({})", call, value,
             o, i, shape.channels, shape.to_string());
    return *label;
  }

  void do_softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                               bool has_ignore_label, int ignore_label, float* loss,
                               float* valid) override {
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t at = o * shape.inner + i;
        const index_t l = checked_label("softmax_loss_forward", shape, label[at], has_ignore_label,
                                        ignore_label, o, i);
        if (l < 0) {
          loss[at] = valid[at] = 0.0f;
          continue;
        }
        const float p = prob[(o * shape.channels + l) * shape.inner + i];
        loss[at] = static_cast<float>(-std::log(static_cast<double>(std::max(p, FLT_MIN))));
        valid[at] = 1.0f;
      }
    }
  }

  void do_softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                                bool has_ignore_label, int ignore_label, float scale,
                                float* dx) override {
    for (index_t o = 0; o < shape.outer; ++o) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const index_t l = checked_label("softmax_loss_backward", shape, label[o * shape.inner + i],
                                        has_ignore_label, ignore_label, o, i);
        for (index_t c = 0; c < shape.channels; ++c) {
          const index_t at = (o * shape.channels + c) * shape.inner + i;
          // prob is read before dx is written: dx may alias prob.
          dx[at] = l < 0 ? 0.0f : scale * (prob[at] - (c == l ? 1.0f : 0.0f));
        }
      }
    }
  }

  static bool ignored_target(float target, bool has_ignore_label, int ignore_label) {
    return has_ignore_label && label_as_int(target) == ignore_label;
  }

  void do_sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                        bool has_ignore_label, int ignore_label, float* loss,
                                        float* valid) override {
    for (index_t i = 0; i < n; ++i) {
      if (ignored_target(target[i], has_ignore_label, ignore_label)) {
        loss[i] = valid[i] = 0.0f;
        continue;
      }
      const double v = x[i], t = target[i];
      loss[i] = static_cast<float>(std::max(v, 0.0) - v * t + std::log1p(std::exp(-std::abs(v))));
      valid[i] = 1.0f;
    }
  }

  void do_sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                         bool has_ignore_label, int ignore_label, float scale,
                                         float* dx) override {
    for (index_t i = 0; i < n; ++i) {
      if (ignored_target(target[i], has_ignore_label, ignore_label)) {
        dx[i] = 0.0f;
        continue;
      }
      const double sigmoid = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
      dx[i] = static_cast<float>(scale * (sigmoid - target[i]));
    }
  }

  // Each statement of Caffe's float update (solvers' ComputeUpdateValue) evaluated in double
  // and rounded to float where Caffe stores a float: the diff after scaling and after
  // regularising, the histories, the update value and the weight.
  void do_solver_update(const SolverUpdate& u, index_t n, float* param, const float* grad,
                        float* history, float* history2) override {
    const double lr = u.lr, momentum = u.momentum, momentum2 = u.momentum2;
    const double delta = u.delta, rms_decay = u.rms_decay, decay = u.decay;
    for (index_t i = 0; i < n; ++i) {
      const double w = param[i];
      float g = static_cast<float>(grad[i] * static_cast<double>(u.grad_scale));
      if (u.decay != 0.0f) {  // Caffe skips regularisation when the local decay is 0
        const double sign = w > 0.0 ? 1.0 : (w < 0.0 ? -1.0 : 0.0);
        g = static_cast<float>(g + decay * (u.l1 ? sign : w));
      }
      const double gg = static_cast<double>(g) * g;
      const double h = history[i];
      double step = 0.0;
      switch (u.type) {
        case UpdateType::sgd:
          history[i] = static_cast<float>(momentum * h + lr * g);
          step = history[i];
          break;
        case UpdateType::nesterov:
          history[i] = static_cast<float>(momentum * h + lr * g);
          step = (1.0 + momentum) * history[i] - momentum * h;
          break;
        case UpdateType::adagrad:
          history[i] = static_cast<float>(h + gg);
          step = lr * (g / (std::sqrt(static_cast<double>(history[i])) + delta));
          break;
        case UpdateType::rmsprop:
          history[i] = static_cast<float>(rms_decay * h + (1.0 - rms_decay) * gg);
          step = lr * (g / (std::sqrt(static_cast<double>(history[i])) + delta));
          break;
        case UpdateType::adadelta: {
          history[i] = static_cast<float>(momentum * h + (1.0 - momentum) * gg);
          const float scaled = static_cast<float>(
              g * std::sqrt((history2[i] + delta) / (static_cast<double>(history[i]) + delta)));
          history2[i] = static_cast<float>(
              momentum * history2[i] + (1.0 - momentum) * (static_cast<double>(scaled) * scaled));
          step = lr * scaled;
          break;
        }
        case UpdateType::adam:
          history[i] = static_cast<float>(momentum * h + (1.0 - momentum) * g);
          history2[i] = static_cast<float>(momentum2 * history2[i] + (1.0 - momentum2) * gg);
          step = lr * (history[i] / (std::sqrt(static_cast<double>(history2[i])) + delta));
          break;
      }
      param[i] = static_cast<float>(w - static_cast<float>(step));
    }
  }

 private:
  // ACROSS_CHANNELS: scale = k + alpha/size * sum of x^2 over the channel window.
  static void lrn_across_forward(const LrnShape& s, const float* x, float* y, float* scale) {
    const index_t pre = (s.size - 1) / 2;
    const index_t plane = s.height * s.width;
    const double alpha_over_size = static_cast<double>(s.alpha) / s.size;
    for (index_t n = 0; n < s.batch; ++n) {
      for (index_t c = 0; c < s.channels; ++c) {
        const index_t c_begin = std::max<index_t>(c - pre, 0);
        const index_t c_end = std::min<index_t>(c + pre + 1, s.channels);
        for (index_t p = 0; p < plane; ++p) {
          double squares = 0.0;
          for (index_t cc = c_begin; cc < c_end; ++cc) {
            const double v = x[(n * s.channels + cc) * plane + p];
            squares += v * v;
          }
          const index_t at = (n * s.channels + c) * plane + p;
          const double sc = s.k + alpha_over_size * squares;
          scale[at] = static_cast<float>(sc);
          y[at] = static_cast<float>(x[at] * std::pow(sc, -static_cast<double>(s.beta)));
        }
      }
    }
  }

  // Caffe's formula: dx = dy * scale^-beta
  //                     - (2 alpha beta / size) * x * sum_{c' in window(c)} dy y / scale.
  static void lrn_across_backward(const LrnShape& s, const float* x, const float* y,
                                  const float* scale, const float* dy, float* dx) {
    const index_t pre = (s.size - 1) / 2;
    const index_t plane = s.height * s.width;
    const double beta = s.beta;
    const double cache_ratio = 2.0 * s.alpha * beta / s.size;
    // Per pixel column: everything read from dy first, so dx may alias dy.
    std::vector<double> ratio(static_cast<std::size_t>(s.channels));
    std::vector<double> direct(static_cast<std::size_t>(s.channels));
    for (index_t n = 0; n < s.batch; ++n) {
      for (index_t p = 0; p < plane; ++p) {
        for (index_t c = 0; c < s.channels; ++c) {
          const index_t at = (n * s.channels + c) * plane + p;
          ratio[c] = static_cast<double>(dy[at]) * y[at] / scale[at];
          direct[c] = dy[at] * std::pow(static_cast<double>(scale[at]), -beta);
        }
        for (index_t c = 0; c < s.channels; ++c) {
          const index_t c_begin = std::max<index_t>(c - pre, 0);
          const index_t c_end = std::min<index_t>(c + pre + 1, s.channels);
          double accum = 0.0;
          for (index_t cc = c_begin; cc < c_end; ++cc)
            accum += ratio[cc];
          const index_t at = (n * s.channels + c) * plane + p;
          dx[at] = static_cast<float>(direct[c] - cache_ratio * x[at] * accum);
        }
      }
    }
  }

  // WITHIN_CHANNEL: scale = 1 + alpha * avgpool(x^2) with Caffe's AVE pooling divisor.
  static void lrn_within_forward(const LrnShape& s, const float* x, float* y, float* scale) {
    const PoolShape pool = within_channel_pool(s);
    const index_t plane = s.height * s.width;
    for (index_t p = 0; p < s.batch * s.channels; ++p) {
      const float* src = x + p * plane;
      for (index_t h = 0; h < s.height; ++h) {
        for (index_t w = 0; w < s.width; ++w) {
          const Window win = avg_window(pool, h, w);
          double squares = 0.0;
          for (index_t hh = win.h_begin; hh < win.h_end; ++hh) {
            for (index_t ww = win.w_begin; ww < win.w_end; ++ww) {
              const double v = src[hh * s.width + ww];
              squares += v * v;
            }
          }
          const index_t at = p * plane + h * s.width + w;
          const double sc = 1.0 + s.alpha * squares / win.pool_size;
          scale[at] = static_cast<float>(sc);
          y[at] = static_cast<float>(x[at] * std::pow(sc, -static_cast<double>(s.beta)));
        }
      }
    }
  }

  // The exact derivative of the forward above:
  //   dx_j = dy_j scale_j^-beta
  //        + 2 x_j sum_{i : j in window(i)} dy_i x_i (-beta) scale_i^(-beta-1) alpha / pool_size_i
  static void lrn_within_backward(const LrnShape& s, const float* x, const float* scale,
                                  const float* dy, float* dx) {
    const PoolShape pool = within_channel_pool(s);
    const index_t plane = s.height * s.width;
    const double beta = s.beta;
    std::vector<double> spread(static_cast<std::size_t>(plane));
    for (index_t p = 0; p < s.batch * s.channels; ++p) {
      const index_t base = p * plane;
      std::fill(spread.begin(), spread.end(), 0.0);
      for (index_t h = 0; h < s.height; ++h) {
        for (index_t w = 0; w < s.width; ++w) {
          const Window win = avg_window(pool, h, w);
          const index_t i = base + h * s.width + w;
          const double through_scale = static_cast<double>(dy[i]) * x[i] * (-beta) *
                                       std::pow(static_cast<double>(scale[i]), -beta - 1.0) *
                                       s.alpha / win.pool_size;
          for (index_t hh = win.h_begin; hh < win.h_end; ++hh) {
            for (index_t ww = win.w_begin; ww < win.w_end; ++ww) {
              spread[hh * s.width + ww] += through_scale;
            }
          }
        }
      }
      // All of dy in this plane has been read: dx may alias dy.
      for (index_t j = 0; j < plane; ++j) {
        const index_t at = base + j;
        const double direct = dy[at] * std::pow(static_cast<double>(scale[at]), -beta);
        dx[at] = static_cast<float>(direct + 2.0 * x[at] * spread[j]);
      }
    }
  }

  const bool separate_memory_;
  // Every live allocation, start -> size: owns() checks against it in separate mode, and
  // deallocate frees only what is listed. Buffers may die on another thread than the one
  // computing, hence the lock.
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> allocations_;
};

}  // namespace

DriverKind reference_driver_kind() {
  DriverKind kind;
  kind.name = "reference";
  kind.summary = "naive single-thread loops, the oracle of every test";
  kind.any_index = true;
  kind.count = [] { return 1; };
  kind.make = [](const Device& device, const DriverOptions& options) -> std::unique_ptr<Driver> {
    return std::make_unique<ReferenceDriver>(device,
                                             options.flag("separate_memory", false, device));
  };
  kind.options = {{"separate_memory",
                   "true: memory of its own that the host may not address, so copies show "
                   "without a GPU (default false)",
                   {"true", "false"}}};
  return kind;
}

}  // namespace hn::detail
