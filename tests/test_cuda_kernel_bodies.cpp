// Host tests of the CUDA kernel bodies (lib/drivers/cuda/kernels/*.cuh): every body runs over its
// whole index space, in a shuffled order (a GPU promises no order), on random inputs with odd
// and prime sizes, and is compared with the reference driver. Built with or without CUDA:
// it includes only the g++-compilable bodies, so CI checks the kernels' indexing and
// arithmetic without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/drivers/cuda/kernels/activations.cuh"
#include "lib/drivers/cuda/kernels/depthwise.cuh"
#include "lib/drivers/cuda/kernels/dropout.cuh"
#include "lib/drivers/cuda/kernels/elementwise.cuh"
#include "lib/drivers/cuda/kernels/losses.cuh"
#include "lib/drivers/cuda/kernels/lowering.cuh"
#include "lib/drivers/cuda/kernels/lrn.cuh"
#include "lib/drivers/cuda/kernels/norm_affine.cuh"
#include "lib/drivers/cuda/kernels/pooling.cuh"
#include "lib/drivers/cuda/kernels/reductions.cuh"
#include "lib/drivers/cuda/kernels/softmax.cuh"
#include "lib/drivers/cuda/kernels/solver_update.cuh"
#include "tests/support.h"

namespace {

using hn::AxisShape;
using hn::index_t;
using hn::LoweringShape;
using hn::LrnRegion;
using hn::LrnShape;
using hn::PoolShape;
using hn::test::lowering;
using hn::test::lrn;
using hn::test::max_rel_diff;
using hn::test::pooling;
using hn::test::random_floats;
namespace cuda = hn::detail::cuda;

// The oracle, on host memory, so its calls take the test's vectors directly.
std::unique_ptr<hn::Driver> make_reference() {
  return hn::make_driver(hn::Device{"reference", 0});
}

// Runs body(i) for every i in [0, n) in a shuffled order: a body that reads what another
// index writes would give a different answer here, as it would race on a GPU.
template <class Body>
void for_each_index(index_t n, Body body) {
  std::vector<index_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), index_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<std::uint32_t>(n) + 17));
  for (const index_t i : order)
    body(i);
}

std::size_t size_of(index_t n) {
  return static_cast<std::size_t>(n);
}

// Values from a small set, so max pooling meets ties (first maximum must win).
std::vector<float> tied_floats(std::size_t n, std::uint32_t seed) {
  std::vector<float> v = random_floats(n, seed, -3.0f, 3.0f);
  for (float& x : v)
    x = std::round(x);
  return v;
}

std::vector<LoweringShape> lowering_shapes() {
  return {
      lowering(3, 5, 7, 11, 3, 5, 1, 2, 2, 1, 1, 2),  // pad, stride and dilation all uneven
      lowering(2, 3, 13, 5, 1, 1, 0, 0, 1, 1, 1, 1),  // 1x1: a plain copy
      lowering(1, 2, 4, 4, 4, 4, 0, 0, 1, 1, 1, 1),   // kernel = image: one column per image
      lowering(2, 7, 9, 10, 3, 3, 2, 2, 3, 3, 2, 2),  // stride > 1 leaves pixels uncovered
      lowering(5, 1, 3, 17, 2, 7, 1, 3, 1, 2, 1, 1),
  };
}

PoolShape without_pads_counted(PoolShape shape) {
  shape.count_include_pad = false;
  return shape;
}

std::vector<PoolShape> pool_shapes() {
  return {
      pooling(2, 3, 7, 11, 3, 2, 2, 3, 1, 1),   // Caffe's ceil mode leaves partial windows
      pooling(1, 2, 5, 5, 3, 3, 3, 3, 0, 0),    // last window clipped by the image
      pooling(3, 1, 13, 9, 2, 4, 1, 2, 1, 0),   // overlapping windows
      pooling(2, 3, 6, 7, 6, 7, 1, 1, 0, 0),    // global pooling
      pooling(1, 5, 11, 13, 3, 3, 2, 2, 2, 2),  // padding drops the last window
      without_pads_counted(pooling(2, 3, 7, 11, 3, 2, 2, 3, 1, 1)),  // ONNX's count_include_pad 0
  };
}

// Depthwise convolutions (groups == channels) with out_channels = channels * multiplier.
struct DepthwiseCase {
  LoweringShape shape;
  index_t multiplier;
  index_t out_channels() const { return shape.channels * multiplier; }
};

std::vector<DepthwiseCase> depthwise_cases() {
  return {
      {lowering(2, 3, 7, 11, 3, 3, 1, 1, 1, 1, 1, 1, 3), 1},   // 3x3, pad 1: "same" size
      {lowering(3, 4, 9, 6, 3, 3, 0, 0, 2, 2, 1, 1, 4), 2},    // stride 2, no pad
      {lowering(2, 5, 13, 10, 5, 5, 1, 1, 2, 2, 1, 1, 5), 1},  // 5x5, stride 2, pad 1
      {lowering(2, 3, 11, 12, 3, 3, 1, 1, 1, 1, 2, 2, 3), 2},  // dilation 2
      {lowering(3, 2, 12, 13, 5, 3, 0, 1, 1, 2, 2, 1, 2), 2},  // every field uneven
      {lowering(2, 7, 12, 9, 3, 3, 1, 1, 2, 2, 1, 1, 7), 1},   // MobileNet-like stride 2
      {lowering(2, 2, 5, 4, 5, 5, 2, 2, 1, 1, 1, 1, 2), 2},    // kernel wider than the image
  };
}

// Emulates the reduction kernels' two passes: per-thread partials, block trees, final tree.
double block_tree(std::vector<double> values) {
  for (int stride = cuda::kReduceThreads / 2; stride > 0; stride /= 2) {
    for (int t = 0; t < cuda::kReduceThreads; ++t)
      cuda::tree_step(t, stride, values.data());
  }
  return values[0];
}

float device_reduce(cuda::ReduceOp op, index_t n, const float* x, const float* y) {
  const int blocks = cuda::reduce_blocks(n);
  const index_t threads = static_cast<index_t>(blocks) * cuda::kReduceThreads;
  std::vector<double> partials(static_cast<std::size_t>(blocks));
  for (int b = 0; b < blocks; ++b) {
    std::vector<double> values(cuda::kReduceThreads);
    for (int t = 0; t < cuda::kReduceThreads; ++t) {
      values[t] =
          cuda::reduce_thread_partial(op, index_t{b} * cuda::kReduceThreads + t, threads, n, x, y);
    }
    partials[b] = block_tree(values);
  }
  std::vector<double> values(cuda::kReduceThreads);
  for (int t = 0; t < cuda::kReduceThreads; ++t) {
    values[t] = cuda::partials_thread_sum(t, blocks, partials.data());
  }
  return static_cast<float>(block_tree(values));
}

// Emulates the bias_backward kernel: one block, and its tree, per channel.
void device_bias_backward(const AxisShape& shape, const float* dy, float beta, float* dbias) {
  for (index_t c = 0; c < shape.channels; ++c) {
    std::vector<double> values(cuda::kReduceThreads);
    for (int t = 0; t < cuda::kReduceThreads; ++t) {
      values[t] = cuda::bias_backward_partial(c, t, shape, dy);
    }
    cuda::bias_backward_finish(c, block_tree(values), beta, dbias);
  }
}

// Emulates norm_affine.cu's backward: every block's threads and trees, then the finish.
void device_norm_affine_backward(const AxisShape& shape, const cuda::NormAffineBackward& p,
                                 float* dgamma, float* dbeta) {
  const index_t blocks = cuda::norm_blocks_per_channel(shape);
  std::vector<double> partials(size_of(2 * shape.channels * blocks));
  for (index_t c = 0; c < shape.channels; ++c) {
    for (index_t b = 0; b < blocks; ++b) {
      std::vector<double> dz(cuda::kReduceThreads), dz_normalised(cuda::kReduceThreads);
      for (int t = 0; t < cuda::kReduceThreads; ++t) {
        const cuda::NormSums sums = cuda::norm_affine_backward_partial(shape, p, c, b, t);
        dz[t] = sums.dz;
        dz_normalised[t] = sums.dz_normalised;
      }
      partials[size_of(2 * (c * blocks + b))] = block_tree(dz);
      partials[size_of(2 * (c * blocks + b) + 1)] = block_tree(dz_normalised);
    }
  }
  for (index_t c = 0; c < shape.channels; ++c)
    cuda::norm_affine_backward_finish(c, blocks, partials.data(), dgamma, dbeta);
}

// Shapes for the fused normalisation: planes smaller and larger than a block, several blocks
// per channel (outer * inner > kNormTermsPerBlock, and not a multiple of it), one channel.
std::vector<AxisShape> norm_shapes() {
  return {AxisShape{3, 5, 7}, AxisShape{2, 3, 300}, AxisShape{5, 2, 3001}, AxisShape{1, 1, 20011},
          AxisShape{37, 4, 1}};
}

}  // namespace

TEST_CASE("cuda im2col body equals the reference lowering", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const LoweringShape& shape : lowering_shapes()) {
    INFO(shape.to_string());
    const auto images = random_floats(size_of(shape.image_count()), 11);
    std::vector<float> expected(size_of(shape.col_count()), NAN);
    std::vector<float> actual(size_of(shape.col_count()), NAN);
    ref->im2col(shape, images.data(), expected.data());
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    REQUIRE(d.rows() * d.cols() == shape.col_count());
    for_each_index(d.rows() * d.cols(),
                   [&](index_t i) { cuda::im2col_element(i, d, images.data(), actual.data()); });
    REQUIRE(actual == expected);
  }
}

TEST_CASE("cuda col2im body gathers bitwise what the reference scatters", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const LoweringShape& shape : lowering_shapes()) {
    INFO(shape.to_string());
    const auto columns = random_floats(size_of(shape.col_count()), 12);
    std::vector<float> expected(size_of(shape.image_count()), NAN);
    std::vector<float> actual(size_of(shape.image_count()), NAN);  // must be overwritten
    ref->col2im(shape, columns.data(), expected.data());
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    for_each_index(shape.image_count(),
                   [&](index_t i) { cuda::col2im_element(i, d, columns.data(), actual.data()); });
    REQUIRE(actual == expected);
  }
}

TEST_CASE("cuda swap_axes body equals the reference", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const auto& sizes :
       std::vector<std::array<index_t, 3>>{{7, 5, 13}, {1, 11, 3}, {17, 1, 2}, {3, 29, 1}}) {
    const index_t d0 = sizes[0], d1 = sizes[1], inner = sizes[2];
    INFO("d0=" << d0 << " d1=" << d1 << " inner=" << inner);
    const index_t n = d0 * d1 * inner;
    const auto src = random_floats(size_of(n), 13);
    std::vector<float> expected(size_of(n)), actual(size_of(n), NAN);
    ref->swap_axes(d0, d1, inner, src.data(), expected.data());
    for_each_index(n, [&](index_t k) {
      cuda::swap_axes_element(k, d0, d1, inner, src.data(), actual.data());
    });
    REQUIRE(actual == expected);
  }
}

TEST_CASE("cuda lift body equals the reference and the lift_backward body is bitwise equal",
          "[cuda-bodies]") {
  auto ref = make_reference();
  index_t out_channels = 1;
  for (const LoweringShape& shape : lowering_shapes()) {
    out_channels = out_channels % 5 + 2;  // 3, 5, 2, 4, 6
    INFO(shape.to_string() << " out_channels=" << out_channels);
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    const index_t p_count =
        shape.batch * shape.height * shape.width * out_channels * shape.kernel_h * shape.kernel_w;
    const index_t y_count = shape.batch * out_channels * d.out_h * d.out_w;
    const auto products = random_floats(size_of(p_count), 14);
    std::vector<float> expected(size_of(y_count)), actual(size_of(y_count), NAN);
    ref->lift(shape, out_channels, products.data(), expected.data());
    for_each_index(y_count, [&](index_t i) {
      cuda::lift_element(i, d, out_channels, products.data(), actual.data());
    });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-6);

    const auto dy = random_floats(size_of(y_count), 15);
    std::vector<float> dp_expected(size_of(p_count)), dp_actual(size_of(p_count), NAN);
    ref->lift_backward(shape, out_channels, dy.data(), dp_expected.data());
    for_each_index(p_count, [&](index_t i) {
      cuda::lift_backward_element(i, d, out_channels, dy.data(), dp_actual.data());
    });
    REQUIRE(dp_actual == dp_expected);
  }
}

TEST_CASE("cuda is_depthwise holds exactly for groups == channels > 1", "[cuda-bodies]") {
  CHECK(cuda::is_depthwise(lowering(1, 4, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 4), 4));
  CHECK(cuda::is_depthwise(lowering(1, 4, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 4), 12));
  CHECK_FALSE(cuda::is_depthwise(lowering(1, 4, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 2), 4));
  CHECK_FALSE(cuda::is_depthwise(lowering(1, 1, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1), 1));
  CHECK_FALSE(cuda::is_depthwise(lowering(1, 4, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1), 4));
}

TEST_CASE("cuda depthwise conv forward body equals the reference convolution, bias or not",
          "[cuda-bodies]") {
  auto ref = make_reference();
  for (const DepthwiseCase& c : depthwise_cases()) {
    const LoweringShape& shape = c.shape;
    const index_t oc = c.out_channels();
    INFO(shape.to_string() << " out_channels=" << oc);
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    const index_t y_count = shape.batch * oc * d.out_h * d.out_w;
    const auto x = random_floats(size_of(shape.image_count()), 16);
    const auto weights = random_floats(size_of(oc * shape.kernel_h * shape.kernel_w), 17);
    const auto bias = random_floats(size_of(oc), 18);
    for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
      INFO((b != nullptr ? "with bias" : "without bias"));
      std::vector<float> expected(size_of(y_count)), actual(size_of(y_count), NAN);
      ref->conv_forward(shape, oc, x.data(), weights.data(), b, expected.data());
      for_each_index(y_count, [&](index_t i) {
        cuda::depthwise_forward_element(i, d, oc, x.data(), weights.data(), b, actual.data());
      });
      REQUIRE(max_rel_diff(actual, expected) <= 1e-5);
    }
  }
}

TEST_CASE("cuda depthwise conv backward_data body overwrites dx with the reference gradient",
          "[cuda-bodies]") {
  auto ref = make_reference();
  for (const DepthwiseCase& c : depthwise_cases()) {
    const LoweringShape& shape = c.shape;
    const index_t oc = c.out_channels();
    INFO(shape.to_string() << " out_channels=" << oc);
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    const auto weights = random_floats(size_of(oc * shape.kernel_h * shape.kernel_w), 19);
    const auto dy = random_floats(size_of(shape.batch * oc * d.out_h * d.out_w), 20);
    std::vector<float> expected(size_of(shape.image_count())),
        actual(size_of(shape.image_count()), NAN);  // must be overwritten
    ref->conv_backward_data(shape, oc, weights.data(), dy.data(), expected.data());
    for_each_index(shape.image_count(), [&](index_t i) {
      cuda::depthwise_backward_data_element(i, d, oc, weights.data(), dy.data(), actual.data());
    });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-5);
  }
}

TEST_CASE(
    "cuda depthwise conv backward_weights body and bias_backward add the reference gradients "
    "to non-zero ones",
    "[cuda-bodies]") {
  auto ref = make_reference();
  for (const DepthwiseCase& c : depthwise_cases()) {
    const LoweringShape& shape = c.shape;
    const index_t oc = c.out_channels();
    INFO(shape.to_string() << " out_channels=" << oc);
    const cuda::LoweringDims d = cuda::lowering_dims(shape);
    const index_t w_count = oc * shape.kernel_h * shape.kernel_w;
    const auto x = random_floats(size_of(shape.image_count()), 21);
    const auto dy = random_floats(size_of(shape.batch * oc * d.out_h * d.out_w), 22);
    const auto dw_prior = random_floats(size_of(w_count), 23, -3.0f, 3.0f);
    const auto db_prior = random_floats(size_of(oc), 24, -3.0f, 3.0f);
    auto dw_expected = dw_prior, dw_actual = dw_prior;
    auto db_expected = db_prior, db_actual = db_prior;
    ref->conv_backward_weights(shape, oc, x.data(), dy.data(), dw_expected.data(),
                               db_expected.data());
    for_each_index(w_count, [&](index_t i) {
      cuda::depthwise_backward_weights_element(i, d, oc, x.data(), dy.data(), dw_actual.data());
    });
    REQUIRE(max_rel_diff(dw_actual, dw_expected) <= 1e-5);
    // The driver's bias gradient: bias_backward over [batch][out_channels][plane], beta = 1.
    device_bias_backward(AxisShape{shape.batch, oc, d.out_h * d.out_w}, dy.data(), 1.0f,
                         db_actual.data());
    REQUIRE(max_rel_diff(db_actual, db_expected) <= 1e-5);
  }
}

TEST_CASE("cuda element-wise bodies equal the reference, in place too", "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 1009;
  const auto x = random_floats(size_of(n), 21);
  const auto y0 = random_floats(size_of(n), 22);

  SECTION("fill") {
    std::vector<float> expected(size_of(n)), actual(size_of(n));
    ref->fill(n, 2.5f, expected.data());
    for_each_index(n, [&](index_t i) { cuda::fill_element(i, 2.5f, actual.data()); });
    REQUIRE(actual == expected);
  }
  SECTION("scale") {
    auto expected = x, actual = x;
    ref->scale(n, -0.7f, expected.data());
    for_each_index(n, [&](index_t i) { cuda::scale_element(i, -0.7f, actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-7);
  }
  SECTION("axpy") {
    auto expected = y0, actual = y0;
    ref->axpy(n, 1.3f, x.data(), expected.data());
    for_each_index(n, [&](index_t i) { cuda::axpy_element(i, 1.3f, x.data(), actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
  }
  SECTION("axpby with beta != 0") {
    auto expected = y0, actual = y0;
    ref->axpby(n, 1.3f, x.data(), -0.4f, expected.data());
    for_each_index(
        n, [&](index_t i) { cuda::axpby_element(i, 1.3f, x.data(), -0.4f, actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
  }
  SECTION("axpby with beta == 0 does not read y (NaN there does not propagate)") {
    std::vector<float> expected(size_of(n), NAN), actual(size_of(n), NAN);
    ref->axpby(n, 1.3f, x.data(), 0.0f, expected.data());
    for_each_index(n,
                   [&](index_t i) { cuda::axpby_element(i, 1.3f, x.data(), 0.0f, actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-7);
  }
  SECTION("mul, in place") {
    auto expected = y0, actual = y0;
    ref->mul(n, x.data(), expected.data(), expected.data());
    for_each_index(
        n, [&](index_t i) { cuda::mul_element(i, x.data(), actual.data(), actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-7);
  }
}

TEST_CASE("cuda add_scalar, powx, copy_strided and scale_channels bodies equal the reference",
          "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 1009;

  SECTION("add_scalar") {
    auto expected = random_floats(size_of(n), 23), actual = expected;
    ref->add_scalar(n, -0.625f, expected.data());
    for_each_index(n, [&](index_t i) { cuda::add_scalar_element(i, -0.625f, actual.data()); });
    REQUIRE(actual == expected);
  }
  SECTION("powx, in place, positive bases and signed bases with integer exponents") {
    const auto positive = random_floats(size_of(n), 24, 0.05f, 4.0f);
    const auto signed_bases = random_floats(size_of(n), 25, -3.0f, 3.0f);
    for (const float exponent : {0.75f, -0.5f, 2.0f, 3.0f}) {
      INFO("exponent=" << exponent);
      const auto& x = exponent == std::floor(exponent) ? signed_bases : positive;
      auto expected = x, actual = x;
      ref->powx(n, x.data(), exponent, expected.data());
      for_each_index(
          n, [&](index_t i) { cuda::powx_element(i, actual.data(), exponent, actual.data()); });
      REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
    }
  }
  SECTION("copy_strided leaves the padding alone") {
    const index_t rows = 13, cols = 7, src_ld = 11, dst_ld = 9;
    const auto src = random_floats(size_of(rows * src_ld), 26);
    std::vector<float> expected(size_of(rows * dst_ld), -777.0f), actual = expected;
    ref->copy_strided(rows, cols, src.data(), src_ld, expected.data(), dst_ld);
    for_each_index(rows * cols, [&](index_t i) {
      cuda::copy_strided_element(i, cols, src.data(), src_ld, actual.data(), dst_ld);
    });
    REQUIRE(actual == expected);
  }
  SECTION("scale_channels, in place") {
    for (const AxisShape shape : {AxisShape{3, 7, 11}, AxisShape{5, 13, 1}, AxisShape{1, 1, 31}}) {
      INFO(shape.to_string());
      const auto scale = random_floats(size_of(shape.channels), 27);
      auto expected = random_floats(size_of(shape.count()), 28), actual = expected;
      ref->scale_channels(shape, scale.data(), expected.data(), expected.data());
      for_each_index(shape.count(), [&](index_t i) {
        cuda::scale_channels_element(i, shape, scale.data(), actual.data(), actual.data());
      });
      REQUIRE(actual == expected);
    }
  }
}

TEST_CASE("cuda max_accumulate and max_select bodies equal the reference bitwise, ties included",
          "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 2011;
  std::vector<float> expected(size_of(n), -7777.0f), actual(size_of(n), NAN);
  std::vector<std::int32_t> mask_expected(size_of(n), -3), mask_actual(size_of(n), 99);
  for (std::int32_t index = 0; index < 4; ++index) {
    INFO("input " << index);
    const auto x = tied_floats(size_of(n), 30 + static_cast<std::uint32_t>(index));
    ref->max_accumulate(n, x.data(), index, expected.data(), mask_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::max_accumulate_element(i, x.data(), index, actual.data(), mask_actual.data());
    });
    REQUIRE(actual == expected);
    REQUIRE(mask_actual == mask_expected);
  }
  const auto dy = random_floats(size_of(n), 35);
  for (std::int32_t index = 0; index < 4; ++index) {
    INFO("max_select " << index);
    std::vector<float> dx_expected(size_of(n)), dx_actual(size_of(n), NAN);
    ref->max_select(n, mask_expected.data(), index, dy.data(), dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::max_select_element(i, mask_expected.data(), index, dy.data(), dx_actual.data());
    });
    REQUIRE(dx_actual == dx_expected);
  }
}

TEST_CASE("cuda gemm body for k == 0 scales C like the reference gemm", "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t m = 7, n = 5, ldc = 9;
  const float unused = 0.0f;
  for (const float beta : {0.0f, 0.5f, -2.0f}) {
    INFO("beta=" << beta);
    auto c0 = random_floats(size_of(m * ldc), 31);
    if (beta == 0.0f) std::fill(c0.begin(), c0.end(), NAN);  // must not be read
    auto expected = c0, actual = c0;
    ref->gemm(hn::Transpose::no, hn::Transpose::no, m, n, 0, 1.0f, &unused, 1, &unused, n, beta,
              expected.data(), ldc);
    for_each_index(m * n,
                   [&](index_t i) { cuda::scale_matrix_element(i, n, ldc, beta, actual.data()); });
    for (index_t r = 0; r < m; ++r) {
      for (index_t col = 0; col < n; ++col) {
        REQUIRE(actual[size_of(r * ldc + col)] == expected[size_of(r * ldc + col)]);
      }
    }
  }
}

TEST_CASE("cuda reduction bodies (two-pass, fixed trees) equal the reference", "[cuda-bodies]") {
  auto ref = make_reference();
  // Around one block, one full first pass (256 x 256 terms) and several terms per thread.
  for (const index_t n :
       {index_t{1}, index_t{255}, index_t{257}, index_t{65536}, index_t{65537}, index_t{100003}}) {
    INFO("n=" << n);
    const auto x = random_floats(size_of(n), 41);
    const auto y = random_floats(size_of(n), 42);
    const auto close = [](float a, float b) {
      return std::abs(a - b) <= 1e-6f * std::max(1.0f, std::abs(b));
    };
    REQUIRE(close(device_reduce(cuda::ReduceOp::dot, n, x.data(), y.data()),
                  ref->dot(n, x.data(), y.data())));
    REQUIRE(
        close(device_reduce(cuda::ReduceOp::asum, n, x.data(), x.data()), ref->asum(n, x.data())));
    REQUIRE(
        close(device_reduce(cuda::ReduceOp::sum, n, x.data(), x.data()), ref->sum(n, x.data())));
  }
}

TEST_CASE("cuda bias_backward body equals the reference, also for outer == 0", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const AxisShape shape :
       {AxisShape{3, 7, 13}, AxisShape{0, 5, 3}, AxisShape{1, 1, 70001}, AxisShape{257, 3, 1}}) {
    for (const float beta : {0.0f, 0.75f}) {
      INFO(shape.to_string() << " beta=" << beta);
      const auto dy = random_floats(size_of(shape.count()), 51);
      auto prior = random_floats(size_of(shape.channels), 52);
      if (beta == 0.0f) std::fill(prior.begin(), prior.end(), NAN);  // must not be read
      auto expected = prior, actual = prior;
      ref->bias_backward(shape, dy.data(), beta, expected.data());
      device_bias_backward(shape, dy.data(), beta, actual.data());
      REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
    }
  }
}

TEST_CASE(
    "cuda bias_backward body gives each thread the sum of its terms in index order, bitwise, "
    "for inner sizes below, at and above the block",
    "[cuda-bodies]") {
  for (const AxisShape shape :
       {AxisShape{5, 3, 100}, AxisShape{2, 2, 300}, AxisShape{33, 2, 7}, AxisShape{1000, 2, 1},
        AxisShape{3, 2, 256}, AxisShape{2, 3, 3001}, AxisShape{1, 1, 5}}) {
    INFO(shape.to_string());
    const auto dy = random_floats(size_of(shape.count()), 53);
    const index_t terms = shape.outer * shape.inner;
    for (index_t c = 0; c < shape.channels; ++c) {
      for (int t = 0; t < cuda::kReduceThreads; ++t) {
        // Term j of channel c is dy[o][c][i] with (o, i) = (j / inner, j % inner).
        double expected = 0.0;
        for (index_t j = t; j < terms; j += cuda::kReduceThreads) {
          const index_t o = j / shape.inner, i = j % shape.inner;
          expected += static_cast<double>(
              dy[static_cast<std::size_t>((o * shape.channels + c) * shape.inner + i)]);
        }
        const double got = cuda::bias_backward_partial(c, t, shape, dy.data());
        CHECK(std::memcmp(&got, &expected, sizeof(double)) == 0);
      }
    }
  }
}

TEST_CASE(
    "cuda norm_affine_forward body equals the reference's sequence of calls bitwise, with and "
    "without beta, ReLU and normalised, in place too",
    "[cuda-bodies]") {
  auto ref = make_reference();
  for (const AxisShape shape : norm_shapes()) {
    const auto x = random_floats(size_of(shape.count()), 61, -3.0f, 3.0f);
    const auto shift = random_floats(size_of(shape.channels), 62);
    const auto inv_std = random_floats(size_of(shape.channels), 63, 0.5f, 2.0f);
    const auto gamma = random_floats(size_of(shape.channels), 64);
    const auto beta = random_floats(size_of(shape.channels), 65);
    for (const bool with_beta : {false, true}) {
      for (const bool relu : {false, true}) {
        for (const bool in_place : {false, true}) {
          INFO(shape.to_string() << " beta " << with_beta << " relu " << relu << " in place "
                                 << in_place);
          const float slope = relu ? 0.125f : 0.0f;
          std::vector<float> n_expected(size_of(shape.count()), NAN), n_actual = n_expected;
          std::vector<float> y_expected = x, y_actual = x;
          ref->norm_affine_forward(shape, in_place ? y_expected.data() : x.data(), shift.data(),
                                   inv_std.data(), gamma.data(), with_beta ? beta.data() : nullptr,
                                   relu, slope, n_expected.data(), y_expected.data());
          cuda::NormAffineForward p;
          p.shift = shift.data();
          p.inv_std = inv_std.data();
          p.gamma = gamma.data();
          p.beta = with_beta ? beta.data() : nullptr;
          p.relu = relu;
          p.slope = slope;
          const float* input = in_place ? y_actual.data() : x.data();
          for_each_index(shape.count(), [&](index_t i) {
            cuda::norm_affine_forward_element(i, shape, p, input, n_actual.data(), y_actual.data());
          });
          REQUIRE(std::memcmp(y_actual.data(), y_expected.data(), y_actual.size() * 4) == 0);
          REQUIRE(std::memcmp(n_actual.data(), n_expected.data(), n_actual.size() * 4) == 0);
        }
      }
    }
  }
}

TEST_CASE(
    "cuda norm_affine_backward bodies equal the reference: dx bitwise, the sums accumulated, "
    "any of dgamma, dbeta and dx null, dx on dy",
    "[cuda-bodies]") {
  auto ref = make_reference();
  for (const AxisShape shape : norm_shapes()) {
    const auto dy = random_floats(size_of(shape.count()), 71);
    const auto y = random_floats(size_of(shape.count()), 72);
    const auto normalised = random_floats(size_of(shape.count()), 73);
    const auto dx_scale = random_floats(size_of(shape.channels), 74);
    const auto prior = random_floats(size_of(shape.channels), 75);
    for (const bool relu : {false, true}) {
      for (int wanted = 1; wanted < 8; ++wanted) {  // bits: dgamma, dbeta, dx
        for (const bool in_place : {false, true}) {
          const bool want_dgamma = (wanted & 1) != 0, want_dbeta = (wanted & 2) != 0;
          const bool want_dx = (wanted & 4) != 0;
          if (in_place && !want_dx) continue;
          INFO(shape.to_string() << " relu " << relu << " dgamma " << want_dgamma << " dbeta "
                                 << want_dbeta << " dx " << want_dx << " in place " << in_place);
          const float slope = relu ? 0.25f : 0.0f;
          std::vector<float> g_expected = prior, g_actual = prior, b_expected = prior,
                             b_actual = prior;
          std::vector<float> dx_expected = dy, dx_actual = dy;
          if (!in_place) {
            std::fill(dx_expected.begin(), dx_expected.end(), NAN);
            std::fill(dx_actual.begin(), dx_actual.end(), NAN);
          }
          ref->norm_affine_backward(
              shape, in_place ? dx_expected.data() : dy.data(), y.data(), normalised.data(),
              dx_scale.data(), relu, slope, want_dgamma ? g_expected.data() : nullptr,
              want_dbeta ? b_expected.data() : nullptr, want_dx ? dx_expected.data() : nullptr);
          cuda::NormAffineBackward p;
          p.dy = in_place ? dx_actual.data() : dy.data();
          p.y = relu ? y.data() : nullptr;
          p.normalised = want_dgamma ? normalised.data() : nullptr;
          p.dx_scale = dx_scale.data();
          p.relu = relu;
          p.slope = slope;
          p.dx = want_dx ? dx_actual.data() : nullptr;
          device_norm_affine_backward(shape, p, want_dgamma ? g_actual.data() : nullptr,
                                      want_dbeta ? b_actual.data() : nullptr);
          REQUIRE(std::memcmp(dx_actual.data(), dx_expected.data(), dx_actual.size() * 4) == 0);
          REQUIRE(max_rel_diff(g_actual, g_expected) <= 1e-6);
          REQUIRE(max_rel_diff(b_actual, b_expected) <= 1e-6);
        }
      }
    }
  }
}

TEST_CASE("cuda activation bodies equal the reference, in place too", "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 2003;
  const auto x = random_floats(size_of(n), 61, -4.0f, 4.0f);
  const auto dy = random_floats(size_of(n), 62);

  SECTION("bias_forward") {
    const AxisShape shape{3, 7, 11};
    const auto bias = random_floats(size_of(shape.channels), 63);
    const auto y0 = random_floats(size_of(shape.count()), 64);
    auto expected = y0, actual = y0;
    ref->bias_forward(shape, bias.data(), expected.data());
    for_each_index(shape.count(), [&](index_t i) {
      cuda::bias_forward_element(i, shape, bias.data(), actual.data());
    });
    REQUIRE(actual == expected);
  }
  SECTION("relu (leaky) forward and backward") {
    std::vector<float> expected(size_of(n)), actual = x;  // forward in place
    ref->relu_forward(n, 0.1f, x.data(), expected.data());
    for_each_index(
        n, [&](index_t i) { cuda::relu_forward_element(i, 0.1f, actual.data(), actual.data()); });
    REQUIRE(actual == expected);
    auto dx_expected = dy, dx_actual = dy;  // backward in place
    ref->relu_backward(n, 0.1f, x.data(), dx_expected.data(), dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::relu_backward_element(i, 0.1f, x.data(), dx_actual.data(), dx_actual.data());
    });
    REQUIRE(dx_actual == dx_expected);
  }
  SECTION("clip forward and backward, the bounds included") {
    auto xb = x;
    xb[0] = -0.5f;
    xb[1] = 0.25f;
    std::vector<float> expected(size_of(n)), actual = xb;  // forward in place
    ref->clip_forward(n, -0.5f, 0.25f, xb.data(), expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::clip_forward_element(i, -0.5f, 0.25f, actual.data(), actual.data());
    });
    REQUIRE(actual == expected);
    auto dx_expected = dy, dx_actual = dy;  // backward in place
    ref->clip_backward(n, -0.5f, 0.25f, xb.data(), dx_expected.data(), dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::clip_backward_element(i, -0.5f, 0.25f, xb.data(), dx_actual.data(), dx_actual.data());
    });
    REQUIRE(dx_actual == dx_expected);
  }
  SECTION("sigmoid forward and backward") {
    std::vector<float> expected(size_of(n)), actual(size_of(n));
    ref->sigmoid_forward(n, x.data(), expected.data());
    for_each_index(n,
                   [&](index_t i) { cuda::sigmoid_forward_element(i, x.data(), actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
    std::vector<float> dx_expected(size_of(n)), dx_actual(size_of(n));
    ref->sigmoid_backward(n, expected.data(), dy.data(), dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::sigmoid_backward_element(i, expected.data(), dy.data(), dx_actual.data());
    });
    REQUIRE(max_rel_diff(dx_actual, dx_expected) <= 1e-6);
  }
  SECTION("tanh forward and backward") {
    std::vector<float> expected(size_of(n)), actual(size_of(n));
    ref->tanh_forward(n, x.data(), expected.data());
    for_each_index(n, [&](index_t i) { cuda::tanh_forward_element(i, x.data(), actual.data()); });
    REQUIRE(max_rel_diff(actual, expected) <= 1e-6);
    std::vector<float> dx_expected(size_of(n)), dx_actual(size_of(n));
    ref->tanh_backward(n, expected.data(), dy.data(), dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::tanh_backward_element(i, expected.data(), dy.data(), dx_actual.data());
    });
    REQUIRE(max_rel_diff(dx_actual, dx_expected) <= 1e-6);
  }
}

TEST_CASE(
    "cuda max pooling bodies: values, masks (first maximum wins) and gathered gradient "
    "equal the reference bitwise",
    "[cuda-bodies]") {
  auto ref = make_reference();
  for (const PoolShape& shape : pool_shapes()) {
    for (const bool ties : {false, true}) {
      INFO(shape.to_string() << (ties ? " with ties" : ""));
      const auto x = ties ? tied_floats(size_of(shape.in_count()), 71)
                          : random_floats(size_of(shape.in_count()), 71);
      const std::size_t outs = size_of(shape.out_count());
      std::vector<float> y_expected(outs), y_actual(outs, NAN);
      std::vector<std::int32_t> mask_expected(outs), mask_actual(outs, -7);
      ref->pool_max_forward(shape, x.data(), y_expected.data(), mask_expected.data());
      const cuda::PoolDims d = cuda::pool_dims(shape);
      for_each_index(shape.out_count(), [&](index_t i) {
        cuda::pool_max_forward_element(i, d, x.data(), y_actual.data(), mask_actual.data());
      });
      REQUIRE(y_actual == y_expected);
      REQUIRE(mask_actual == mask_expected);

      const auto dy = random_floats(outs, 72);
      std::vector<float> dx_expected(size_of(shape.in_count())),
          dx_actual(size_of(shape.in_count()), NAN);
      ref->pool_max_backward(shape, dy.data(), mask_expected.data(), dx_expected.data());
      for_each_index(shape.in_count(), [&](index_t i) {
        cuda::pool_max_backward_element(i, d, dy.data(), mask_expected.data(), dx_actual.data());
      });
      REQUIRE(dx_actual == dx_expected);
    }
  }
}

TEST_CASE("cuda average pooling bodies equal the reference (Caffe's divisor)", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const PoolShape& shape : pool_shapes()) {
    INFO(shape.to_string());
    const auto x = random_floats(size_of(shape.in_count()), 81);
    const std::size_t outs = size_of(shape.out_count());
    std::vector<float> y_expected(outs), y_actual(outs, NAN);
    ref->pool_avg_forward(shape, x.data(), y_expected.data());
    const cuda::PoolDims d = cuda::pool_dims(shape);
    for_each_index(shape.out_count(), [&](index_t i) {
      cuda::pool_avg_forward_element(i, d, x.data(), y_actual.data());
    });
    REQUIRE(max_rel_diff(y_actual, y_expected) <= 1e-6);

    const auto dy = random_floats(outs, 82);
    std::vector<float> dx_expected(size_of(shape.in_count())),
        dx_actual(size_of(shape.in_count()), NAN);
    ref->pool_avg_backward(shape, dy.data(), dx_expected.data());
    for_each_index(shape.in_count(), [&](index_t i) {
      cuda::pool_avg_backward_element(i, d, dy.data(), dx_actual.data());
    });
    // Same shares added in the same (output) order as the reference's scatter.
    REQUIRE(dx_actual == dx_expected);
  }
}

TEST_CASE("cuda LRN bodies equal the reference in both regions", "[cuda-bodies]") {
  auto ref = make_reference();
  const std::vector<LrnShape> shapes = {
      lrn(2, 7, 5, 3, 5, LrnRegion::across_channels),
      lrn(1, 3, 4, 7, 1, LrnRegion::across_channels),
      lrn(3, 2, 3, 5, 7, LrnRegion::across_channels),  // window wider than the channels
      lrn(2, 3, 7, 11, 3, LrnRegion::within_channel),
      lrn(1, 2, 5, 4, 5, LrnRegion::within_channel),
      lrn(1, 1, 2, 3, 7, LrnRegion::within_channel),  // window wider than the image
  };
  for (const LrnShape& shape : shapes) {
    INFO(shape.to_string());
    const std::size_t n = size_of(shape.count());
    const auto x = random_floats(n, 91, -2.0f, 2.0f);
    const auto dy = random_floats(n, 92);
    std::vector<float> y_expected(n), scale_expected(n), y_actual(n, NAN), scale_actual(n, NAN);
    ref->lrn_forward(shape, x.data(), y_expected.data(), scale_expected.data());
    const bool across = shape.region == LrnRegion::across_channels;
    for_each_index(shape.count(), [&](index_t i) {
      if (across) {
        cuda::lrn_across_forward_element(i, shape, x.data(), y_actual.data(), scale_actual.data());
      } else {
        cuda::lrn_within_forward_element(i, shape, x.data(), y_actual.data(), scale_actual.data());
      }
    });
    CHECK(max_rel_diff(scale_actual, scale_expected) <= 1e-6);
    CHECK(max_rel_diff(y_actual, y_expected) <= 2e-6);
    if (across) {  // the cuDNN path fills scale with this body alone
      std::vector<float> scale_only(n, NAN);
      for_each_index(shape.count(), [&](index_t i) {
        cuda::lrn_across_scale_element(i, shape, x.data(), scale_only.data());
      });
      CHECK(scale_only == scale_actual);
    }

    // Backward from the reference's forward results, so it is checked on its own.
    std::vector<float> dx_expected(n), dx_actual(n, NAN);
    ref->lrn_backward(shape, x.data(), y_expected.data(), scale_expected.data(), dy.data(),
                      dx_expected.data());
    for_each_index(shape.count(), [&](index_t i) {
      if (across) {
        cuda::lrn_across_backward_element(i, shape, x.data(), y_expected.data(),
                                          scale_expected.data(), dy.data(), dx_actual.data());
      } else {
        cuda::lrn_within_backward_element(i, shape, x.data(), scale_expected.data(), dy.data(),
                                          dx_actual.data());
      }
    });
    CHECK(max_rel_diff(dx_actual, dx_expected) <= 1e-5);
  }
}

TEST_CASE("cuda softmax bodies equal the reference, in place too", "[cuda-bodies]") {
  auto ref = make_reference();
  for (const AxisShape shape : {AxisShape{5, 11, 7}, AxisShape{3, 1000, 1}, AxisShape{1, 2, 1},
                                AxisShape{2, 1, 13}, AxisShape{0, 3, 5}}) {
    INFO(shape.to_string());
    const std::size_t n = size_of(shape.count());
    const auto x = random_floats(n, 101, -8.0f, 8.0f);
    const auto dy = random_floats(n, 102);
    std::vector<float> y_expected(n);
    ref->softmax_forward(shape, x.data(), y_expected.data());
    auto y_actual = x;  // in place
    for_each_index(shape.outer * shape.inner, [&](index_t col) {
      cuda::softmax_forward_column(col, shape, y_actual.data(), y_actual.data());
    });
    REQUIRE(max_rel_diff(y_actual, y_expected) <= 1e-6);

    std::vector<float> dx_expected(n);
    ref->softmax_backward(shape, y_expected.data(), dy.data(), dx_expected.data());
    auto dx_actual = dy;  // in place
    for_each_index(shape.outer * shape.inner, [&](index_t col) {
      cuda::softmax_backward_column(col, shape, y_expected.data(), dx_actual.data(),
                                    dx_actual.data());
    });
    REQUIRE(max_rel_diff(dx_actual, dx_expected) <= 1e-6);
  }
}

TEST_CASE("cuda dropout bodies draw the reference's mask and outputs bitwise", "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 4099;
  const auto x = random_floats(size_of(n), 111);
  const auto dy = random_floats(size_of(n), 112);
  // An offset just below 2^32 makes the counters cross into the high word.
  for (const std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{0xFFFFF800u}}) {
    for (const float ratio : {0.0f, 0.3f, 0.5f, 0.9f}) {
      INFO("ratio=" << ratio << " offset=" << offset);
      const std::uint64_t seed = 0x123456789ABCDEFull;
      std::vector<float> y_expected(size_of(n)), mask_expected(size_of(n));
      ref->dropout_forward(n, ratio, seed, offset, x.data(), y_expected.data(),
                           mask_expected.data());
      std::vector<float> y_actual(size_of(n), NAN), mask_actual(size_of(n), NAN);
      const float scale = cuda::dropout_scale(ratio);
      for_each_index(n, [&](index_t i) {
        cuda::dropout_forward_element(i, ratio, scale, seed, offset, x.data(), y_actual.data(),
                                      mask_actual.data());
      });
      REQUIRE(mask_actual == mask_expected);
      REQUIRE(y_actual == y_expected);

      std::vector<float> dx_expected(size_of(n)), dx_actual(size_of(n), NAN);
      ref->dropout_backward(n, ratio, mask_expected.data(), dy.data(), dx_expected.data());
      for_each_index(n, [&](index_t i) {
        cuda::dropout_backward_element(i, scale, mask_expected.data(), dy.data(), dx_actual.data());
      });
      REQUIRE(dx_actual == dx_expected);
    }
  }
}

namespace {

// Labels in [0, channels) with `ignore` at every 4th position.
std::vector<float> labels_for(const AxisShape& s, int ignore, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<index_t> pick(0, s.channels - 1);
  std::vector<float> labels(size_of(s.outer * s.inner));
  for (std::size_t p = 0; p < labels.size(); ++p)
    labels[p] = p % 4 == 1 ? static_cast<float>(ignore) : static_cast<float>(pick(rng));
  return labels;
}

}  // namespace

TEST_CASE("cuda softmax_loss bodies equal the reference, with ignore_label, in place too",
          "[cuda-bodies]") {
  auto ref = make_reference();
  for (const AxisShape shape : {AxisShape{5, 11, 7}, AxisShape{3, 1000, 1}, AxisShape{2, 3, 13}}) {
    for (const bool has_ignore : {false, true}) {
      INFO(shape.to_string() << " has_ignore_label=" << has_ignore);
      const int ignore = has_ignore ? 255 : 0;  // without ignore_label, 0 is a class
      const index_t positions = shape.outer * shape.inner;
      auto prob = random_floats(size_of(shape.count()), 121, 1e-3f, 1.0f);
      prob[3] = 0.0f;  // -log clamps at FLT_MIN
      const auto label = labels_for(shape, ignore, 122);
      std::vector<float> loss_expected(size_of(positions)), valid_expected(size_of(positions));
      std::vector<float> loss_actual(size_of(positions), NAN),
          valid_actual(size_of(positions), NAN);
      ref->softmax_loss_forward(shape, prob.data(), label.data(), has_ignore, ignore,
                                loss_expected.data(), valid_expected.data());
      for_each_index(positions, [&](index_t p) {
        REQUIRE(cuda::softmax_loss_forward_position(p, shape, prob.data(), label.data(), has_ignore,
                                                    ignore, loss_actual.data(),
                                                    valid_actual.data()));
      });
      REQUIRE(max_rel_diff(loss_actual, loss_expected) <= 1e-6);
      REQUIRE(valid_actual == valid_expected);

      std::vector<float> dx_expected(size_of(shape.count()));
      ref->softmax_loss_backward(shape, prob.data(), label.data(), has_ignore, ignore, 0.3f,
                                 dx_expected.data());
      auto dx_actual = prob;  // in place
      for_each_index(shape.count(), [&](index_t j) {
        index_t position = -1;
        REQUIRE(cuda::softmax_loss_backward_element(j, shape, dx_actual.data(), label.data(),
                                                    has_ignore, ignore, 0.3f, dx_actual.data(),
                                                    &position));
        REQUIRE(position == (j / (shape.channels * shape.inner)) * shape.inner + j % shape.inner);
      });
      REQUIRE(dx_actual == dx_expected);
    }
  }
}

TEST_CASE(
    "cuda softmax_loss bodies flag invalid labels, and settle keeps the first failing "
    "launch's first position",
    "[cuda-bodies]") {
  const AxisShape shape{2, 3, 4};
  const std::vector<float> prob(size_of(shape.count()), 0.5f);
  // Positions 5 (label 3 == channels) and 2 (NaN) are invalid; -1 is ignored; 7 is 1e10.
  std::vector<float> label = {0, 1, NAN, 2, -1, 3, 0, 1e10f};
  CHECK(cuda::label_class(label[2], 3, true, -1) == cuda::kInvalidLabel);
  CHECK(cuda::label_class(label[4], 3, true, -1) == cuda::kIgnoredLabel);
  CHECK(cuda::label_class(label[4], 3, false, -1) == cuda::kInvalidLabel);
  CHECK(cuda::label_class(label[7], 3, true, -1) == cuda::kInvalidLabel);
  CHECK(cuda::label_class(2.7f, 3, true, -1) == 2);  // truncates as Caffe's int cast

  cuda::LabelError error{};
  cuda::reset_label_error(&error);
  std::vector<float> loss(8), valid(8);
  std::vector<index_t> invalid;
  for_each_index(8, [&](index_t p) {
    if (!cuda::softmax_loss_forward_position(p, shape, prob.data(), label.data(), true, -1,
                                             loss.data(), valid.data())) {
      invalid.push_back(p);
      error.current =
          std::min<unsigned long long>(error.current, static_cast<unsigned long long>(p));
    }
  });
  std::sort(invalid.begin(), invalid.end());
  CHECK(invalid == std::vector<index_t>{2, 5, 7});
  CHECK(valid == std::vector<float>{1, 1, 0, 1, 0, 0, 1, 0});
  cuda::settle_label_error(&error, label.data(), cuda::LossCall::softmax_loss_forward, shape);
  CHECK(error.position == 2);
  CHECK(std::isnan(error.label));
  CHECK(error.call == static_cast<std::int32_t>(cuda::LossCall::softmax_loss_forward));
  CHECK(error.channels == 3);
  CHECK(error.inner == 4);
  CHECK(error.current == cuda::kNoLabelError);

  // A later failing launch does not replace the first report.
  error.current = 5;
  cuda::settle_label_error(&error, label.data(), cuda::LossCall::softmax_loss_backward, shape);
  CHECK(error.position == 2);
  CHECK(error.call == static_cast<std::int32_t>(cuda::LossCall::softmax_loss_forward));
  CHECK(error.current == cuda::kNoLabelError);

  // After a reset, the next failing launch is reported.
  cuda::reset_label_error(&error);
  error.current = 5;
  cuda::settle_label_error(&error, label.data(), cuda::LossCall::softmax_loss_backward, shape);
  CHECK(error.position == 5);
  CHECK(error.label == 3.0f);
  CHECK(error.call == static_cast<std::int32_t>(cuda::LossCall::softmax_loss_backward));
}

TEST_CASE("cuda sigmoid_cross_entropy bodies equal the reference, with ignore_label",
          "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 2003;
  auto x = random_floats(size_of(n), 131, -8.0f, 8.0f);
  x[0] = 100.0f;
  x[1] = -100.0f;  // exp(-|x|) underflows harmlessly; no overflow anywhere
  auto target = random_floats(size_of(n), 132, 0.0f, 1.0f);
  for (index_t i = 0; i < n; i += 9)
    target[size_of(i)] = -1.0f;
  for (const bool has_ignore : {false, true}) {
    INFO("has_ignore_label=" << has_ignore);
    std::vector<float> loss_expected(size_of(n)), valid_expected(size_of(n));
    std::vector<float> loss_actual(size_of(n), NAN), valid_actual(size_of(n), NAN);
    ref->sigmoid_cross_entropy_forward(n, x.data(), target.data(), has_ignore, -1,
                                       loss_expected.data(), valid_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::sigmoid_cross_entropy_forward_element(i, x.data(), target.data(), has_ignore, -1,
                                                  loss_actual.data(), valid_actual.data());
    });
    REQUIRE(max_rel_diff(loss_actual, loss_expected) <= 1e-6);
    REQUIRE(valid_actual == valid_expected);

    std::vector<float> dx_expected(size_of(n)), dx_actual(size_of(n), NAN);
    ref->sigmoid_cross_entropy_backward(n, x.data(), target.data(), has_ignore, -1, 0.5f,
                                        dx_expected.data());
    for_each_index(n, [&](index_t i) {
      cuda::sigmoid_cross_entropy_backward_element(i, x.data(), target.data(), has_ignore, -1, 0.5f,
                                                   dx_actual.data());
    });
    REQUIRE(max_rel_diff(dx_actual, dx_expected) <= 1e-6);
  }
}

TEST_CASE("cuda solver_update body equals the reference for every rule, L1 and L2",
          "[cuda-bodies]") {
  auto ref = make_reference();
  const index_t n = 1009;
  using hn::UpdateType;
  for (const UpdateType type : {UpdateType::sgd, UpdateType::nesterov, UpdateType::adagrad,
                                UpdateType::rmsprop, UpdateType::adadelta, UpdateType::adam}) {
    for (const int regularisation : {0, 1, 2}) {  // none, L2, L1
      hn::SolverUpdate u;
      u.type = type;
      u.lr = type == UpdateType::adadelta ? 1.0f : 0.01f;
      u.momentum = type == UpdateType::adadelta ? 0.95f : 0.9f;
      u.delta = 1e-6f;
      u.rms_decay = 0.98f;
      u.decay = regularisation == 0 ? 0.0f : 0.01f;
      u.l1 = regularisation == 2;
      u.grad_scale = 0.7f;
      INFO(hn::update_type_name(type) << " regularisation " << regularisation);
      auto w_expected = random_floats(size_of(n), 120, -1.0f, 1.0f);
      for (index_t i = 0; i < n; i += 5)
        w_expected[size_of(i)] = 0.0f;  // sign(0) = 0
      auto h_expected = random_floats(size_of(n), 121, 0.0f, 0.3f);
      auto h2_expected = random_floats(size_of(n), 122, 0.0f, 0.3f);
      auto w_actual = w_expected, h_actual = h_expected, h2_actual = h2_expected;
      for (int step = 0; step < 3; ++step) {
        const auto grad = random_floats(size_of(n), 130 + static_cast<std::uint32_t>(step));
        ref->solver_update(u, n, w_expected.data(), grad.data(), h_expected.data(),
                           h2_expected.data());
        for_each_index(n, [&](index_t i) {
          cuda::solver_update_element(i, u, w_actual.data(), grad.data(), h_actual.data(),
                                      h2_actual.data());
        });
      }
      REQUIRE(max_rel_diff(w_actual, w_expected) <= 1e-5);
      REQUIRE(max_rel_diff(h_actual, h_expected) <= 1e-5);
      REQUIRE(max_rel_diff(h2_actual, h2_expected) <= 1e-5);
      // The rate read where the update runs (lr * *rate), bit for bit the folded one; a gate
      // that is not finite updates nothing.
      const auto grad = random_floats(size_of(n), 140);
      const float rate = 0.37f, finite = 2.0f, nan = std::nanf("");
      hn::SolverUpdate read = u, folded = u;
      folded.lr = u.lr * rate;
      read.rate = &rate;
      auto w_read = w_actual, h_read = h_actual, h2_read = h2_actual;
      for (const float* gate : {&finite, &nan}) {
        read.gate = gate;
        for_each_index(n, [&](index_t i) {
          cuda::solver_update_element(i, read, w_read.data(), grad.data(), h_read.data(),
                                      h2_read.data());
        });
      }
      for_each_index(n, [&](index_t i) {
        cuda::solver_update_element(i, folded, w_actual.data(), grad.data(), h_actual.data(),
                                    h2_actual.data());
      });
      CHECK(w_read == w_actual);
      CHECK(h_read == h_actual);
      CHECK(h2_read == h2_actual);
    }
  }
}
