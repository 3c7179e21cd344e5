// The reference driver, the oracle of all driver tests, checked against values worked out
// by hand on tiny cases (the arithmetic is in the comments), its separate-memory mode, and
// finite-difference checks that its backward passes are the derivatives of its forwards.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/philox.h"
#include "tests/support.h"

using namespace hn;
using Catch::Matchers::Contains;
using hn::test::DeviceArray;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::unique_ptr<Driver> make_reference(bool separate_memory) {
  return make_driver(Device{"reference", 0},
                     DriverOptions{{"separate_memory", separate_memory ? "true" : "false"}});
}

// int32 pooling masks on a driver (DeviceArray holds floats).
class MaskArray {
 public:
  MaskArray(Driver& driver, std::size_t count)
      : driver_(&driver), buffer_(driver, count * sizeof(std::int32_t)), count_(count) {}
  std::int32_t* data() const { return buffer_.as<std::int32_t>(); }
  std::vector<std::int32_t> host() const {
    std::vector<std::int32_t> out(count_);
    driver_->copy_to_host(out.data(), buffer_.address(), count_ * sizeof(std::int32_t));
    return out;
  }

 private:
  Driver* driver_;
  Buffer buffer_;
  std::size_t count_;
};

void check_close(const std::vector<float>& actual, const std::vector<float>& expected,
                 double margin = 1e-6) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i);
    CHECK(actual[i] == Approx(expected[i]).margin(margin));
  }
}

using hn::test::axis;
using hn::test::pooling;

// Square kernel, pad, stride and dilation.
LoweringShape lowering(index_t batch, index_t channels, index_t height, index_t width,
                       index_t kernel, index_t pad, index_t stride, index_t dilation = 1) {
  return hn::test::lowering(batch, channels, height, width, kernel, kernel, pad, pad, stride,
                            stride, dilation, dilation);
}

LrnShape lrn(index_t batch, index_t channels, index_t height, index_t width, index_t size,
             float alpha, float beta, float k, LrnRegion region) {
  return hn::test::lrn(batch, channels, height, width, size, region, alpha, beta, k);
}

PoolShape square_pooling(index_t batch, index_t channels, index_t size, index_t kernel,
                         index_t stride, index_t pad) {
  return pooling(batch, channels, size, size, kernel, kernel, stride, stride, pad, pad);
}

}  // namespace

// ---- GEMM -----------------------------------------------------------------------------

TEST_CASE("reference gemm computes alpha*op(A)*op(B) + beta*C for every transpose pair",
          "[reference]") {
  const bool separate = GENERATE(false, true);
  const Transpose trans_a = GENERATE(Transpose::no, Transpose::yes);
  const Transpose trans_b = GENERATE(Transpose::no, Transpose::yes);
  CAPTURE(separate, trans_a == Transpose::yes, trans_b == Transpose::yes);
  auto driver = make_reference(separate);
  // op(A) = [1 2 3; 4 5 6], op(B) = [7 8; 9 10; 11 12], both stored with padded leading
  // dimensions whose padding is NaN: reading it would poison the result.
  const float P = kNaN;
  std::vector<float> a_stored, b_stored;
  index_t lda, ldb;
  if (trans_a == Transpose::no) {
    a_stored = {1, 2, 3, P, 4, 5, 6, P};  // 2 x 3, lda 4
    lda = 4;
  } else {
    a_stored = {1, 4, P, 2, 5, P, 3, 6, P};  // A^T stored 3 x 2, lda 3
    lda = 3;
  }
  if (trans_b == Transpose::no) {
    b_stored = {7, 8, P, 9, 10, P, 11, 12, P};  // 3 x 2, ldb 3
    ldb = 3;
  } else {
    b_stored = {7, 9, 11, P, 8, 10, 12, P};  // B^T stored 2 x 3, ldb 4
    ldb = 4;
  }
  DeviceArray a(*driver, a_stored), b(*driver, b_stored);
  // C is 2 x 2 with ldc 3; its padding column (-777) must stay untouched.
  DeviceArray c(*driver, std::vector<float>{1, 2, -777, 3, 4, -777});
  driver->gemm(trans_a, trans_b, 2, 2, 3, 2.0f, a.data(), lda, b.data(), ldb, 0.5f, c.data(), 3);
  // A*B = [1*7+2*9+3*11  1*8+2*10+3*12; 4*7+5*9+6*11  4*8+5*10+6*12] = [58 64; 139 154]
  // 2*AB + 0.5*C = [116+0.5  128+1; 278+1.5  308+2]
  check_close(c.host(), {116.5f, 129.0f, -777.0f, 279.5f, 310.0f, -777.0f});
}

TEST_CASE("reference gemm with beta 0 does not read C, so NaN in C does not propagate",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  DeviceArray a(*driver, std::vector<float>{1, 2, 3, 4, 5, 6});
  DeviceArray b(*driver, std::vector<float>{7, 8, 9, 10, 11, 12});
  DeviceArray c(*driver, std::vector<float>(4, kNaN));
  driver->gemm(Transpose::no, Transpose::no, 2, 2, 3, 1.0f, a.data(), 3, b.data(), 2, 0.0f,
               c.data(), 2);
  check_close(c.host(), {58, 64, 139, 154});  // A*B as above
}

TEST_CASE("reference gemm with k 0 scales C by beta", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  DeviceArray c(*driver, std::vector<float>{2, 4, 6, 8});
  driver->gemm(Transpose::no, Transpose::no, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(),
               2);
  check_close(c.host(), {1, 2, 3, 4});  // 0.5 * C: the empty product is 0
}

// ---- lowering -------------------------------------------------------------------------

TEST_CASE("reference im2col and col2im follow the (c,kh,kw) x (n,oh,ow) layout", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const std::vector<float> image3x3{1, 2, 3, 4, 5, 6, 7, 8, 9};

  SECTION("3x3 image, 2x2 kernel, pad 1, stride 2") {
    const LoweringShape s = lowering(1, 1, 3, 3, 2, 1, 2);
    REQUIRE(s.out_h() == 2);  // (3 + 2 - 2) / 2 + 1
    DeviceArray images(*driver, image3x3), columns(*driver, 16);
    driver->im2col(s, images.data(), columns.data());
    // Window corners (oh*2-1, ow*2-1) = (-1,-1) (-1,1) (1,-1) (1,1); row (kh,kw) reads the
    // pixel at corner + (kh,kw), 0 in the padding.
    check_close(columns.host(), {0, 0, 0, 5,    // (0,0): only (1,1) is inside
                                 0, 0, 4, 6,    // (0,1): (1,0)=4 (1,2)=6
                                 0, 2, 0, 8,    // (1,0): (0,1)=2 (2,1)=8
                                 1, 3, 7, 9});  // (1,1): (0,0) (0,2) (2,0) (2,2)
    // Every pixel appears exactly once, so col2im gives the image back, overwriting 100s.
    DeviceArray back(*driver, std::vector<float>(9, 100.0f));
    driver->col2im(s, columns.data(), back.data());
    check_close(back.host(), image3x3);
  }

  SECTION("3x3 image, 2x2 kernel, stride 1: col2im sums overlapping entries") {
    const LoweringShape s = lowering(1, 1, 3, 3, 2, 0, 1);
    const std::vector<float> expected_columns{1, 2, 4, 5,   // (0,0)
                                              2, 3, 5, 6,   // (0,1)
                                              4, 5, 7, 8,   // (1,0)
                                              5, 6, 8, 9};  // (1,1)
    DeviceArray images(*driver, image3x3), columns(*driver, 16);
    driver->im2col(s, images.data(), columns.data());
    check_close(columns.host(), expected_columns);
    // Pixel (h,w) appears once per window covering it: corners 1, edges 2, centre 4.
    DeviceArray back(*driver, std::vector<float>(9, kNaN));
    driver->col2im(s, columns.data(), back.data());
    check_close(back.host(), {1 * 1, 2 * 2, 3 * 1, 4 * 2, 5 * 4, 6 * 2, 7 * 1, 8 * 2, 9 * 1});
  }

  SECTION("4x4 image, 2x2 kernel, dilation 2") {
    const LoweringShape s = lowering(1, 1, 4, 4, 2, 0, 1, 2);
    REQUIRE(s.out_h() == 2);  // (4 - (2*(2-1)+1)) / 1 + 1
    std::vector<float> image(16);
    std::iota(image.begin(), image.end(), 1.0f);  // x[h][w] = 4h + w + 1
    DeviceArray images(*driver, image), columns(*driver, 16);
    driver->im2col(s, images.data(), columns.data());
    // Row (kh,kw) reads x[oh + 2kh][ow + 2kw].
    check_close(columns.host(), {1, 2, 5, 6,        // (0,0): x[oh][ow]
                                 3, 4, 7, 8,        // (0,1): x[oh][ow + 2]
                                 9, 10, 13, 14,     // (1,0): x[oh + 2][ow]
                                 11, 12, 15, 16});  // (1,1): x[oh + 2][ow + 2]
  }

  SECTION("3x3 image, 2x2 kernel, dilation 2, pad 1, stride 2") {
    const LoweringShape s = lowering(1, 1, 3, 3, 2, 1, 2, 2);
    REQUIRE(s.out_h() == 2);  // (3 + 2 - 3) / 2 + 1
    DeviceArray images(*driver, image3x3), columns(*driver, 16);
    driver->im2col(s, images.data(), columns.data());
    // Corners (-1,-1) (-1,1) (1,-1) (1,1) plus offsets {0,2}: only pixel (1,1) = 5 is ever
    // inside, once per kernel tap.
    check_close(columns.host(), {0, 0, 0, 5, 0, 0, 5, 0, 0, 5, 0, 0, 5, 0, 0, 0});
    DeviceArray back(*driver, image3x3);
    driver->col2im(s, columns.data(), back.data());
    check_close(back.host(), {0, 0, 0, 0, 20, 0, 0, 0, 0});  // 4 taps x 5, zero elsewhere
  }

  SECTION("a 2-image batch puts image n's columns after image n-1's, per channel row") {
    // N=2, C=2, 2x2 images, 1x1 kernel: rows = c, columns = (n, h, w).
    const std::vector<float> batch{1, 2,  3,  4,  5,  6,  7,  8,    // n0: c0, c1
                                   9, 10, 11, 12, 13, 14, 15, 16};  // n1: c0, c1
    const std::vector<float> expected{1, 2, 3, 4, 9,  10, 11, 12,   // c0: n0 then n1
                                      5, 6, 7, 8, 13, 14, 15, 16};  // c1
    for (index_t groups : {1, 2}) {  // groups only name row blocks; the layout is the same
      LoweringShape s = lowering(2, 2, 2, 2, 1, 0, 1);
      s.groups = groups;
      DeviceArray images(*driver, batch), columns(*driver, 16);
      driver->im2col(s, images.data(), columns.data());
      check_close(columns.host(), expected);
      DeviceArray back(*driver, 16);
      driver->col2im(s, columns.data(), back.data());
      check_close(back.host(), batch);
    }
    // N=2, C=1, 2x2 images, 2x2 kernel: one output pixel per image, so column n is image n.
    const LoweringShape s = lowering(2, 1, 2, 2, 2, 0, 1);
    DeviceArray images(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}), columns(*driver, 8);
    driver->im2col(s, images.data(), columns.data());
    check_close(columns.host(), {1, 5, 2, 6, 3, 7, 4, 8});  // row (kh,kw): [x0 x1]
  }
}

TEST_CASE("reference swap_axes moves element (i, j, r) to (j, i, r)", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  std::vector<float> src(12);
  std::iota(src.begin(), src.end(), 0.0f);  // src[i][j][r] = 6i + 2j + r, d0=2 d1=3 inner=2
  DeviceArray in(*driver, src), out(*driver, 12);
  driver->swap_axes(2, 3, 2, in.data(), out.data());
  // dst[j] = src[0][j], src[1][j]: j=0 -> 0 1 6 7, j=1 -> 2 3 8 9, j=2 -> 4 5 10 11
  check_close(out.host(), {0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11});
}

TEST_CASE("reference lift sums the product taps of each output, and lift_backward routes dy back",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  // 1x1x3x3 input, 2x2 kernel, pad 1, stride 2, 2 output channels: out 2x2. P has rows
  // (ih, iw) = 9 and columns (co, kh, kw) = 8; P[r][c] = 10r + c.
  const LoweringShape s = lowering(1, 1, 3, 3, 2, 1, 2);
  std::vector<float> products(72);
  for (int r = 0; r < 9; ++r) {
    for (int c = 0; c < 8; ++c)
      products[r * 8 + c] = static_cast<float>(10 * r + c);
  }
  DeviceArray p(*driver, products), y(*driver, std::vector<float>(8, kNaN));
  driver->lift(s, 2, p.data(), y.data());
  // Output (oh, ow) reads (ih, iw) = (2oh - 1 + kh, 2ow - 1 + kw), column co*4 + kh*2 + kw:
  //   (0,0): tap (1,1) at (0,0)                    -> P[0][3]                  = 3  | co 1: 7
  //   (0,1): taps (1,0) (1,1) at (0,1) (0,2)       -> P[1][2] + P[2][3]        = 35 | 43
  //   (1,0): taps (0,1) (1,1) at (1,0) (2,0)       -> P[3][1] + P[6][3]        = 94 | 102
  //   (1,1): all four at (1,1) (1,2) (2,1) (2,2)   -> 40 + 51 + 72 + 83        = 246 | 262
  check_close(y.host(), {3, 35, 94, 246, 7, 43, 102, 262});

  // dy[co] = (1 2 3 4) and (5 6 7 8): each P entry gets the dy of the output it feeds
  // (the same taps as above), 0 where it feeds none; the NaN start is overwritten.
  DeviceArray dy(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  DeviceArray dp(*driver, std::vector<float>(72, kNaN));
  driver->lift_backward(s, 2, dy.data(), dp.data());
  //                 co 0: kh,kw = 00 01 10 11 | co 1: 00 01 10 11
  check_close(dp.host(), {0, 0, 0, 1, 0, 0, 0, 5,    // (0,0) -> out (0,0)
                          0, 0, 2, 0, 0, 0, 6, 0,    // (0,1) -> out (0,1) via tap (1,0)
                          0, 0, 0, 2, 0, 0, 0, 6,    // (0,2) -> out (0,1) via tap (1,1)
                          0, 3, 0, 0, 0, 7, 0, 0,    // (1,0) -> out (1,0) via tap (0,1)
                          4, 0, 0, 0, 8, 0, 0, 0,    // (1,1) -> out (1,1) via tap (0,0)
                          0, 4, 0, 0, 0, 8, 0, 0,    // (1,2) -> out (1,1) via tap (0,1)
                          0, 0, 0, 3, 0, 0, 0, 7,    // (2,0) -> out (1,0) via tap (1,1)
                          0, 0, 4, 0, 0, 0, 8, 0,    // (2,1) -> out (1,1) via tap (1,0)
                          0, 0, 0, 4, 0, 0, 0, 8});  // (2,2) -> out (1,1) via tap (1,1)
}

TEST_CASE("reference lift with dilation 2 reads taps two pixels apart", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  // 2 images of 1x3x3, 2x2 kernel, dilation 2, no pad: out 1x1, taps at (0,0) (0,2) (2,0)
  // (2,2). One output channel, P[(n, ih, iw)][(kh, kw)] = 100n + 10(3ih + iw) + (2kh + kw).
  const LoweringShape s = lowering(2, 1, 3, 3, 2, 0, 1, 2);
  REQUIRE(s.out_h() == 1);
  std::vector<float> products(72);
  for (int n = 0; n < 2; ++n) {
    for (int pixel = 0; pixel < 9; ++pixel) {
      for (int tap = 0; tap < 4; ++tap)
        products[(n * 9 + pixel) * 4 + tap] = static_cast<float>(100 * n + 10 * pixel + tap);
    }
  }
  DeviceArray p(*driver, products), y(*driver, 2);
  driver->lift(s, 1, p.data(), y.data());
  // Tap t reads pixel 0, 2, 6, 8: (0 + 0) + (20 + 1) + (60 + 2) + (80 + 3) = 166; n = 1 adds 400.
  check_close(y.host(), {166, 566});
}

// ---- element-wise and reductions --------------------------------------------------------

TEST_CASE("reference element-wise calls and reductions give the BLAS results", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  DeviceArray x(*driver, std::vector<float>{1, 2, 3});
  DeviceArray y(*driver, std::vector<float>{10, 20, 30});

  SECTION("fill") {
    driver->fill(3, 2.5f, y.data());
    check_close(y.host(), {2.5f, 2.5f, 2.5f});
  }
  SECTION("scale") {
    driver->scale(3, -2.0f, x.data());
    check_close(x.host(), {-2, -4, -6});
  }
  SECTION("axpy") {
    driver->axpy(3, 2.0f, x.data(), y.data());
    check_close(y.host(), {12, 24, 36});  // 10+2*1, 20+2*2, 30+2*3
  }
  SECTION("axpby") {
    driver->axpby(3, 2.0f, x.data(), 0.5f, y.data());
    check_close(y.host(), {7, 14, 21});  // 2*1+0.5*10, 2*2+0.5*20, 2*3+0.5*30
  }
  SECTION("axpby with beta 0 does not read y") {
    DeviceArray nan(*driver, std::vector<float>(3, kNaN));
    driver->axpby(3, 2.0f, x.data(), 0.0f, nan.data());
    check_close(nan.host(), {2, 4, 6});
  }
  SECTION("mul, also in place") {
    DeviceArray b(*driver, std::vector<float>{4, 5, 6}), out(*driver, 3);
    driver->mul(3, x.data(), b.data(), out.data());
    check_close(out.host(), {4, 10, 18});
    driver->mul(3, x.data(), b.data(), b.data());
    check_close(b.host(), {4, 10, 18});
  }
  SECTION("dot, asum, sum") {
    DeviceArray b(*driver, std::vector<float>{4, 5, 6});
    CHECK(driver->dot(3, x.data(), b.data()) == 32.0f);  // 4 + 10 + 18
    DeviceArray signs(*driver, std::vector<float>{1, -2, 3, -4});
    CHECK(driver->asum(4, signs.data()) == 10.0f);  // 1+2+3+4
    CHECK(driver->sum(4, signs.data()) == -2.0f);   // 1-2+3-4
  }
  SECTION("sum, dot and asum accumulate in double") {
    // In float, 1e8 + 1 rounds to 1e8 (its ulp is 8) and the sum would be 0.
    DeviceArray big(*driver, std::vector<float>{1e8f, 1.0f, -1e8f});
    DeviceArray ones(*driver, std::vector<float>{1, 1, 1});
    CHECK(driver->sum(3, big.data()) == 1.0f);
    CHECK(driver->dot(3, big.data(), ones.data()) == 1.0f);
    DeviceArray mixed(*driver, std::vector<float>{1e8f, 1.0f, 1.0f, 1.0f, 1.0f});
    CHECK(driver->asum(5, mixed.data()) == 100000004.0f);  // 1e8 + 4, representable
  }
}

TEST_CASE("reference add_scalar, powx, copy_strided and scale_channels", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));

  SECTION("add_scalar") {
    DeviceArray x(*driver, std::vector<float>{1, 2, 3});
    driver->add_scalar(3, 0.5f, x.data());
    check_close(x.host(), {1.5f, 2.5f, 3.5f});
  }
  SECTION("powx, also in place") {
    DeviceArray x(*driver, std::vector<float>{4, 9, 0.25f, 16}), y(*driver, 4);
    driver->powx(4, x.data(), 0.5f, y.data());
    check_close(y.host(), {2, 3, 0.5f, 4});  // square roots
    driver->powx(4, x.data(), -0.75f, x.data());
    // 4^-0.75 = 2^-1.5 = 0.353553; 9^-0.75 = 3^-1.5 = 0.19245; 0.25^-0.75 = 2^1.5 = 2.828427;
    // 16^-0.75 = 2^-3
    check_close(x.host(), {0.35355339f, 0.19245009f, 2.8284271f, 0.125f});
    DeviceArray neg(*driver, std::vector<float>{-3, 2}), sq(*driver, 2);
    driver->powx(2, neg.data(), 2.0f, sq.data());  // integer exponents take negative bases
    check_close(sq.host(), {9, 4});
  }
  SECTION("copy_strided copies a rows x cols block between leading dimensions") {
    const float P = kNaN;
    DeviceArray src(*driver, std::vector<float>{1, 2, 3, P, 4, 5, 6, P});  // 2x3, ld 4
    DeviceArray dst(*driver, std::vector<float>(10, -777.0f));             // 2x3, ld 5
    driver->copy_strided(2, 3, src.data(), 4, dst.data(), 5);
    check_close(dst.host(), {1, 2, 3, -777, -777, 4, 5, 6, -777, -777});
  }
  SECTION("scale_channels multiplies by scale[c], also in place") {
    const AxisShape s = axis(2, 2, 2);  // x[o][c][i] = 1..8
    DeviceArray x(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}), y(*driver, 8);
    DeviceArray scale(*driver, std::vector<float>{2, -1});
    driver->scale_channels(s, scale.data(), x.data(), y.data());
    check_close(y.host(), {2, 4, -3, -4, 10, 12, -7, -8});
    driver->scale_channels(s, scale.data(), x.data(), x.data());
    check_close(x.host(), {2, 4, -3, -4, 10, 12, -7, -8});
  }
}

TEST_CASE("reference max_accumulate breaks ties as Caffe, and max_select routes dy by the mask",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  DeviceArray a(*driver, std::vector<float>{1, 5, 3, -2});
  DeviceArray b(*driver, std::vector<float>{2, 5, 1, -1});
  DeviceArray c(*driver, std::vector<float>{0, 6, 3, -1});
  DeviceArray y(*driver, std::vector<float>(4, kNaN));  // index 0 overwrites, never reads
  MaskArray mask(*driver, 4);
  driver->max_accumulate(4, a.data(), 0, y.data(), mask.data());
  check_close(y.host(), {1, 5, 3, -2});
  CHECK(mask.host() == std::vector<std::int32_t>{0, 0, 0, 0});
  driver->max_accumulate(4, b.data(), 1, y.data(), mask.data());
  // 2 > 1 and -1 > -2 replace; 5 == 5 is a tie, which input 1 takes (Caffe's
  // `a > b ? 0 : 1`); 1 < 3.
  check_close(y.host(), {2, 5, 3, -1});
  CHECK(mask.host() == std::vector<std::int32_t>{1, 1, 0, 1});
  driver->max_accumulate(4, c.data(), 2, y.data(), mask.data());
  // Only 6 > 5 replaces; 3 == 3 and -1 == -1 are ties.
  check_close(y.host(), {2, 6, 3, -1});
  CHECK(mask.host() == std::vector<std::int32_t>{1, 2, 0, 1});

  DeviceArray dy(*driver, std::vector<float>{10, 20, 30, 40});
  DeviceArray dx(*driver, std::vector<float>(4, kNaN));
  driver->max_select(4, mask.data(), 0, dy.data(), dx.data());
  check_close(dx.host(), {0, 0, 30, 0});
  driver->max_select(4, mask.data(), 1, dy.data(), dx.data());
  check_close(dx.host(), {10, 0, 0, 40});
  driver->max_select(4, mask.data(), 2, dy.data(), dy.data());  // in place
  check_close(dy.host(), {0, 20, 0, 0});
}

TEST_CASE(
    "reference bias_forward adds the channel bias and bias_backward sums dy over outer and inner",
    "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const AxisShape s = axis(2, 2, 2);  // [outer 2][channels 2][inner 2]
  DeviceArray bias(*driver, std::vector<float>{10, 20});
  DeviceArray y(*driver, std::vector<float>(8, 1.0f));
  driver->bias_forward(s, bias.data(), y.data());
  check_close(y.host(), {11, 11, 21, 21, 11, 11, 21, 21});

  DeviceArray dy(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  // dbias[0] = dy[0][0][*] + dy[1][0][*] = 1+2+5+6 = 14; dbias[1] = 3+4+7+8 = 22
  DeviceArray dbias(*driver, std::vector<float>{100, 200});
  driver->bias_backward(s, dy.data(), 0.5f, dbias.data());
  check_close(dbias.host(), {64, 122});  // 0.5*100 + 14, 0.5*200 + 22
  DeviceArray fresh(*driver, std::vector<float>{kNaN, kNaN});
  driver->bias_backward(s, dy.data(), 0.0f, fresh.data());
  check_close(fresh.host(), {14, 22});  // beta 0: dbias not read

  // outer == 0 still applies beta: nothing to sum.
  DeviceArray empty(*driver, 0);
  DeviceArray scaled(*driver, std::vector<float>{100, 200});
  driver->bias_backward(axis(0, 2, 2), empty.data(), 0.5f, scaled.data());
  check_close(scaled.host(), {50, 100});
  DeviceArray zeroed(*driver, std::vector<float>{kNaN, kNaN});
  driver->bias_backward(axis(0, 2, 2), empty.data(), 0.0f, zeroed.data());
  check_close(zeroed.host(), {0, 0});
}

// ---- activations ------------------------------------------------------------------------

TEST_CASE("reference relu uses the negative slope for x <= 0, forward and backward",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  DeviceArray x(*driver, std::vector<float>{-2.0f, -0.5f, 0.0f, 1.5f}), y(*driver, 4);
  driver->relu_forward(4, 0.1f, x.data(), y.data());
  check_close(y.host(), {-0.2f, -0.05f, 0.0f, 1.5f});  // 0.1*-2, 0.1*-0.5, 0.1*0, 1.5
  driver->relu_forward(4, 0.0f, x.data(), y.data());
  check_close(y.host(), {0, 0, 0, 1.5f});

  DeviceArray dy(*driver, std::vector<float>{1, 2, 3, 4}), dx(*driver, 4);
  driver->relu_backward(4, 0.1f, x.data(), dy.data(), dx.data());
  check_close(dx.host(), {0.1f, 0.2f, 0.3f, 4.0f});  // x = 0 takes the slope: 0.1*3

  driver->relu_backward(4, 0.1f, x.data(), dy.data(), dy.data());  // in place
  check_close(dy.host(), {0.1f, 0.2f, 0.3f, 4.0f});
  driver->relu_forward(4, 0.1f, x.data(), x.data());  // in place
  check_close(x.host(), {-0.2f, -0.05f, 0.0f, 1.5f});
}

TEST_CASE("reference sigmoid and tanh match closed forms, and backward uses y", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const float ln2 = 0.6931471805599453f, ln3 = 1.0986122886681098f;
  DeviceArray x(*driver, std::vector<float>{0.0f, ln3, -ln3}), y(*driver, 3);
  driver->sigmoid_forward(3, x.data(), y.data());
  // 1/(1+e^0) = 1/2; 1/(1+1/3) = 3/4; 1/(1+3) = 1/4
  check_close(y.host(), {0.5f, 0.75f, 0.25f});

  DeviceArray ys(*driver, std::vector<float>{0.5f, 0.75f}), dy(*driver, std::vector<float>{1, 2});
  DeviceArray dx(*driver, 2);
  driver->sigmoid_backward(2, ys.data(), dy.data(), dx.data());
  check_close(dx.host(), {0.25f, 0.375f});  // 1*0.5*0.5, 2*0.75*0.25

  DeviceArray xt(*driver, std::vector<float>{0.0f, ln2, -ln2}), yt(*driver, 3);
  driver->tanh_forward(3, xt.data(), yt.data());
  // tanh(ln 2) = (2 - 1/2) / (2 + 1/2) = 0.6
  check_close(yt.host(), {0.0f, 0.6f, -0.6f});
  DeviceArray yt2(*driver, std::vector<float>{0.0f, 0.6f});
  driver->tanh_backward(2, yt2.data(), dy.data(), dx.data());
  check_close(dx.host(), {1.0f, 1.28f});  // 1*(1-0), 2*(1-0.36)
}

// ---- pooling ----------------------------------------------------------------------------

TEST_CASE("reference pooled sizes follow Caffe: round up, drop a window starting in the pad",
          "[reference]") {
  CHECK(square_pooling(1, 1, 6, 3, 2, 0).out_h() == 3);  // ceil((6-3)/2)+1 = ceil(1.5)+1
  CHECK(square_pooling(1, 1, 6, 3, 2, 1).out_h() == 4);  // ceil((6+2-3)/2)+1 = 4; 3*2 < 6+1
  CHECK(square_pooling(1, 1, 3, 2, 2, 1).out_h() == 2);  // ceil(1.5)+1 = 3, but 2*2 >= 3+1
  CHECK(square_pooling(1, 1, 4, 2, 2, 0).out_h() == 2);  // exact: (4-2)/2+1
}

TEST_CASE("reference max pooling takes the first maximum and routes dy through the mask",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));

  SECTION("ties go to the first element in row-major window order") {
    const PoolShape s = square_pooling(1, 1, 4, 2, 2, 0);
    DeviceArray x(*driver, std::vector<float>{1, 3, 2, 2,  //
                                              3, 0, 1, 2,  //
                                              5, 4, 0, 0,  //
                                              4, 5, 0, -1});
    DeviceArray y(*driver, 4);
    MaskArray mask(*driver, 4);
    driver->pool_max_forward(s, x.data(), y.data(), mask.data());
    // {1,3,3,0}: 3 at (0,1) beats the tie at (1,0) -> 1;  {2,2,1,2}: (0,2) -> 2;
    // {5,4,4,5}: (2,0) -> 8;  {0,0,0,-1}: (2,2) -> 10
    check_close(y.host(), {3, 2, 5, 0});
    CHECK(mask.host() == std::vector<std::int32_t>{1, 2, 8, 10});

    DeviceArray dy(*driver, std::vector<float>{10, 20, 30, 40});
    DeviceArray dx(*driver, std::vector<float>(16, 7.0f));  // overwritten, not accumulated
    driver->pool_max_backward(s, dy.data(), mask.data(), dx.data());
    check_close(dx.host(), {0, 10, 20, 0, 0, 0, 0, 0, 30, 0, 40, 0, 0, 0, 0, 0});
  }

  SECTION("an input that is the maximum of two windows gets both gradients") {
    const PoolShape s = pooling(1, 1, 1, 3, 1, 2, 1, 1, 0, 0);
    DeviceArray x(*driver, std::vector<float>{1, 5, 2}), y(*driver, 2);
    MaskArray mask(*driver, 2);
    driver->pool_max_forward(s, x.data(), y.data(), mask.data());
    check_close(y.host(), {5, 5});
    CHECK(mask.host() == std::vector<std::int32_t>{1, 1});
    DeviceArray dy(*driver, std::vector<float>{1, 2}), dx(*driver, 3);
    driver->pool_max_backward(s, dy.data(), mask.data(), dx.data());
    check_close(dx.host(), {0, 3, 0});  // 1 + 2
  }

  SECTION("mask indices are within each channel plane") {
    const PoolShape s = square_pooling(1, 2, 2, 2, 2, 0);
    DeviceArray x(*driver, std::vector<float>{1, 4, 2, 3, 8, 5, 6, 7}), y(*driver, 2);
    MaskArray mask(*driver, 2);
    driver->pool_max_forward(s, x.data(), y.data(), mask.data());
    check_close(y.host(), {4, 8});
    CHECK(mask.host() == std::vector<std::int32_t>{1, 0});
    DeviceArray dy(*driver, std::vector<float>{1, 2}), dx(*driver, 8);
    driver->pool_max_backward(s, dy.data(), mask.data(), dx.data());
    check_close(dx.host(), {0, 1, 0, 0, 2, 0, 0, 0});
  }

  SECTION("6x6, kernel 3, stride 2: the rounded-up last window is clipped at the border") {
    const PoolShape s = square_pooling(1, 1, 6, 3, 2, 0);
    std::vector<float> values(36);
    std::iota(values.begin(), values.end(), 0.0f);  // x[h][w] = 6h + w
    DeviceArray x(*driver, values), y(*driver, 9);
    MaskArray mask(*driver, 9);
    driver->pool_max_forward(s, x.data(), y.data(), mask.data());
    // Window rows [0,3) [2,5) [4,6) end at rows 2, 4, 5: max = 6*last_row + last_col.
    check_close(y.host(), {14, 16, 17, 26, 28, 29, 32, 34, 35});
    CHECK(mask.host() == std::vector<std::int32_t>{14, 16, 17, 26, 28, 29, 32, 34, 35});
  }
}

TEST_CASE("reference average pooling divides by Caffe's padded pool size", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));

  SECTION("3x3, kernel 3, stride 1, pad 1: padding counts, divisor always 9") {
    const PoolShape s = square_pooling(1, 1, 3, 3, 1, 1);
    REQUIRE(s.out_h() == 3);
    DeviceArray x(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}), y(*driver, 9);
    driver->pool_avg_forward(s, x.data(), y.data());
    // (1+2+4+5)/9, (1+...+6)/9, (2+3+5+6)/9; (1+2+4+5+7+8)/9, 45/9, (2+3+5+6+8+9)/9; ...
    check_close(y.host(), {12.0f / 9, 21.0f / 9, 16.0f / 9, 27.0f / 9, 45.0f / 9, 33.0f / 9,
                           24.0f / 9, 39.0f / 9, 28.0f / 9});
    DeviceArray dy(*driver, std::vector<float>(9, 1.0f));
    DeviceArray dx(*driver, std::vector<float>(9, 7.0f));  // overwritten
    driver->pool_avg_backward(s, dy.data(), dx.data());
    // each pixel gets 1/9 from every window covering it: corners 4, edges 6, centre 9
    check_close(dx.host(), {4.0f / 9, 6.0f / 9, 4.0f / 9, 6.0f / 9, 1.0f, 6.0f / 9, 4.0f / 9,
                            6.0f / 9, 4.0f / 9});
  }

  SECTION("1x4, kernel 3, stride 2, pad 1: the last window is clipped at width + pad") {
    const PoolShape s = pooling(1, 1, 1, 4, 1, 3, 1, 2, 0, 1);
    REQUIRE(s.out_w() == 3);  // ceil((4+2-3)/2)+1 = 3; 2*2 < 4+1 keeps it
    DeviceArray x(*driver, std::vector<float>{1, 2, 3, 4}), y(*driver, 3);
    driver->pool_avg_forward(s, x.data(), y.data());
    // ow=0: [-1,2) size 3, sum x0+x1 = 3 -> 1;  ow=1: [1,4) size 3, 2+3+4 = 9 -> 3;
    // ow=2: [3,min(6,5)) size 2 (not 3, not the 1 in-image cell), sum 4 -> 2
    check_close(y.host(), {1, 3, 2});
    DeviceArray dy(*driver, std::vector<float>{3, 6, 4}), dx(*driver, 4);
    driver->pool_avg_backward(s, dy.data(), dx.data());
    // x0: 3/3; x1: 3/3 + 6/3; x2: 6/3; x3: 6/3 + 4/2
    check_close(dx.host(), {1, 3, 2, 4});
  }

  SECTION("3x3, kernel 2, stride 2, pad 1") {
    const PoolShape s = square_pooling(1, 1, 3, 2, 2, 1);
    REQUIRE(s.out_h() == 2);
    DeviceArray x(*driver, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9}), y(*driver, 4);
    driver->pool_avg_forward(s, x.data(), y.data());
    // windows rows [-1,1) and [1,3), size 2 each, so every divisor is 4:
    // 1/4, (2+3)/4, (4+7)/4, (5+6+8+9)/4
    check_close(y.host(), {0.25f, 1.25f, 2.75f, 7.0f});
  }

  SECTION("6x6, kernel 3, stride 2, no pad: the clipped last window divides by its size") {
    const PoolShape s = square_pooling(1, 1, 6, 3, 2, 0);
    std::vector<float> values(36);
    std::iota(values.begin(), values.end(), 0.0f);  // x[h][w] = 6h + w
    DeviceArray x(*driver, values), y(*driver, 9);
    driver->pool_avg_forward(s, x.data(), y.data());
    // mean over rows [0,3) [2,5) [4,6) is 1, 3, 4.5: y = 6*mean_h + mean_w
    check_close(y.host(), {7, 9, 10.5f, 19, 21, 22.5f, 28, 30, 31.5f});
  }
}

// ---- LRN --------------------------------------------------------------------------------

TEST_CASE("reference LRN across channels clips the channel window at the borders", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));

  SECTION("size 3 on 3 channels, alpha 3, beta 1, k 1, two pixels") {
    const LrnShape s = lrn(1, 3, 1, 2, 3, 3.0f, 1.0f, 1.0f, LrnRegion::across_channels);
    // pixel 0: x = 1, 2, 3; pixel 1: all 0 (scale = k, y = 0, dx = dy / k)
    DeviceArray x(*driver, std::vector<float>{1, 0, 2, 0, 3, 0});
    DeviceArray y(*driver, 6), scale(*driver, 6);
    driver->lrn_forward(s, x.data(), y.data(), scale.data());
    // alpha/size = 1: scale = 1 + (1+4), 1 + (1+4+9), 1 + (4+9) = 6, 15, 14
    check_close(scale.host(), {6, 1, 15, 1, 14, 1});
    check_close(y.host(), {1.0f / 6, 0, 2.0f / 15, 0, 3.0f / 14, 0});  // x / scale
    DeviceArray dy(*driver, std::vector<float>(6, 1.0f)), dx(*driver, 6);
    driver->lrn_backward(s, x.data(), y.data(), scale.data(), dy.data(), dx.data());
    // dx_c = 1/scale_c - 2*x_c * sum_{c' in window} y/scale, with y/scale = 1/36, 2/225,
    // 3/196 (LCD 44100: 1225, 392, 675):
    //   dx0 = 1/6  - 2*1*(1225+392)/44100     = 7/75      (= dy0/dx0 + dy1/dx0 = 1/9 - 4/225)
    //   dx1 = 1/15 - 2*2*(1225+392+675)/44100 = -173/1225 (= -1/9 + 7/225 - 3/49)
    //   dx2 = 1/14 - 2*3*(392+675)/44100      = -271/3675 (= -12/225 - 4/196)
    check_close(dx.host(), {7.0f / 75, 1, -173.0f / 1225, 1, -271.0f / 3675, 1});
  }

  SECTION("size 5 on 3 channels: every window is all channels") {
    const LrnShape s = lrn(1, 3, 1, 1, 5, 5.0f, 1.0f, 1.0f, LrnRegion::across_channels);
    DeviceArray x(*driver, std::vector<float>{1, 2, 3}), y(*driver, 3), scale(*driver, 3);
    driver->lrn_forward(s, x.data(), y.data(), scale.data());
    check_close(scale.host(), {15, 15, 15});                   // 1 + (1+4+9)
    check_close(y.host(), {1.0f / 15, 2.0f / 15, 3.0f / 15});  // x / 15
    DeviceArray dy(*driver, std::vector<float>{1, 1, 1}), dx(*driver, 3);
    driver->lrn_backward(s, x.data(), y.data(), scale.data(), dy.data(), dx.data());
    // dx_c = 1/15 - 2*x_c*(1+2+3)/225 = (15 - 12 x_c)/225
    check_close(dx.host(), {3.0f / 225, -9.0f / 225, -21.0f / 225});
  }

  SECTION("k and beta: scale = k + alpha/size * x^2, y = x * scale^-beta") {
    const LrnShape s = lrn(1, 1, 1, 1, 3, 3.0f, 0.5f, 5.0f, LrnRegion::across_channels);
    DeviceArray x(*driver, std::vector<float>{2}), y(*driver, 1), scale(*driver, 1);
    driver->lrn_forward(s, x.data(), y.data(), scale.data());
    check_close(scale.host(), {9});     // 5 + 1*4
    check_close(y.host(), {2.0f / 3});  // 2 * 9^-0.5
    DeviceArray dy(*driver, std::vector<float>{1}), dx(*driver, 1);
    driver->lrn_backward(s, x.data(), y.data(), scale.data(), dy.data(), dx.data());
    // 9^-0.5 - (2*3*0.5/3) * 2 * (2/3)/9 = 1/3 - 4/27 = 5/27 = d/dx[x (5+x^2)^-0.5] at 2
    check_close(dx.host(), {5.0f / 27});
  }
}

TEST_CASE("reference LRN within channel averages x^2 over a padded window, ignoring k",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  // 3x3 plane of ones, size 3, alpha 9, beta 1, k 7 (unused by WITHIN_CHANNEL).
  const LrnShape s = lrn(1, 1, 3, 3, 3, 9.0f, 1.0f, 7.0f, LrnRegion::within_channel);
  DeviceArray x(*driver, std::vector<float>(9, 1.0f)), y(*driver, 9), scale(*driver, 9);
  driver->lrn_forward(s, x.data(), y.data(), scale.data());
  // The pool divisor is 9 everywhere (pad 1); the clipped window holds 4 / 6 / 9 ones, so
  // scale = 1 + 9 * count/9 = 5 (corner), 7 (edge), 10 (centre); y = 1/scale.
  check_close(scale.host(), {5, 7, 5, 7, 10, 7, 5, 7, 5});
  check_close(y.host(), {0.2f, 1.0f / 7, 0.2f, 1.0f / 7, 0.1f, 1.0f / 7, 0.2f, 1.0f / 7, 0.2f});

  // dy = 1 at the corner (0) and the centre (4).
  std::vector<float> dy_values(9, 0.0f);
  dy_values[0] = dy_values[4] = 1.0f;
  DeviceArray dy(*driver, dy_values), dx(*driver, 9);
  driver->lrn_backward(s, x.data(), y.data(), scale.data(), dy.data(), dx.data());
  // Through the scale, output i sends 2*x_j * dy_i*x_i*(-1)*scale_i^-2*alpha/9 to each j in
  // its window: the corner -2/25 = -0.08 to {0,1,3,4}, the centre -2/100 = -0.02 to all.
  // Directly: dy/scale = 1/5 at 0, 1/10 at 4.
  //   dx0 = 0.2 - 0.08 - 0.02;  dx1 = dx3 = -0.08 - 0.02;  dx4 = 0.1 - 0.08 - 0.02;  else -0.02
  check_close(dx.host(), {0.1f, -0.1f, -0.02f, -0.1f, 0.0f, -0.02f, -0.02f, -0.02f, -0.02f});
}

// ---- softmax ----------------------------------------------------------------------------

TEST_CASE("reference softmax normalises exp over the channel axis", "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const float ln2 = 0.6931471805599453f, ln3 = 1.0986122886681098f;

  // 2x3: exp(0, ln2, ln3) = 1, 2, 3 over 6; the second row would overflow exp without the
  // max subtraction.
  DeviceArray x(*driver, std::vector<float>{0, ln2, ln3, 1000, 1000, 1000}), y(*driver, 6);
  driver->softmax_forward(axis(2, 3, 1), x.data(), y.data());
  check_close(y.host(), {1.0f / 6, 1.0f / 3, 0.5f, 1.0f / 3, 1.0f / 3, 1.0f / 3});

  // inner 2: channels are strided by 2. Column 0: exp(0), exp(ln3) = 1, 3; column 1: equal.
  DeviceArray xi(*driver, std::vector<float>{0, 0, ln3, 0}), yi(*driver, 4);
  driver->softmax_forward(axis(1, 2, 2), xi.data(), yi.data());
  check_close(yi.host(), {0.25f, 0.5f, 0.75f, 0.5f});

  // backward: y = (1/6, 1/3, 1/2), dy = (1, 0, 0): sum dy*y = 1/6, dx = y * (dy - 1/6)
  DeviceArray yb(*driver, std::vector<float>{1.0f / 6, 1.0f / 3, 0.5f});
  DeviceArray dy(*driver, std::vector<float>{1, 0, 0}), dx(*driver, 3);
  driver->softmax_backward(axis(1, 3, 1), yb.data(), dy.data(), dx.data());
  check_close(dx.host(), {5.0f / 36, -1.0f / 18, -1.0f / 12});  // 1/6*5/6, -1/3*1/6, -1/2*1/6
}

// ---- dropout ----------------------------------------------------------------------------

TEST_CASE("philox4x32-10 matches Random123's known answer for counter 0, key 0", "[reference]") {
  // Random123 kat_vectors: philox4x32 10, ctr {0,0,0,0}, key {0,0} -> 6627e8d5 e169c58d ...
  CHECK(detail::philox_bits(0, 0) == 0x6627e8d5u);
  // The uniform keeps the top 24 bits: 0x6627e8 / 2^24 = 6694888 / 16777216 = 0.39905...
  CHECK(detail::philox_uniform(0, 0) == 6694888.0f / 16777216.0f);
}

TEST_CASE("reference dropout keeps element i when philox_uniform(seed, offset+i) >= ratio",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));

  SECTION("the known answer decides element 0 of seed 0, offset 0 (u = 0.39905)") {
    DeviceArray x(*driver, std::vector<float>{3}), y(*driver, 1), mask(*driver, 1);
    driver->dropout_forward(1, 0.39f, 0, 0, x.data(), y.data(), mask.data());
    CHECK(mask.host()[0] == 1.0f);
    CHECK(y.host()[0] == 3.0f * (1.0f / (1.0f - 0.39f)));
    driver->dropout_forward(1, 0.40f, 0, 0, x.data(), y.data(), mask.data());
    CHECK(mask.host()[0] == 0.0f);
    CHECK(y.host()[0] == 0.0f);
  }

  SECTION("mask, y and dx follow the rule bit for bit, and depend only on offset + i") {
    const index_t n = 64;
    const float ratio = 0.3f;
    const std::uint64_t seed = 1234, offset = 100;
    const float s = 1.0f / (1.0f - ratio);
    const std::vector<float> x_values = test::random_floats(n, 1);
    DeviceArray x(*driver, x_values), y(*driver, n), mask(*driver, n);
    driver->dropout_forward(n, ratio, seed, offset, x.data(), y.data(), mask.data());
    const std::vector<float> y_host = y.host(), mask_host = mask.host();
    int kept = 0;
    for (index_t i = 0; i < n; ++i) {
      const bool keep = detail::philox_uniform(seed, offset + i) >= ratio;
      INFO("element " << i);
      CHECK(mask_host[i] == (keep ? 1.0f : 0.0f));
      CHECK(y_host[i] == (keep ? x_values[i] * s : 0.0f));
      kept += keep;
    }
    CHECK(kept > 0);
    CHECK(kept < n);

    // The tail [16, 64) drawn on its own with offset + 16 is the same mask.
    DeviceArray tail_x(*driver, std::vector<float>(x_values.begin() + 16, x_values.end()));
    DeviceArray tail_y(*driver, n - 16), tail_mask(*driver, n - 16);
    driver->dropout_forward(n - 16, ratio, seed, offset + 16, tail_x.data(), tail_y.data(),
                            tail_mask.data());
    CHECK(tail_mask.host() == std::vector<float>(mask_host.begin() + 16, mask_host.end()));
    CHECK(tail_y.host() == std::vector<float>(y_host.begin() + 16, y_host.end()));

    const std::vector<float> dy_values = test::random_floats(n, 2);
    DeviceArray dy(*driver, dy_values), dx(*driver, n);
    driver->dropout_backward(n, ratio, mask.data(), dy.data(), dx.data());
    const std::vector<float> dx_host = dx.host();
    for (index_t i = 0; i < n; ++i) {
      INFO("element " << i);
      CHECK(dx_host[i] == (mask_host[i] != 0.0f ? dy_values[i] * s : 0.0f));
    }
  }

  SECTION("ratio 0 keeps everything unscaled") {
    const std::vector<float> x_values = test::random_floats(16, 3);
    DeviceArray x(*driver, x_values), y(*driver, 16), mask(*driver, 16);
    driver->dropout_forward(16, 0.0f, 7, 0, x.data(), y.data(), mask.data());
    CHECK(y.host() == x_values);
    CHECK(mask.host() == std::vector<float>(16, 1.0f));
  }
}

// ---- losses -----------------------------------------------------------------------------

TEST_CASE(
    "reference softmax_loss takes -log of the label probability, skips ignored labels, and its "
    "backward subtracts the one-hot label",
    "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const AxisShape s = axis(2, 3, 2);                                               // prob[o][c][i]
  const std::vector<float> prob_values{0.5f, 0.25f,  0.25f, 0.25f,  0.25f, 0.5f,   // o = 0
                                       1.0f, 0.125f, 0.0f,  0.375f, 0.0f,  0.5f};  // o = 1
  DeviceArray prob(*driver, prob_values);
  // Labels per (o, i): (0,0) -> 0, (0,1) -> 2, (1,0) -> 1, (1,1) -> ignored (-1).
  DeviceArray label(*driver, std::vector<float>{0, 2, 1, -1});
  DeviceArray loss(*driver, std::vector<float>(4, kNaN)),
      valid(*driver, std::vector<float>(4, kNaN));
  driver->softmax_loss_forward(s, prob.data(), label.data(), true, -1, loss.data(), valid.data());
  // -log 0.5 = ln 2 twice; prob 0 is clamped to FLT_MIN: -ln(1.17549435e-38) = 87.336545
  check_close(loss.host(), {0.69314718f, 0.69314718f, 87.336545f, 0.0f}, 1e-5);
  check_close(valid.host(), {1, 1, 1, 0});

  DeviceArray dx(*driver, std::vector<float>(12, kNaN));
  driver->softmax_loss_backward(s, prob.data(), label.data(), true, -1, 0.5f, dx.data());
  // 0.5 * (prob - onehot): (0,0) label 0: (0.5-1, 0.25, 0.25)/2; (0,1) label 2: (0.25, 0.25,
  // 0.5-1)/2; (1,0) label 1: (1, 0-1, 0)/2; (1,1) ignored: zeros. Laid out [o][c][i]:
  const std::vector<float> expected{-0.25f, 0.125f, 0.125f, 0.125f, 0.125f, -0.25f,  //
                                    0.5f,   0.0f,   -0.5f,  0.0f,   0.0f,   0.0f};
  check_close(dx.host(), expected);
  driver->softmax_loss_backward(s, prob.data(), label.data(), true, -1, 0.5f, prob.data());
  check_close(prob.host(), expected);  // in place
}

TEST_CASE("reference softmax_loss rejects a label outside the classes, naming it and where",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const AxisShape s = axis(1, 3, 2);
  DeviceArray prob(*driver, std::vector<float>(6, 1.0f / 3)), loss(*driver, 2), valid(*driver, 2);
  DeviceArray dx(*driver, 6);
  SECTION("a negative label without ignore_label") {
    DeviceArray label(*driver, std::vector<float>{0, -1});
    CHECK_THROWS_WITH(driver->softmax_loss_forward(s, prob.data(), label.data(), false, -1,
                                                   loss.data(), valid.data()),
                      Contains("softmax_loss_forward") && Contains("label -1") &&
                          Contains("inner 1") && Contains("[0, 3)"));
    CHECK_THROWS_WITH(
        driver->softmax_loss_backward(s, prob.data(), label.data(), false, -1, 1.0f, dx.data()),
        Contains("softmax_loss_backward") && Contains("label -1"));
  }
  SECTION("a label equal to channels, even with another ignore_label") {
    DeviceArray label(*driver, std::vector<float>{3, 0});
    CHECK_THROWS_WITH(driver->softmax_loss_forward(s, prob.data(), label.data(), true, 255,
                                                   loss.data(), valid.data()),
                      Contains("label 3") && Contains("inner 0"));
  }
  SECTION("an ignored label outside the range is fine") {
    DeviceArray label(*driver, std::vector<float>{255, 1});
    driver->softmax_loss_forward(s, prob.data(), label.data(), true, 255, loss.data(),
                                 valid.data());
    check_close(loss.host(), {0.0f, 1.0986123f});  // -log(1/3) = ln 3
    check_close(valid.host(), {0, 1});
  }
}

TEST_CASE("reference sigmoid_cross_entropy is stable for large logits and skips ignored targets",
          "[reference]") {
  auto driver = make_reference(GENERATE(false, true));
  const float ln3 = 1.0986122886681098f;
  DeviceArray x(*driver, std::vector<float>{0, ln3, -ln3, 100, 2});
  DeviceArray t(*driver, std::vector<float>{1, 0, 1, 0.25f, -1});  // the last is ignored
  DeviceArray loss(*driver, std::vector<float>(5, kNaN)),
      valid(*driver, std::vector<float>(5, kNaN));
  driver->sigmoid_cross_entropy_forward(5, x.data(), t.data(), true, -1, loss.data(), valid.data());
  // max(x,0) - x t + log(1 + e^-|x|):  0 - 0 + ln 2;  ln3 - 0 + ln(4/3) = ln 4;
  // 0 + ln3 + ln(4/3) = ln 4;  100 - 25 + log(1 + e^-100) = 75 (no overflow);  ignored 0
  check_close(loss.host(), {0.69314718f, 1.3862944f, 1.3862944f, 75.0f, 0.0f}, 1e-5);
  check_close(valid.host(), {1, 1, 1, 1, 0});

  DeviceArray dx(*driver, std::vector<float>(5, kNaN));
  driver->sigmoid_cross_entropy_backward(5, x.data(), t.data(), true, -1, 2.0f, dx.data());
  // 2 (sigmoid(x) - t): 2(0.5 - 1), 2(0.75 - 0), 2(0.25 - 1), 2(1 - 0.25), ignored 0
  check_close(dx.host(), {-1.0f, 1.5f, -1.5f, 1.5f, 0.0f});

  // Without ignore_label, target -1 is just a number: 2 + 2 + log(1 + e^-2) = 4.126928.
  driver->sigmoid_cross_entropy_forward(5, x.data(), t.data(), false, -1, loss.data(),
                                        valid.data());
  CHECK(loss.host()[4] == Approx(4.126928f));
  CHECK(valid.host()[4] == 1.0f);
}

// ---- memory -----------------------------------------------------------------------------

TEST_CASE("reference memory is 64-byte aligned, copies round-trip, foreign frees are ignored",
          "[reference]") {
  const bool separate = GENERATE(false, true);
  auto driver = make_reference(separate);
  CHECK(driver->allocate(0) == nullptr);
  for (std::size_t bytes : {1u, 63u, 64u, 100u, 4096u}) {
    void* p = driver->allocate(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    driver->deallocate(p);
  }
  const std::vector<float> values{1, 2, 3, 4};
  DeviceArray a(*driver, values), b(*driver, 4);
  driver->copy(b.data(), a.data(), sizeof(float) * 4);
  driver->synchronize();
  CHECK(b.host() == values);

  std::vector<float> host(4);
  driver->deallocate(host.data());   // not this driver's: ignored, never freed
  driver->deallocate(a.data() + 1);  // inside an allocation but not its start: ignored
  CHECK(a.host() == values);
}

TEST_CASE("reference separate memory is a space of its own that rejects host addresses",
          "[reference]") {
  auto host_driver = make_reference(false);
  auto driver = make_reference(true);
  auto other = make_reference(true);
  CHECK(host_driver->memory_space() == host_space());
  CHECK(host_driver->capabilities().host_addressable);
  CHECK(driver->memory_space() != host_space());
  CHECK(driver->memory_space() != other->memory_space());
  CHECK_FALSE(driver->capabilities().host_addressable);

  std::vector<float> host(16, 0.0f);
  CHECK(host_driver->owns(host.data(), 64));
  CHECK_FALSE(driver->owns(host.data(), 64));

  char* p = static_cast<char*>(driver->allocate(100));
  CHECK(driver->owns(p, 100));
  CHECK(driver->owns(p + 10, 90));
  CHECK_FALSE(driver->owns(p + 10, 91));  // runs past the end
  CHECK_FALSE(driver->owns(p + 100, 1));
  CHECK_FALSE(other->owns(p, 1));  // another separate driver's memory is foreign too

  CHECK_THROWS_AS(driver->fill(16, 1.0f, host.data()), Error);
  CHECK_THROWS_WITH(driver->fill(16, 1.0f, host.data()), Contains("fill") && Contains("reference"));
  CHECK_THROWS_WITH(driver->copy_from_host(host.data(), host.data(), 64), Contains("reference"));
  CHECK(host == std::vector<float>(16, 0.0f));  // nothing was written

  driver->deallocate(host.data());  // foreign: ignored
  driver->deallocate(p);
  CHECK_FALSE(driver->owns(p, 1));  // freed memory is no longer the driver's
}

// ---- finite differences -----------------------------------------------------------------

namespace {

using Forward = std::function<std::vector<float>(const std::vector<float>&)>;

// Compares an analytic dx (the backward for dy = weights) with central differences of the
// loss L(x) = sum_i weights_i * forward(x)_i, summed in double.
void check_gradient(const std::vector<float>& x, const std::vector<float>& weights,
                    const Forward& forward, const std::vector<float>& analytic, float step = 1e-3f,
                    double tolerance = 1e-3) {
  REQUIRE(analytic.size() == x.size());
  const auto loss = [&](const std::vector<float>& at) {
    const std::vector<float> y = forward(at);
    REQUIRE(y.size() == weights.size());
    double total = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i)
      total += static_cast<double>(weights[i]) * y[i];
    return total;
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::vector<float> plus = x, minus = x;
    plus[i] += step;
    minus[i] -= step;
    const double numeric = (loss(plus) - loss(minus)) / (static_cast<double>(plus[i]) - minus[i]);
    INFO("element " << i << ": numeric " << numeric << ", analytic " << analytic[i]);
    CHECK(std::abs(numeric - analytic[i]) <= tolerance * std::max(1.0, std::abs(numeric)));
  }
}

// Distinct values 0.05 apart in random order: no ties, so max pooling has no kink within a
// finite-difference step.
std::vector<float> distinct_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = 0.05f * static_cast<float>(i) - 1.0f;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

}  // namespace

TEST_CASE("reference pooling backward is the derivative of its forward", "[reference]") {
  auto driver = make_reference(false);  // computes on host vectors directly
  const PoolShape shape = GENERATE(square_pooling(2, 2, 5, 3, 2, 1),  // overlapping, padded
                                   square_pooling(1, 2, 6, 3, 2, 0),  // clipped last window
                                   pooling(1, 1, 4, 5, 2, 3, 1, 2, 1, 1));
  CAPTURE(shape.to_string());
  const std::vector<float> x = distinct_values(shape.in_count(), 11);
  const std::vector<float> weights = test::random_floats(shape.out_count(), 12);
  std::vector<float> dx(x.size());

  SECTION("max") {
    std::vector<std::int32_t> mask(shape.out_count());
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> y(shape.out_count());
      driver->pool_max_forward(shape, at.data(), y.data(), mask.data());
      return y;
    };
    forward(x);
    driver->pool_max_backward(shape, weights.data(), mask.data(), dx.data());
    check_gradient(x, weights, forward, dx);
  }
  SECTION("average") {
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> y(shape.out_count());
      driver->pool_avg_forward(shape, at.data(), y.data());
      return y;
    };
    driver->pool_avg_backward(shape, weights.data(), dx.data());
    check_gradient(x, weights, forward, dx);
  }
}

TEST_CASE("reference LRN backward is the derivative of its forward in both regions",
          "[reference]") {
  auto driver = make_reference(false);
  const LrnShape shape = GENERATE(lrn(2, 5, 2, 3, 3, 2.0f, 0.75f, 1.5f, LrnRegion::across_channels),
                                  lrn(1, 3, 2, 2, 5, 1.0f, 0.75f, 2.0f, LrnRegion::across_channels),
                                  lrn(2, 2, 4, 5, 3, 2.0f, 0.75f, 1.0f, LrnRegion::within_channel),
                                  lrn(1, 1, 5, 4, 5, 3.0f, 0.6f, 1.0f, LrnRegion::within_channel));
  CAPTURE(shape.to_string());
  const std::vector<float> x = test::random_floats(shape.count(), 21);
  const std::vector<float> weights = test::random_floats(shape.count(), 22);
  std::vector<float> y(x.size()), scale(x.size()), dx(x.size());
  const Forward forward = [&](const std::vector<float>& at) {
    std::vector<float> out(shape.count()), sc(shape.count());
    driver->lrn_forward(shape, at.data(), out.data(), sc.data());
    return out;
  };
  driver->lrn_forward(shape, x.data(), y.data(), scale.data());
  driver->lrn_backward(shape, x.data(), y.data(), scale.data(), weights.data(), dx.data());
  check_gradient(x, weights, forward, dx);
}

TEST_CASE("reference softmax backward is the derivative of its forward", "[reference]") {
  auto driver = make_reference(false);
  const AxisShape shape = axis(2, 4, 3);
  const std::vector<float> x = test::random_floats(shape.count(), 31, -2.0f, 2.0f);
  const std::vector<float> weights = test::random_floats(shape.count(), 32);
  std::vector<float> y(x.size()), dx(x.size());
  const Forward forward = [&](const std::vector<float>& at) {
    std::vector<float> out(shape.count());
    driver->softmax_forward(shape, at.data(), out.data());
    return out;
  };
  driver->softmax_forward(shape, x.data(), y.data());
  driver->softmax_backward(shape, y.data(), weights.data(), dx.data());
  check_gradient(x, weights, forward, dx);
}

TEST_CASE("reference sigmoid, tanh and relu backward are the derivatives of their forwards",
          "[reference]") {
  auto driver = make_reference(false);
  const index_t n = 12;
  std::vector<float> x = test::random_floats(n, 41, -2.0f, 2.0f);
  const std::vector<float> weights = test::random_floats(n, 42);
  std::vector<float> y(n), dx(n);

  SECTION("sigmoid") {
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> out(n);
      driver->sigmoid_forward(n, at.data(), out.data());
      return out;
    };
    driver->sigmoid_forward(n, x.data(), y.data());
    driver->sigmoid_backward(n, y.data(), weights.data(), dx.data());
    check_gradient(x, weights, forward, dx);
  }
  SECTION("tanh") {
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> out(n);
      driver->tanh_forward(n, at.data(), out.data());
      return out;
    };
    driver->tanh_forward(n, x.data(), y.data());
    driver->tanh_backward(n, y.data(), weights.data(), dx.data());
    check_gradient(x, weights, forward, dx);
  }
  SECTION("relu with slope, away from the kink at 0") {
    for (float& v : x)
      v += v < 0.0f ? -0.05f : 0.05f;
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> out(n);
      driver->relu_forward(n, 0.1f, at.data(), out.data());
      return out;
    };
    driver->relu_backward(n, 0.1f, x.data(), weights.data(), dx.data());
    check_gradient(x, weights, forward, dx);
  }
}

TEST_CASE("reference lift_backward is the adjoint of lift", "[reference]") {
  auto driver = make_reference(false);
  LoweringShape shape = GENERATE(lowering(2, 1, 5, 4, 3, 1, 2),     // stride 2, pad 1
                                 lowering(1, 1, 6, 7, 2, 2, 1, 2),  // dilation 2, big pad
                                 lowering(2, 1, 5, 5, 3, 0, 3));    // stride > 1, gaps
  shape.kernel_w = shape.kernel_h == 3 ? 2 : 3;                     // non-square kernels
  CAPTURE(shape.to_string());
  const index_t out_channels = 3;
  const index_t p_count =
      shape.batch * shape.height * shape.width * out_channels * shape.kernel_h * shape.kernel_w;
  const index_t y_count = shape.batch * out_channels * shape.out_h() * shape.out_w();
  const std::vector<float> p = test::random_floats(p_count, 51);
  const std::vector<float> dy = test::random_floats(y_count, 52);
  std::vector<float> y(y_count), dp(p_count);
  driver->lift(shape, out_channels, p.data(), y.data());
  driver->lift_backward(shape, out_channels, dy.data(), dp.data());
  // <lift(P), dy> == <P, lift_backward(dy)>
  double forward_side = 0.0, backward_side = 0.0;
  for (index_t i = 0; i < y_count; ++i)
    forward_side += static_cast<double>(y[i]) * dy[i];
  for (index_t i = 0; i < p_count; ++i)
    backward_side += static_cast<double>(p[i]) * dp[i];
  CHECK(forward_side == Approx(backward_side).epsilon(1e-5));

  // And by central differences: lift is linear, so its derivative is lift_backward.
  const Forward forward = [&](const std::vector<float>& at) {
    std::vector<float> out(y_count);
    driver->lift(shape, out_channels, at.data(), out.data());
    return out;
  };
  check_gradient(p, dy, forward, dp);
}

TEST_CASE("reference type-3 convolution (NHWC products, lift) equals im2col convolution",
          "[reference]") {
  auto driver = make_reference(false);
  const LoweringShape shape =
      GENERATE(lowering(2, 3, 5, 6, 3, 1, 2), lowering(1, 2, 7, 5, 2, 1, 1, 2),
               lowering(3, 4, 4, 4, 1, 0, 1));
  CAPTURE(shape.to_string());
  const index_t n = shape.batch, c = shape.channels, hw = shape.height * shape.width;
  const index_t co = 5, k = shape.kernel_h * shape.kernel_w;
  const index_t ohw = shape.out_h() * shape.out_w();
  const std::vector<float> x = test::random_floats(n * c * hw, 61);
  const std::vector<float> w = test::random_floats(co * c * k, 62);  // [co][c][kh][kw]

  // Type 1: columns [(c,kh,kw)][(n,oh,ow)]; W [co][(c,kh,kw)] x columns = [co][n][oh*ow].
  std::vector<float> columns(shape.col_count()), by_columns(co * n * ohw), expected(co * n * ohw);
  driver->im2col(shape, x.data(), columns.data());
  driver->gemm(Transpose::no, Transpose::no, co, n * ohw, c * k, 1.0f, w.data(), c * k,
               columns.data(), n * ohw, 0.0f, by_columns.data(), n * ohw);
  driver->swap_axes(co, n, ohw, by_columns.data(), expected.data());

  // Type 3: X^T in NHWC ([n][hw][c]) times W' = [c][(co,kh,kw)], then lift.
  std::vector<float> x_nhwc(x.size()), w_lowered(w.size()), products(n * hw * co * k);
  for (index_t i = 0; i < n; ++i)
    driver->swap_axes(c, hw, 1, x.data() + i * c * hw, x_nhwc.data() + i * c * hw);
  driver->swap_axes(co, c, k, w.data(), w_lowered.data());
  driver->gemm(Transpose::no, Transpose::no, n * hw, co * k, c, 1.0f, x_nhwc.data(), c,
               w_lowered.data(), co * k, 0.0f, products.data(), co * k);
  std::vector<float> y(n * co * ohw);
  driver->lift(shape, co, products.data(), y.data());
  CHECK(test::max_rel_diff(y, expected) < 1e-5);
}

TEST_CASE("reference loss backwards are the derivatives of their forwards", "[reference]") {
  auto driver = make_reference(false);

  SECTION("softmax_loss through softmax: d(-log softmax_l)/dx = prob - onehot") {
    const AxisShape shape = axis(2, 4, 3);
    const std::vector<float> x = test::random_floats(shape.count(), 71, -2.0f, 2.0f);
    const std::vector<float> label{0, 3, 255, 1, 2, 2};  // 255 is ignored
    const std::vector<float> ones(6, 1.0f);
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> prob(shape.count()), loss(6), valid(6);
      driver->softmax_forward(shape, at.data(), prob.data());
      driver->softmax_loss_forward(shape, prob.data(), label.data(), true, 255, loss.data(),
                                   valid.data());
      return loss;
    };
    std::vector<float> prob(shape.count()), dx(shape.count());
    driver->softmax_forward(shape, x.data(), prob.data());
    driver->softmax_loss_backward(shape, prob.data(), label.data(), true, 255, 1.0f, dx.data());
    check_gradient(x, ones, forward, dx);
  }
  SECTION("sigmoid_cross_entropy: dloss/dx = sigmoid(x) - t") {
    const index_t n = 10;
    const std::vector<float> x = test::random_floats(n, 72, -3.0f, 3.0f);
    std::vector<float> t = test::random_floats(n, 73, 0.0f, 1.0f);
    t[3] = -1.0f;  // ignored
    const std::vector<float> ones(n, 1.0f);
    const Forward forward = [&](const std::vector<float>& at) {
      std::vector<float> loss(n), valid(n);
      driver->sigmoid_cross_entropy_forward(n, at.data(), t.data(), true, -1, loss.data(),
                                            valid.data());
      return loss;
    };
    std::vector<float> dx(n);
    driver->sigmoid_cross_entropy_backward(n, x.data(), t.data(), true, -1, 1.0f, dx.data());
    check_gradient(x, ones, forward, dx);
  }
}

// ---- direct convolution ---------------------------------------------------------------

TEST_CASE("reference conv_forward sums x * w over the window and adds the bias", "[reference]") {
  auto driver = make_reference(false);
  // x = 1..9 in a 3x3 plane, w = [1 0; 0 -1]: y[oh][ow] = x[oh][ow] - x[oh+1][ow+1] = -4.
  const LoweringShape shape = lowering(1, 1, 3, 3, 2, 0, 1);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w = {1, 0, 0, -1}, bias = {0.5f};
  std::vector<float> y(4, kNaN);
  driver->conv_forward(shape, 1, x.data(), w.data(), nullptr, y.data());
  check_close(y, {-4, -4, -4, -4});
  driver->conv_forward(shape, 1, x.data(), w.data(), bias.data(), y.data());
  check_close(y, {-3.5f, -3.5f, -3.5f, -3.5f});
}

TEST_CASE("reference conv_forward with groups, stride 2 and pad 1 reads only in-image taps",
          "[reference]") {
  auto driver = make_reference(false);
  // Two channels, two groups, 1x1 kernels w = 2 (group 0) and 3 (group 1). Outputs read
  // input pixel (2*oh - 1, 2*ow - 1): only output (1, 1) lands inside, on pixel (1, 1).
  LoweringShape shape = lowering(1, 2, 2, 2, 1, 1, 2);
  shape.groups = 2;
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, w = {2, 3};
  REQUIRE(shape.out_h() == 2);
  std::vector<float> y(8, kNaN);
  driver->conv_forward(shape, 2, x.data(), w.data(), nullptr, y.data());
  check_close(y, {0, 0, 0, 2 * 4, 0, 0, 0, 3 * 8});
}

TEST_CASE("reference conv_forward with a 1x2 kernel dilated by 2 reads taps two pixels apart",
          "[reference]") {
  auto driver = make_reference(false);
  LoweringShape shape = lowering(1, 1, 1, 5, 1, 0, 1);
  shape.kernel_w = 2;
  shape.dilation_w = 2;
  // y[ow] = x[ow] + 10 * x[ow + 2], out_w = 5 - 3 + 1 = 3.
  const std::vector<float> x = {1, 2, 3, 4, 5}, w = {1, 10};
  std::vector<float> y(3, kNaN);
  driver->conv_forward(shape, 1, x.data(), w.data(), nullptr, y.data());
  check_close(y, {31, 42, 53});
}

TEST_CASE("reference conv_backward_data scatters dy through the weights", "[reference]") {
  auto driver = make_reference(false);
  // w = [1 0; 0 -1], dy = 1 on the 2x2 output: dx[h][w] = [h<2 && w<2] - [h>=1 && w>=1].
  const LoweringShape shape = lowering(1, 1, 3, 3, 2, 0, 1);
  const std::vector<float> w = {1, 0, 0, -1}, dy = {1, 1, 1, 1};
  std::vector<float> dx(9, kNaN);
  driver->conv_backward_data(shape, 1, w.data(), dy.data(), dx.data());
  check_close(dx, {1, 1, 0, 1, 0, -1, 0, -1, -1});
}

TEST_CASE("reference conv_backward_weights adds x * dy to dweights and dy to dbias",
          "[reference]") {
  auto driver = make_reference(false);
  // dy = 1: dw[kh][kw] = sum over the 2x2 outputs of x[oh+kh][ow+kw], x = 1..9:
  // 1+2+4+5 = 12, 2+3+5+6 = 16, 4+5+7+8 = 24, 5+6+8+9 = 28; dbias = 4 ones.
  const LoweringShape shape = lowering(1, 1, 3, 3, 2, 0, 1);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, dy = {1, 1, 1, 1};
  std::vector<float> dw = {100, 100, 100, 100}, db = {1};
  driver->conv_backward_weights(shape, 1, x.data(), dy.data(), dw.data(), db.data());
  check_close(dw, {112, 116, 124, 128});
  check_close(db, {5});
  driver->conv_backward_weights(shape, 1, x.data(), dy.data(), dw.data(), nullptr);
  check_close(dw, {124, 132, 148, 156});
  check_close(db, {5});
}

TEST_CASE("reference conv backward passes are the adjoint and derivative of conv_forward",
          "[reference]") {
  auto driver = make_reference(false);
  LoweringShape shape = GENERATE(lowering(2, 4, 6, 5, 3, 1, 2),     // stride 2, pad 1
                                 lowering(1, 6, 7, 6, 2, 2, 1, 2),  // dilation 2, big pad
                                 lowering(2, 2, 5, 7, 3, 0, 3));    // stride > 1, gaps
  shape.kernel_w = shape.kernel_h == 3 ? 2 : 3;                     // non-square kernels
  shape.groups = 2;
  CAPTURE(shape.to_string());
  const index_t oc = 4;
  const index_t x_count = shape.image_count();
  const index_t w_count = oc * (shape.channels / shape.groups) * shape.kernel_h * shape.kernel_w;
  const index_t y_count = shape.batch * oc * shape.out_h() * shape.out_w();
  const std::vector<float> x = test::random_floats(x_count, 71);
  const std::vector<float> w = test::random_floats(w_count, 72);
  const std::vector<float> bias = test::random_floats(oc, 73);
  const std::vector<float> dy = test::random_floats(y_count, 74);
  std::vector<float> y(y_count), dx(x_count), dw(w_count, 0.0f), db(oc, 0.0f);
  driver->conv_forward(shape, oc, x.data(), w.data(), nullptr, y.data());
  driver->conv_backward_data(shape, oc, w.data(), dy.data(), dx.data());
  driver->conv_backward_weights(shape, oc, x.data(), dy.data(), dw.data(), db.data());

  // <conv_forward(x), dy> == <x, conv_backward_data(dy)> == <w, conv_backward_weights(dy)>
  double forward_side = 0.0, data_side = 0.0, weights_side = 0.0;
  for (index_t i = 0; i < y_count; ++i)
    forward_side += static_cast<double>(y[i]) * dy[i];
  for (index_t i = 0; i < x_count; ++i)
    data_side += static_cast<double>(x[i]) * dx[i];
  for (index_t i = 0; i < w_count; ++i)
    weights_side += static_cast<double>(w[i]) * dw[i];
  CHECK(forward_side == Approx(data_side).epsilon(1e-5));
  CHECK(forward_side == Approx(weights_side).epsilon(1e-5));

  // Central differences of L = <conv_forward(x, w, bias), dy> in x, w and bias.
  const auto run = [&](const std::vector<float>& at_x, const std::vector<float>& at_w,
                       const std::vector<float>& at_bias) {
    std::vector<float> out(y_count);
    driver->conv_forward(shape, oc, at_x.data(), at_w.data(), at_bias.data(), out.data());
    return out;
  };
  check_gradient(
      x, dy, [&](const std::vector<float>& at) { return run(at, w, bias); }, dx);
  check_gradient(
      w, dy, [&](const std::vector<float>& at) { return run(x, at, bias); }, dw);
  check_gradient(
      bias, dy, [&](const std::vector<float>& at) { return run(x, w, at); }, db);
}
