// Every Driver call on every driver configuration present, compared with the reference
// driver (ggml's test-backend-ops idea): fixed-seed random shapes with odd and prime sizes,
// the edge cases each call documents, and the misuse errors of the validating front.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/driver.h"
#include "lib/core/memory.h"
#include "lib/core/philox.h"
#include "lib/core/runtime.h"
#include "lib/core/shapes.h"
#include "tests/core_driver.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Transpose;
using hn::test::axis;
using hn::test::DeviceArray;
using hn::test::DriverConfig;
using hn::test::error_of;
using hn::test::lowering;
using hn::test::lrn;
using hn::test::pooling;
using hn::test::random_floats;

// Relative tolerances (|got - want| / max(1, |want|)). Element-wise results may differ by
// a contraction into FMA or a vectorised exp; reductions and GEMM by summation order.
constexpr double kElementwiseTolerance = 1e-5;
constexpr double kReductionTolerance = 1e-4;
double gemm_tolerance(index_t k) {
  return 1e-4 * std::max(1.0, static_cast<double>(k) / 64.0);
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 777.0f;  // marks memory a call must leave alone
const std::vector<index_t> kOddSizes = {1, 3, 7, 13, 31, 97};

// The driver under test and the oracle. Declared before any array in a test, so the
// arrays (whose Buffers these drivers free) die first.
struct Drivers {
  explicit Drivers(const DriverConfig& config)
      : oracle(hn::make_driver(hn::Device{"reference", 0})),
        driver(hn::make_driver(config.device, config.options)) {}
  std::unique_ptr<hn::Driver> oracle;
  std::unique_ptr<hn::Driver> driver;
};

enum class Side { oracle, tested };

// Runs `call(driver, side)` on the oracle, then on the driver under test.
template <class Call>
void run_both(const Drivers& drivers, Call&& call) {
  call(*drivers.oracle, Side::oracle);
  call(*drivers.driver, Side::tested);
}

// The same values (or, for outputs, deliberately different garbage) on both drivers.
class TwinArray {
 public:
  TwinArray(const Drivers& drivers, const std::vector<float>& values)
      : TwinArray(drivers, values, values) {}
  TwinArray(const Drivers& drivers, const std::vector<float>& oracle_values,
            const std::vector<float>& tested_values)
      : oracle_(*drivers.oracle, oracle_values), tested_(*drivers.driver, tested_values) {}
  float* operator[](Side side) const {
    return side == Side::oracle ? oracle_.data() : tested_.data();
  }
  std::vector<float> oracle() const { return oracle_.host(); }
  std::vector<float> tested() const { return tested_.host(); }

 private:
  DeviceArray oracle_, tested_;
};

// Max-pooling masks: int32 on a driver.
class MaskArray {
 public:
  MaskArray(hn::Driver& driver, std::size_t count)
      : driver_(&driver), buffer_(driver, count * sizeof(std::int32_t)), count_(count) {}
  std::int32_t* data() const { return buffer_.as<std::int32_t>(); }
  void upload(const std::vector<std::int32_t>& values) {
    REQUIRE(values.size() == count_);
    driver_->copy_from_host(data(), values.data(), count_ * sizeof(std::int32_t));
  }
  std::vector<std::int32_t> host() const {
    std::vector<std::int32_t> out(count_);
    driver_->copy_to_host(out.data(), data(), count_ * sizeof(std::int32_t));
    return out;
  }

 private:
  hn::Driver* driver_;
  hn::Buffer buffer_;
  std::size_t count_;
};

class TwinMask {
 public:
  TwinMask(const Drivers& drivers, std::size_t count)
      : oracle_(*drivers.oracle, count), tested_(*drivers.driver, count) {}
  std::int32_t* operator[](Side side) const {
    return side == Side::oracle ? oracle_.data() : tested_.data();
  }
  std::vector<std::int32_t> oracle() const { return oracle_.host(); }
  std::vector<std::int32_t> tested() const { return tested_.host(); }
  void upload(const std::vector<std::int32_t>& values) {
    oracle_.upload(values);
    tested_.upload(values);
  }

 private:
  MaskArray oracle_, tested_;
};

// Checks max_rel_diff(tested, oracle) <= tolerance and names the worst element on failure.
void check_close(const std::vector<float>& tested, const std::vector<float>& oracle,
                 double tolerance) {
  REQUIRE(tested.size() == oracle.size());
  const double diff = hn::test::max_rel_diff(tested, oracle);
  std::size_t worst = 0;
  double worst_diff = -1.0;
  for (std::size_t i = 0; i < tested.size(); ++i) {
    const double d = std::abs(static_cast<double>(tested[i]) - oracle[i]) /
                     std::max(1.0, std::abs(static_cast<double>(oracle[i])));
    if (!(d <= worst_diff)) {
      worst_diff = d;
      worst = i;
      if (std::isnan(d)) break;
    }
  }
  INFO("worst element " << worst << " of " << tested.size() << ": driver "
                        << (tested.empty() ? 0.0f : tested[worst]) << ", reference "
                        << (oracle.empty() ? 0.0f : oracle[worst]));
  CHECK(diff <= tolerance);
}

void check_close(const TwinArray& array, double tolerance) {
  check_close(array.tested(), array.oracle(), tolerance);
}

// Bit-for-bit equality; names the first differing element on failure.
template <class T>
void check_identical(const std::vector<T>& tested, const std::vector<T>& oracle) {
  REQUIRE(tested.size() == oracle.size());
  std::size_t first = tested.size();
  std::size_t differing = 0;
  for (std::size_t i = 0; i < tested.size(); ++i) {
    if (std::memcmp(&tested[i], &oracle[i], sizeof(T)) != 0) {
      if (first == tested.size()) first = i;
      ++differing;
    }
  }
  if (differing > 0) {
    INFO("first differing element " << first << " of " << tested.size() << ": driver "
                                    << tested[first] << ", reference " << oracle[first]);
    CHECK(differing == 0);
  } else {
    CHECK(differing == 0);
  }
}

void check_identical(const TwinArray& array) {
  check_identical(array.tested(), array.oracle());
}
void check_identical(const TwinMask& mask) {
  check_identical(mask.tested(), mask.oracle());
}

template <class T>
T pick(std::mt19937& rng, const std::vector<T>& choices) {
  return choices[std::uniform_int_distribution<std::size_t>(0, choices.size() - 1)(rng)];
}

index_t uniform(std::mt19937& rng, index_t lo, index_t hi) {
  return std::uniform_int_distribution<index_t>(lo, hi)(rng);
}

// n distinct values in [lo, lo + 1), shuffled, so a max-pooling window never holds a tie.
std::vector<float> distinct_floats(std::size_t n, std::uint32_t seed, float lo) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = lo + static_cast<float>(i) / static_cast<float>(std::max<std::size_t>(n, 1));
  }
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

// Random values with an exact zero every 17th element (the x > 0 boundary of relu).
std::vector<float> floats_with_zeros(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, -2.0f, 2.0f);
  for (std::size_t i = 0; i < n; i += 17)
    v[i] = 0.0f;
  return v;
}

std::vector<float> constant(std::size_t n, float value) {
  return std::vector<float>(n, value);
}

const std::vector<index_t> kVectorSizes = {1, 3, 7, 13, 31, 97, 1000, 10007, 100003, 1000003};

// ---- shapes -------------------------------------------------------------------------

std::vector<hn::LoweringShape> lowering_cases() {
  std::vector<hn::LoweringShape> cases = {
      lowering(1, 1, 5, 5, 3, 3, 1, 1, 1, 1),
      lowering(1, 1, 1, 1, 1, 1, 0, 0, 1, 1),
      lowering(2, 3, 7, 13, 3, 2, 1, 0, 2, 1),            // non-square kernel, stride 2
      lowering(3, 4, 13, 11, 3, 3, 2, 2, 1, 1, 2, 2, 2),  // dilation 2, groups 2
      lowering(1, 6, 31, 7, 5, 1, 2, 0, 3, 1, 1, 1, 3),   // groups 3
      lowering(2, 2, 13, 13, 2, 2, 0, 0, 3, 3),           // stride > kernel: skipped pixels
      lowering(1, 3, 7, 7, 7, 7, 0, 0, 1, 1),             // kernel = image: one output
      lowering(1, 2, 3, 5, 5, 5, 2, 2, 1, 1),             // kernel larger than the image
      lowering(2, 1, 97, 3, 1, 3, 0, 1, 1, 1),
      lowering(1, 1, 11, 11, 3, 3, 3, 3, 2, 2, 3, 1),  // wide padding, dilation 3 x 1
      // Large enough for the CPU driver's parallel paths (AlexNet conv2-like, 2 groups).
      lowering(3, 16, 27, 27, 5, 5, 2, 2, 1, 1, 1, 1, 2),
  };
  std::mt19937 rng(7);
  while (cases.size() < 18) {
    // One draw per statement: the order of draws must not depend on the compiler.
    hn::LoweringShape s;
    s.groups = pick<index_t>(rng, {1, 1, 2, 3});
    s.batch = uniform(rng, 1, 3);
    s.channels = s.groups * pick<index_t>(rng, {1, 3, 7});
    s.height = pick<index_t>(rng, {1, 3, 7, 13, 31});
    s.width = pick<index_t>(rng, {1, 3, 7, 13, 31});
    s.kernel_h = uniform(rng, 1, 5);
    s.kernel_w = uniform(rng, 1, 5);
    s.pad_h = uniform(rng, 0, s.kernel_h);
    s.pad_w = uniform(rng, 0, s.kernel_w);
    s.stride_h = uniform(rng, 1, 3);
    s.stride_w = uniform(rng, 1, 3);
    s.dilation_h = pick<index_t>(rng, {1, 1, 2});
    s.dilation_w = pick<index_t>(rng, {1, 1, 2});
    if (s.out_h() > 0 && s.out_w() > 0) cases.push_back(s);
  }
  return cases;
}

hn::PoolShape without_pads_counted(hn::PoolShape shape) {
  shape.count_include_pad = false;
  return shape;
}

std::vector<hn::PoolShape> pool_cases() {
  std::vector<hn::PoolShape> cases = {
      pooling(1, 1, 5, 5, 2, 2, 2, 2, 0, 0),
      pooling(2, 3, 7, 7, 3, 3, 2, 2, 1, 1),    // rounds up; windows clipped by padding
      pooling(1, 2, 13, 11, 3, 2, 2, 3, 1, 1),  // non-square kernel and stride
      pooling(3, 4, 6, 6, 3, 3, 3, 3, 0, 0),    // no overlap
      pooling(2, 1, 1, 1, 1, 1, 1, 1, 0, 0),    // 1x1
      pooling(1, 3, 31, 17, 5, 3, 2, 2, 2, 1),  // AlexNet-like odd sizes
      pooling(1, 1, 8, 8, 3, 3, 1, 1, 2, 2),    // pad 2 with kernel 3
      pooling(1, 2, 13, 13, 2, 2, 3, 3, 0, 0),  // stride > kernel: skipped inputs
      pooling(1, 1, 5, 5, 2, 2, 2, 2, 1, 1),    // Caffe drops a window starting in the pad
      pooling(2, 2, 6, 6, 3, 3, 2, 2, 0, 0),    // rounding up: last window past the border
      pooling(1, 1, 97, 3, 3, 3, 2, 1, 1, 1),
      pooling(1, 1, 3, 3, 3, 3, 1, 1, 0, 0),      // kernel = image
      pooling(2, 3, 13, 13, 13, 13, 1, 1, 0, 0),  // global pooling: whole vectors and a tail
      pooling(1, 5, 4, 8, 4, 8, 1, 1, 0, 0),      // global pooling: whole vectors only
      pooling(4, 24, 55, 55, 3, 3, 2, 2, 0, 0),   // large: the CPU driver's parallel paths
  };
  std::mt19937 rng(11);
  while (cases.size() < 20) {
    hn::PoolShape s;
    s.batch = uniform(rng, 1, 3);
    s.channels = pick<index_t>(rng, {1, 3, 7});
    s.height = pick<index_t>(rng, {1, 3, 7, 13, 31});
    s.width = pick<index_t>(rng, {1, 3, 7, 13, 31});
    s.kernel_h = uniform(rng, 1, 5);
    s.kernel_w = uniform(rng, 1, 5);
    s.stride_h = uniform(rng, 1, 3);
    s.stride_w = uniform(rng, 1, 3);
    s.pad_h = uniform(rng, 0, s.kernel_h - 1);
    s.pad_w = uniform(rng, 0, s.kernel_w - 1);
    if (s.kernel_h <= s.height + 2 * s.pad_h && s.kernel_w <= s.width + 2 * s.pad_w) {
      cases.push_back(s);
    }
  }
  // Averages that leave the padding out of the divisor (ONNX's count_include_pad 0), in
  // both rounding modes.
  for (std::size_t i = 0, n = cases.size(); i < n; ++i) {
    hn::PoolShape s = cases[i];
    if (s.pad_h == 0 && s.pad_w == 0) continue;
    s.count_include_pad = false;
    s.ceil_mode = i % 2 == 0;
    cases.push_back(s);
  }
  return cases;
}

std::vector<hn::AxisShape> axis_cases() {
  return {axis(1, 1, 1),     axis(2, 3, 7),    axis(3, 13, 31), axis(5, 97, 1),
          axis(1, 7, 291),   axis(4, 1, 13),   axis(2, 31, 97), axis(1, 1000, 1),
          axis(64, 1000, 1), axis(8, 21, 1023)};  // large: the parallel paths
}

std::vector<hn::LrnShape> lrn_cases() {
  std::vector<hn::LrnShape> cases;
  std::mt19937 rng(13);
  for (index_t size : {1, 3, 5}) {
    // Channels smaller than, equal to and larger than the window.
    for (index_t channels : {1, 2, 3, 5, 7, 13}) {
      const index_t batch = uniform(rng, 1, 2);
      const index_t height = pick<index_t>(rng, {1, 3, 7});
      const index_t width = pick<index_t>(rng, {1, 3, 7});
      cases.push_back(lrn(batch, channels, height, width, size, hn::LrnRegion::across_channels));
    }
    // Planes smaller than, equal to and larger than the window.
    for (index_t height : {1, 2, 3, 7, 13}) {
      const index_t batch = uniform(rng, 1, 2);
      const index_t channels = pick<index_t>(rng, {1, 3});
      const index_t width = pick<index_t>(rng, {1, 2, 3, 7, 13});
      cases.push_back(lrn(batch, channels, height, width, size, hn::LrnRegion::within_channel));
    }
  }
  // Other parameters (k = 2 as AlexNet's, beta 0.5, alpha as Caffe's default).
  cases.push_back(lrn(2, 13, 5, 3, 5, hn::LrnRegion::across_channels, 1e-4f, 0.75f, 2.0f));
  cases.push_back(lrn(2, 7, 3, 3, 3, hn::LrnRegion::across_channels, 0.5f, 0.5f, 2.0f));
  cases.push_back(lrn(1, 3, 13, 7, 3, hn::LrnRegion::within_channel, 0.5f, 0.5f));
  // Large enough for the CPU driver's parallel paths.
  cases.push_back(lrn(4, 24, 27, 27, 5, hn::LrnRegion::across_channels, 1e-4f, 0.75f, 1.0f));
  cases.push_back(lrn(2, 8, 55, 55, 3, hn::LrnRegion::within_channel, 1e-2f, 0.75f));
  return cases;
}

// ---- GEMM ---------------------------------------------------------------------------

struct GemmCase {
  Transpose trans_a, trans_b;
  index_t m, n, k;
  float alpha, beta;
  index_t pad_a, pad_b, pad_c;  // leading dimension beyond the minimal one
};

std::string describe(const GemmCase& g) {
  std::ostringstream out;
  out << "gemm " << (g.trans_a == Transpose::yes ? "T" : "N")
      << (g.trans_b == Transpose::yes ? "T" : "N") << " m=" << g.m << " n=" << g.n << " k=" << g.k
      << " alpha=" << g.alpha << " beta=" << g.beta << " lda+" << g.pad_a << " ldb+" << g.pad_b
      << " ldc+" << g.pad_c;
  return out.str();
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  std::mt19937 rng(2024);
  for (Transpose ta : {Transpose::no, Transpose::yes}) {
    for (Transpose tb : {Transpose::no, Transpose::yes}) {
      cases.push_back({ta, tb, 1, 1, 1, 1.0f, 0.0f, 0, 0, 0});
      cases.push_back({ta, tb, 1, 97, 3, 1.0f, 1.0f, 0, 0, 0});
      cases.push_back({ta, tb, 97, 1, 13, -0.5f, 0.0f, 2, 0, 5});
      cases.push_back({ta, tb, 7, 13, 31, 2.5f, -0.7f, 3, 1, 2});
      cases.push_back({ta, tb, 31, 7, 1, 1.0f, 1.0f, 0, 4, 0});
      cases.push_back({ta, tb, 5, 3, 0, 1.0f, 0.0f, 0, 0, 1});  // k = 0: C = beta * C
      cases.push_back({ta, tb, 4, 6, 0, 1.0f, 0.5f, 1, 1, 0});
      cases.push_back({ta, tb, 257, 263, 255, 1.0f, 0.0f, 1, 0, 3});
      for (int r = 0; r < 4; ++r) {
        auto size = [&] { return r % 2 == 0 ? pick(rng, kOddSizes) : uniform(rng, 1, 64); };
        const index_t m = size(), n = size(), k = size();
        cases.push_back({ta, tb, m, n, k, pick<float>(rng, {1.0f, -0.5f, 2.5f}),
                         pick<float>(rng, {0.0f, 1.0f, -0.7f}), pick<index_t>(rng, {0, 0, 1, 3}),
                         pick<index_t>(rng, {0, 0, 1, 3}), pick<index_t>(rng, {0, 0, 1, 3})});
      }
    }
  }
  return cases;
}

// A rows x cols matrix stored with leading dimension ld; the padding columns hold `fill`.
std::vector<float> padded(const std::vector<float>& values, index_t rows, index_t cols, index_t ld,
                          float fill) {
  std::vector<float> out(static_cast<std::size_t>(rows * ld), fill);
  for (index_t r = 0; r < rows; ++r) {
    std::copy_n(values.begin() + r * cols, cols, out.begin() + r * ld);
  }
  return out;
}

TEST_CASE("gemm matches the reference on every driver", "[driver_ops][gemm]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 100;
    for (const GemmCase& g : gemm_cases()) {
      INFO(describe(g));
      const bool ta = g.trans_a == Transpose::yes, tb = g.trans_b == Transpose::yes;
      const index_t a_rows = ta ? g.k : g.m, a_cols = ta ? g.m : g.k;
      const index_t b_rows = tb ? g.n : g.k, b_cols = tb ? g.k : g.n;
      const index_t lda = std::max<index_t>(1, a_cols) + g.pad_a;
      const index_t ldb = std::max<index_t>(1, b_cols) + g.pad_b;
      const index_t ldc = std::max<index_t>(1, g.n) + g.pad_c;
      // Padding holds NaN in A and B (must not be read) and a sentinel in C (must not be
      // written); with beta == 0, C itself holds NaN (must not be read).
      const TwinArray a(drivers,
                        padded(random_floats(a_rows * a_cols, seed++), a_rows, a_cols, lda, kNaN));
      const TwinArray b(drivers,
                        padded(random_floats(b_rows * b_cols, seed++), b_rows, b_cols, ldb, kNaN));
      const std::vector<float> c_values =
          g.beta == 0.0f ? constant(g.m * g.n, kNaN) : random_floats(g.m * g.n, seed++);
      const TwinArray c(drivers, padded(c_values, g.m, g.n, ldc, kSentinel));
      run_both(drivers, [&](hn::Driver& driver, Side side) {
        driver.gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a[side], lda, b[side], ldb,
                    g.beta, c[side], ldc);
      });
      const std::vector<float> tested = c.tested();
      check_close(tested, c.oracle(), gemm_tolerance(g.k));
      index_t padding_written = 0;
      for (index_t r = 0; r < g.m; ++r) {
        for (index_t j = g.n; j < ldc; ++j)
          padding_written += tested[r * ldc + j] != kSentinel;
      }
      CHECK(padding_written == 0);
    }
  }
}

// ---- lowering -----------------------------------------------------------------------

TEST_CASE("im2col matches the reference bit for bit on every driver", "[driver_ops][lowering]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 200;
    for (const hn::LoweringShape& shape : lowering_cases()) {
      INFO(shape.to_string());
      const TwinArray images(drivers, random_floats(shape.image_count(), seed++));
      // Different garbage on each side: an entry left unwritten cannot match.
      const TwinArray columns(drivers, constant(shape.col_count(), -7777.0f),
                              constant(shape.col_count(), kNaN));
      run_both(drivers, [&](hn::Driver& driver, Side side) {
        driver.im2col(shape, images[side], columns[side]);
      });
      check_identical(columns);
    }
  }
}

TEST_CASE("col2im overwrites the images with the reference sums on every driver",
          "[driver_ops][lowering]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 300;
    for (const hn::LoweringShape& shape : lowering_cases()) {
      INFO(shape.to_string());
      const TwinArray columns(drivers, random_floats(shape.col_count(), seed++));
      const TwinArray images(drivers, constant(shape.image_count(), -7777.0f),
                             constant(shape.image_count(), kNaN));
      run_both(drivers, [&](hn::Driver& driver, Side side) {
        driver.col2im(shape, columns[side], images[side]);
      });
      check_close(images, kElementwiseTolerance);
    }
  }
}

TEST_CASE("im2col row block g is the lowering of group g's channels on every driver",
          "[driver_ops][lowering]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 400;
    for (const hn::LoweringShape& shape : lowering_cases()) {
      if (shape.groups == 1) continue;
      INFO(shape.to_string());
      const std::vector<float> image_values = random_floats(shape.image_count(), seed++);
      const DeviceArray images(*driver, image_values);
      const DeviceArray columns(*driver, shape.col_count());
      driver->im2col(shape, images.data(), columns.data());
      const std::vector<float> lowered = columns.host();

      hn::LoweringShape group_shape = shape;
      group_shape.channels = shape.channels / shape.groups;
      group_shape.groups = 1;
      const index_t plane = shape.height * shape.width;
      const index_t block = group_shape.col_count();  // rows / groups full rows
      for (index_t g = 0; g < shape.groups; ++g) {
        INFO("group " << g);
        std::vector<float> subset;
        for (index_t n = 0; n < shape.batch; ++n) {
          const auto begin =
              image_values.begin() + (n * shape.channels + g * group_shape.channels) * plane;
          subset.insert(subset.end(), begin, begin + group_shape.channels * plane);
        }
        const DeviceArray group_images(*driver, subset);
        const DeviceArray group_columns(*driver, block);
        driver->im2col(group_shape, group_images.data(), group_columns.data());
        const std::vector<float> rows(lowered.begin() + g * block,
                                      lowered.begin() + (g + 1) * block);
        check_identical(rows, group_columns.host());
      }
    }
  }
}

TEST_CASE("swap_axes matches the reference bit for bit on every driver", "[driver_ops][lowering]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 500;
    const std::vector<std::vector<index_t>> cases = {
        {1, 1, 1}, {3, 7, 1}, {13, 31, 5}, {97, 3, 7}, {1, 13, 31}, {31, 1, 3}, {64, 49, 97}};
    for (const auto& d : cases) {
      INFO("swap_axes d0=" << d[0] << " d1=" << d[1] << " inner=" << d[2]);
      const index_t count = d[0] * d[1] * d[2];
      const TwinArray src(drivers, random_floats(count, seed++));
      const TwinArray dst(drivers, constant(count, -7777.0f), constant(count, kNaN));
      run_both(drivers, [&](hn::Driver& driver, Side side) {
        driver.swap_axes(d[0], d[1], d[2], src[side], dst[side]);
      });
      check_identical(dst);
    }
  }
}

// lowering_cases() with one group (lift is type 3, groups == 1) and a number of output
// channels per case.
std::vector<std::pair<hn::LoweringShape, index_t>> lift_cases() {
  std::vector<std::pair<hn::LoweringShape, index_t>> cases;
  const index_t out_channels[] = {1, 2, 3, 7, 13};
  index_t next = 0;
  for (hn::LoweringShape shape : lowering_cases()) {
    shape.groups = 1;
    cases.emplace_back(shape, out_channels[next++ % std::size(out_channels)]);
  }
  return cases;
}

index_t product_count(const hn::LoweringShape& s, index_t out_channels) {
  return s.batch * s.height * s.width * out_channels * s.kernel_h * s.kernel_w;
}

TEST_CASE("lift matches the reference and lift_backward matches it bit for bit on every driver",
          "[driver_ops][lowering]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 550;
    for (const auto& conv_case : lift_cases()) {
      const hn::LoweringShape& shape = conv_case.first;
      const index_t out_channels = conv_case.second;
      INFO(shape.to_string() << " out_channels=" << out_channels);
      const index_t p_count = product_count(shape, out_channels);
      const index_t y_count = shape.batch * out_channels * shape.out_h() * shape.out_w();
      {
        INFO("lift (overwrites y)");
        const TwinArray products(drivers, random_floats(p_count, seed++));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.lift(shape, out_channels, products[s], y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      {
        INFO("lift_backward (overwrites dP, zeros where no output maps)");
        const TwinArray dy(drivers, random_floats(y_count, seed++));
        const TwinArray dp(drivers, constant(p_count, -7777.0f), constant(p_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.lift_backward(shape, out_channels, dy[s], dp[s]);
        });
        check_identical(dp);
      }
    }
  }
}

// ---- direct convolution -------------------------------------------------------------

// lowering_cases() with a number of output channels divisible by the groups, plus shapes
// whose channels are multiples of 16 (oneDNN's blocked AVX-512 kernels on the CPU driver;
// the small ones above take its plain-layout path).
std::vector<std::pair<hn::LoweringShape, index_t>> conv_cases() {
  const index_t per_group[] = {1, 2, 3, 5, 16};
  std::vector<std::pair<hn::LoweringShape, index_t>> cases;
  index_t next = 0;
  for (const hn::LoweringShape& shape : lowering_cases()) {
    cases.emplace_back(shape, shape.groups * per_group[next++ % std::size(per_group)]);
  }
  cases.emplace_back(lowering(1, 3, 37, 41, 11, 11, 0, 0, 4, 4), 32);  // conv1-like, batch 1
  cases.emplace_back(lowering(2, 32, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 2), 32);  // conv4-like
  cases.emplace_back(lowering(3, 16, 9, 11, 5, 3, 2, 1, 2, 1), 32);          // non-square, stride 2
  cases.emplace_back(lowering(2, 64, 7, 9, 3, 3, 2, 2, 1, 1, 2, 2), 16);     // dilation 2
  cases.emplace_back(lowering(2, 32, 8, 8, 1, 1, 0, 0, 1, 1, 1, 1, 2), 64);  // 1x1, groups 2
  cases.emplace_back(lowering(1, 32, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 32), 32);  // depthwise
  // Depthwise shapes whose weight gradient the CPU driver computes itself (oneDNN's
  // depthwise kernel takes 3x3 only): EfficientNet's 5x5, stride 2 on odd sizes, dilated.
  cases.emplace_back(lowering(3, 32, 14, 14, 5, 5, 2, 2, 1, 1, 1, 1, 32), 32);
  cases.emplace_back(lowering(2, 48, 13, 11, 5, 5, 2, 2, 2, 2, 1, 1, 48), 48);
  cases.emplace_back(lowering(2, 16, 9, 12, 3, 5, 0, 1, 1, 2, 2, 1, 16), 16);
  // ShuffleNet v2's: 58 channels (no whole vector of them), stride 2; and stride 1.
  cases.emplace_back(lowering(2, 58, 12, 12, 3, 3, 1, 1, 2, 2, 1, 1, 58), 58);
  cases.emplace_back(lowering(3, 29, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 29), 29);
  cases.emplace_back(lowering(8, 16, 14, 14, 3, 3, 1, 1, 1, 1), 16);  // Winograd-sized batch
  // First layers of few channels with strides (the CPU driver's conv_small): ShuffleNet v2's
  // conv1 on odd sizes, 5x5 with stride 2 down the rows only, a column stride of 3, and a
  // row of 40 phases (two and a half vectors of each).
  cases.emplace_back(lowering(2, 3, 23, 37, 3, 3, 1, 1, 2, 2), 24);
  cases.emplace_back(lowering(3, 1, 17, 20, 5, 5, 2, 2, 2, 1), 12);
  cases.emplace_back(lowering(2, 2, 9, 50, 3, 4, 0, 1, 1, 3), 9);
  cases.emplace_back(lowering(1, 4, 6, 80, 2, 5, 1, 2, 1, 2), 5);
  return cases;
}

index_t conv_weight_count(const hn::LoweringShape& s, index_t out_channels) {
  return out_channels * (s.channels / s.groups) * s.kernel_h * s.kernel_w;
}

TEST_CASE("conv_forward, conv_backward_data and conv_backward_weights match the reference",
          "[driver_ops][convolution]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 3100;
    index_t case_index = 0;
    for (const auto& conv_case : conv_cases()) {
      const hn::LoweringShape& shape = conv_case.first;
      const index_t out_channels = conv_case.second;
      // Alternate bias present and absent; every case accumulates into non-zero gradients.
      const bool with_bias = case_index++ % 2 == 0;
      INFO(shape.to_string() << " out_channels=" << out_channels
                             << (with_bias ? " with bias" : " no bias"));
      const index_t x_count = shape.image_count();
      const index_t w_count = conv_weight_count(shape, out_channels);
      const index_t y_count = shape.batch * out_channels * shape.out_h() * shape.out_w();
      const double tolerance =
          gemm_tolerance(shape.channels / shape.groups * shape.kernel_h * shape.kernel_w);
      const TwinArray x(drivers, random_floats(x_count, seed++));
      const TwinArray w(drivers, random_floats(w_count, seed++));
      const TwinArray bias(drivers, random_floats(out_channels, seed++));
      {
        INFO("conv_forward (overwrites y)");
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_forward(shape, out_channels, x[s], w[s], with_bias ? bias[s] : nullptr, y[s]);
        });
        check_close(y, tolerance);
      }
      const TwinArray dy(drivers, random_floats(y_count, seed++));
      {
        INFO("conv_backward_data (overwrites dx, zeros where no output reads)");
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_backward_data(shape, out_channels, w[s], dy[s], dx[s]);
        });
        check_close(dx,
                    gemm_tolerance(out_channels / shape.groups * shape.kernel_h * shape.kernel_w));
      }
      {
        INFO("conv_backward_weights (adds to dweights and dbias)");
        const TwinArray dw(drivers, random_floats(w_count, seed++, -3.0f, 3.0f));
        const TwinArray db(drivers, random_floats(out_channels, seed++, -3.0f, 3.0f));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_backward_weights(shape, out_channels, x[s], dy[s], dw[s],
                                  with_bias ? db[s] : nullptr);
        });
        const double sum_tolerance = gemm_tolerance(shape.batch * shape.out_h() * shape.out_w());
        check_close(dw, sum_tolerance);
        check_close(db, sum_tolerance);  // untouched when no bias
      }
      for (const int wanted : {3, 1, 2}) {  // both gradients, dx alone, dweights alone
        INFO("conv_backward (both gradients in one call), gradients wanted " << wanted);
        const bool want_dx = (wanted & 1) != 0, want_dw = (wanted & 2) != 0;
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        const TwinArray dw(drivers, random_floats(w_count, seed++, -3.0f, 3.0f));
        const TwinArray db(drivers, random_floats(out_channels, seed++, -3.0f, 3.0f));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_backward(shape, out_channels, x[s], w[s], dy[s], want_dx ? dx[s] : nullptr,
                          want_dw ? dw[s] : nullptr, want_dw && with_bias ? db[s] : nullptr);
        });
        if (want_dx) {
          check_close(
              dx, gemm_tolerance(out_channels / shape.groups * shape.kernel_h * shape.kernel_w));
        }
        const double sum_tolerance = gemm_tolerance(shape.batch * shape.out_h() * shape.out_w());
        check_close(dw, sum_tolerance);  // untouched when not wanted
        check_close(db, sum_tolerance);
      }
    }
  }
}

TEST_CASE(
    "depthwise and 1x1 convolutions on NCHW kernels (plain_kernel: the CPU driver's own "
    "depthwise ones, oneDNN's GEMM-based 1x1) match the reference, with and without bias and "
    "ReLU",
    "[driver_ops][convolution]") {
  // Widths below, at and above one 16-pixel transpose tile; channel counts with a partial
  // group of 16; strides 1 and 2, 5x5 and dilated windows, padding past the window.
  // (shape, outputs): depthwise ones, then 1x1 ones (ShuffleNet's between its depthwise
  // layers, and odd sizes).
  const std::pair<hn::LoweringShape, index_t> cases[] = {
      {lowering(2, 58, 12, 12, 3, 3, 1, 1, 2, 2, 1, 1, 58), 58},  // ShuffleNet's, stride 2
      {lowering(3, 29, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 29), 29},    // stride 1, 7x7
      {lowering(2, 32, 17, 19, 3, 3, 1, 1, 1, 1, 1, 1, 32), 32},  // planes of 323 pixels
      {lowering(1, 16, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 16), 16},    // one tile exactly
      {lowering(2, 48, 13, 11, 5, 5, 2, 2, 2, 2, 1, 1, 48), 48},  // 5x5, stride 2, odd sizes
      {lowering(2, 7, 9, 12, 3, 5, 0, 1, 1, 2, 2, 1, 7), 7},      // dilated 3x5, 7 channels
      {lowering(1, 20, 6, 6, 3, 3, 3, 3, 2, 2, 1, 1, 20), 20},    // padding past the window
      {lowering(2, 58, 14, 14, 1, 1, 0, 0, 1, 1), 58},            // ShuffleNet's 1x1
      {lowering(3, 5, 7, 7, 1, 1, 0, 0, 1, 1), 13},               // 49 pixels, 13 outputs
      {lowering(1, 24, 16, 8, 1, 1, 0, 0, 1, 1), 6},              // 128 pixels, 6 outputs
      {lowering(2, 9, 11, 13, 1, 1, 0, 0, 1, 1), 1},              // one output row
  };
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 3700;
    index_t case_index = 0;
    for (const auto& entry : cases) {
      // (Not a structured binding: C++17 lambdas cannot capture those.)
      hn::LoweringShape shape = entry.first;
      const index_t c = entry.second;
      shape.plain_kernel = true;
      const bool with_bias = case_index++ % 2 == 0;
      INFO(shape.to_string() << (with_bias ? " with bias" : " no bias"));
      const index_t x_count = shape.image_count(), w_count = conv_weight_count(shape, c);
      const index_t y_count = shape.batch * c * shape.out_h() * shape.out_w();
      // Sums over the taps and channels of a window (the forward, the data gradient).
      const double taps = gemm_tolerance(std::max(shape.channels, c) / shape.groups *
                                         shape.kernel_h * shape.kernel_w);
      const double sums = gemm_tolerance(shape.batch * shape.out_h() * shape.out_w());
      const TwinArray x(drivers, random_floats(x_count, seed++));
      const TwinArray w(drivers, random_floats(w_count, seed++));
      const TwinArray bias(drivers, random_floats(c, seed++));
      const TwinArray dy(drivers, random_floats(y_count, seed++));
      const float* no = nullptr;
      {
        INFO("conv_forward (overwrites y)");
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_forward(shape, c, x[s], w[s], with_bias ? bias[s] : no, y[s]);
        });
        check_close(y, taps);
      }
      {
        INFO("conv_forward_activation, ReLU");
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          if (s == Side::oracle) {
            d.conv_forward(shape, c, x[s], w[s], bias[s], y[s]);
            d.relu_forward(y_count, 0.0f, y[s], y[s]);
          } else {
            d.conv_forward_activation(shape, c, x[s], w[s], bias[s], hn::Activation::relu(0.0f),
                                      y[s]);
          }
        });
        check_close(y, taps);
      }
      {
        INFO("conv_backward_data (overwrites dx, zeros where no output reads)");
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_backward_data(shape, c, w[s], dy[s], dx[s]);
        });
        check_close(dx, taps);
      }
      {
        INFO("conv_backward (both gradients: adds to dweights and dbias)");
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        const TwinArray dw(drivers, random_floats(w_count, seed++, -3.0f, 3.0f));
        const TwinArray db(drivers, random_floats(c, seed++, -3.0f, 3.0f));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.conv_backward(shape, c, x[s], w[s], dy[s], dx[s], dw[s], with_bias ? db[s] : nullptr);
        });
        check_close(dx, taps);
        check_close(dw, sums);
        check_close(db, sums);
      }
    }
  }
}

TEST_CASE("convolution calls on alternating shapes and fresh buffers match the reference",
          "[driver_ops][convolution]") {
  // Drivers that cache per-shape state must bind each call's own addresses.
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    const hn::LoweringShape a = lowering(2, 4, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 2);
    const hn::LoweringShape b = lowering(3, 4, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 2);  // batch only
    std::uint32_t seed = 3300;
    for (const hn::LoweringShape& shape : {a, b, a, a, b}) {
      INFO(shape.to_string());
      const index_t oc = 6;
      const index_t y_count = shape.batch * oc * shape.out_h() * shape.out_w();
      const index_t w_count = conv_weight_count(shape, oc);
      const TwinArray x(drivers, random_floats(shape.image_count(), seed++));
      const TwinArray w(drivers, random_floats(w_count, seed++));
      const TwinArray bias(drivers, random_floats(oc, seed++));
      const TwinArray y(drivers, constant(y_count, kNaN));
      const TwinArray dx(drivers, constant(shape.image_count(), kNaN));
      const TwinArray dw(drivers, random_floats(w_count, seed++));
      const TwinArray db(drivers, random_floats(oc, seed++));
      run_both(drivers, [&](hn::Driver& d, Side s) {
        d.conv_forward(shape, oc, x[s], w[s], bias[s], y[s]);
        d.conv_backward_data(shape, oc, w[s], y[s], dx[s]);
        d.conv_backward_weights(shape, oc, x[s], y[s], dw[s], db[s]);
        d.conv_backward(shape, oc, x[s], w[s], y[s], dx[s], dw[s], db[s]);
      });
      check_close(y, gemm_tolerance(18));
      check_close(dx, gemm_tolerance(27));
      check_close(dw, gemm_tolerance(shape.batch * 63));
      check_close(db, gemm_tolerance(shape.batch * 63));
    }
  }
}

// ---- element-wise and reductions ----------------------------------------------------

TEST_CASE(
    "fill, scale, axpy, axpby, lincomb, lincomb_relu and mul match the reference on every "
    "driver",
    "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 600;
    for (const index_t n : kVectorSizes) {
      INFO("n=" << n);
      const std::vector<float> x_values = random_floats(n, seed++);
      const std::vector<float> y_values = random_floats(n, seed++);
      {
        INFO("fill over NaN");
        const TwinArray y(drivers, constant(n, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.fill(n, 3.25f, y[s]); });
        check_identical(y);
      }
      for (const float alpha : {0.5f, -3.0f, 1.0f}) {
        INFO("scale alpha=" << alpha);
        const TwinArray y(drivers, y_values);
        run_both(drivers, [&](hn::Driver& d, Side s) { d.scale(n, alpha, y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      for (const float alpha : {0.5f, -3.0f, 1.0f}) {
        INFO("axpy alpha=" << alpha);
        const TwinArray x(drivers, x_values), y(drivers, y_values);
        run_both(drivers, [&](hn::Driver& d, Side s) { d.axpy(n, alpha, x[s], y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      for (const float alpha : {0.5f, -3.0f}) {
        for (const float beta : {0.0f, 1.0f, 0.9f}) {
          INFO("axpby alpha=" << alpha << " beta=" << beta << " (beta 0: y holds NaN)");
          const TwinArray x(drivers, x_values);
          const TwinArray y(drivers, beta == 0.0f ? constant(n, kNaN) : y_values);
          run_both(drivers, [&](hn::Driver& d, Side s) { d.axpby(n, alpha, x[s], beta, y[s]); });
          check_close(y, kElementwiseTolerance);
        }
      }
      for (const int target : {0, 1, 2}) {
        INFO("lincomb into " << (target == 0 ? "y" : target == 1 ? "a" : "b"));
        const TwinArray a(drivers, x_values), b(drivers, y_values);
        const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
        const TwinArray& out = target == 0 ? y : target == 1 ? a : b;
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.lincomb(n, 0.5f, a[s], -3.0f, b[s], out[s]); });
        check_close(out, kElementwiseTolerance);
      }
      for (const float slope : {0.0f, 0.1f}) {
        for (const int target : {0, 1, 2}) {
          INFO("lincomb_relu slope " << slope << " into "
                                     << (target == 0   ? "y"
                                         : target == 1 ? "a"
                                                       : "b"));
          const TwinArray a(drivers, x_values), b(drivers, y_values);
          const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
          const TwinArray& out = target == 0 ? y : target == 1 ? a : b;
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.lincomb_relu(n, 1.0f, a[s], 0.5f, b[s], slope, out[s]);
          });
          check_close(out, kElementwiseTolerance);
        }
      }
      {
        INFO("mul");
        const TwinArray a(drivers, x_values), b(drivers, y_values);
        const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.mul(n, a[s], b[s], y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      {
        INFO("mul in place (y == a)");
        const TwinArray a(drivers, x_values), b(drivers, y_values);
        run_both(drivers, [&](hn::Driver& d, Side s) { d.mul(n, a[s], b[s], a[s]); });
        check_close(a, kElementwiseTolerance);
      }
    }
  }
}

// A value's bits may not depend on where the array it is in begins or ends (a chunk of a
// thread, a slice of the batch): a split net is bitwise the unsplit one. The CPU driver's
// AVX2 build computes lincomb_relu on 8-float vectors with the last values padded, not in a
// scalar loop that gcc may contract into an FMA.
TEST_CASE("lincomb_relu gives each value the same bits wherever the array is cut, on every driver",
          "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const index_t n = 1001;
    const std::vector<float> a_values = random_floats(n, 650), b_values = random_floats(n, 651);
    const DeviceArray a(*driver, a_values), b(*driver, b_values),
        whole(*driver, static_cast<std::size_t>(n));
    driver->lincomb_relu(n, 0.7f, a.data(), -1.3f, b.data(), 0.1f, whole.data());
    const std::vector<float> want = whole.host();
    for (const index_t cut : {1, 3, 7, 8, 9, 13, 500, 993, 1000}) {
      INFO("cut at " << cut);
      const DeviceArray parts(*driver, static_cast<std::size_t>(n));
      driver->lincomb_relu(cut, 0.7f, a.data(), -1.3f, b.data(), 0.1f, parts.data());
      driver->lincomb_relu(n - cut, 0.7f, a.data() + cut, -1.3f, b.data() + cut, 0.1f,
                           parts.data() + cut);
      CHECK(parts.host() == want);
    }
  }
}

TEST_CASE("add_scalar and powx match the reference on every driver, in place too",
          "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 650;
    for (const index_t n : kVectorSizes) {
      INFO("n=" << n);
      for (const float alpha : {1.0f, -0.375f, 1e3f}) {
        INFO("add_scalar alpha=" << alpha);
        const TwinArray x(drivers, random_floats(n, seed++));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.add_scalar(n, alpha, x[s]); });
        check_close(x, kElementwiseTolerance);
      }
      // Positive bases for any exponent (Caffe's LRN and Power use 0.75, 0.5, -0.75, ...).
      const std::vector<float> positive = random_floats(n, seed++, 0.05f, 4.0f);
      for (const float exponent : {0.5f, -0.75f, 2.0f, 1.0f, 0.0f, 3.3f}) {
        INFO("powx exponent=" << exponent);
        const TwinArray x(drivers, positive);
        const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.powx(n, x[s], exponent, y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      // Negative bases with integer exponents are defined: (-2)^3 = -8.
      for (const float exponent : {2.0f, 3.0f, -1.0f}) {
        INFO("powx of signed bases, in place, exponent=" << exponent);
        std::vector<float> signed_bases = random_floats(n, seed++, -2.0f, 2.0f);
        for (float& v : signed_bases)
          v += v < 0.0f ? -0.25f : 0.25f;  // away from 0 for the exponent -1
        const TwinArray x(drivers, signed_bases);
        run_both(drivers, [&](hn::Driver& d, Side s) { d.powx(n, x[s], exponent, x[s]); });
        check_close(x, kElementwiseTolerance);
      }
    }
  }
}

TEST_CASE("copy_strided copies the block bit for bit and leaves the padding on every driver",
          "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 660;
    // rows, cols, src_ld, dst_ld: contiguous, Concat-like (narrow into wide), Slice-like
    // (wide into narrow), and a large one for the parallel paths.
    const std::vector<std::vector<index_t>> cases = {
        {1, 1, 1, 1},   {3, 7, 7, 7},          {13, 31, 31, 44},
        {97, 3, 10, 3}, {7, 13, 29, 17},       {1, 97, 97, 200},
        {31, 1, 2, 3},  {1000, 97, 1000, 131}, {2, 100003, 100003, 100003}};
    for (const auto& c : cases) {
      const index_t rows = c[0], cols = c[1], src_ld = c[2], dst_ld = c[3];
      INFO("copy_strided rows=" << rows << " cols=" << cols << " src_ld=" << src_ld
                                << " dst_ld=" << dst_ld);
      const TwinArray src(drivers,
                          padded(random_floats(rows * cols, seed++), rows, cols, src_ld, kNaN));
      const TwinArray dst(drivers, constant(rows * dst_ld, kSentinel));
      run_both(drivers, [&](hn::Driver& d, Side s) {
        d.copy_strided(rows, cols, src[s], src_ld, dst[s], dst_ld);
      });
      check_identical(dst);
    }
  }
}

TEST_CASE(
    "copy_strided_batched copies every image's block bit for bit and leaves the rest on every "
    "driver",
    "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 665;
    // batch, rows, cols, src_ld, src_stride, dst_ld, dst_stride: one image, images apart
    // on both sides, images back to back (one block), one source for every image, and
    // ShuffleNet v2's cut (a run of channels of each image into every other channel).
    const std::vector<std::vector<index_t>> cases = {{1, 3, 7, 7, 0, 7, 0},
                                                     {4, 3, 5, 5, 17, 10, 31},
                                                     {5, 4, 6, 6, 24, 6, 24},
                                                     {3, 2, 4, 4, 0, 4, 8},
                                                     {3, 0, 4, 4, 9, 4, 9},
                                                     {0, 3, 4, 4, 12, 4, 12},
                                                     {32, 29, 196, 196, 22736, 392, 11368}};
    for (const auto& c : cases) {
      const index_t batch = c[0], rows = c[1], cols = c[2], src_ld = c[3], src_stride = c[4],
                    dst_ld = c[5], dst_stride = c[6];
      INFO("copy_strided_batched batch=" << batch << " rows=" << rows << " cols=" << cols
                                         << " src_ld=" << src_ld << " src_stride=" << src_stride
                                         << " dst_ld=" << dst_ld << " dst_stride=" << dst_stride);
      const auto span = [&](index_t ld, index_t stride) {
        return std::max<index_t>(1, (std::max<index_t>(batch, 1) - 1) * stride +
                                        (std::max<index_t>(rows, 1) - 1) * ld + cols);
      };
      const TwinArray src(drivers, random_floats(span(src_ld, src_stride), seed++));
      const TwinArray dst(drivers, constant(span(dst_ld, dst_stride), kSentinel));
      run_both(drivers, [&](hn::Driver& d, Side s) {
        d.copy_strided_batched(batch, rows, cols, src[s], src_ld, src_stride, dst[s], dst_ld,
                               dst_stride);
      });
      check_identical(dst);
    }
  }
}

TEST_CASE("scale_channels matches the reference on every driver, in place too",
          "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 670;
    for (const hn::AxisShape& shape : axis_cases()) {
      INFO(shape.to_string());
      const TwinArray scale(drivers, random_floats(shape.channels, seed++, -2.0f, 2.0f));
      const std::vector<float> x_values = random_floats(shape.count(), seed++);
      const TwinArray x(drivers, x_values);
      const TwinArray y(drivers, constant(shape.count(), -7777.0f), constant(shape.count(), kNaN));
      run_both(drivers,
               [&](hn::Driver& d, Side s) { d.scale_channels(shape, scale[s], x[s], y[s]); });
      check_close(y, kElementwiseTolerance);
      INFO("in place");
      run_both(drivers,
               [&](hn::Driver& d, Side s) { d.scale_channels(shape, scale[s], x[s], x[s]); });
      check_close(x, kElementwiseTolerance);
    }
  }
}

TEST_CASE("max_accumulate outputs and masks and max_select are identical on every driver",
          "[driver_ops][elementwise]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 680;
    for (const index_t n : kVectorSizes) {
      INFO("n=" << n);
      // Four inputs drawn from eight values, so ties between inputs are frequent: every
      // driver must break them as Caffe does (input 1 over 0, then the earlier input).
      std::vector<std::vector<float>> inputs;
      for (int k = 0; k < 4; ++k) {
        std::vector<float> v = random_floats(n, seed++, 0.0f, 8.0f);
        for (float& e : v)
          e = std::floor(e) - 4.0f;
        inputs.push_back(v);
      }
      // y and mask start as different garbage on each side: index 0 must not read them.
      const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
      TwinMask mask(drivers, n);
      std::vector<std::int32_t> garbage(n);
      for (index_t i = 0; i < n; ++i)
        garbage[i] = static_cast<std::int32_t>(i * 7919 % 1000) - 500;
      mask.upload(garbage);
      for (std::int32_t index = 0; index < 4; ++index) {
        INFO("max_accumulate of input " << index);
        const TwinArray x(drivers, inputs[index]);
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.max_accumulate(n, x[s], index, y[s], mask[s]); });
        check_identical(y);
        check_identical(mask);
      }
      const std::vector<float> dy_values = random_floats(n, seed++);
      const TwinArray dy(drivers, dy_values);
      for (std::int32_t index = 0; index < 4; ++index) {
        INFO("max_select of input " << index);
        const TwinArray dx(drivers, constant(n, -7777.0f), constant(n, kNaN));
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.max_select(n, mask[s], index, dy[s], dx[s]); });
        check_identical(dx);
      }
      INFO("max_select in place (dx == dy)");
      const TwinArray g(drivers, dy_values);
      run_both(drivers, [&](hn::Driver& d, Side s) { d.max_select(n, mask[s], 2, g[s], g[s]); });
      check_identical(g);
    }
  }
}

// |got - want| <= tolerance * max(1, |want|) + 1e-6 * magnitude, where magnitude is the sum
// of the absolute terms: a sum that cancels to near zero keeps the rounding of its terms.
void check_reduction(float got, float want, double magnitude) {
  INFO("driver " << got << ", reference " << want << ", sum of |terms| " << magnitude);
  CHECK(std::abs(static_cast<double>(got) - want) <=
        kReductionTolerance * std::max(1.0, std::abs(static_cast<double>(want))) +
            1e-6 * magnitude);
}

TEST_CASE("dot, asum and sum match the reference on every driver", "[driver_ops][reductions]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 700;
    for (const index_t n : kVectorSizes) {
      INFO("n=" << n);
      const std::vector<float> x_values = random_floats(n, seed++);
      const std::vector<float> y_values = random_floats(n, seed++, -2.0f, 3.0f);
      const TwinArray x(drivers, x_values), y(drivers, y_values);
      double abs_x = 0.0, abs_xy = 0.0;
      for (index_t i = 0; i < n; ++i) {
        abs_x += std::abs(x_values[i]);
        abs_xy += std::abs(x_values[i] * y_values[i]);
      }
      {
        INFO("dot");
        check_reduction(drivers.driver->dot(n, x[Side::tested], y[Side::tested]),
                        drivers.oracle->dot(n, x[Side::oracle], y[Side::oracle]), abs_xy);
      }
      {
        INFO("asum");
        check_reduction(drivers.driver->asum(n, x[Side::tested]),
                        drivers.oracle->asum(n, x[Side::oracle]), abs_x);
      }
      {
        INFO("sum");
        check_reduction(drivers.driver->sum(n, x[Side::tested]),
                        drivers.oracle->sum(n, x[Side::oracle]), abs_x);
      }
    }
  }
}

TEST_CASE("bias_forward and bias_backward match the reference on every driver",
          "[driver_ops][bias]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 800;
    for (const hn::AxisShape& shape : axis_cases()) {
      INFO(shape.to_string());
      {
        INFO("bias_forward");
        const TwinArray bias(drivers, random_floats(shape.channels, seed++));
        const TwinArray y(drivers, random_floats(shape.count(), seed++));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.bias_forward(shape, bias[s], y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      for (const float beta : {0.0f, 1.0f}) {
        INFO("bias_backward beta=" << beta << " (beta 0: dbias holds NaN)");
        const TwinArray dy(drivers, random_floats(shape.count(), seed++));
        const TwinArray dbias(drivers, beta == 0.0f ? constant(shape.channels, kNaN)
                                                    : random_floats(shape.channels, seed++));
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.bias_backward(shape, dy[s], beta, dbias[s]); });
        check_close(dbias, kReductionTolerance);
      }
      for (const float slope : {0.0f, 0.1f}) {
        for (const bool in_place : {false, true}) {
          INFO("relu_backward_bias slope " << slope << (in_place ? ", in place" : ""));
          const std::vector<float> dy_values = random_floats(shape.count(), seed++);
          const TwinArray y(drivers, random_floats(shape.count(), seed++));
          const TwinArray dy(drivers, dy_values);
          const TwinArray dx(drivers, constant(shape.count(), -7777.0f),
                             constant(shape.count(), kNaN));
          const TwinArray dbias(drivers, random_floats(shape.channels, seed++));
          const TwinArray& out = in_place ? dy : dx;
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.relu_backward_bias(shape, slope, y[s], dy[s], out[s], dbias[s]);
          });
          check_close(out, kElementwiseTolerance);
          check_close(dbias, kReductionTolerance);
          // The same bits as the two calls it fuses, on the tested driver.
          hn::Driver& d = *drivers.driver;
          const TwinArray apart(drivers, dy_values);
          const TwinArray sums(drivers, constant(shape.channels, 0.0f));
          const TwinArray fused(drivers, dy_values);
          const TwinArray fused_sums(drivers, constant(shape.channels, 0.0f));
          d.relu_backward(shape.count(), slope, y[Side::tested], apart[Side::tested],
                          apart[Side::tested]);
          d.bias_backward(shape, apart[Side::tested], 1.0f, sums[Side::tested]);
          d.relu_backward_bias(shape, slope, y[Side::tested], fused[Side::tested],
                               fused[Side::tested], fused_sums[Side::tested]);
          check_identical(fused.tested(), apart.tested());
          check_identical(fused_sums.tested(), sums.tested());
        }
      }
    }
  }
}

TEST_CASE("bias_backward with no images scales dbias by beta on every driver",
          "[driver_ops][bias]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const hn::AxisShape shape = axis(0, 5, 3);
    const std::vector<float> values = {1.0f, -2.0f, 0.5f, 4.0f, -0.25f};
    const DeviceArray dy(*driver, 4);
    {
      const DeviceArray dbias(*driver, constant(5, kNaN));
      driver->bias_backward(shape, dy.data(), 0.0f, dbias.data());
      check_identical(dbias.host(), constant(5, 0.0f));
    }
    for (const float beta : {1.0f, 0.5f}) {
      INFO("beta=" << beta);
      const DeviceArray dbias(*driver, values);
      driver->bias_backward(shape, dy.data(), beta, dbias.data());
      std::vector<float> want = values;
      for (float& v : want)
        v *= beta;  // exact: beta is a power of two
      check_identical(dbias.host(), want);
    }
  }
}

// ---- activations --------------------------------------------------------------------

TEST_CASE("relu forward and backward match the reference on every driver, in place too",
          "[driver_ops][activations]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 900;
    for (const index_t n : kVectorSizes) {
      for (const float slope : {0.0f, 0.1f}) {
        INFO("n=" << n << " negative_slope=" << slope);
        const std::vector<float> x_values = floats_with_zeros(n, seed++);
        const std::vector<float> dy_values = random_floats(n, seed++);
        const TwinArray x(drivers, x_values), dy(drivers, dy_values);
        {
          INFO("relu_forward");
          const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) { d.relu_forward(n, slope, x[s], y[s]); });
          check_close(y, kElementwiseTolerance);
        }
        {
          INFO("relu_forward in place");
          const TwinArray xy(drivers, x_values);
          run_both(drivers, [&](hn::Driver& d, Side s) { d.relu_forward(n, slope, xy[s], xy[s]); });
          check_close(xy, kElementwiseTolerance);
        }
        {
          INFO("relu_backward");
          const TwinArray dx(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers,
                   [&](hn::Driver& d, Side s) { d.relu_backward(n, slope, x[s], dy[s], dx[s]); });
          check_close(dx, kElementwiseTolerance);
        }
        {
          INFO("relu_backward in place (dx == dy)");
          const TwinArray g(drivers, dy_values);
          run_both(drivers,
                   [&](hn::Driver& d, Side s) { d.relu_backward(n, slope, x[s], g[s], g[s]); });
          check_close(g, kElementwiseTolerance);
        }
      }
    }
  }
}

TEST_CASE("clip forward and backward match the reference on every driver, bounds included",
          "[driver_ops][activations]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 950;
    for (const index_t n : kVectorSizes) {
      for (const std::pair<float, float>& bounds :
           {std::pair{0.0f, 6.0f}, std::pair{-0.5f, 0.25f}}) {
        const float lo = bounds.first, hi = bounds.second;
        INFO("n=" << n << " lo=" << lo << " hi=" << hi);
        std::vector<float> x_values = random_floats(n, seed++, -8.0f, 8.0f);
        for (std::size_t i = 0; i < x_values.size(); i += 5)  // the bounds themselves
          x_values[i] = i % 10 == 0 ? lo : hi;
        const std::vector<float> dy_values = random_floats(n, seed++);
        const TwinArray x(drivers, x_values), dy(drivers, dy_values);
        {
          INFO("clip_forward");
          const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) { d.clip_forward(n, lo, hi, x[s], y[s]); });
          check_close(y, 0.0);
        }
        {
          INFO("clip_forward in place");
          const TwinArray xy(drivers, x_values);
          run_both(drivers,
                   [&](hn::Driver& d, Side s) { d.clip_forward(n, lo, hi, xy[s], xy[s]); });
          check_close(xy, 0.0);
        }
        {
          INFO("clip_backward in place (dx == dy)");
          const TwinArray g(drivers, dy_values);
          run_both(drivers,
                   [&](hn::Driver& d, Side s) { d.clip_backward(n, lo, hi, x[s], g[s], g[s]); });
          check_close(g, 0.0);
        }
      }
    }
  }
}

// Inputs over the useful range plus saturating extremes (exp overflows beyond ~88).
std::vector<float> activation_inputs(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, -8.0f, 8.0f);
  const float extremes[] = {0.0f, 50.0f, -50.0f, 100.0f, -100.0f, 1e-7f, -1e-7f};
  for (std::size_t i = 0; i < n && i < std::size(extremes); ++i)
    v[i * 7 % n] = extremes[i];
  return v;
}

TEST_CASE(
    "sigmoid and tanh forward and backward match the reference on every driver, in place "
    "too",
    "[driver_ops][activations]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1000;
    using Forward = void (hn::Driver::*)(index_t, const float*, float*);
    using Backward = void (hn::Driver::*)(index_t, const float*, const float*, float*);
    struct Activation {
      const char* name;
      Forward forward;
      Backward backward;
      float y_lo, y_hi;  // range of y for the backward inputs
    };
    const Activation activations[] = {
        {"sigmoid", &hn::Driver::sigmoid_forward, &hn::Driver::sigmoid_backward, 0.0f, 1.0f},
        {"tanh", &hn::Driver::tanh_forward, &hn::Driver::tanh_backward, -1.0f, 1.0f}};
    for (const Activation& act : activations) {
      for (const index_t n : kVectorSizes) {
        INFO(act.name << " n=" << n);
        const std::vector<float> x_values = activation_inputs(n, seed++);
        const std::vector<float> y_values = random_floats(n, seed++, act.y_lo, act.y_hi);
        const std::vector<float> dy_values = random_floats(n, seed++);
        const TwinArray x(drivers, x_values);
        {
          INFO("forward");
          const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) { (d.*act.forward)(n, x[s], y[s]); });
          check_close(y, kElementwiseTolerance);
        }
        {
          INFO("forward in place");
          const TwinArray xy(drivers, x_values);
          run_both(drivers, [&](hn::Driver& d, Side s) { (d.*act.forward)(n, xy[s], xy[s]); });
          check_close(xy, kElementwiseTolerance);
        }
        const TwinArray y(drivers, y_values), dy(drivers, dy_values);
        {
          INFO("backward");
          const TwinArray dx(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers,
                   [&](hn::Driver& d, Side s) { (d.*act.backward)(n, y[s], dy[s], dx[s]); });
          check_close(dx, kElementwiseTolerance);
        }
        {
          INFO("backward in place (dx == dy)");
          const TwinArray g(drivers, dy_values);
          run_both(drivers, [&](hn::Driver& d, Side s) { (d.*act.backward)(n, y[s], g[s], g[s]); });
          check_close(g, kElementwiseTolerance);
        }
      }
    }
  }
}

// ---- pooling ------------------------------------------------------------------------

TEST_CASE("max pooling outputs and masks are identical on every driver", "[driver_ops][pooling]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1100;
    for (const hn::PoolShape& shape : pool_cases()) {
      // Mixed signs, then all negative (the running maximum must start below every input).
      for (const float lo : {-0.5f, -3.0f}) {
        INFO(shape.to_string() << " inputs in [" << lo << ", " << lo + 1.0f << ")");
        const TwinArray x(drivers, distinct_floats(shape.in_count(), seed++, lo));
        const TwinArray y(drivers, constant(shape.out_count(), -7777.0f),
                          constant(shape.out_count(), kNaN));
        TwinMask mask(drivers, shape.out_count());
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.pool_max_forward(shape, x[s], y[s], mask[s]); });
        check_identical(y);
        check_identical(mask);
      }
    }
  }
}

TEST_CASE("max pooling backward matches the reference on every driver", "[driver_ops][pooling]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1200;
    for (const hn::PoolShape& shape : pool_cases()) {
      INFO(shape.to_string());
      // The oracle's mask feeds both, so backward is checked on its own.
      const DeviceArray x(*drivers.oracle, distinct_floats(shape.in_count(), seed++, -0.5f));
      const DeviceArray y(*drivers.oracle, shape.out_count());
      MaskArray oracle_mask(*drivers.oracle, shape.out_count());
      drivers.oracle->pool_max_forward(shape, x.data(), y.data(), oracle_mask.data());
      TwinMask mask(drivers, shape.out_count());
      mask.upload(oracle_mask.host());

      const TwinArray dy(drivers, random_floats(shape.out_count(), seed++));
      const TwinArray dx(drivers, constant(shape.in_count(), -7777.0f),
                         constant(shape.in_count(), kNaN));
      run_both(drivers,
               [&](hn::Driver& d, Side s) { d.pool_max_backward(shape, dy[s], mask[s], dx[s]); });
      check_close(dx, kElementwiseTolerance);
    }
  }
}

TEST_CASE("average pooling forward and backward match the reference on every driver",
          "[driver_ops][pooling]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1300;
    for (const hn::PoolShape& shape : pool_cases()) {
      INFO(shape.to_string());
      {
        INFO("pool_avg_forward");
        const TwinArray x(drivers, random_floats(shape.in_count(), seed++));
        const TwinArray y(drivers, constant(shape.out_count(), -7777.0f),
                          constant(shape.out_count(), kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.pool_avg_forward(shape, x[s], y[s]); });
        check_close(y, kElementwiseTolerance);
      }
      {
        INFO("pool_avg_backward");
        const TwinArray dy(drivers, random_floats(shape.out_count(), seed++));
        const TwinArray dx(drivers, constant(shape.in_count(), -7777.0f),
                           constant(shape.in_count(), kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.pool_avg_backward(shape, dy[s], dx[s]); });
        check_close(dx, kElementwiseTolerance);
      }
    }
  }
}

// ---- LRN and softmax ----------------------------------------------------------------

TEST_CASE("lrn forward and backward match the reference on every driver in both regions",
          "[driver_ops][lrn]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1400;
    for (const hn::LrnShape& shape : lrn_cases()) {
      INFO(shape.to_string());
      const index_t count = shape.count();
      const std::vector<float> x_values = random_floats(count, seed++, -2.0f, 2.0f);
      const TwinArray x(drivers, x_values);
      {
        INFO("lrn_forward: y and scale");
        const TwinArray y(drivers, constant(count, -7777.0f), constant(count, kNaN));
        const TwinArray scale(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers,
                 [&](hn::Driver& d, Side s) { d.lrn_forward(shape, x[s], y[s], scale[s]); });
        check_close(y, kReductionTolerance);
        check_close(scale, kReductionTolerance);
      }
      {
        INFO("lrn_backward (given the reference's y and scale)");
        const DeviceArray oracle_y(*drivers.oracle, count), oracle_scale(*drivers.oracle, count);
        drivers.oracle->lrn_forward(shape, x[Side::oracle], oracle_y.data(), oracle_scale.data());
        const TwinArray y(drivers, oracle_y.host()), scale(drivers, oracle_scale.host());
        const TwinArray dy(drivers, random_floats(count, seed++));
        const TwinArray dx(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.lrn_backward(shape, x[s], y[s], scale[s], dy[s], dx[s]);
        });
        check_close(dx, kReductionTolerance);
      }
    }
  }
}

TEST_CASE("softmax forward and backward match the reference on every driver",
          "[driver_ops][softmax]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1500;
    for (const hn::AxisShape& shape : axis_cases()) {
      // Ordinary logits, then large ones whose exp overflows unless the maximum is taken off.
      for (const float lo : {-10.0f, 80.0f}) {
        INFO(shape.to_string() << " logits in [" << lo << ", " << lo + 20.0f << ")");
        const index_t count = shape.count();
        const TwinArray x(drivers, random_floats(count, seed++, lo, lo + 20.0f));
        const TwinArray y(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) { d.softmax_forward(shape, x[s], y[s]); });
        check_close(y, kElementwiseTolerance);

        INFO("softmax_backward (given the reference's y)");
        const TwinArray y_given(drivers, y.oracle());
        const TwinArray dy(drivers, random_floats(count, seed++));
        const TwinArray dx(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.softmax_backward(shape, y_given[s], dy[s], dx[s]);
        });
        check_close(dx, kElementwiseTolerance);
      }
    }
  }
}

// ---- dropout ------------------------------------------------------------------------

constexpr std::uint64_t kHighCounter = (std::uint64_t{1} << 32) - 3;  // crosses 2^32

TEST_CASE("dropout masks and outputs are bitwise identical on every driver",
          "[driver_ops][dropout]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1600;
    const std::uint64_t seeds[] = {0, 42, 0xDEADBEEFCAFEull};
    const std::uint64_t offsets[] = {0, 12345, kHighCounter};
    int round = 0;
    for (const index_t n : {1, 7, 97, 1000, 10007}) {
      for (const float ratio : {0.0f, 0.1f, 0.5f, 0.9f}) {
        const std::uint64_t draw_seed = seeds[round % 3], offset = offsets[(round / 3) % 3];
        ++round;
        INFO("n=" << n << " ratio=" << ratio << " seed=" << draw_seed << " offset=" << offset);
        const std::vector<float> x_values = random_floats(n, seed++);
        const TwinArray x(drivers, x_values);
        const TwinArray y(drivers, constant(n, -7777.0f), constant(n, kNaN));
        const TwinArray mask(drivers, constant(n, -7777.0f), constant(n, kNaN));
        run_both(drivers, [&](hn::Driver& d, Side s) {
          d.dropout_forward(n, ratio, draw_seed, offset, x[s], y[s], mask[s]);
        });
        check_identical(mask);
        check_identical(y);
        {
          INFO("dropout_forward in place (y == x)");
          const TwinArray xy(drivers, x_values);
          const TwinArray mask_in_place(drivers, constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.dropout_forward(n, ratio, draw_seed, offset, xy[s], xy[s], mask_in_place[s]);
          });
          check_identical(xy.tested(), y.oracle());
          check_identical(mask_in_place.tested(), mask.oracle());
        }
        {
          INFO("dropout_backward (given the reference's mask)");
          const TwinArray given_mask(drivers, mask.oracle());
          const TwinArray dy(drivers, random_floats(n, seed++));
          const TwinArray dx(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.dropout_backward(n, ratio, given_mask[s], dy[s], dx[s]);
          });
          check_identical(dx);
        }
      }
    }
  }
}

TEST_CASE("dropout keeps exactly the elements whose philox draw is >= ratio on every driver",
          "[driver_ops][dropout]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const index_t n = 4099;
    const std::uint64_t draw_seed = 7, offset = kHighCounter;
    const std::vector<float> x_values = random_floats(n, 1700);
    for (const float ratio : {0.0f, 0.3f, 0.5f}) {
      INFO("ratio=" << ratio);
      const DeviceArray x(*driver, x_values), y(*driver, n), mask(*driver, n);
      driver->dropout_forward(n, ratio, draw_seed, offset, x.data(), y.data(), mask.data());
      // Independent of any driver: the rule stated in driver.h, recomputed here.
      const float s = 1.0f / (1.0f - ratio);
      std::vector<float> want_mask(n), want_y(n);
      for (index_t i = 0; i < n; ++i) {
        const bool keep = hn::detail::philox_uniform(draw_seed, offset + i) >= ratio;
        want_mask[i] = keep ? 1.0f : 0.0f;
        want_y[i] = keep ? x_values[i] * s : 0.0f;
      }
      check_identical(mask.host(), want_mask);
      check_identical(y.host(), want_y);
    }
  }
}

TEST_CASE("dropout of elements a..n at offset a equals the tail of the full run on every driver",
          "[driver_ops][dropout]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    const float ratio = 0.5f;
    const std::uint64_t draw_seed = 1234;
    for (const std::uint64_t offset : {std::uint64_t{0}, kHighCounter}) {
      for (const index_t n : {97, 1000}) {
        const std::vector<float> x_values = random_floats(n, 1800);
        // The full run on the reference.
        const DeviceArray full_x(*drivers.oracle, x_values), full_y(*drivers.oracle, n),
            full_mask(*drivers.oracle, n);
        drivers.oracle->dropout_forward(n, ratio, draw_seed, offset, full_x.data(), full_y.data(),
                                        full_mask.data());
        const std::vector<float> want_y = full_y.host(), want_mask = full_mask.host();
        for (const index_t a : {index_t{0}, index_t{1}, index_t{13}, n / 2, n - 1, n}) {
          INFO("n=" << n << " split at a=" << a << " offset=" << offset);
          // Head [0, a) and tail [a, n) as two slices of one batch on the driver under test.
          const DeviceArray x(*drivers.driver, x_values), y(*drivers.driver, constant(n, kNaN)),
              mask(*drivers.driver, constant(n, kNaN));
          drivers.driver->dropout_forward(n - a, ratio, draw_seed, offset + a, x.data() + a,
                                          y.data() + a, mask.data() + a);
          drivers.driver->dropout_forward(a, ratio, draw_seed, offset, x.data(), y.data(),
                                          mask.data());
          check_identical(y.host(), want_y);
          check_identical(mask.host(), want_mask);
        }
      }
    }
  }
}

TEST_CASE("dropout_forward_layout on NCHW images draws dropout_forward's mask on every driver",
          "[driver_ops][dropout]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    for (const hn::AxisShape& shape : {hn::test::axis(3, 5, 7), hn::test::axis(2, 16, 1)}) {
      for (const std::uint64_t offset : {std::uint64_t{0}, kHighCounter}) {
        INFO(shape.to_string() << " offset=" << offset);
        const index_t n = shape.count();
        const std::vector<float> x_values = random_floats(n, 1900);
        const DeviceArray full_x(*drivers.oracle, x_values), full_y(*drivers.oracle, n),
            full_mask(*drivers.oracle, n);
        drivers.oracle->dropout_forward(n, 0.4f, 99, offset, full_x.data(), full_y.data(),
                                        full_mask.data());
        const DeviceArray x(*drivers.driver, x_values), y(*drivers.driver, constant(n, kNaN)),
            mask(*drivers.driver, constant(n, kNaN));
        drivers.driver->dropout_forward_layout(shape, 0.4f, 99, offset, x.data(), y.data(),
                                               mask.data());
        check_identical(y.host(), full_y.host());
        check_identical(mask.host(), full_mask.host());
      }
    }
  }
}

// ---- losses -------------------------------------------------------------------------

struct LabelCase {
  bool has_ignore_label;
  int ignore_label;
};

// Integer labels in [0, channels), with the ignore_label at every 5th position when there is
// one (it may also be a class, as Caffe allows: ignore_label 0 skips the background).
std::vector<float> random_labels(const hn::AxisShape& s, const LabelCase& c, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> labels(static_cast<std::size_t>(s.outer * s.inner));
  for (std::size_t p = 0; p < labels.size(); ++p) {
    labels[p] = static_cast<float>(uniform(rng, 0, s.channels - 1));
    if (c.has_ignore_label && p % 5 == 2) labels[p] = static_cast<float>(c.ignore_label);
  }
  return labels;
}

// Probabilities with an exact 0 every 11th element (-log clamps it at FLT_MIN).
std::vector<float> probabilities(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, 1e-3f, 1.0f);
  for (std::size_t i = 0; i < n; i += 11)
    v[i] = 0.0f;
  return v;
}

TEST_CASE(
    "softmax_loss forward and backward match the reference on every driver, with "
    "ignore_label",
    "[driver_ops][losses]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1600;
    for (const hn::AxisShape& shape : axis_cases()) {
      for (const LabelCase& labels :
           {LabelCase{false, -1}, LabelCase{true, -1}, LabelCase{true, 255}, LabelCase{true, 0}}) {
        INFO(shape.to_string() << " has_ignore_label=" << labels.has_ignore_label
                               << " ignore_label=" << labels.ignore_label);
        const index_t count = shape.count(), positions = shape.outer * shape.inner;
        const std::vector<float> prob_values = probabilities(count, seed++);
        const TwinArray prob(drivers, prob_values);
        const TwinArray label(drivers, random_labels(shape, labels, seed++));
        {
          INFO("softmax_loss_forward");
          const TwinArray loss(drivers, constant(positions, -7777.0f), constant(positions, kNaN));
          const TwinArray valid(drivers, constant(positions, -7777.0f), constant(positions, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.softmax_loss_forward(shape, prob[s], label[s], labels.has_ignore_label,
                                   labels.ignore_label, loss[s], valid[s]);
          });
          check_close(loss, kElementwiseTolerance);
          check_identical(valid);
        }
        for (const float scale : {1.0f, 0.3f}) {
          INFO("softmax_loss_backward scale=" << scale);
          const TwinArray dx(drivers, constant(count, -7777.0f), constant(count, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.softmax_loss_backward(shape, prob[s], label[s], labels.has_ignore_label,
                                    labels.ignore_label, scale, dx[s]);
          });
          check_close(dx, kElementwiseTolerance);
        }
        {
          INFO("softmax_loss_backward in place (dx == prob)");
          const TwinArray g(drivers, prob_values);
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.softmax_loss_backward(shape, g[s], label[s], labels.has_ignore_label,
                                    labels.ignore_label, 0.5f, g[s]);
          });
          check_close(g, kElementwiseTolerance);
        }
      }
    }
  }
}

TEST_CASE(
    "a softmax_loss label outside the classes is an error naming the call, the label and the "
    "position on every driver, and the driver stays usable",
    "[driver_ops][losses][errors]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto owned = hn::make_driver(config.device, config.options);
    hn::Driver& d = *owned;
    const hn::AxisShape shape = axis(3, 4, 5);
    const DeviceArray prob(d, probabilities(shape.count(), 1700));
    const DeviceArray loss(d, 15), valid(d, 15), dx(d, shape.count());
    std::vector<float> values = random_labels(shape, LabelCase{true, -1}, 1701);
    values[7] = 4.0f;   // (outer 1, inner 2): == channels
    values[12] = 9.0f;  // a later one: the first is named
    const DeviceArray label(d, values);
    // Asynchronous drivers may report at the next synchronising call.
    CHECK_THAT(error_of([&] {
                 d.softmax_loss_forward(shape, prob.data(), label.data(), true, -1, loss.data(),
                                        valid.data());
                 d.synchronize();
               }),
               Contains("softmax_loss_forward") && Contains("label 4") && Contains("outer 1") &&
                   Contains("inner 2") && Contains("[0, 4)"));
    CHECK_THAT(error_of([&] {
                 d.softmax_loss_backward(shape, prob.data(), label.data(), true, -1, 1.0f,
                                         dx.data());
                 d.synchronize();
               }),
               Contains("softmax_loss_backward") && Contains("label 4") && Contains("outer 1") &&
                   Contains("inner 2"));
    // -1 is a class only when it is not the ignore_label.
    const DeviceArray negative(d, constant(15, -1.0f));
    CHECK_THAT(error_of([&] {
                 d.softmax_loss_forward(shape, prob.data(), negative.data(), false, -1, loss.data(),
                                        valid.data());
                 d.synchronize();
               }),
               Contains("softmax_loss_forward") && Contains("label -1") && Contains("outer 0") &&
                   Contains("inner 0"));
    // The error is reported once; later calls work.
    d.softmax_loss_forward(shape, prob.data(), negative.data(), true, -1, loss.data(),
                           valid.data());
    CHECK(d.sum(15, valid.data()) == 0.0f);
    d.synchronize();
  }
}

TEST_CASE("sigmoid_cross_entropy forward and backward match the reference on every driver",
          "[driver_ops][losses]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    std::uint32_t seed = 1800;
    for (const index_t n : kVectorSizes) {
      for (const LabelCase& labels : {LabelCase{false, -1}, LabelCase{true, -1}}) {
        INFO("n=" << n << " has_ignore_label=" << labels.has_ignore_label);
        // Logits with saturating extremes; targets in [0, 1] with exact 0s and 1s, and -1 at
        // every 7th element (ignored when there is an ignore_label, a number otherwise).
        const TwinArray x(drivers, activation_inputs(n, seed++));
        std::vector<float> t = random_floats(n, seed++, 0.0f, 1.0f);
        for (index_t i = 0; i < n; ++i) {
          if (i % 7 == 3) t[i] = -1.0f;
          if (i % 7 == 5) t[i] = static_cast<float>(i % 2);
        }
        const TwinArray target(drivers, t);
        {
          INFO("sigmoid_cross_entropy_forward");
          const TwinArray loss(drivers, constant(n, -7777.0f), constant(n, kNaN));
          const TwinArray valid(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.sigmoid_cross_entropy_forward(n, x[s], target[s], labels.has_ignore_label,
                                            labels.ignore_label, loss[s], valid[s]);
          });
          check_close(loss, kElementwiseTolerance);
          check_identical(valid);
        }
        {
          INFO("sigmoid_cross_entropy_backward");
          const TwinArray dx(drivers, constant(n, -7777.0f), constant(n, kNaN));
          run_both(drivers, [&](hn::Driver& d, Side s) {
            d.sigmoid_cross_entropy_backward(n, x[s], target[s], labels.has_ignore_label,
                                             labels.ignore_label, 0.25f, dx[s]);
          });
          check_close(dx, kElementwiseTolerance);
        }
      }
    }
  }
}

// ---- memory -------------------------------------------------------------------------

TEST_CASE("copies to, within and from every driver round-trip bit for bit",
          "[driver_ops][memory]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    std::uint32_t seed = 1900;
    for (const std::size_t n :
         {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
      INFO("n=" << n << " floats");
      const std::size_t bytes = n * sizeof(float);
      const std::vector<float> values = random_floats(n, seed++);
      hn::Buffer src(*driver, bytes), dst(*driver, 2 * bytes);
      driver->reset_transfer_stats();
      driver->copy_from_host(src.address(), values.data(), bytes);
      // Into the second half of dst: an interior address of an allocation.
      driver->copy(dst.as<float>() + n, src.address(), bytes);
      std::vector<float> back(n, kNaN);
      driver->copy_to_host(back.data(), dst.as<float>() + n, bytes);
      driver->synchronize();
      check_identical(back, values);
      // Zero-byte copies are no-ops and not counted.
      driver->copy_from_host(src.address(), values.data(), 0);
      driver->copy(dst.address(), src.address(), 0);
      driver->copy_to_host(back.data(), src.address(), 0);
      const hn::TransferStats& stats = driver->transfer_stats();
      CHECK(stats.to_device == 1);
      CHECK(stats.to_device_bytes == bytes);
      CHECK(stats.within == 1);
      CHECK(stats.within_bytes == bytes);
      CHECK(stats.to_host == 1);
      CHECK(stats.to_host_bytes == bytes);
    }
  }
}

// ---- zero-sized calls ---------------------------------------------------------------

TEST_CASE("calls with no elements leave memory untouched on every driver", "[driver_ops]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto owned = hn::make_driver(config.device, config.options);
    hn::Driver& d = *owned;
    const std::vector<float> sentinel = constant(16, kSentinel);
    const DeviceArray a(d, sentinel), b(d, sentinel), c(d, sentinel), e(d, sentinel);
    MaskArray mask(d, 16);
    mask.upload(std::vector<std::int32_t>(16, 12345));

    d.gemm(Transpose::no, Transpose::no, 0, 3, 2, 1.0f, a.data(), 2, b.data(), 3, 0.0f, c.data(),
           3);
    d.gemm(Transpose::no, Transpose::no, 2, 0, 2, 1.0f, a.data(), 2, b.data(), 1, 0.0f, c.data(),
           1);
    const hn::LoweringShape lowered = lowering(0, 2, 3, 3, 2, 2, 0, 0, 1, 1);
    d.im2col(lowered, a.data(), c.data());
    d.col2im(lowered, a.data(), c.data());
    d.swap_axes(0, 3, 2, a.data(), c.data());
    d.fill(0, 1.0f, c.data());
    d.scale(0, 2.0f, c.data());
    d.axpy(0, 2.0f, a.data(), c.data());
    d.axpby(0, 2.0f, a.data(), 0.0f, c.data());
    d.mul(0, a.data(), b.data(), c.data());
    CHECK(d.dot(0, a.data(), b.data()) == 0.0f);
    CHECK(d.asum(0, a.data()) == 0.0f);
    CHECK(d.sum(0, a.data()) == 0.0f);
    const hn::AxisShape no_outer = axis(0, 3, 2);
    d.bias_forward(no_outer, a.data(), c.data());
    d.relu_forward(0, 0.0f, a.data(), c.data());
    d.relu_backward(0, 0.0f, a.data(), b.data(), c.data());
    d.sigmoid_forward(0, a.data(), c.data());
    d.sigmoid_backward(0, a.data(), b.data(), c.data());
    d.tanh_forward(0, a.data(), c.data());
    d.tanh_backward(0, a.data(), b.data(), c.data());
    const hn::PoolShape pooled = pooling(0, 2, 3, 3, 2, 2, 1, 1, 0, 0);
    d.pool_max_forward(pooled, a.data(), c.data(), mask.data());
    d.pool_max_backward(pooled, a.data(), mask.data(), c.data());
    d.pool_avg_forward(pooled, a.data(), c.data());
    d.pool_avg_backward(pooled, a.data(), c.data());
    for (const hn::LrnRegion region :
         {hn::LrnRegion::across_channels, hn::LrnRegion::within_channel}) {
      const hn::LrnShape normalised = lrn(0, 3, 2, 2, 3, region);
      d.lrn_forward(normalised, a.data(), c.data(), e.data());
      d.lrn_backward(normalised, a.data(), b.data(), b.data(), b.data(), c.data());
    }
    d.softmax_forward(no_outer, a.data(), c.data());
    d.softmax_backward(no_outer, a.data(), b.data(), c.data());
    d.dropout_forward(0, 0.5f, 1, 0, a.data(), c.data(), e.data());
    d.dropout_backward(0, 0.5f, a.data(), b.data(), c.data());
    d.lift(lowered, 3, a.data(), c.data());
    d.lift_backward(lowered, 3, a.data(), c.data());
    d.add_scalar(0, 1.0f, c.data());
    d.powx(0, a.data(), 2.0f, c.data());
    d.copy_strided(0, 3, a.data(), 3, c.data(), 4);
    d.copy_strided(3, 0, a.data(), 1, c.data(), 1);
    d.copy_strided_batched(0, 3, 3, a.data(), 3, 9, c.data(), 3, 9);
    d.scale_channels(no_outer, a.data(), b.data(), c.data());
    d.max_accumulate(0, a.data(), 0, c.data(), mask.data());
    d.max_select(0, mask.data(), 0, a.data(), c.data());
    d.softmax_loss_forward(no_outer, a.data(), b.data(), false, -1, c.data(), e.data());
    d.softmax_loss_backward(no_outer, a.data(), b.data(), false, -1, 1.0f, c.data());
    d.sigmoid_cross_entropy_forward(0, a.data(), b.data(), false, -1, c.data(), e.data());
    d.sigmoid_cross_entropy_backward(0, a.data(), b.data(), false, -1, 1.0f, c.data());
    if (d.capabilities().convolution) {
      d.conv_forward(lowered, 3, a.data(), b.data(), b.data(), c.data());
      d.conv_backward_data(lowered, 3, a.data(), b.data(), c.data());
      d.conv_backward_weights(lowered, 3, a.data(), b.data(), c.data(), e.data());
    }
    d.synchronize();

    check_identical(a.host(), sentinel);
    check_identical(b.host(), sentinel);
    check_identical(c.host(), sentinel);
    check_identical(e.host(), sentinel);
    check_identical(mask.host(), std::vector<std::int32_t>(16, 12345));
  }
}

// ---- misuse -------------------------------------------------------------------------

TEST_CASE("misuse errors name the call and the sizes on every driver", "[driver_ops][errors]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto owned = hn::make_driver(config.device, config.options);
    hn::Driver& d = *owned;
    const DeviceArray a(d, 64), b(d, 64), c(d, 64), e(d, 64);
    MaskArray mask(d, 64);
    const Transpose no = Transpose::no;

    CHECK_THAT(error_of([&] {
                 d.gemm(no, no, 4, 6, 5, 1.0f, a.data(), 3, b.data(), 6, 0.0f, c.data(), 6);
               }),
               Contains("gemm") && Contains("lda=3") && Contains("k=5"));
    CHECK_THAT(error_of([&] {
                 d.gemm(no, Transpose::yes, 4, 6, 5, 1.0f, a.data(), 5, b.data(), 4, 0.0f, c.data(),
                        6);
               }),
               Contains("gemm") && Contains("ldb=4") && Contains("k=5"));
    CHECK_THAT(error_of([&] {
                 d.gemm(no, no, 4, 6, 5, 1.0f, a.data(), 5, b.data(), 6, 0.0f, c.data(), 5);
               }),
               Contains("gemm") && Contains("ldc=5") && Contains("n=6"));
    CHECK_THAT(error_of([&] {
                 d.gemm(no, no, -1, 6, 5, 1.0f, a.data(), 5, b.data(), 6, 0.0f, c.data(), 6);
               }),
               Contains("gemm") && Contains("m=-1"));

    const hn::LoweringShape odd_groups = lowering(1, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 2);
    CHECK_THAT(error_of([&] { d.im2col(odd_groups, a.data(), c.data()); }),
               Contains("im2col") && Contains("channels 5") && Contains("groups=2"));
    CHECK_THAT(error_of([&] { d.col2im(odd_groups, a.data(), c.data()); }),
               Contains("col2im") && Contains("channels 5") && Contains("groups=2"));
    const hn::LoweringShape too_big = lowering(1, 1, 3, 3, 5, 5, 0, 0, 1, 1);
    CHECK_THAT(error_of([&] { d.im2col(too_big, a.data(), c.data()); }),
               Contains("im2col") && Contains("kernel=5x5"));

    const hn::PoolShape pad_too_big = pooling(1, 1, 5, 5, 3, 3, 1, 1, 3, 0);
    CHECK_THAT(error_of([&] { d.pool_max_forward(pad_too_big, a.data(), c.data(), mask.data()); }),
               Contains("pool_max_forward") && Contains("pad") && Contains("kernel=3x3") &&
                   Contains("pad=3x0"));
    CHECK_THAT(error_of([&] { d.pool_avg_backward(pad_too_big, a.data(), c.data()); }),
               Contains("pool_avg_backward") && Contains("pad=3x0"));

    const hn::LrnShape even_size = lrn(1, 3, 2, 2, 4, hn::LrnRegion::across_channels);
    CHECK_THAT(error_of([&] { d.lrn_forward(even_size, a.data(), c.data(), e.data()); }),
               Contains("lrn_forward") && Contains("size=4"));
    CHECK_THAT(error_of([&] { d.softmax_forward(axis(2, 0, 3), a.data(), c.data()); }),
               Contains("softmax_forward") && Contains("channels=0"));

    CHECK_THAT(error_of([&] { d.dropout_forward(8, 1.0f, 1, 0, a.data(), c.data(), e.data()); }),
               Contains("dropout_forward") && Contains("ratio") && Contains("got 1"));
    CHECK_THAT(error_of([&] { d.dropout_backward(8, -0.5f, a.data(), b.data(), c.data()); }),
               Contains("dropout_backward") && Contains("ratio") && Contains("got -0.5"));
    CHECK_THAT(error_of([&] {
                 d.dropout_forward_layout(hn::test::axis(2, 2, 2), 1.5f, 1, 0, a.data(), c.data(),
                                          e.data());
               }),
               Contains("dropout_forward_layout") && Contains("ratio") && Contains("got 1.5"));

    CHECK_THAT(error_of([&] { d.fill(-1, 0.0f, c.data()); }),
               Contains("fill") && Contains("n must be >= 0, got -1"));
    CHECK_THAT(error_of([&] { d.relu_forward(-3, 0.0f, a.data(), c.data()); }),
               Contains("relu_forward") && Contains("got -3"));
    CHECK_THAT(error_of([&] { (void)d.dot(-2, a.data(), b.data()); }),
               Contains("dot") && Contains("got -2"));
    CHECK_THAT(error_of([&] { d.swap_axes(2, 3, 4, a.data(), a.data()); }),
               Contains("swap_axes") && Contains("src and dst"));
    const hn::LoweringShape grouped = lowering(1, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 2);
    CHECK_THAT(error_of([&] { d.lift(grouped, 2, a.data(), c.data()); }),
               Contains("lift") && Contains("groups must be 1, got 2"));
    const hn::LoweringShape single = lowering(1, 1, 3, 3, 1, 1, 0, 0, 1, 1);
    CHECK_THAT(error_of([&] { d.lift_backward(single, 0, a.data(), c.data()); }),
               Contains("lift_backward") && Contains("out_channels must be > 0, got 0"));
    CHECK_THAT(error_of([&] { d.copy_strided(2, 5, a.data(), 4, c.data(), 5); }),
               Contains("copy_strided") && Contains("src_ld=4") && Contains("cols=5"));
    CHECK_THAT(error_of([&] { d.copy_strided_batched(2, 2, 2, a.data(), 2, 4, c.data(), 3, 4); }),
               Contains("copy_strided_batched") && Contains("overlap") && Contains("dst_stride=4"));
    CHECK_THAT(error_of([&] { d.max_accumulate(4, a.data(), -1, c.data(), mask.data()); }),
               Contains("max_accumulate") && Contains("got -1"));
    CHECK_THAT(error_of([&] { d.powx(-2, a.data(), 1.0f, c.data()); }),
               Contains("powx") && Contains("got -2"));
  }
}

std::vector<DriverConfig> separate_memory_configs() {
  std::vector<DriverConfig> configs;
  for (const DriverConfig& config : hn::test::driver_configs()) {
    if (!hn::make_driver(config.device, config.options)->can_address(hn::host_space())) {
      configs.push_back(config);
    }
  }
  return configs;
}

TEST_CASE(
    "host memory passed to a separate-memory driver is an error naming the call and the "
    "device",
    "[driver_ops][errors]") {
  const DriverConfig config = GENERATE(from_range(separate_memory_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto owned = hn::make_driver(config.device, config.options);
    hn::Driver& d = *owned;
    const std::string device = d.name();
    std::vector<float> host(10, 1.0f);
    const DeviceArray y(d, 10), z(d, 10);

    CHECK_THAT(error_of([&] { d.relu_forward(10, 0.0f, host.data(), y.data()); }),
               Contains("relu_forward") && Contains("not memory of device " + device) &&
                   Contains("x = ") && Contains("40 bytes"));
    CHECK_THAT(error_of([&] {
                 d.gemm(Transpose::no, Transpose::no, 2, 2, 2, 1.0f, y.data(), 2, host.data(), 2,
                        0.0f, z.data(), 2);
               }),
               Contains("gemm") && Contains("B = ") && Contains("not memory of device " + device));
    CHECK_THAT(error_of([&] { d.copy(y.data(), host.data(), 40); }),
               Contains("copy") && Contains("src") && Contains("not memory of device " + device));
    CHECK_THAT(error_of([&] { d.copy_to_host(host.data(), host.data(), 40); }),
               Contains("copy_to_host") && Contains("not memory of device " + device));
    // One float past the end of an allocation is not the driver's memory either.
    CHECK_THAT(
        error_of([&] { d.fill(11, 0.0f, y.data()); }),
        Contains("fill") && Contains("44 bytes") && Contains("not memory of device " + device));
    CHECK_THAT(error_of([&] { d.fill(10, 0.0f, y.data() + 1); }),
               Contains("fill") && Contains("not memory of device " + device));
  }
}

// ---- generic implementations --------------------------------------------------------

TEST_CASE(
    "a driver with only the core runs optional calls generically, staging only where its "
    "memory is its own",
    "[driver_ops][generic]") {
  hn::test::register_core_driver();
  const bool separate = GENERATE(false, true);
  DYNAMIC_SECTION((separate ? "separate memory" : "host memory")) {
    hn::DriverOptions options;
    options.set("separate_memory", separate);
    const std::unique_ptr<hn::Driver> owned = hn::make_driver(hn::Device{"core", 0}, options);
    hn::Driver& d = *owned;
    const std::vector<float> values = random_floats(24, 2000);
    const DeviceArray a(d, values), c(d, 24);
    std::unique_ptr<hn::Driver> reference = hn::make_driver(hn::Device{"reference", 0});
    const DeviceArray ra(*reference, values), rc(*reference, 24);

    // Composed from core calls: no copy leaves the driver's memory.
    d.reset_transfer_stats();
    d.swap_axes(2, 3, 4, a.data(), c.data());
    d.bias_forward(axis(2, 3, 4), a.data(), c.data());
    CHECK(d.transfer_stats().to_host == 0);
    CHECK(d.transfer_stats().to_device == 0);
    reference->swap_axes(2, 3, 4, ra.data(), rc.data());
    reference->bias_forward(axis(2, 3, 4), ra.data(), rc.data());
    check_close(c.host(), rc.host(), 1e-6);

    // Run on the reference kernel: with memory of its own, every operand goes to the host
    // once (x and y alias here) and the written one comes back.
    d.reset_transfer_stats();
    d.relu_forward(24, 0.1f, c.data(), c.data());
    CHECK(d.transfer_stats().to_host == (separate ? 1u : 0u));
    CHECK(d.transfer_stats().to_device == (separate ? 1u : 0u));
    reference->relu_forward(24, 0.1f, rc.data(), rc.data());
    check_identical(c.host(), rc.host());

    // The checks of the public call still come first.
    CHECK_THAT(error_of([&] { d.relu_forward(-1, 0.0f, a.data(), c.data()); }),
               Contains("relu_forward") && Contains("n must be >= 0"));
  }
}

// ---- nChw16c and nChw8c operands ---------------------------------------------------

// `values` of a [batch][channels][plane] tensor moved from one layout to the other (a
// naive loop over layout_offset).
std::vector<float> relaid(const std::vector<float>& values, index_t batch, index_t channels,
                          index_t height, index_t width, hn::Layout from, hn::Layout to) {
  std::vector<float> out(values.size());
  for (index_t n = 0; n < batch; ++n)
    for (index_t c = 0; c < channels; ++c)
      for (index_t h = 0; h < height; ++h)
        for (index_t w = 0; w < width; ++w)
          out[static_cast<std::size_t>(
              hn::layout_offset(to, channels, height, width, n, c, h, w))] =
              values[static_cast<std::size_t>(
                  hn::layout_offset(from, channels, height, width, n, c, h, w))];
  return out;
}

TEST_CASE(
    "nChw16c and nChw8c convolutions (on blocked kernels or, with plain_kernel, NCHW ones), "
    "pooling, LRN, per-channel calls and dropout give the reference's NCHW results on drivers "
    "with blocked_layout, and the others reject them",
    "[driver_ops][layout]") {
  using hn::Layout;
  // Both blocked layouts on any machine (the CPU driver prefers one, and takes either).
  const Layout blocked = GENERATE(Layout::nchw16c, Layout::nchw8c);
  const index_t block = hn::layout_block(blocked);
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label << ", " << hn::layout_name(blocked)) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    std::uint32_t seed = 5100;
    if (!d.capabilities().blocked_layout) {
      hn::PoolShape pool = hn::test::pooling(1, 16, 4, 4, 2, 2, 2, 2, 0, 0);
      pool.layout = blocked;
      const DeviceArray x(d, pool.in_count()), y(d, pool.out_count());
      CHECK_THAT(
          error_of([&] { d.pool_avg_forward(pool, x.data(), y.data()); }),
          Contains("pool_avg_forward") && Contains("NCHW operands only") && Contains(d.name()));
      hn::AxisShape images = hn::test::axis(1, 16, 16);
      images.layout = blocked;
      const DeviceArray mask(d, images.count());
      CHECK_THAT(error_of([&] {
                   d.dropout_forward_layout(images, 0.5f, 1, 0, x.data(), x.data(), mask.data());
                 }),
                 Contains("dropout_forward_layout") && Contains("NCHW operands only"));
      return;
    }
    // Convolutions: every mix of input and output layouts, grouped and depthwise too.
    const std::pair<hn::LoweringShape, index_t> convs[] = {
        {hn::test::lowering(2, 16, 9, 7, 3, 3, 1, 1, 1, 1), 32},
        {hn::test::lowering(3, 32, 8, 8, 1, 1, 0, 0, 1, 1), 16},             // 1x1
        {hn::test::lowering(2, 32, 11, 11, 5, 5, 2, 2, 2, 2, 1, 1, 2), 32},  // groups 2
        {hn::test::lowering(2, 64, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 2), 64},  // per-group
        {hn::test::lowering(2, 32, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 32), 32},  // depthwise
        // Depthwise weight gradients of the CPU driver's own on blocked operands: EfficientNet's
        // 5x5, stride 2 on odd sizes, a 3x5 dilated window.
        {hn::test::lowering(2, 32, 14, 14, 5, 5, 2, 2, 1, 1, 1, 1, 32), 32},
        {hn::test::lowering(2, 48, 13, 11, 5, 5, 2, 2, 2, 2, 1, 1, 48), 48},
        {hn::test::lowering(2, 16, 9, 12, 3, 5, 0, 1, 1, 2, 2, 1, 16), 16},
        {hn::test::lowering(2, 3, 17, 17, 7, 7, 3, 3, 2, 2), 32},  // 3 channels in: NCHW only
    };
    for (const auto& conv : convs) {
      const auto& base = conv.first;
      const auto out_channels = conv.second;
      for (int mix = 1; mix < 8; ++mix) {
        hn::LoweringShape shape = base;
        shape.layout = (mix & 1) != 0 && base.channels % block == 0 ? blocked : Layout::nchw;
        shape.out_layout = (mix & 2) != 0 ? blocked : Layout::nchw;
        shape.plain_kernel = (mix & 4) != 0;
        if (shape.layout == Layout::nchw && shape.out_layout == Layout::nchw) continue;
        INFO(shape.to_string() << " out_channels=" << out_channels);
        const index_t oh = shape.out_h(), ow = shape.out_w();
        const auto in_tested = [&](const std::vector<float>& v, bool back = false) {
          return back ? relaid(v, shape.batch, shape.channels, shape.height, shape.width,
                               shape.layout, Layout::nchw)
                      : relaid(v, shape.batch, shape.channels, shape.height, shape.width,
                               Layout::nchw, shape.layout);
        };
        const auto out_tested = [&](const std::vector<float>& v, bool back = false) {
          return back
                     ? relaid(v, shape.batch, out_channels, oh, ow, shape.out_layout, Layout::nchw)
                     : relaid(v, shape.batch, out_channels, oh, ow, Layout::nchw, shape.out_layout);
        };
        hn::LoweringShape plain = shape;
        plain.layout = plain.out_layout = Layout::nchw;
        plain.plain_kernel = false;
        const index_t x_count = shape.image_count(), y_count = shape.batch * out_channels * oh * ow;
        const index_t w_count = conv_weight_count(shape, out_channels);
        const std::vector<float> xv = random_floats(x_count, seed++),
                                 dyv = random_floats(y_count, seed++);
        const TwinArray x(drivers, xv, in_tested(xv)), dy(drivers, dyv, out_tested(dyv));
        const TwinArray w(drivers, random_floats(w_count, seed++));
        const TwinArray bias(drivers, random_floats(out_channels, seed++));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        const TwinArray dw(drivers, constant(w_count, 0.5f)),
            db(drivers, constant(out_channels, 0.5f));
        drivers.oracle->conv_forward(plain, out_channels, x[Side::oracle], w[Side::oracle],
                                     bias[Side::oracle], y[Side::oracle]);
        drivers.oracle->conv_backward(plain, out_channels, x[Side::oracle], w[Side::oracle],
                                      dy[Side::oracle], dx[Side::oracle], dw[Side::oracle],
                                      db[Side::oracle]);
        d.conv_forward(shape, out_channels, x[Side::tested], w[Side::tested], bias[Side::tested],
                       y[Side::tested]);
        d.conv_backward(shape, out_channels, x[Side::tested], w[Side::tested], dy[Side::tested],
                        dx[Side::tested], dw[Side::tested], db[Side::tested]);
        const double k =
            static_cast<double>(shape.channels / shape.groups * shape.kernel_h * shape.kernel_w);
        check_close(out_tested(y.tested(), true), y.oracle(),
                    gemm_tolerance(static_cast<index_t>(k)));
        check_close(in_tested(dx.tested(), true), dx.oracle(),
                    gemm_tolerance(out_channels / shape.groups * shape.kernel_h * shape.kernel_w));
        check_close(dw.tested(), dw.oracle(), gemm_tolerance(shape.batch * oh * ow));
        check_close(db.tested(), db.oracle(), gemm_tolerance(shape.batch * oh * ow));
      }
    }
    // Pooling: the same bits and masks as the reference on NCHW.
    for (hn::PoolShape shape :
         {hn::test::pooling(2, 32, 7, 7, 3, 3, 2, 2, 1, 1),
          hn::test::pooling(1, 16, 13, 11, 3, 2, 2, 3, 1, 1),
          hn::test::pooling(2, 16, 8, 8, 3, 3, 1, 1, 1, 1),
          hn::test::pooling(1, 32, 7, 7, 7, 7, 1, 1, 0, 0),
          without_pads_counted(hn::test::pooling(2, 16, 9, 8, 3, 3, 2, 2, 1, 1))}) {
      hn::PoolShape plain = shape;
      shape.layout = blocked;
      INFO(shape.to_string());
      const auto in = [&](const std::vector<float>& v, Layout from, Layout to) {
        return relaid(v, shape.batch, shape.channels, shape.height, shape.width, from, to);
      };
      const auto out = [&](const std::vector<float>& v, Layout from, Layout to) {
        return relaid(v, shape.batch, shape.channels, shape.out_h(), shape.out_w(), from, to);
      };
      const std::vector<float> xv = distinct_floats(shape.in_count(), seed++, -0.5f);
      const std::vector<float> dyv = random_floats(shape.out_count(), seed++);
      const TwinArray x(drivers, xv, in(xv, Layout::nchw, blocked));
      const TwinArray dy(drivers, dyv, out(dyv, Layout::nchw, blocked));
      const TwinArray y(drivers, constant(shape.out_count(), -7777.0f),
                        constant(shape.out_count(), kNaN));
      const TwinArray dx(drivers, constant(shape.in_count(), -7777.0f),
                         constant(shape.in_count(), kNaN));
      TwinMask mask(drivers, shape.out_count());
      drivers.oracle->pool_max_forward(plain, x[Side::oracle], y[Side::oracle], mask[Side::oracle]);
      drivers.oracle->pool_max_backward(plain, dy[Side::oracle], mask[Side::oracle],
                                        dx[Side::oracle]);
      d.pool_max_forward(shape, x[Side::tested], y[Side::tested], mask[Side::tested]);
      d.pool_max_backward(shape, dy[Side::tested], mask[Side::tested], dx[Side::tested]);
      check_identical(out(y.tested(), blocked, Layout::nchw), y.oracle());
      check_identical(in(dx.tested(), blocked, Layout::nchw), dx.oracle());
      // The mask's entries are pixel indices: the same in both layouts, moved like values.
      const std::vector<std::int32_t> masks = mask.tested();
      std::vector<float> as_floats(masks.begin(), masks.end());
      as_floats = out(as_floats, blocked, Layout::nchw);
      const std::vector<std::int32_t> oracle_masks = mask.oracle();
      check_identical(as_floats, std::vector<float>(oracle_masks.begin(), oracle_masks.end()));
      drivers.oracle->pool_avg_forward(plain, x[Side::oracle], y[Side::oracle]);
      drivers.oracle->pool_avg_backward(plain, dy[Side::oracle], dx[Side::oracle]);
      d.pool_avg_forward(shape, x[Side::tested], y[Side::tested]);
      d.pool_avg_backward(shape, dy[Side::tested], dx[Side::tested]);
      check_close(out(y.tested(), blocked, Layout::nchw), y.oracle(), kElementwiseTolerance);
      check_close(in(dx.tested(), blocked, Layout::nchw), dx.oracle(), kElementwiseTolerance);
    }
    // LRN across channels: windows that cross blocks, up to the widest (2 * block + 1).
    for (hn::LrnShape shape :
         {hn::test::lrn(2, 32, 5, 7, 5, hn::LrnRegion::across_channels, 0.5f, 0.75f, 2.0f),
          hn::test::lrn(1, 48, 17, 19, 3, hn::LrnRegion::across_channels),
          hn::test::lrn(1, 48, 3, 5, 2 * block + 1, hn::LrnRegion::across_channels)}) {
      hn::LrnShape plain = shape;
      shape.layout = blocked;
      INFO(shape.to_string());
      const auto lay = [&](const std::vector<float>& v, Layout from, Layout to) {
        return relaid(v, shape.batch, shape.channels, shape.height, shape.width, from, to);
      };
      const index_t count = shape.count();
      const std::vector<float> xv = random_floats(count, seed++, -2.0f, 2.0f);
      const std::vector<float> dyv = random_floats(count, seed++);
      const TwinArray x(drivers, xv, lay(xv, Layout::nchw, blocked));
      const TwinArray dy(drivers, dyv, lay(dyv, Layout::nchw, blocked));
      const TwinArray y(drivers, constant(count, -7777.0f), constant(count, kNaN));
      const TwinArray scale(drivers, constant(count, -7777.0f), constant(count, kNaN));
      const TwinArray dx(drivers, constant(count, -7777.0f), constant(count, kNaN));
      drivers.oracle->lrn_forward(plain, x[Side::oracle], y[Side::oracle], scale[Side::oracle]);
      drivers.oracle->lrn_backward(plain, x[Side::oracle], y[Side::oracle], scale[Side::oracle],
                                   dy[Side::oracle], dx[Side::oracle]);
      d.lrn_forward(shape, x[Side::tested], y[Side::tested], scale[Side::tested]);
      d.lrn_backward(shape, x[Side::tested], y[Side::tested], scale[Side::tested], dy[Side::tested],
                     dx[Side::tested]);
      check_close(lay(y.tested(), blocked, Layout::nchw), y.oracle(), kReductionTolerance);
      check_close(lay(dx.tested(), blocked, Layout::nchw), dx.oracle(), kReductionTolerance);
    }
    // Per-channel calls on [outer][channels][inner] images.
    for (hn::AxisShape shape : {hn::test::axis(2, 32, 35), hn::test::axis(3, 16, 1)}) {
      hn::AxisShape plain = shape;
      shape.layout = blocked;
      INFO(shape.to_string());
      const auto lay = [&](const std::vector<float>& v, Layout from, Layout to) {
        return relaid(v, shape.outer, shape.channels, shape.inner, 1, from, to);
      };
      const index_t count = shape.count();
      const std::vector<float> xv = random_floats(count, seed++);
      const TwinArray x(drivers, xv, lay(xv, Layout::nchw, blocked));
      const TwinArray factors(drivers, random_floats(shape.channels, seed++));
      const TwinArray y(drivers, constant(count, -7777.0f), constant(count, kNaN));
      const TwinArray sums(drivers, constant(shape.channels, 2.0f));
      drivers.oracle->scale_channels(plain, factors[Side::oracle], x[Side::oracle],
                                     y[Side::oracle]);
      drivers.oracle->bias_forward(plain, factors[Side::oracle], y[Side::oracle]);
      drivers.oracle->bias_backward(plain, y[Side::oracle], 0.5f, sums[Side::oracle]);
      d.scale_channels(shape, factors[Side::tested], x[Side::tested], y[Side::tested]);
      d.bias_forward(shape, factors[Side::tested], y[Side::tested]);
      d.bias_backward(shape, y[Side::tested], 0.5f, sums[Side::tested]);
      check_close(lay(y.tested(), blocked, Layout::nchw), y.oracle(), kElementwiseTolerance);
      check_close(sums.tested(), sums.oracle(), kReductionTolerance);
      {
        INFO("relu_backward_bias");
        const std::vector<float> dyv = random_floats(count, seed++);
        const TwinArray dy(drivers, dyv, lay(dyv, Layout::nchw, blocked));
        drivers.oracle->relu_backward_bias(plain, 0.1f, y[Side::oracle], dy[Side::oracle],
                                           dy[Side::oracle], sums[Side::oracle]);
        d.relu_backward_bias(shape, 0.1f, y[Side::tested], dy[Side::tested], dy[Side::tested],
                             sums[Side::tested]);
        check_close(lay(dy.tested(), blocked, Layout::nchw), dy.oracle(), kElementwiseTolerance);
        check_close(sums.tested(), sums.oracle(), kReductionTolerance);
      }
      // Dropout: the mask and output of the NCHW draw, relaid, from a slice's offset too.
      for (const std::uint64_t offset : {std::uint64_t{0}, kHighCounter}) {
        INFO("dropout, offset " << offset);
        const TwinArray mask(drivers, constant(count, -7777.0f), constant(count, kNaN));
        const TwinArray dropped(drivers, constant(count, -7777.0f), constant(count, kNaN));
        drivers.oracle->dropout_forward(count, 0.3f, 77, offset, x[Side::oracle],
                                        dropped[Side::oracle], mask[Side::oracle]);
        d.dropout_forward_layout(shape, 0.3f, 77, offset, x[Side::tested], dropped[Side::tested],
                                 mask[Side::tested]);
        check_identical(lay(mask.tested(), blocked, Layout::nchw), mask.oracle());
        check_identical(lay(dropped.tested(), blocked, Layout::nchw), dropped.oracle());
      }
    }
    // Channels that do not fill blocks, wider LRN windows, lowering and softmax: errors.
    hn::PoolShape odd = hn::test::pooling(1, 20, 4, 4, 2, 2, 2, 2, 0, 0);
    odd.layout = blocked;
    const DeviceArray a(d, odd.in_count()), b(d, odd.out_count());
    CHECK_THAT(error_of([&] { d.pool_avg_forward(odd, a.data(), b.data()); }),
               Contains(std::string(hn::layout_name(blocked)) + " needs channels in multiples of " +
                        std::to_string(block)) &&
                   Contains("channels=20"));
    hn::LrnShape wide = hn::test::lrn(1, 32, 3, 3, 2 * block + 3, hn::LrnRegion::across_channels);
    wide.layout = blocked;
    const DeviceArray lx(d, wide.count()), ly(d, wide.count()), ls(d, wide.count());
    CHECK_THAT(error_of([&] { d.lrn_forward(wide, lx.data(), ly.data(), ls.data()); }),
               Contains("windows of up to " + std::to_string(2 * block + 1) + " channels"));
    hn::LoweringShape lowered = hn::test::lowering(1, 16, 4, 4, 1, 1, 0, 0, 1, 1);
    lowered.layout = blocked;
    const DeviceArray columns(d, lowered.col_count()), image(d, lowered.image_count());
    CHECK_THAT(error_of([&] { d.im2col(lowered, image.data(), columns.data()); }),
               Contains("im2col") && Contains("NCHW images only"));
    hn::AxisShape rows = hn::test::axis(1, 16, 1);
    rows.layout = blocked;
    CHECK_THAT(error_of([&] { d.softmax_forward(rows, image.data(), image.data()); }),
               Contains("softmax_forward") && Contains("NCHW only"));
  }
}

// ---- Winograd convolution ------------------------------------------------------------

// The operands of a convolution test, both sides.
struct ConvTwins {
  const TwinArray &x, &w, &bias, &y, &dy, &dx, &dw, &db;
};

// New weights `values` at c.w's address, then the forward (with `activation`) and both
// gradients: the oracle's on `plain`, the tested driver's on `shape` (whose weights_version
// names the new weights).
void run_conv_round(const Drivers& drivers, const hn::LoweringShape& plain,
                    const hn::LoweringShape& shape, index_t out_channels,
                    const std::vector<float>& values, const hn::Activation& activation,
                    const ConvTwins& c) {
  hn::Driver& oracle = *drivers.oracle;
  hn::Driver& d = *drivers.driver;
  oracle.copy_from_host(c.w[Side::oracle], values.data(), values.size() * sizeof(float));
  d.copy_from_host(c.w[Side::tested], values.data(), values.size() * sizeof(float));
  oracle.conv_forward_activation(plain, out_channels, c.x[Side::oracle], c.w[Side::oracle],
                                 c.bias[Side::oracle], activation, c.y[Side::oracle]);
  oracle.conv_backward(plain, out_channels, c.x[Side::oracle], c.w[Side::oracle],
                       c.dy[Side::oracle], c.dx[Side::oracle], c.dw[Side::oracle],
                       c.db[Side::oracle]);
  d.conv_forward_activation(shape, out_channels, c.x[Side::tested], c.w[Side::tested],
                            c.bias[Side::tested], activation, c.y[Side::tested]);
  d.conv_backward(shape, out_channels, c.x[Side::tested], c.w[Side::tested], c.dy[Side::tested],
                  c.dx[Side::tested], c.dw[Side::tested], c.db[Side::tested]);
}

// Winograd F(4x4, 3x3)'s error against the direct sum: its transforms multiply by
// constants up to 5 (B^T), 8 (A^T) and down to 1/24 (G), and a tile's 36 points sum to its
// outputs with cancellation, so each product's rounding error comes out amplified (Lavin
// and Gray measured about 10x direct's error for this tile size). The bound is twice a
// GEMM's of the same reduction length; measured on the cases below (random values in
// [-1, 1)): at most 0.19 of a GEMM's bound forward, 0.21 for the data gradient, 0.31 for
// the weight gradient and 0.51 on the 8-channel layer of several chunks.
double winograd_tolerance(index_t k) {
  return 2.0 * gemm_tolerance(k);
}

TEST_CASE(
    "Winograd convolutions (LoweringShape::winograd) match the reference within Winograd's "
    "bound on NCHW and blocked operands, across chunks of tiles and weight versions",
    "[driver_ops][convolution][winograd]") {
  using hn::Layout;
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    if (!d.capabilities().winograd) {
      SUCCEED(d.name() << " has no Winograd convolution: it computes its direct one");
      return;
    }
    std::uint32_t seed = 6700;
    std::uint64_t last_version = 0;
    const std::pair<hn::LoweringShape, index_t> convs[] = {
        {hn::test::lowering(2, 16, 9, 7, 3, 3, 1, 1, 1, 1), 32},    // partial tiles
        {hn::test::lowering(1, 3, 11, 13, 3, 3, 0, 0, 1, 1), 5},    // channels not a block
        {hn::test::lowering(2, 24, 6, 10, 3, 3, 2, 2, 1, 1), 13},   // pad 2
        {hn::test::lowering(1, 32, 5, 6, 3, 3, 1, 2, 1, 1), 48},    // unequal pads
        {hn::test::lowering(3, 64, 7, 7, 3, 3, 1, 1, 1, 1), 64},    // ResNet-50's last 3x3
        {hn::test::lowering(2, 1, 3, 3, 3, 3, 0, 0, 1, 1), 1},      // one output pixel
        {hn::test::lowering(4, 8, 130, 126, 3, 3, 1, 1, 1, 1), 8},  // several chunks of tiles
        // Groups, each a convolution of its own on views of x and y (CaffeNet's conv4 and
        // conv5 have two): 16 -> 24 per group; 32 -> 16 per group; and 2 -> 3 (NCHW only).
        {hn::test::lowering(2, 32, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 2), 48},
        {hn::test::lowering(2, 64, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 2), 32},
        {hn::test::lowering(1, 6, 7, 5, 3, 3, 1, 0, 1, 1, 1, 1, 3), 9},
    };
    const Layout layouts[] = {Layout::nchw, Layout::nchw8c, Layout::nchw16c};
    for (const auto& conv : convs) {
      const auto& base = conv.first;
      const auto out_channels = conv.second;
      for (const Layout in_layout : layouts) {
        for (const Layout out_layout : layouts) {
          if (base.channels / base.groups % hn::layout_block(in_layout) != 0 ||
              out_channels / base.groups % hn::layout_block(out_layout) != 0 ||
              (in_layout != Layout::nchw && out_layout != Layout::nchw &&
               in_layout != out_layout)) {
            continue;
          }
          if ((in_layout != Layout::nchw || out_layout != Layout::nchw) &&
              !d.capabilities().blocked_layout) {
            continue;
          }
          hn::LoweringShape shape = base;
          shape.layout = in_layout;
          shape.out_layout = out_layout;
          shape.winograd = true;
          INFO(shape.to_string() << " out_channels=" << out_channels);
          const index_t oh = shape.out_h(), ow = shape.out_w();
          const auto in_tested = [&](const std::vector<float>& v, bool back = false) {
            return back ? relaid(v, shape.batch, shape.channels, shape.height, shape.width,
                                 in_layout, Layout::nchw)
                        : relaid(v, shape.batch, shape.channels, shape.height, shape.width,
                                 Layout::nchw, in_layout);
          };
          const auto out_tested = [&](const std::vector<float>& v, bool back = false) {
            return back ? relaid(v, shape.batch, out_channels, oh, ow, out_layout, Layout::nchw)
                        : relaid(v, shape.batch, out_channels, oh, ow, Layout::nchw, out_layout);
          };
          hn::LoweringShape plain = base;
          const index_t x_count = shape.image_count(),
                        y_count = shape.batch * out_channels * oh * ow;
          const index_t w_count = conv_weight_count(shape, out_channels);
          const std::vector<float> xv = random_floats(x_count, seed++),
                                   dyv = random_floats(y_count, seed++);
          const TwinArray x(drivers, xv, in_tested(xv)), dy(drivers, dyv, out_tested(dyv));
          const TwinArray bias(drivers, random_floats(out_channels, seed++));
          const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
          const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
          const TwinArray dw(drivers, constant(w_count, 0.5f)),
              db(drivers, constant(out_channels, 0.5f));
          // Two versions of new weights at one address: the second call must not reuse the
          // first's transformed weights. (Versions name contents once: Tensor's counter.)
          const TwinArray w(drivers, constant(w_count, 0.0f));
          for (int round = 0; round < 2; ++round) {
            const std::uint64_t version = ++last_version;
            INFO("weights version " << version);
            shape.weights_version = version;
            run_conv_round(drivers, plain, shape, out_channels, random_floats(w_count, seed++),
                           hn::Activation::relu(round == 0 ? 0.0f : 0.125f),
                           ConvTwins{x, w, bias, y, dy, dx, dw, db});
            check_close(out_tested(y.tested(), true), y.oracle(),
                        winograd_tolerance(shape.channels * 9));
            check_close(in_tested(dx.tested(), true), dx.oracle(),
                        winograd_tolerance(out_channels * 9));
            check_close(dw.tested(), dw.oracle(), winograd_tolerance(shape.batch * oh * ow));
            check_close(db.tested(), db.oracle(), gemm_tolerance(shape.batch * oh * ow));
          }
        }
      }
    }
    if (d.capabilities().blocked_layout) {
      // Two different blocks (nChw16c in, nChw8c out): refused before any work, by name.
      hn::LoweringShape mixed = hn::test::lowering(1, 16, 6, 6, 3, 3, 1, 1, 1, 1);
      mixed.layout = Layout::nchw16c;
      mixed.out_layout = Layout::nchw8c;
      mixed.winograd = true;
      const DeviceArray x(d, mixed.image_count()), w(d, 16 * 16 * 9), y(d, 16 * 36);
      CHECK_THAT(
          error_of([&] { d.conv_forward(mixed, 16, x.data(), w.data(), nullptr, y.data()); }),
          Contains("conv_forward (winograd)") && Contains("two blocks"));
      // Groups of 12 channels in nChw8c: no group is a view of whole blocks.
      hn::LoweringShape split = hn::test::lowering(1, 24, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2);
      split.layout = split.out_layout = Layout::nchw8c;
      split.winograd = true;
      const DeviceArray xs(d, split.image_count()), ws(d, 24 * 12 * 9), ys(d, 24 * 36);
      CHECK_THAT(
          error_of([&] { d.conv_forward(split, 24, xs.data(), ws.data(), nullptr, ys.data()); }),
          Contains("conv_forward (winograd)") && Contains("whole blocks") && Contains("groups=2"));
    }
  }
}

// ---- pointwise (1x1) convolution on blocked and NCHW operands -------------------------

TEST_CASE(
    "pointwise convolutions (LoweringShape::pointwise) match the reference on blocked "
    "operands, strided, on NCHW ones and across weight versions, and refuse what they cannot "
    "compute",
    "[driver_ops][convolution][pointwise]") {
  using hn::Layout;
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    if (!d.capabilities().pointwise || !d.capabilities().blocked_layout) {
      SUCCEED(d.name() << " has no pointwise convolution on blocked operands");
      return;
    }
    std::uint32_t seed = 6900;
    std::uint64_t last_version = 0;
    const std::pair<hn::LoweringShape, index_t> convs[] = {
        {hn::test::lowering(2, 32, 9, 7, 1, 1, 0, 0, 1, 1), 48},    // rows of 6 not whole
        {hn::test::lowering(1, 16, 1, 1, 1, 1, 0, 0, 1, 1), 16},    // one pixel
        {hn::test::lowering(3, 64, 9, 11, 1, 1, 0, 0, 2, 2), 32},   // stride 2, odd sides
        {hn::test::lowering(2, 48, 14, 14, 1, 1, 0, 0, 2, 2), 80},  // stride 2, even sides
        {hn::test::lowering(1, 16, 7, 7, 1, 1, 0, 0, 1, 1), 224},   // batch 1: panel groups
        {hn::test::lowering(5, 24, 30, 28, 1, 1, 0, 0, 1, 1), 8},   // long reduction, 3 blocks
        {hn::test::lowering(2, 16, 8, 5, 1, 1, 0, 0, 3, 3), 16},    // stride 3
        // NCHW only (channel counts no multiple of a block): ShuffleNet's 58 channels on 7x7
        // (tiles across images, 12-row panels not whole), a tiny one, one whose tiles stay
        // inside an image (a 64-pixel plane), and more inputs than outputs.
        {hn::test::lowering(3, 58, 7, 7, 1, 1, 0, 0, 1, 1), 29},
        {hn::test::lowering(2, 5, 3, 3, 1, 1, 0, 0, 1, 1), 13},
        {hn::test::lowering(2, 24, 8, 8, 1, 1, 0, 0, 1, 1), 58},
        {hn::test::lowering(3, 116, 6, 5, 1, 1, 0, 0, 1, 1), 20},
    };
    for (const auto& conv : convs) {
      for (const Layout layout : {Layout::nchw8c, Layout::nchw16c, Layout::nchw}) {
        const auto& base = conv.first;
        const auto out_channels = conv.second;
        const index_t block = hn::layout_block(layout);
        if (base.channels % block != 0 || out_channels % block != 0) continue;
        if (layout == Layout::nchw && base.stride_h != 1) continue;  // stride 1 there
        hn::LoweringShape shape = base;
        shape.layout = shape.out_layout = layout;
        shape.pointwise = true;
        INFO(shape.to_string() << " out_channels=" << out_channels);
        const index_t oh = shape.out_h(), ow = shape.out_w();
        const auto in_tested = [&](const std::vector<float>& v, bool back = false) {
          return relaid(v, shape.batch, shape.channels, shape.height, shape.width,
                        back ? layout : Layout::nchw, back ? Layout::nchw : layout);
        };
        const auto out_tested = [&](const std::vector<float>& v, bool back = false) {
          return relaid(v, shape.batch, out_channels, oh, ow, back ? layout : Layout::nchw,
                        back ? Layout::nchw : layout);
        };
        const index_t x_count = shape.image_count(), y_count = shape.batch * out_channels * oh * ow;
        const index_t w_count = conv_weight_count(shape, out_channels);
        const std::vector<float> xv = random_floats(x_count, seed++),
                                 dyv = random_floats(y_count, seed++);
        const TwinArray x(drivers, xv, in_tested(xv)), dy(drivers, dyv, out_tested(dyv));
        const TwinArray bias(drivers, random_floats(out_channels, seed++));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        // dx over NaN: the pixels a stride skips must come out zero.
        const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
        const TwinArray dw(drivers, random_floats(w_count, seed++, -3.0f, 3.0f)),
            db(drivers, random_floats(out_channels, seed++, -3.0f, 3.0f));
        // Two versions of new weights at one address: the second call must not reuse the
        // first's packed weights.
        const TwinArray w(drivers, constant(w_count, 0.0f));
        for (int round = 0; round < 2; ++round) {
          const std::uint64_t version = ++last_version;
          INFO("weights version " << version);
          shape.weights_version = version;
          run_conv_round(
              drivers, base, shape, out_channels, random_floats(w_count, seed++),
              round == 0 ? hn::Activation::relu(0.125f) : hn::Activation::clip(-0.25f, 0.5f),
              ConvTwins{x, w, bias, y, dy, dx, dw, db});
          check_close(out_tested(y.tested(), true), y.oracle(), gemm_tolerance(shape.channels));
          check_close(in_tested(dx.tested(), true), dx.oracle(), gemm_tolerance(out_channels));
          check_close(dw.tested(), dw.oracle(), gemm_tolerance(shape.batch * oh * ow));
          check_close(db.tested(), db.oracle(), gemm_tolerance(shape.batch * oh * ow));
          if (layout != Layout::nchw) continue;
          // On NCHW conv_backward computes both in one pass: bitwise the separate calls.
          const DeviceArray dx1(d, x_count), dx2(d, x_count);
          const DeviceArray dw1(d, constant(w_count, 0.5f)), dw2(d, constant(w_count, 0.5f));
          const DeviceArray db1(d, constant(out_channels, 0.5f)),
              db2(d, constant(out_channels, 0.5f));
          d.conv_backward(shape, out_channels, x[Side::tested], w[Side::tested], dy[Side::tested],
                          dx1.data(), dw1.data(), db1.data());
          d.conv_backward_weights(shape, out_channels, x[Side::tested], dy[Side::tested],
                                  dw2.data(), db2.data());
          d.conv_backward_data(shape, out_channels, w[Side::tested], dy[Side::tested], dx2.data());
          CHECK(dx1.host() == dx2.host());
          CHECK(dw1.host() == dw2.host());
          CHECK(db1.host() == db2.host());
          CHECK(dx1.host() == dx.tested());
        }
      }
    }
    // Shapes it does not compute: refused before any work, naming the call.
    const DeviceArray a(d, 2 * 16 * 8 * 8), w(d, 16 * 16 * 9), b(d, 2 * 16 * 8 * 8);
    hn::LoweringShape padded = hn::test::lowering(2, 16, 6, 6, 1, 1, 1, 1, 1, 1);
    hn::LoweringShape nchw = hn::test::lowering(2, 16, 8, 8, 1, 1, 0, 0, 2, 2);  // strided
    hn::LoweringShape mixed = hn::test::lowering(2, 16, 8, 8, 1, 1, 0, 0, 1, 1),
                      three = hn::test::lowering(1, 16, 8, 8, 3, 3, 1, 1, 1, 1);
    padded.layout = padded.out_layout = three.layout = three.out_layout = Layout::nchw8c;
    mixed.layout = Layout::nchw16c;
    mixed.out_layout = Layout::nchw8c;
    for (hn::LoweringShape* s : {&padded, &nchw, &mixed, &three}) {
      s->pointwise = true;
      INFO(s->to_string());
      CHECK_THAT(error_of([&] { d.conv_forward(*s, 16, a.data(), w.data(), nullptr, b.data()); }),
                 Contains("conv_forward (pointwise)") && Contains("1x1 kernel"));
      CHECK_THAT(
          error_of([&] { d.conv_backward_weights(*s, 16, a.data(), b.data(), w.data(), nullptr); }),
          Contains("conv_backward_weights (pointwise)"));
    }
  }
}

// ---- BatchNorm + Scale + ReLU fused -------------------------------------------------

TEST_CASE(
    "norm_affine forward and backward match the reference on every driver, in place and "
    "nChw16c and nChw8c too",
    "[driver_ops][norm]") {
  using hn::Layout;
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    std::uint32_t seed = 5300;
    std::vector<hn::AxisShape> shapes = axis_cases();
    shapes.push_back(axis(2, 16, 1));  // one 16-wide vector per image
    for (const Layout layout : {Layout::nchw16c, Layout::nchw8c}) {
      for (hn::AxisShape shape : {axis(2, 32, 35), axis(3, 16, 1), axis(1, 48, 200)}) {
        shape.layout = layout;
        shapes.push_back(shape);
      }
    }
    // nChw8c only: 24 channels (three blocks), an odd run of pixels.
    shapes.push_back(axis(2, 24, 7));
    shapes.back().layout = Layout::nchw8c;
    for (const hn::AxisShape& shape : shapes) {
      const bool blocked = shape.layout != Layout::nchw;
      if (blocked && !d.capabilities().blocked_layout) continue;
      hn::AxisShape plain = shape;
      plain.layout = Layout::nchw;
      // The tested side gets blocked copies; the oracle computes on NCHW.
      const auto lay = [&](const std::vector<float>& v, bool back = false) {
        if (!blocked) return v;
        return back ? relaid(v, shape.outer, shape.channels, shape.inner, 1, shape.layout,
                             Layout::nchw)
                    : relaid(v, shape.outer, shape.channels, shape.inner, 1, Layout::nchw,
                             shape.layout);
      };
      const index_t count = shape.count(), c = shape.channels;
      for (int variant = 0; variant < 4; ++variant) {
        const bool relu = variant != 0, in_place = variant >= 2;
        const float slope = variant == 3 ? 0.25f : 0.0f;
        const bool with_beta = variant != 2;
        INFO(shape.to_string() << " relu=" << relu << " slope=" << slope << " in_place=" << in_place
                               << " beta=" << with_beta);
        const std::vector<float> xv = random_floats(count, seed++, -2.0f, 2.0f);
        const TwinArray x(drivers, xv, lay(xv));
        const TwinArray shift(drivers, random_floats(c, seed++));
        const TwinArray inv_std(drivers, random_floats(c, seed++, 0.5f, 2.0f));
        const TwinArray gamma(drivers, random_floats(c, seed++, -2.0f, 2.0f));
        const TwinArray beta(drivers, random_floats(c, seed++));
        const TwinArray normalised(drivers, constant(count, -7777.0f), constant(count, kNaN));
        const TwinArray y(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers, [&](hn::Driver& dr, Side s) {
          const hn::AxisShape& as = s == Side::oracle ? plain : shape;
          dr.norm_affine_forward(as, x[s], shift[s], inv_std[s], gamma[s],
                                 with_beta ? beta[s] : nullptr, relu, slope, normalised[s],
                                 in_place ? x[s] : y[s]);
        });
        const TwinArray& out = in_place ? x : y;
        check_close(lay(out.tested(), true), out.oracle(), kElementwiseTolerance);
        check_close(lay(normalised.tested(), true), normalised.oracle(), kElementwiseTolerance);
        // Without a kept normalised: the same output.
        if (!in_place) {
          const TwinArray y2(drivers, constant(count, -7777.0f), constant(count, kNaN));
          d.norm_affine_forward(shape, x[Side::tested], shift[Side::tested], inv_std[Side::tested],
                                gamma[Side::tested], with_beta ? beta[Side::tested] : nullptr, relu,
                                slope, nullptr, y2[Side::tested]);
          check_identical(y2.tested(), y.tested());
        }
        // Backward from the forward's output; the gradients add to what is there.
        const std::vector<float> dyv = random_floats(count, seed++);
        const TwinArray dy(drivers, dyv, lay(dyv));
        const TwinArray dx_scale(drivers, random_floats(c, seed++, -2.0f, 2.0f));
        const TwinArray dgamma(drivers, random_floats(c, seed++));
        const TwinArray dbeta(drivers, random_floats(c, seed++));
        const TwinArray dx(drivers, constant(count, -7777.0f), constant(count, kNaN));
        run_both(drivers, [&](hn::Driver& dr, Side s) {
          const hn::AxisShape& as = s == Side::oracle ? plain : shape;
          dr.norm_affine_backward(as, dy[s], out[s], normalised[s], dx_scale[s], relu, slope,
                                  dgamma[s], with_beta ? dbeta[s] : nullptr,
                                  in_place ? dy[s] : dx[s]);
        });
        const TwinArray& grad = in_place ? dy : dx;
        check_close(lay(grad.tested(), true), grad.oracle(), kElementwiseTolerance);
        check_close(dgamma.tested(), dgamma.oracle(), kReductionTolerance);
        check_close(dbeta.tested(), dbeta.oracle(), kReductionTolerance);
        // Only the parameters' gradients, and only dx: each as in the full call.
        if (!in_place) {
          const TwinArray sums(drivers, random_floats(c, seed++));
          const TwinArray dx_only(drivers, constant(count, -7777.0f), constant(count, kNaN));
          run_both(drivers, [&](hn::Driver& dr, Side s) {
            const hn::AxisShape& as = s == Side::oracle ? plain : shape;
            dr.norm_affine_backward(as, dy[s], out[s], normalised[s], nullptr, relu, slope, sums[s],
                                    nullptr, nullptr);
            dr.norm_affine_backward(as, dy[s], out[s], nullptr, dx_scale[s], relu, slope, nullptr,
                                    nullptr, dx_only[s]);
          });
          check_close(sums.tested(), sums.oracle(), kReductionTolerance);
          check_identical(dx_only.tested(), dx.tested());
        }
      }
    }
    if (!d.capabilities().blocked_layout) {
      hn::AxisShape rows = axis(1, 16, 4);
      rows.layout = Layout::nchw16c;
      const DeviceArray a(d, rows.count()), v(d, 16);
      CHECK_THAT(error_of([&] {
                   d.norm_affine_forward(rows, a.data(), v.data(), v.data(), v.data(), nullptr,
                                         false, 0.0f, nullptr, a.data());
                 }),
                 Contains("norm_affine_forward") && Contains("NCHW"));
    }
  }
}

TEST_CASE(
    "conv_forward_activation equals conv_forward then relu_forward or clip_forward of the "
    "reference on every driver, NCHW and blocked, NaN never finite",
    "[driver_ops][convolution]") {
  using hn::Activation;
  using hn::Layout;
  const Activation activations[] = {Activation::relu(0.0f), Activation::clip(-0.3f, 0.4f),
                                    Activation::relu(0.1f), Activation::clip(0.0f, 6.0f)};
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    const hn::Capabilities caps = d.capabilities();
    std::uint32_t seed = 5900;
    std::size_t case_index = 0;
    auto cases = conv_cases();
    cases.emplace_back(lowering(2, 1, 12, 12, 5, 5, 0, 0, 1, 1), 20);  // LeNet conv1: conv_small
    for (const auto& [base, out_channels] : cases) {
      const Activation& activation = activations[case_index % std::size(activations)];
      const bool with_nan = case_index % 3 == 1;
      ++case_index;
      // On drivers with blocked kernels, the channel multiples of a block blocked too.
      for (const bool blocked : {false, true}) {
        if (blocked && !caps.blocked_layout) continue;
        hn::LoweringShape shape = base;
        const Layout layout = caps.preferred_blocked_layout;
        const index_t block = hn::layout_block(layout);
        if (blocked) {
          if (shape.channels % block != 0 && out_channels % block != 0) continue;
          if (shape.channels % block == 0) shape.layout = layout;
          if (out_channels % block == 0) shape.out_layout = layout;
        }
        INFO(shape.to_string() << " out_channels=" << out_channels << " activation "
                               << activation.to_string() << (with_nan ? ", a NaN in x" : ""));
        const index_t oh = shape.out_h(), ow = shape.out_w();
        const index_t y_count = shape.batch * out_channels * oh * ow;
        std::vector<float> xv = random_floats(shape.image_count(), seed++);
        if (with_nan) xv[xv.size() / 2] = kNaN;
        const TwinArray x(drivers, xv,
                          relaid(xv, shape.batch, shape.channels, shape.height, shape.width,
                                 Layout::nchw, shape.layout));
        const TwinArray w(drivers, random_floats(conv_weight_count(shape, out_channels), seed++));
        const TwinArray bias(drivers, random_floats(out_channels, seed++));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        hn::LoweringShape plain = shape;
        plain.layout = plain.out_layout = Layout::nchw;
        drivers.oracle->conv_forward(plain, out_channels, x[Side::oracle], w[Side::oracle],
                                     bias[Side::oracle], y[Side::oracle]);
        if (activation.kind == Activation::Kind::relu) {
          drivers.oracle->relu_forward(y_count, activation.slope, y[Side::oracle], y[Side::oracle]);
        } else {
          drivers.oracle->clip_forward(y_count, activation.lo, activation.hi, y[Side::oracle],
                                       y[Side::oracle]);
        }
        d.conv_forward_activation(shape, out_channels, x[Side::tested], w[Side::tested],
                                  bias[Side::tested], activation, y[Side::tested]);
        std::vector<float> tested =
            relaid(y.tested(), shape.batch, out_channels, oh, ow, shape.out_layout, Layout::nchw);
        std::vector<float> oracle = y.oracle();
        // Not finite where the reference has NaN (the windows over the NaN: a driver may give
        // -infinity there), finite elsewhere.
        std::size_t nans = 0, misplaced = 0;
        for (std::size_t i = 0; i < oracle.size(); ++i) {
          if (std::isnan(oracle[i]) == std::isfinite(tested[i])) ++misplaced;
          if (std::isnan(oracle[i])) {
            ++nans;
            oracle[i] = tested[i] = 0.0f;
          }
        }
        CHECK((nans > 0) == with_nan);
        CHECK(misplaced == 0);
        check_close(
            tested, oracle,
            gemm_tolerance(shape.channels / shape.groups * shape.kernel_h * shape.kernel_w));
      }
    }
    const TwinArray a(drivers, constant(16, 1.0f));
    CHECK_THAT(error_of([&] {
                 d.conv_forward_activation(lowering(1, 1, 4, 4, 1, 1, 0, 0, 1, 1), 1,
                                           a[Side::tested], a[Side::tested], nullptr,
                                           Activation::clip(1.0f, 0.0f), a[Side::tested]);
               }),
               Contains("conv_forward_activation") && Contains("clip [1, 0]"));
  }
}

// Whether a driver of `caps` runs `shape` on its pointwise kernels (LoweringShape::pointwise):
// one group, a 1x1 kernel without padding, equal strides; stride 1 where x and y are NCHW.
bool takes_pointwise(const hn::Capabilities& caps, const hn::LoweringShape& shape, bool nchw) {
  return caps.pointwise && shape.groups == 1 && shape.kernel_h == 1 && shape.kernel_w == 1 &&
         shape.pad_h == 0 && shape.pad_w == 0 && shape.stride_h == shape.stride_w &&
         (!nchw || shape.stride_h == 1);
}

TEST_CASE(
    "conv_backward_relu equals relu_backward then conv_backward of the reference on every "
    "driver, the driver's own NCHW 1x1 kernels included, and refuses a y over dy",
    "[driver_ops][convolution]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    const hn::Capabilities caps = d.capabilities();
    std::uint32_t seed = 7300;
    auto cases = conv_cases();
    cases.emplace_back(lowering(3, 58, 7, 7, 1, 1, 0, 0, 1, 1), 29);  // NCHW pointwise
    cases.emplace_back(lowering(2, 24, 8, 8, 1, 1, 0, 0, 1, 1), 58);
    std::size_t case_index = 0;
    for (const auto& [base, out_channels] : cases) {
      const float slope = case_index % 2 == 0 ? 0.0f : 0.125f;
      const bool has_pointwise = takes_pointwise(caps, base, true);
      const int chosen_want = static_cast<int>(case_index++ % 3);
      // Both gradients, the weights' alone, the data's alone: all three where the driver's
      // pointwise kernels run the shape (both: its one pass), else one per case.
      for (const int want : {0, 1, 2}) {
        if (!has_pointwise && want != chosen_want) continue;
        for (const bool pointwise : {false, true}) {
          if (pointwise && !has_pointwise) continue;
          hn::LoweringShape shape = base;
          shape.pointwise = pointwise;
          INFO(shape.to_string() << " out_channels=" << out_channels << " slope " << slope
                                 << " want " << want << (pointwise ? " pointwise" : ""));
          const index_t y_count = shape.batch * out_channels * shape.out_h() * shape.out_w();
          const index_t x_count = shape.image_count();
          const index_t w_count = conv_weight_count(shape, out_channels);
          // y: half of it at or under zero, exact zeros included.
          std::vector<float> yv = random_floats(y_count, seed++);
          for (std::size_t i = 0; i < yv.size(); i += 7)
            yv[i] = 0.0f;
          const TwinArray x(drivers, random_floats(x_count, seed++)),
              w(drivers, random_floats(w_count, seed++)), y(drivers, yv),
              dy(drivers, random_floats(y_count, seed++));
          const TwinArray dx(drivers, constant(x_count, -7777.0f), constant(x_count, kNaN));
          const TwinArray dw(drivers, random_floats(w_count, seed++, -3.0f, 3.0f)),
              db(drivers, random_floats(out_channels, seed++, -3.0f, 3.0f));
          const auto at = [&](const TwinArray& a, Side side, bool wanted) {
            return wanted ? a[side] : nullptr;
          };
          const bool want_dx = want != 1, want_dw = want != 2;
          hn::LoweringShape plain = shape;
          plain.pointwise = false;
          drivers.oracle->relu_backward(y_count, slope, y[Side::oracle], dy[Side::oracle],
                                        dy[Side::oracle]);
          drivers.oracle->conv_backward(plain, out_channels, x[Side::oracle], w[Side::oracle],
                                        dy[Side::oracle], at(dx, Side::oracle, want_dx),
                                        at(dw, Side::oracle, want_dw),
                                        at(db, Side::oracle, want_dw));
          d.conv_backward_relu(shape, out_channels, x[Side::tested], w[Side::tested],
                               y[Side::tested], slope, dy[Side::tested],
                               at(dx, Side::tested, want_dx), at(dw, Side::tested, want_dw),
                               at(db, Side::tested, want_dw));
          // The rectifier's gradient is one product per element: the same everywhere.
          CHECK(dy.tested() == dy.oracle());
          const index_t reduction = shape.batch * shape.out_h() * shape.out_w();
          if (want_dx) {
            check_close(
                dx.tested(), dx.oracle(),
                gemm_tolerance(out_channels / shape.groups * shape.kernel_h * shape.kernel_w));
          }
          check_close(dw.tested(), dw.oracle(), gemm_tolerance(reduction));
          check_close(db.tested(), db.oracle(), gemm_tolerance(reduction));
        }
      }
    }
    const TwinArray a(drivers, constant(2 * 4 * 4, 1.0f));
    CHECK_THAT(error_of([&] {
                 d.conv_backward_relu(lowering(2, 1, 4, 4, 1, 1, 0, 0, 1, 1), 1, a[Side::tested],
                                      a[Side::tested], a[Side::tested] + 1, 0.0f, a[Side::tested],
                                      nullptr, nullptr, nullptr);
               }),
               Contains("conv_backward_relu") && Contains("y overlaps dy"));
  }
}

TEST_CASE(
    "conv_forward_residual equals conv_forward, a sum and the activation of the reference on "
    "every driver, NCHW and blocked, the driver's own 1x1 kernels included",
    "[driver_ops][convolution]") {
  using hn::Activation;
  using hn::Layout;
  const Activation activations[] = {Activation{}, Activation::relu(0.0f),
                                    Activation::clip(-0.3f, 0.4f), Activation::relu(0.1f),
                                    Activation::clip(0.0f, 6.0f)};
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    const hn::Capabilities caps = d.capabilities();
    std::uint32_t seed = 7100;
    std::size_t case_index = 0;
    auto cases = conv_cases();
    cases.emplace_back(lowering(2, 2, 12, 12, 5, 5, 0, 0, 1, 1), 20);  // conv_small
    cases.emplace_back(lowering(3, 32, 7, 6, 1, 1, 0, 0, 1, 1), 48);   // ResNet's conv3
    cases.emplace_back(lowering(2, 32, 9, 9, 1, 1, 0, 0, 2, 2), 64);   // its strided shortcut
    cases.emplace_back(lowering(3, 58, 7, 7, 1, 1, 0, 0, 1, 1), 29);   // NCHW pointwise only
    for (const auto& [base, out_channels] : cases) {
      const Activation& activation = activations[case_index % std::size(activations)];
      ++case_index;
      // Blocked where the channels allow; the 1x1 ones on the driver's pointwise kernels too,
      // blocked (mode 2) and NCHW (mode 3, stride 1).
      for (const int mode : {0, 1, 2, 3}) {
        hn::LoweringShape shape = base;
        const Layout layout = caps.preferred_blocked_layout;
        const index_t block = hn::layout_block(layout);
        if (mode == 1 || mode == 2) {
          if (!caps.blocked_layout || shape.channels % block != 0 || out_channels % block != 0)
            continue;
          shape.layout = shape.out_layout = layout;
        }
        if (mode >= 2) {
          if (!takes_pointwise(caps, shape, mode == 3)) continue;
          shape.pointwise = true;
        }
        INFO(shape.to_string() << " out_channels=" << out_channels << " activation "
                               << activation.to_string() << (shape.pointwise ? " pointwise" : ""));
        const index_t oh = shape.out_h(), ow = shape.out_w();
        const index_t y_count = shape.batch * out_channels * oh * ow;
        const std::vector<float> xv = random_floats(shape.image_count(), seed++);
        const std::vector<float> rv = random_floats(y_count, seed++);
        const TwinArray x(drivers, xv,
                          relaid(xv, shape.batch, shape.channels, shape.height, shape.width,
                                 Layout::nchw, shape.layout));
        const TwinArray r(
            drivers, rv,
            relaid(rv, shape.batch, out_channels, oh, ow, Layout::nchw, shape.out_layout));
        const TwinArray w(drivers, random_floats(conv_weight_count(shape, out_channels), seed++));
        const TwinArray bias(drivers, random_floats(out_channels, seed++));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        hn::LoweringShape plain = shape;
        plain.layout = plain.out_layout = Layout::nchw;
        plain.pointwise = false;
        drivers.oracle->conv_forward(plain, out_channels, x[Side::oracle], w[Side::oracle],
                                     bias[Side::oracle], y[Side::oracle]);
        std::vector<float> oracle = y.oracle();
        for (std::size_t i = 0; i < oracle.size(); ++i) {
          float v = oracle[i] + rv[i];
          if (activation.kind == Activation::Kind::relu && !(v > 0.0f)) v *= activation.slope;
          if (activation.kind == Activation::Kind::clip)
            v = std::min(std::max(v, activation.lo), activation.hi);
          oracle[i] = v;
        }
        d.conv_forward_residual(shape, out_channels, x[Side::tested], w[Side::tested],
                                bias[Side::tested], r[Side::tested], activation, y[Side::tested]);
        const std::vector<float> tested =
            relaid(y.tested(), shape.batch, out_channels, oh, ow, shape.out_layout, Layout::nchw);
        check_close(
            tested, oracle,
            gemm_tolerance(shape.channels / shape.groups * shape.kernel_h * shape.kernel_w));
      }
    }
    // The residual must not overlap y.
    const TwinArray a(drivers, constant(32, 1.0f));
    CHECK_THAT(error_of([&] {
                 d.conv_forward_residual(lowering(1, 1, 4, 4, 1, 1, 0, 0, 1, 1), 1, a[Side::tested],
                                         a[Side::tested], nullptr, a[Side::tested] + 8,
                                         Activation{}, a[Side::tested]);
               }),
               Contains("conv_forward_residual") && Contains("residual"));
  }
}

TEST_CASE(
    "conv_forward with weights versions computes with the weights of each call on every "
    "driver: a new version or 0 after the contents change, two weights arrays in turn",
    "[driver_ops][convolution]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const Drivers drivers(config);
    hn::Driver& d = *drivers.driver;
    const hn::Capabilities caps = d.capabilities();
    std::uint32_t seed = 6100;
    for (const bool blocked : {false, true}) {
      if (blocked && !caps.blocked_layout) continue;
      hn::LoweringShape shape = lowering(2, 32, 9, 8, 3, 3, 1, 1, 1, 1);
      const index_t out_channels = 32;
      if (blocked) shape.layout = shape.out_layout = caps.preferred_blocked_layout;
      INFO(shape.to_string());
      hn::LoweringShape plain = shape;
      plain.layout = plain.out_layout = hn::Layout::nchw;
      const index_t oh = shape.out_h(), ow = shape.out_w();
      const index_t y_count = shape.batch * out_channels * oh * ow;
      const index_t w_count = conv_weight_count(shape, out_channels);
      const std::vector<float> xv = random_floats(shape.image_count(), seed++);
      const TwinArray x(drivers, xv,
                        relaid(xv, shape.batch, shape.channels, shape.height, shape.width,
                               hn::Layout::nchw, shape.layout));
      const TwinArray first(drivers, random_floats(w_count, seed++));
      const TwinArray second(drivers, random_floats(w_count, seed++));
      // (weights, their new contents or none, version): the same address with a new
      // version, the other array, the first again at its version, then unknown (0).
      struct Step {
        const TwinArray* w;
        bool change;
        std::uint64_t version;
      };
      const Step steps[] = {{&first, false, 11}, {&first, true, 12},  {&second, false, 13},
                            {&first, false, 12}, {&second, true, 14}, {&first, true, 0},
                            {&first, true, 0}};
      for (const Step& step : steps) {
        if (step.change) {
          const std::vector<float> values = random_floats(w_count, seed++);
          d.copy_from_host((*step.w)[Side::tested], values.data(), values.size() * sizeof(float));
          drivers.oracle->copy_from_host((*step.w)[Side::oracle], values.data(),
                                         values.size() * sizeof(float));
        }
        INFO("version " << step.version << (step.change ? ", changed" : ""));
        const TwinArray y(drivers, constant(y_count, -7777.0f), constant(y_count, kNaN));
        drivers.oracle->conv_forward(plain, out_channels, x[Side::oracle], (*step.w)[Side::oracle],
                                     nullptr, y[Side::oracle]);
        hn::LoweringShape versioned = shape;
        versioned.weights_version = step.version;
        d.conv_forward(versioned, out_channels, x[Side::tested], (*step.w)[Side::tested], nullptr,
                       y[Side::tested]);
        check_close(relaid(y.tested(), shape.batch, out_channels, oh, ow, shape.out_layout,
                           hn::Layout::nchw),
                    y.oracle(), gemm_tolerance(shape.channels * shape.kernel_h * shape.kernel_w));
      }
    }
  }
}

}  // namespace
