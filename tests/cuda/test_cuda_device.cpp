// GPU-only tests of the CUDA driver: what the host tests of the kernel bodies cannot see.
// Every op on cuda:0 against the reference driver, async copies through the staging
// buffers, errors, stream ordering, bitwise determinism, and cuDNN against our own kernels.
// cuda_test_main.cpp skips the whole binary (exit 77) when no GPU answers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "tests/support.h"

namespace {

using hn::AxisShape;
using hn::Driver;
using hn::index_t;
using hn::LoweringShape;
using hn::LrnRegion;
using hn::LrnShape;
using hn::PoolShape;
using hn::Transpose;
using hn::test::DeviceArray;
using hn::test::max_rel_diff;
using hn::test::random_floats;
using Values = std::vector<float>;

std::unique_ptr<Driver> make_gpu() {
  return hn::make_driver(hn::Device{"cuda", 0});
}
std::unique_ptr<Driver> make_reference() {
  return hn::make_driver(hn::Device{"reference", 0});
}

std::size_t size_of(index_t n) {
  return static_cast<std::size_t>(n);
}

// Copies `args` to `driver`, runs op(driver, pointers) and returns every array read back:
// the same call on two drivers gives two results to compare.
template <class Op>
std::vector<Values> run(Driver& driver, const std::vector<Values>& args, Op op) {
  std::vector<DeviceArray> arrays;
  arrays.reserve(args.size());
  for (const Values& values : args)
    arrays.emplace_back(driver, values);
  std::vector<float*> pointers;
  for (const DeviceArray& array : arrays)
    pointers.push_back(array.data());
  op(driver, pointers);
  std::vector<Values> out;
  for (const DeviceArray& array : arrays)
    out.push_back(array.host());
  return out;
}

// Runs op on cuda:0 and on the reference driver; checks the arrays listed in `outputs`.
template <class Op>
void compare(Driver& gpu, Driver& ref, const std::vector<Values>& args,
             const std::vector<std::size_t>& outputs, double tolerance, Op op) {
  const auto got = run(gpu, args, op);
  const auto want = run(ref, args, op);
  static int calls = 0;  // which comparison of a test case failed
  INFO("comparison " << ++calls << " of this run");
  for (const std::size_t k : outputs) {
    INFO("argument " << k);
    if (tolerance == 0.0) {
      // Bitwise; a failure says how many values differ and the first.
      std::size_t differing = 0, first = 0;
      for (std::size_t i = 0; i < got[k].size(); ++i) {
        if (std::memcmp(&got[k][i], &want[k][i], sizeof(float)) == 0) continue;
        if (differing++ == 0) first = i;
      }
      INFO(differing << " of " << got[k].size() << " values differ, the first at " << first << ": "
                     << (differing ? got[k][first] : 0.0f) << " against "
                     << (differing ? want[k][first] : 0.0f) << "; largest relative difference "
                     << max_rel_diff(got[k], want[k]));
      CHECK(differing == 0);
    } else {
      CHECK(max_rel_diff(got[k], want[k]) <= tolerance);
    }
  }
}

std::int32_t* as_mask(float* p) {
  return reinterpret_cast<std::int32_t*>(p);
}

Values nans(std::size_t n) {
  return Values(n, NAN);
}

// Deliberately non-square: the width gets kernel + 1, pad + 1 and another stride.
LoweringShape lowering(index_t batch, index_t channels, index_t height, index_t width,
                       index_t kernel, index_t pad, index_t stride, index_t dilation) {
  return hn::test::lowering(batch, channels, height, width, kernel, kernel + 1, pad, pad + 1,
                            stride, stride == 1 ? 2 : 1, dilation, 1);
}

PoolShape pooling(index_t batch, index_t channels, index_t height, index_t width, index_t kernel,
                  index_t stride, index_t pad) {
  return hn::test::pooling(batch, channels, height, width, kernel, kernel, stride, stride, pad,
                           pad);
}

LrnShape lrn(index_t batch, index_t channels, index_t height, index_t width, index_t size,
             LrnRegion region) {
  return hn::test::lrn(batch, channels, height, width, size, region, 0.37f, 0.75f, 1.3f);
}

}  // namespace

TEST_CASE("cuda gemm equals the reference for every transpose and odd leading dimensions",
          "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const Transpose ta : {Transpose::no, Transpose::yes}) {
    for (const Transpose tb : {Transpose::no, Transpose::yes}) {
      for (const float beta : {0.0f, 0.5f}) {
        const index_t m = 37, n = 29, k = 53;
        const index_t lda = (ta == Transpose::yes ? m : k) + 3;
        const index_t ldb = (tb == Transpose::yes ? k : n) + 1;
        const index_t ldc = n + 2;
        const index_t a_rows = ta == Transpose::yes ? k : m;
        const index_t b_rows = tb == Transpose::yes ? n : k;
        INFO("trans_a=" << (ta == Transpose::yes) << " trans_b=" << (tb == Transpose::yes)
                        << " beta=" << beta);
        const Values c0 =
            beta == 0.0f ? nans(size_of(m * ldc)) : random_floats(size_of(m * ldc), 3);
        const std::vector<Values> args = {random_floats(size_of(a_rows * lda), 1),
                                          random_floats(size_of(b_rows * ldb), 2), c0};
        const auto op = [&](Driver& d, const std::vector<float*>& p) {
          d.gemm(ta, tb, m, n, k, 0.75f, p[0], lda, p[1], ldb, beta, p[2], ldc);
        };
        const auto got = run(*gpu, args, op), want = run(*ref, args, op);
        // Compare only C's m x n block: the padding columns are never written.
        for (index_t i = 0; i < m; ++i) {
          for (index_t j = 0; j < n; ++j) {
            const float g = got[2][size_of(i * ldc + j)], w = want[2][size_of(i * ldc + j)];
            REQUIRE(std::abs(g - w) <= 1e-4f * std::max(1.0f, std::abs(w)));
          }
        }
      }
    }
  }
}

TEST_CASE("cuda gemm with k == 0 scales C and with beta == 0 ignores NaN in C", "[cuda]") {
  auto gpu = make_gpu();
  const index_t m = 5, n = 7;
  DeviceArray a(*gpu, Values(1, 1.0f)), b(*gpu, Values(size_of(n), 1.0f));
  for (const float beta : {0.0f, 2.0f}) {
    DeviceArray c(*gpu, beta == 0.0f ? nans(size_of(m * n)) : Values(size_of(m * n), 3.0f));
    gpu->gemm(Transpose::no, Transpose::no, m, n, 0, 1.0f, a.data(), 1, b.data(), n, beta, c.data(),
              n);
    REQUIRE(c.host() == Values(size_of(m * n), beta == 0.0f ? 0.0f : 6.0f));
  }
}

TEST_CASE("cuda lowering equals the reference (im2col, col2im bitwise, swap_axes)", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const LoweringShape& s :
       {lowering(3, 5, 7, 11, 3, 1, 2, 2), lowering(2, 3, 13, 5, 1, 0, 1, 1),
        lowering(7, 17, 31, 29, 3, 1, 1, 1), lowering(2, 6, 9, 10, 3, 2, 3, 2)}) {
    INFO(s.to_string());
    compare(*gpu, *ref, {random_floats(size_of(s.image_count()), 4), nans(size_of(s.col_count()))},
            {1}, 0.0, [&](Driver& d, const std::vector<float*>& p) { d.im2col(s, p[0], p[1]); });
    compare(*gpu, *ref, {random_floats(size_of(s.col_count()), 5), nans(size_of(s.image_count()))},
            {1}, 0.0, [&](Driver& d, const std::vector<float*>& p) { d.col2im(s, p[0], p[1]); });
  }
  compare(*gpu, *ref, {random_floats(7 * 13 * 11, 6), nans(7 * 13 * 11)}, {1}, 0.0,
          [](Driver& d, const std::vector<float*>& p) { d.swap_axes(7, 13, 11, p[0], p[1]); });
}

TEST_CASE("cuda element-wise ops equal the reference", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  const index_t n = 100003;
  const Values x = random_floats(size_of(n), 7), y = random_floats(size_of(n), 8);
  compare(*gpu, *ref, {nans(size_of(n))}, {0}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.fill(n, -1.5f, p[0]); });
  compare(*gpu, *ref, {x}, {0}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.scale(n, 0.3f, p[0]); });
  compare(*gpu, *ref, {x, y}, {1}, 1e-6,
          [&](Driver& d, const std::vector<float*>& p) { d.axpy(n, 0.3f, p[0], p[1]); });
  compare(*gpu, *ref, {x, y}, {1}, 1e-6,
          [&](Driver& d, const std::vector<float*>& p) { d.axpby(n, 0.3f, p[0], -2.0f, p[1]); });
  compare(*gpu, *ref, {x, nans(size_of(n))}, {1}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.axpby(n, 0.3f, p[0], 0.0f, p[1]); });
  compare(*gpu, *ref, {x, y, nans(size_of(n))}, {2}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.mul(n, p[0], p[1], p[2]); });
}

TEST_CASE("cuda reductions equal the reference and are bitwise reproducible", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const index_t n : {index_t{1}, index_t{257}, index_t{65537}, index_t{1000003}}) {
    INFO("n=" << n);
    const Values x = random_floats(size_of(n), 9), y = random_floats(size_of(n), 10);
    DeviceArray gx(*gpu, x), gy(*gpu, y);
    const auto close = [](float a, float b) {
      return std::abs(a - b) <= 1e-6f * std::max(1.0f, std::abs(b));
    };
    const float dot = gpu->dot(n, gx.data(), gy.data());
    const float asum = gpu->asum(n, gx.data());
    const float sum = gpu->sum(n, gx.data());
    CHECK(close(dot, ref->dot(n, x.data(), y.data())));
    CHECK(close(asum, ref->asum(n, x.data())));
    CHECK(close(sum, ref->sum(n, x.data())));
    const float dot2 = gpu->dot(n, gx.data(), gy.data()), sum2 = gpu->sum(n, gx.data());
    CHECK(std::memcmp(&dot, &dot2, sizeof dot) == 0);
    CHECK(std::memcmp(&sum, &sum2, sizeof sum) == 0);
  }
  for (const AxisShape s : {AxisShape{3, 7, 13}, AxisShape{0, 5, 3}, AxisShape{64, 3, 3137}}) {
    for (const float beta : {0.0f, 0.5f}) {
      INFO(s.to_string() << " beta=" << beta);
      const Values prior =
          beta == 0.0f ? nans(size_of(s.channels)) : random_floats(size_of(s.channels), 11);
      const Values dy = random_floats(size_of(s.count()), 12);
      const auto op = [&](Driver& d, const std::vector<float*>& p) {
        d.bias_backward(s, p[0], beta, p[1]);
      };
      compare(*gpu, *ref, {dy, prior}, {1}, 1e-6, op);
      const auto first = run(*gpu, {dy, prior}, op), second = run(*gpu, {dy, prior}, op);
      CHECK(std::memcmp(first[1].data(), second[1].data(), first[1].size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE(
    "cuda fused BatchNorm + Scale + ReLU equals the reference both ways, gradients added, dx in "
    "place too",
    "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  // ResNet's scale_conv1 at batch 2, and a shape of odd sizes.
  for (const AxisShape s : {AxisShape{2, 64, 112 * 112}, AxisShape{3, 7, 13}}) {
    for (const bool relu : {true, false}) {
      INFO(s.to_string() << (relu ? " with ReLU" : " without ReLU"));
      const std::size_t n = size_of(s.count()), c = size_of(s.channels);
      const Values x = random_floats(n, 81, -2.0f, 2.0f), shift = random_floats(c, 82),
                   inv_std = random_floats(c, 83, 0.5f, 2.0f), gamma = random_floats(c, 84),
                   beta = random_floats(c, 85);
      // Bitwise: each element rounds as the reference's unfused sequence of calls.
      compare(*gpu, *ref, {x, shift, inv_std, gamma, beta, nans(n), nans(n)}, {5, 6}, 0.0,
              [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_forward(s, p[0], p[1], p[2], p[3], p[4], relu, 0.0f, p[5], p[6]);
              });
      // The forward's outputs as the backward's inputs.
      const auto forward =
          run(*ref, {x, shift, inv_std, gamma, beta, nans(n), nans(n)},
              [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_forward(s, p[0], p[1], p[2], p[3], p[4], relu, 0.0f, p[5], p[6]);
              });
      const Values& normalised = forward[5];
      const Values& y = forward[6];
      const Values dy = random_floats(n, 86), dx_scale = random_floats(c, 87, -2.0f, 2.0f),
                   dgamma = random_floats(c, 88), dbeta = random_floats(c, 89);
      const double sum_tolerance = 1e-5 * std::max(1.0, s.outer * s.inner / 64.0);
      compare(*gpu, *ref, {dy, y, normalised, dx_scale, dgamma, dbeta, nans(n)}, {6}, 0.0,
              [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_backward(s, p[0], p[1], p[2], p[3], relu, 0.0f, p[4], p[5], p[6]);
              });
      compare(*gpu, *ref, {dy, y, normalised, dx_scale, dgamma, dbeta, nans(n)}, {4, 5},
              sum_tolerance, [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_backward(s, p[0], p[1], p[2], p[3], relu, 0.0f, p[4], p[5], p[6]);
              });
      // dx over dy, and the parameters' gradients alone.
      compare(*gpu, *ref, {dy, y, dx_scale}, {0}, 0.0,
              [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_backward(s, p[0], p[1], nullptr, p[2], relu, 0.0f, nullptr, nullptr,
                                       p[0]);
              });
      compare(*gpu, *ref, {dy, y, normalised, dgamma}, {3}, sum_tolerance,
              [&](Driver& d, const std::vector<float*>& p) {
                d.norm_affine_backward(s, p[0], p[1], p[2], nullptr, relu, 0.0f, p[3], nullptr,
                                       nullptr);
              });
    }
  }
}

namespace {

// max |a - b| over max |b|: the error of a sum of products relative to its scale.
double scaled_diff(const Values& a, const Values& b) {
  double worst = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? worst / scale : worst;
}

}  // namespace

TEST_CASE(
    "cuda TF32 and BF16 math round GEMMs and convolutions within their precision of FP32, "
    "and FP32 is bitwise FP32 again after them",
    "[cuda]") {
  auto gpu = make_gpu();
  INFO(gpu->description());
  const index_t m = 192, n = 160, k = 512;
  const Values a = random_floats(size_of(m * k), 91), b = random_floats(size_of(k * n), 92);
  const auto gemm = [&](Driver& d, const std::vector<float*>& p) {
    d.gemm(Transpose::no, Transpose::no, m, n, k, 1.0f, p[0], k, p[1], n, 0.0f, p[2], n);
  };
  const LoweringShape s = hn::test::lowering(4, 32, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1);
  const index_t oc = 64;
  const Values x = random_floats(size_of(s.image_count()), 93),
               w = random_floats(size_of(oc * 32 * 9), 94);
  const std::size_t yn = size_of(s.batch * oc * s.out_h() * s.out_w());
  const auto conv = [&](Driver& d, const std::vector<float*>& p) {
    d.conv_forward(s, oc, p[0], p[1], nullptr, p[2]);
  };
  const Values gemm_fp32 = run(*gpu, {a, b, nans(size_of(m * n))}, gemm)[2];
  const Values conv_fp32 = run(*gpu, {x, w, nans(yn)}, conv)[2];
  // Inputs rounded to 10 (TF32) or 7 (BF16) mantissa bits: each product is off by up to
  // 2^-10 or 2^-7 of itself; the sums' errors partly cancel.
  for (const auto& [mode, bound] :
       {std::pair{hn::MathMode::tf32, 2e-3}, std::pair{hn::MathMode::bf16, 1.5e-2}}) {
    INFO(hn::math_mode_name(mode) << " math; " << gpu->math_note(mode));
    gpu->set_math_mode(mode);
    const Values g = run(*gpu, {a, b, nans(size_of(m * n))}, gemm)[2];
    const Values c = run(*gpu, {x, w, nans(yn)}, conv)[2];
    CHECK(scaled_diff(g, gemm_fp32) <= bound);
    // TF32 in both modes (cuDNN has no BF16); cuDNN may also find an FMA algorithm fastest.
    CHECK(scaled_diff(c, conv_fp32) <= 2e-3);
    // The GEMM's tensor cores did round: the result is not the FP32 one.
    CHECK(scaled_diff(g, gemm_fp32) > 0.0);
  }
  gpu->set_math_mode(hn::MathMode::fp32);
  const Values g = run(*gpu, {a, b, nans(size_of(m * n))}, gemm)[2];
  const Values c = run(*gpu, {x, w, nans(yn)}, conv)[2];
  CHECK(std::memcmp(g.data(), gemm_fp32.data(), g.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(c.data(), conv_fp32.data(), c.size() * sizeof(float)) == 0);
}

TEST_CASE("cuda activations equal the reference, in place too", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  const AxisShape s{5, 13, 17};
  const index_t n = s.count();
  const Values x = random_floats(size_of(n), 13, -4.0f, 4.0f), dy = random_floats(size_of(n), 14);
  compare(*gpu, *ref, {random_floats(13, 15), x}, {1}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.bias_forward(s, p[0], p[1]); });
  compare(*gpu, *ref, {x}, {0}, 0.0,
          [&](Driver& d, const std::vector<float*>& p) { d.relu_forward(n, 0.1f, p[0], p[0]); });
  compare(*gpu, *ref, {x, dy}, {1}, 0.0, [&](Driver& d, const std::vector<float*>& p) {
    d.relu_backward(n, 0.1f, p[0], p[1], p[1]);
  });
  compare(*gpu, *ref, {x, nans(size_of(n))}, {1}, 1e-6,
          [&](Driver& d, const std::vector<float*>& p) { d.sigmoid_forward(n, p[0], p[1]); });
  compare(
      *gpu, *ref, {random_floats(size_of(n), 16, 0.0f, 1.0f), dy}, {1}, 1e-6,
      [&](Driver& d, const std::vector<float*>& p) { d.sigmoid_backward(n, p[0], p[1], p[1]); });
  compare(*gpu, *ref, {x}, {0}, 1e-6,
          [&](Driver& d, const std::vector<float*>& p) { d.tanh_forward(n, p[0], p[0]); });
  compare(*gpu, *ref, {random_floats(size_of(n), 17), dy, nans(size_of(n))}, {2}, 1e-6,
          [&](Driver& d, const std::vector<float*>& p) { d.tanh_backward(n, p[0], p[1], p[2]); });
}

TEST_CASE("cuda pooling equals the reference, masks and max backward bitwise", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const PoolShape& s : {pooling(2, 3, 7, 11, 3, 2, 1), pooling(3, 5, 13, 13, 2, 2, 0),
                             pooling(2, 3, 6, 6, 6, 1, 0), pooling(32, 17, 27, 27, 3, 2, 0)}) {
    INFO(s.to_string());
    const std::size_t in = size_of(s.in_count()), out = size_of(s.out_count());
    Values x = random_floats(in, 18, -3.0f, 3.0f);
    for (std::size_t i = 0; i < in; i += 3)
      x[i] = std::round(x[i]);  // some ties
    compare(*gpu, *ref, {x, nans(out), nans(out)}, {1, 2}, 0.0,
            [&](Driver& d, const std::vector<float*>& p) {
              d.pool_max_forward(s, p[0], p[1], as_mask(p[2]));
            });
    // Backward from the reference's mask, so the comparison is of the gather alone.
    Values mask(out);
    ref->pool_max_forward(s, x.data(), nans(out).data(), as_mask(mask.data()));
    const Values dy = random_floats(out, 19);
    const auto max_backward = [&](Driver& d, const std::vector<float*>& p) {
      d.pool_max_backward(s, p[0], as_mask(p[1]), p[2]);
    };
    compare(*gpu, *ref, {dy, mask, nans(in)}, {2}, 0.0, max_backward);
    compare(*gpu, *ref, {x, nans(out)}, {1}, 1e-6,
            [&](Driver& d, const std::vector<float*>& p) { d.pool_avg_forward(s, p[0], p[1]); });
    compare(*gpu, *ref, {dy, nans(in)}, {1}, 0.0,
            [&](Driver& d, const std::vector<float*>& p) { d.pool_avg_backward(s, p[0], p[1]); });
    const auto first = run(*gpu, {dy, mask, nans(in)}, max_backward);
    const auto second = run(*gpu, {dy, mask, nans(in)}, max_backward);
    CHECK(std::memcmp(first[2].data(), second[2].data(), in * sizeof(float)) == 0);
  }
}

TEST_CASE("cuda LRN equals the reference in both regions, dx == dy included", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const LrnShape& s : {lrn(2, 7, 5, 3, 5, LrnRegion::across_channels),
                            lrn(3, 2, 3, 5, 7, LrnRegion::across_channels),
                            lrn(4, 32, 13, 13, 5, LrnRegion::across_channels),
                            lrn(2, 3, 7, 11, 3, LrnRegion::within_channel),
                            lrn(1, 1, 2, 3, 7, LrnRegion::within_channel)}) {
    INFO(s.to_string());
    const std::size_t n = size_of(s.count());
    const Values x = random_floats(n, 20, -2.0f, 2.0f), dy = random_floats(n, 21);
    compare(*gpu, *ref, {x, nans(n), nans(n)}, {1, 2}, 1e-5,
            [&](Driver& d, const std::vector<float*>& p) { d.lrn_forward(s, p[0], p[1], p[2]); });
    Values y(n), scale(n);
    ref->lrn_forward(s, x.data(), y.data(), scale.data());
    compare(*gpu, *ref, {x, y, scale, dy, nans(n)}, {4}, 1e-5,
            [&](Driver& d, const std::vector<float*>& p) {
              d.lrn_backward(s, p[0], p[1], p[2], p[3], p[4]);
            });
    compare(*gpu, *ref, {x, y, scale, dy}, {3}, 1e-5, [&](Driver& d, const std::vector<float*>& p) {
      d.lrn_backward(s, p[0], p[1], p[2], p[3], p[3]);
    });
  }
}

TEST_CASE("cuda softmax equals the reference, in place too", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  for (const AxisShape s : {AxisShape{5, 11, 7}, AxisShape{64, 1000, 1}, AxisShape{2, 1, 13}}) {
    INFO(s.to_string());
    const std::size_t n = size_of(s.count());
    const Values x = random_floats(n, 22, -8.0f, 8.0f), dy = random_floats(n, 23);
    compare(*gpu, *ref, {x, nans(n)}, {1}, 1e-5,
            [&](Driver& d, const std::vector<float*>& p) { d.softmax_forward(s, p[0], p[1]); });
    compare(*gpu, *ref, {x}, {0}, 1e-5,
            [&](Driver& d, const std::vector<float*>& p) { d.softmax_forward(s, p[0], p[0]); });
    Values y(n);
    ref->softmax_forward(s, x.data(), y.data());
    compare(*gpu, *ref, {y, dy, nans(n)}, {2}, 1e-5, [&](Driver& d, const std::vector<float*>& p) {
      d.softmax_backward(s, p[0], p[1], p[2]);
    });
    compare(*gpu, *ref, {y, dy}, {1}, 1e-5, [&](Driver& d, const std::vector<float*>& p) {
      d.softmax_backward(s, p[0], p[1], p[1]);
    });
  }
}

TEST_CASE("cuda dropout draws the reference's mask and outputs bitwise", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  const index_t n = 1000003;
  const Values x = random_floats(size_of(n), 24), dy = random_floats(size_of(n), 25);
  for (const float ratio : {0.0f, 0.5f, 0.9f}) {
    INFO("ratio=" << ratio);
    compare(*gpu, *ref, {x, nans(size_of(n)), nans(size_of(n))}, {1, 2}, 0.0,
            [&](Driver& d, const std::vector<float*>& p) {
              d.dropout_forward(n, ratio, 42, 0xFFFFFF00u, p[0], p[1], p[2]);
            });
    Values y(size_of(n)), mask(size_of(n));
    ref->dropout_forward(n, ratio, 42, 0xFFFFFF00u, x.data(), y.data(), mask.data());
    compare(*gpu, *ref, {mask, dy, nans(size_of(n))}, {2}, 0.0,
            [&](Driver& d, const std::vector<float*>& p) {
              d.dropout_backward(n, ratio, p[0], p[1], p[2]);
            });
  }
}

TEST_CASE("cuda copies round-trip for every size, staged, chunked and unaligned", "[cuda]") {
  auto gpu = make_gpu();
  // Up to well past the largest staging buffer (32 MiB), so copies run in chunks.
  for (const std::size_t bytes :
       {std::size_t{1}, std::size_t{3}, std::size_t{4097}, std::size_t{(1 << 20) + 1},
        std::size_t{(16 << 20) + 7}, std::size_t{(80 << 20) + 5}}) {
    INFO("bytes=" << bytes);
    std::vector<unsigned char> src(bytes + 1), back(bytes + 1, 0), back2(bytes + 1, 0);
    for (std::size_t i = 0; i < src.size(); ++i)
      src[i] = static_cast<unsigned char>(i * 131 + 7);
    hn::Buffer device(*gpu, bytes), other(*gpu, bytes);
    gpu->copy_from_host(device.address(), src.data() + 1, bytes);  // unaligned host source
    gpu->copy(other.address(), device.address(), bytes);
    gpu->copy_to_host(back.data() + 1, other.address(), bytes);  // unaligned host destination
    REQUIRE(std::memcmp(back.data() + 1, src.data() + 1, bytes) == 0);
    gpu->copy_to_host(back2.data(), device.address(), bytes);
    REQUIRE(std::memcmp(back2.data(), src.data() + 1, bytes) == 0);
  }
}

TEST_CASE("cuda results are visible after copy_to_host without an explicit synchronize", "[cuda]") {
  auto gpu = make_gpu();
  const index_t n = 1 << 24;
  DeviceArray x(*gpu, size_of(n));
  gpu->fill(n, 1.0f, x.data());
  for (int i = 0; i < 20; ++i)
    gpu->scale(n, 2.0f, x.data());  // queued, not waited for
  const Values host = x.host();
  REQUIRE(host.front() == 1048576.0f);
  REQUIRE(host.back() == 1048576.0f);
  gpu->fill(n, 0.5f, x.data());
  REQUIRE(gpu->sum(n, x.data()) == 0.5f * static_cast<float>(n));
}

TEST_CASE(
    "cuda reports an invalid softmax_loss label at the next synchronising call, once, "
    "and the first failing call's first position",
    "[cuda]") {
  auto gpu = make_gpu();
  AxisShape shape;
  shape.outer = 64;
  shape.channels = 10;
  shape.inner = 1000;
  const index_t positions = shape.outer * shape.inner;
  DeviceArray prob(*gpu, Values(size_of(shape.count()), 0.1f));
  Values labels(size_of(positions), 3.0f);
  labels[size_of(positions - 1)] = 12.0f;  // (outer 63, inner 999)
  labels[size_of(1234)] = 10.0f;           // (outer 1, inner 234): the first
  DeviceArray label(*gpu, labels), good(*gpu, Values(size_of(positions), 1.0f));
  DeviceArray loss(*gpu, size_of(positions)), valid(*gpu, size_of(positions));
  DeviceArray dx(*gpu, size_of(shape.count()));

  // Queued without an error; a later failing call does not replace the first report.
  gpu->softmax_loss_forward(shape, prob.data(), label.data(), false, -1, loss.data(), valid.data());
  gpu->softmax_loss_backward(shape, prob.data(), label.data(), false, -1, 1.0f, dx.data());
  std::string message;
  try {
    (void)loss.host();  // copy_to_host synchronises
  } catch (const hn::Error& error) {
    message = error.what();
  }
  CHECK(message.find("softmax_loss_forward: label 10 at position (outer 1, inner 234)") !=
        std::string::npos);
  CHECK(message.find("outside [0, 10)") != std::string::npos);
  CHECK(message.find("next synchronising call") != std::string::npos);
  gpu->synchronize();  // reported once

  // The record is clear again: valid labels pass, the next invalid one is reported.
  gpu->softmax_loss_forward(shape, prob.data(), good.data(), false, -1, loss.data(), valid.data());
  REQUIRE(gpu->sum(positions, valid.data()) == static_cast<float>(positions));
  gpu->softmax_loss_backward(shape, prob.data(), label.data(), false, -1, 1.0f, dx.data());
  REQUIRE_THROWS_WITH(gpu->synchronize(),
                      Catch::Matchers::Contains("softmax_loss_backward: label 10"));
  gpu->synchronize();
}

TEST_CASE("cuda allocation failure is an hn::Error and the driver stays usable", "[cuda]") {
  auto gpu = make_gpu();
  const std::size_t huge = std::size_t{1} << 52;  // 4 PiB
  try {
    gpu->allocate(huge);
    FAIL("allocating 4 PiB succeeded");
  } catch (const hn::Error& error) {
    const std::string message = error.what();
    CHECK(message.find("cudaMalloc") != std::string::npos);
    CHECK(message.find(std::to_string(huge)) != std::string::npos);
  }
  DeviceArray x(*gpu, 1000);
  gpu->fill(1000, 3.0f, x.data());
  REQUIRE(x.host() == Values(1000, 3.0f));
}

TEST_CASE("cuda driver owns its device memory only, and rejects host addresses", "[cuda]") {
  auto gpu = make_gpu();
  CHECK_FALSE(gpu->capabilities().host_addressable);
  hn::Buffer buffer(*gpu, 4096);
  const auto* base = static_cast<const char*>(buffer.address());
  CHECK(gpu->owns(base, 4096));
  CHECK(gpu->owns(base + 100, 3996));
  CHECK_FALSE(gpu->owns(base + 100, 3997));  // runs past the allocation
  Values host(16, 1.0f);
  CHECK_FALSE(gpu->owns(host.data(), 64));
  CHECK_THROWS_AS(gpu->fill(16, 0.0f, host.data()), hn::Error);
}

TEST_CASE("cuda cuDNN softmax and LRN agree with the driver's own kernels", "[cuda]") {
  // HYBRIDNN_CUDNN=0 at construction turns cuDNN off for that driver.
  ::setenv("HYBRIDNN_CUDNN", "0", 1);
  auto own = make_gpu();
  ::unsetenv("HYBRIDNN_CUDNN");
  auto dnn = make_gpu();
  INFO(dnn->description() << " vs " << own->description());
  const AxisShape axis{64, 1000, 3};
  const std::size_t n = size_of(axis.count());
  const Values x = random_floats(n, 26, -8.0f, 8.0f), dy = random_floats(n, 27);
  compare(*dnn, *own, {x, nans(n)}, {1}, 1e-5,
          [&](Driver& d, const std::vector<float*>& p) { d.softmax_forward(axis, p[0], p[1]); });
  const auto y = run(*own, {x, nans(n)}, [&](Driver& d, const std::vector<float*>& p) {
    d.softmax_forward(axis, p[0], p[1]);
  })[1];
  compare(*dnn, *own, {y, dy, nans(n)}, {2}, 1e-5, [&](Driver& d, const std::vector<float*>& p) {
    d.softmax_backward(axis, p[0], p[1], p[2]);
  });

  const LrnShape s = lrn(8, 64, 13, 13, 5, LrnRegion::across_channels);
  const std::size_t m = size_of(s.count());
  const Values lx = random_floats(m, 28, -2.0f, 2.0f), ldy = random_floats(m, 29);
  compare(*dnn, *own, {lx, nans(m), nans(m)}, {1, 2}, 1e-5,
          [&](Driver& d, const std::vector<float*>& p) { d.lrn_forward(s, p[0], p[1], p[2]); });
  const auto forward =
      run(*own, {lx, nans(m), nans(m)},
          [&](Driver& d, const std::vector<float*>& p) { d.lrn_forward(s, p[0], p[1], p[2]); });
  compare(*dnn, *own, {lx, forward[1], forward[2], ldy, nans(m)}, {4}, 1e-5,
          [&](Driver& d, const std::vector<float*>& p) {
            d.lrn_backward(s, p[0], p[1], p[2], p[3], p[4]);
          });
}

TEST_CASE("cuda cuDNN convolution equals the reference, accumulating weight gradients", "[cuda]") {
  auto gpu = make_gpu();
  auto ref = make_reference();
  // Without cuDNN the calls run the generic implementation: the comparisons hold as well.
  INFO(gpu->description());
  struct Case {
    LoweringShape shape;
    index_t out_channels;
  };
  std::vector<Case> cases = {
      {lowering(2, 3, 17, 19, 5, 2, 1, 1), 8},    // non-square kernel, pad and stride
      {lowering(1, 6, 13, 11, 3, 1, 2, 2), 4},    // dilation 2, batch 1
      {lowering(3, 8, 9, 9, 1, 0, 1, 1), 12},     // 1x1 x 2 wide kernel
      {lowering(4, 32, 13, 13, 3, 1, 1, 1), 48},  // conv4-like, groups below
      // CIFAR-10 quick's conv1: cuDNN's heuristics rank FFT first for some directions here
      // (an H200's weight gradient was 7e-4 from the CPU's relative to its largest value).
      {lowering(8, 3, 32, 32, 5, 2, 1, 1), 32},
  };
  cases[1].shape.groups = 2;
  cases[2].shape.groups = 4;
  cases[3].shape.groups = 2;
  for (const Case& c : cases) {
    const LoweringShape& s = c.shape;
    const index_t oc = c.out_channels;
    INFO(s.to_string() << " out_channels=" << oc);
    const std::size_t xn = size_of(s.image_count());
    const std::size_t wn = size_of(oc * (s.channels / s.groups) * s.kernel_h * s.kernel_w);
    const std::size_t yn = size_of(s.batch * oc * s.out_h() * s.out_w());
    const double tolerance =
        1e-4 * std::max(1.0, (s.channels / s.groups) * s.kernel_h * s.kernel_w / 64.0);
    const Values x = random_floats(xn, 41), w = random_floats(wn, 42),
                 b = random_floats(size_of(oc), 43);
    const Values dy = random_floats(yn, 44);
    compare(*gpu, *ref, {x, w, b, nans(yn)}, {3}, tolerance,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_forward(s, oc, p[0], p[1], p[2], p[3]);
            });
    compare(*gpu, *ref, {x, w, nans(yn)}, {2}, tolerance,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_forward(s, oc, p[0], p[1], nullptr, p[2]);
            });
    compare(*gpu, *ref, {w, dy, nans(xn)}, {2}, tolerance,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_backward_data(s, oc, p[0], p[1], p[2]);
            });
    // Non-zero starting gradients: conv_backward_weights adds to them.
    const Values dw = random_floats(wn, 45, -3.0f, 3.0f), db = random_floats(size_of(oc), 46);
    const double sum_tolerance = 1e-4 * std::max(1.0, s.batch * s.out_h() * s.out_w() / 64.0);
    compare(*gpu, *ref, {x, dy, dw, db}, {2, 3}, sum_tolerance,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_backward_weights(s, oc, p[0], p[1], p[2], p[3]);
            });
    compare(*gpu, *ref, {x, dy, dw, db}, {2, 3}, sum_tolerance,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_backward_weights(s, oc, p[0], p[1], p[2], nullptr);
            });
  }
}

// HYBRIDNN_CUDNN_TRANSFORMS=1 lets FFT and Winograd in (measured, the fastest for ResNet-50's
// 3x3 convolutions on an H200): their results stay within 2e-3 of the reference relative to
// the largest value, the bound docs/architecture.md gives for them.
TEST_CASE("cuda convolutions with FFT and Winograd allowed stay within their bound", "[cuda]") {
  ::setenv("HYBRIDNN_CUDNN_TRANSFORMS", "1", 1);
  ::setenv("HYBRIDNN_CUDNN_ALGO", "find", 1);
  auto gpu = make_gpu();
  ::unsetenv("HYBRIDNN_CUDNN_TRANSFORMS");
  ::unsetenv("HYBRIDNN_CUDNN_ALGO");
  auto ref = make_reference();
  INFO(gpu->description());
  CHECK((gpu->description().find("FFT and Winograd allowed") != std::string::npos ||
         gpu->description().find("cuDNN off") != std::string::npos));
  for (const auto& [shape, oc] : {std::pair{lowering(4, 64, 28, 28, 3, 1, 1, 1), index_t{64}},
                                  std::pair{lowering(4, 128, 14, 14, 3, 1, 1, 1), index_t{128}}}) {
    const LoweringShape& s = shape;
    INFO(s.to_string() << " out_channels=" << oc);
    const std::size_t xn = size_of(s.image_count());
    const std::size_t wn = size_of(oc * s.channels * s.kernel_h * s.kernel_w);
    const std::size_t yn = size_of(s.batch * oc * s.out_h() * s.out_w());
    const Values x = random_floats(xn, 51), w = random_floats(wn, 52), dy = random_floats(yn, 53);
    constexpr double kBound = 2e-3;
    compare(*gpu, *ref, {x, w, nans(yn)}, {2}, kBound,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_forward(s, oc, p[0], p[1], nullptr, p[2]);
            });
    compare(*gpu, *ref, {w, dy, nans(xn)}, {2}, kBound,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_backward_data(s, oc, p[0], p[1], p[2]);
            });
    compare(*gpu, *ref, {x, dy, Values(wn, 0.0f)}, {2}, kBound,
            [&](Driver& d, const std::vector<float*>& p) {
              d.conv_backward_weights(s, oc, p[0], p[1], p[2], nullptr);
            });
  }
}

TEST_CASE(
    "cuda depthwise convolution equals the reference on cuDNN and on the own kernels "
    "(HYBRIDNN_CUDNN=own-depthwise), bitwise reproducible, and without cuDNN other shapes fall "
    "back",
    "[cuda]") {
  auto ref = make_reference();
  ::setenv("HYBRIDNN_CUDNN", "0", 1);
  auto no_dnn = make_gpu();
  ::setenv("HYBRIDNN_CUDNN", "own-depthwise", 1);
  auto own = make_gpu();  // own kernels for depthwise, cuDNN (when built) for the rest
  ::unsetenv("HYBRIDNN_CUDNN");
  auto gpu = make_gpu();  // cuDNN for every convolution when built with it
  // The own kernels cover depthwise shapes only, so without cuDNN no convolution is claimed.
  CHECK_FALSE(no_dnn->capabilities().convolution);

  struct Case {
    LoweringShape shape;
    index_t multiplier;
  };
  using hn::test::lowering;  // with groups
  const std::vector<Case> cases = {
      {lowering(4, 32, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1, 32), 1},  // MobileNet-like
      {lowering(2, 16, 29, 31, 3, 3, 1, 1, 2, 2, 1, 1, 16), 2},  // stride 2, multiplier 2
      {lowering(3, 8, 17, 13, 5, 5, 2, 2, 1, 1, 2, 2, 8), 1},    // 5x5, dilation 2
      {lowering(2, 6, 15, 20, 3, 5, 0, 1, 2, 1, 1, 1, 6), 3},    // non-square, uneven
  };
  for (const Case& c : cases) {
    const LoweringShape& s = c.shape;
    const index_t oc = s.channels * c.multiplier;
    INFO(s.to_string() << " out_channels=" << oc);
    const std::size_t xn = size_of(s.image_count());
    const std::size_t wn = size_of(oc * s.kernel_h * s.kernel_w);
    const std::size_t yn = size_of(s.batch * oc * s.out_h() * s.out_w());
    const Values x = random_floats(xn, 51), w = random_floats(wn, 52),
                 b = random_floats(size_of(oc), 53), dy = random_floats(yn, 54);
    const Values dw = random_floats(wn, 55, -3.0f, 3.0f), db = random_floats(size_of(oc), 56);
    const auto forward = [&](Driver& d, const std::vector<float*>& p) {
      d.conv_forward(s, oc, p[0], p[1], p[2], p[3]);
    };
    const auto backward_data = [&](Driver& d, const std::vector<float*>& p) {
      d.conv_backward_data(s, oc, p[0], p[1], p[2]);
    };
    const auto backward_weights = [&](Driver& d, const std::vector<float*>& p) {
      d.conv_backward_weights(s, oc, p[0], p[1], p[2], p[3]);
    };
    const auto check = [&](Driver& d, double tolerance) {
      INFO(d.description());
      compare(d, *ref, {x, w, b, nans(yn)}, {3}, tolerance, forward);
      compare(d, *ref, {x, w, nans(yn)}, {2}, tolerance,
              [&](Driver& e, const std::vector<float*>& p) {
                e.conv_forward(s, oc, p[0], p[1], nullptr, p[2]);
              });
      compare(d, *ref, {w, dy, nans(xn)}, {2}, tolerance, backward_data);
      // Non-zero starting gradients: conv_backward_weights adds to them.
      compare(d, *ref, {x, dy, dw, db}, {2, 3}, tolerance, backward_weights);
      compare(d, *ref, {x, dy, dw, db}, {2, 3}, tolerance,
              [&](Driver& e, const std::vector<float*>& p) {
                e.conv_backward_weights(s, oc, p[0], p[1], p[2], nullptr);
              });
    };
    check(*own, 1e-5);
    check(*no_dnn, 1e-5);
    if (gpu->capabilities().convolution) {
      check(*gpu, 1e-4 * std::max(1.0, s.batch * s.out_h() * s.out_w() / 64.0));
    }

    // No atomics in the own kernels, deterministic algorithms of cuDNN: a second run gives
    // the same bits.
    for (Driver* d : {own.get(), gpu.get()}) {
      INFO(d->description());
      const auto reproducible = [&](const std::vector<Values>& args,
                                    const std::vector<std::size_t>& outputs, const auto& op) {
        const auto first = run(*d, args, op), second = run(*d, args, op);
        for (const std::size_t k : outputs) {
          CHECK(std::memcmp(first[k].data(), second[k].data(), first[k].size() * sizeof(float)) ==
                0);
        }
      };
      reproducible({x, w, b, nans(yn)}, {3}, forward);
      reproducible({w, dy, nans(xn)}, {2}, backward_data);
      reproducible({x, dy, dw, db}, {2, 3}, backward_weights);
    }
  }

  // A grouped but not depthwise shape on the driver without cuDNN: the generic implementation.
  const LoweringShape grouped = lowering(2, 4, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2);
  const index_t oc = 6;
  const std::size_t xn = size_of(grouped.image_count());
  const std::size_t yn = size_of(grouped.batch * oc * grouped.out_h() * grouped.out_w());
  compare(*no_dnn, *ref, {random_floats(xn, 57), random_floats(size_of(oc * 2 * 9), 58), nans(yn)},
          {2}, 1e-5, [&](Driver& d, const std::vector<float*>& p) {
            d.conv_forward(grouped, oc, p[0], p[1], nullptr, p[2]);
          });
}
