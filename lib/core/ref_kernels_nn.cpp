// The reference kernels, part 2: pooling, LRN, softmax, dropout, losses and the solver
// update (see ref_kernels.cpp).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/core/ref_kernels.h"

namespace hn::ref {

namespace {

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
// window clipped to the image. Without count_include_pad the divisor is that window's size.
Window avg_window(const PoolShape& s, index_t oh, index_t ow) {
  const index_t h_begin = oh * s.stride_h - s.pad_h, w_begin = ow * s.stride_w - s.pad_w;
  const index_t h_end = std::min(h_begin + s.kernel_h, s.height + s.pad_h);
  const index_t w_end = std::min(w_begin + s.kernel_w, s.width + s.pad_w);
  Window win{std::max<index_t>(h_begin, 0), std::min(h_end, s.height),
             std::max<index_t>(w_begin, 0), std::min(w_end, s.width),
             (h_end - h_begin) * (w_end - w_begin)};
  if (!s.count_include_pad) win.pool_size = (win.h_end - win.h_begin) * (win.w_end - win.w_begin);
  return win;
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

// ACROSS_CHANNELS: scale = k + alpha/size * sum of x^2 over the channel window.
void lrn_across_forward(const LrnShape& s, const float* x, float* y, float* scale) {
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
void lrn_across_backward(const LrnShape& s, const float* x, const float* y, const float* scale,
                         const float* dy, float* dx) {
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
void lrn_within_forward(const LrnShape& s, const float* x, float* y, float* scale) {
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
void lrn_within_backward(const LrnShape& s, const float* x, const float* scale, const float* dy,
                         float* dx) {
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

}  // namespace

// ---- pooling ------------------------------------------------------------------------

void pool_max_forward(const PoolShape& shape, const float* x, float* y, std::int32_t* mask) {
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

void pool_max_backward(const PoolShape& shape, const float* dy, const std::int32_t* mask,
                       float* dx) {
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

void pool_avg_forward(const PoolShape& shape, const float* x, float* y) {
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

void pool_avg_backward(const PoolShape& shape, const float* dy, float* dx) {
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

void lrn_forward(const LrnShape& shape, const float* x, float* y, float* scale) {
  if (shape.region == LrnRegion::across_channels) {
    lrn_across_forward(shape, x, y, scale);
  } else {
    lrn_within_forward(shape, x, y, scale);
  }
}

void lrn_backward(const LrnShape& shape, const float* x, const float* y, const float* scale,
                  const float* dy, float* dx) {
  if (shape.region == LrnRegion::across_channels) {
    lrn_across_backward(shape, x, y, scale, dy, dx);
  } else {
    lrn_within_backward(shape, x, scale, dy, dx);
  }
}

// ---- softmax ------------------------------------------------------------------------

void softmax_forward(const AxisShape& shape, const float* x, float* y) {
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

void softmax_backward(const AxisShape& shape, const float* y, const float* dy, float* dx) {
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

void log_softmax_forward(const AxisShape& shape, const float* x, float* y) {
  const index_t stride = shape.inner;
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t i = 0; i < shape.inner; ++i) {
      const index_t base = o * shape.channels * shape.inner + i;
      double max = x[base];
      for (index_t c = 1; c < shape.channels; ++c)
        max = std::max(max, static_cast<double>(x[base + c * stride]));
      double total = 0.0;
      for (index_t c = 0; c < shape.channels; ++c)
        total += std::exp(static_cast<double>(x[base + c * stride]) - max);
      const double shift = max + std::log(total);
      for (index_t c = 0; c < shape.channels; ++c)
        y[base + c * stride] = static_cast<float>(x[base + c * stride] - shift);
    }
  }
}

void log_softmax_backward(const AxisShape& shape, const float* y, const float* dy, float* dx) {
  const index_t stride = shape.inner;
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t i = 0; i < shape.inner; ++i) {
      const index_t base = o * shape.channels * shape.inner + i;
      double total = 0.0;
      for (index_t c = 0; c < shape.channels; ++c)
        total += dy[base + c * stride];
      for (index_t c = 0; c < shape.channels; ++c) {
        const index_t at = base + c * stride;
        dx[at] = static_cast<float>(dy[at] - std::exp(static_cast<double>(y[at])) * total);
      }
    }
  }
}

// ---- dropout ------------------------------------------------------------------------

void dropout_forward(index_t n, float ratio, std::uint64_t seed, std::uint64_t offset,
                     const float* x, float* y, float* mask) {
  const float s = 1.0f / (1.0f - ratio);  // exactly this float expression on every driver
  for (index_t i = 0; i < n; ++i) {
    const bool keep = detail::philox_uniform(seed, offset + static_cast<std::uint64_t>(i)) >= ratio;
    mask[i] = keep ? 1.0f : 0.0f;
    y[i] = keep ? x[i] * s : 0.0f;
  }
}

void dropout_forward_layout(const AxisShape& shape, float ratio, std::uint64_t seed,
                            std::uint64_t offset, const float* x, float* y, float* mask) {
  const float s = 1.0f / (1.0f - ratio);
  for (index_t o = 0; o < shape.outer; ++o) {
    for (index_t c = 0; c < shape.channels; ++c) {
      for (index_t i = 0; i < shape.inner; ++i) {
        const auto counter =
            offset + static_cast<std::uint64_t>((o * shape.channels + c) * shape.inner + i);
        const index_t at = layout_offset(shape.layout, shape.channels, shape.inner, 1, o, c, i, 0);
        const bool keep = detail::philox_uniform(seed, counter) >= ratio;
        mask[at] = keep ? 1.0f : 0.0f;
        y[at] = keep ? x[at] * s : 0.0f;
      }
    }
  }
}

void dropout_backward(index_t n, float ratio, const float* mask, const float* dy, float* dx) {
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
           "{}: label {} at position (outer {}, inner {}) is outside [0, {}) ({})", call, value, o,
           i, shape.channels, shape.to_string());
  return *label;
}

void softmax_loss_forward(const AxisShape& shape, const float* prob, const float* label,
                          bool has_ignore_label, int ignore_label, float* loss, float* valid) {
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

void softmax_loss_backward(const AxisShape& shape, const float* prob, const float* label,
                           bool has_ignore_label, int ignore_label, float scale, float* dx) {
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

bool ignored_target(float target, bool has_ignore_label, int ignore_label) {
  return has_ignore_label && label_as_int(target) == ignore_label;
}

void sigmoid_cross_entropy_forward(index_t n, const float* x, const float* target,
                                   bool has_ignore_label, int ignore_label, float* loss,
                                   float* valid) {
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

void sigmoid_cross_entropy_backward(index_t n, const float* x, const float* target,
                                    bool has_ignore_label, int ignore_label, float scale,
                                    float* dx) {
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
void solver_update(const SolverUpdate& update, index_t n, float* param, const float* grad,
                   float* history, float* history2) {
  SolverUpdate u = update;
  if (!fold_update_scalars(u)) return;
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
        history2[i] = static_cast<float>(momentum * history2[i] +
                                         (1.0 - momentum) * (static_cast<double>(scaled) * scaled));
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

}  // namespace hn::ref
