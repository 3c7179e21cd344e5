// The weight gradient of a depthwise convolution on NCHW, for the shapes oneDNN 2.6 computes
// with its GEMM-based kernel (its depthwise weight-gradient kernel takes 3x3 windows only):
// EfficientNet's 5x5 depthwise layers at batch 32 took 47-72 ms each there, 20x their
// forward.
//
// dW[c][kh][kw] = sum over images and output pixels of dy[n][c][oh][ow] *
// x[n][c][oh * stride - pad + kh * dilation][ow * stride - pad + kw * dilation]. The output
// rows of these layers are short (7 to 28 columns), so the vectors run across channels: a
// task takes 16 channels, copies each image's 16 planes of x and of dy into pixel-major
// buffers ([pixel][16]), and for each tap adds dy * x over the output pixels into one
// 16-lane sum (a fixed-size loop the compiler vectorises: one AVX-512 register, two AVX2
// ones). Each image's sum is added to the tap's total in image order, so the result depends
// on the shape only, not on the thread count.
#include "lib/drivers/cpu/kernels.h"  // first: see eigen.h

#include "lib/drivers/cpu/conv_depthwise.h"

#include <algorithm>
#include <vector>

namespace hn::detail::cpu {

namespace {

// Channels per task: the lanes of one vector of sums.
constexpr index_t kLanes = 16;

// Outputs [lo, hi) along one axis whose tap k reads inside the input: 0 <= o * stride -
// pad + k * dilation < size.
struct Range {
  index_t lo, hi;
};

Range valid(index_t size, index_t out, index_t stride, index_t pad, index_t offset) {
  // o * stride >= pad - offset, and o * stride <= size - 1 + pad - offset.
  const index_t first = pad - offset;
  index_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const index_t last = size - 1 + pad - offset;
  index_t hi = last < 0 ? 0 : last / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

}  // namespace

bool depthwise_nchw(const LoweringShape& s, index_t out_channels) {
  return s.groups > 1 && s.groups == s.channels && out_channels == s.channels &&
         s.layout == Layout::nchw && s.out_layout == Layout::nchw && !s.plain_kernel;
}

void depthwise_backward_weights(Parallel& par, const LoweringShape& s, const float* x,
                                const float* dy, float* dweights, float* dbias) {
  const index_t out_h = s.out_h(), out_w = s.out_w();
  const index_t taps = s.kernel_h * s.kernel_w;
  const index_t in_plane = s.height * s.width, out_plane = out_h * out_w;
  const index_t blocks = (s.channels + kLanes - 1) / kLanes;
  // Per block: the copies, and every tap over every output pixel of every image.
  const index_t cost = s.batch * kLanes * (in_plane + out_plane * (taps + 1));
  par.for_range(blocks, cost, [&](index_t first, index_t last) {
    std::vector<float> xb(static_cast<std::size_t>(in_plane * kLanes));
    std::vector<float> gb(static_cast<std::size_t>(out_plane * kLanes));
    std::vector<float> total(static_cast<std::size_t>((taps + 1) * kLanes));
    for (index_t block = first; block < last; ++block) {
      const index_t c0 = block * kLanes;
      const index_t lanes = std::min(kLanes, s.channels - c0);
      std::fill(total.begin(), total.end(), 0.0f);
      if (lanes < kLanes) {  // the missing channels stay 0 and add nothing
        std::fill(xb.begin(), xb.end(), 0.0f);
        std::fill(gb.begin(), gb.end(), 0.0f);
      }
      for (index_t n = 0; n < s.batch; ++n) {
        for (index_t l = 0; l < lanes; ++l) {
          const float* xp = x + (n * s.channels + c0 + l) * in_plane;
          const float* gp = dy + (n * s.channels + c0 + l) * out_plane;
          for (index_t p = 0; p < in_plane; ++p)
            xb[static_cast<std::size_t>(p * kLanes + l)] = xp[p];
          for (index_t p = 0; p < out_plane; ++p)
            gb[static_cast<std::size_t>(p * kLanes + l)] = gp[p];
        }
        for (index_t kh = 0; kh < s.kernel_h; ++kh) {
          const Range rows = valid(s.height, out_h, s.stride_h, s.pad_h, kh * s.dilation_h);
          for (index_t kw = 0; kw < s.kernel_w; ++kw) {
            const Range cols = valid(s.width, out_w, s.stride_w, s.pad_w, kw * s.dilation_w);
            float acc[kLanes] = {};
            for (index_t oh = rows.lo; oh < rows.hi; ++oh) {
              const index_t ih = oh * s.stride_h - s.pad_h + kh * s.dilation_h;
              const float* grow = gb.data() + oh * out_w * kLanes;
              const float* xrow = xb.data() + ih * s.width * kLanes;
              for (index_t ow = cols.lo; ow < cols.hi; ++ow) {
                const index_t iw = ow * s.stride_w - s.pad_w + kw * s.dilation_w;
                const float* g = grow + ow * kLanes;
                const float* v = xrow + iw * kLanes;
                for (index_t l = 0; l < kLanes; ++l)
                  acc[l] += g[l] * v[l];
              }
            }
            float* t = total.data() + (kh * s.kernel_w + kw) * kLanes;
            for (index_t l = 0; l < kLanes; ++l)
              t[l] += acc[l];
          }
        }
        if (dbias != nullptr) {
          float acc[kLanes] = {};
          for (index_t p = 0; p < out_plane; ++p)
            for (index_t l = 0; l < kLanes; ++l)
              acc[l] += gb[static_cast<std::size_t>(p * kLanes + l)];
          float* t = total.data() + taps * kLanes;
          for (index_t l = 0; l < kLanes; ++l)
            t[l] += acc[l];
        }
      }
      for (index_t l = 0; l < lanes; ++l) {
        for (index_t k = 0; k < taps; ++k)
          dweights[(c0 + l) * taps + k] += total[static_cast<std::size_t>(k * kLanes + l)];
        if (dbias != nullptr) dbias[c0 + l] += total[static_cast<std::size_t>(taps * kLanes + l)];
      }
    }
  });
}

}  // namespace hn::detail::cpu
