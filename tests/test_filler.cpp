// Fillers against Caffe's definitions: exact values where they are deterministic (constant,
// bilinear, positive_unitball sums), bounds and moments where they are random.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "lib/net/filler.h"

namespace hn {
namespace {

hybridnn::proto::FillerParameter filler(const std::string& type) {
  hybridnn::proto::FillerParameter f;
  f.set_type(type);
  return f;
}

struct Moments {
  double mean = 0, variance = 0, min = 1e30, max = -1e30;
};

Moments moments(const std::vector<float>& v) {
  Moments m;
  for (float x : v) {
    m.mean += x;
    m.min = std::min<double>(m.min, x);
    m.max = std::max<double>(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (float x : v)
    m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= static_cast<double>(v.size());
  return m;
}

TEST_CASE("Constant filler writes its value everywhere") {
  auto f = filler("constant");
  f.set_value(0.25f);
  std::vector<float> v(10, -1.0f);
  detail::fill(f, Shape({2, 5}), v.data(), 1, "test");
  for (float x : v)
    CHECK(x == 0.25f);
}

TEST_CASE("Uniform gaussian xavier and msra fillers have Caffe's bounds and moments") {
  const Shape shape({64, 32, 3, 3});  // fan_in 288, fan_out 576
  std::vector<float> v(static_cast<std::size_t>(shape.count()));
  auto uniform = filler("uniform");
  uniform.set_min(-2.0f);
  uniform.set_max(3.0f);
  detail::fill(uniform, shape, v.data(), 5, "test");
  Moments m = moments(v);
  CHECK(m.min >= -2.0);
  CHECK(m.max < 3.0);
  CHECK(m.mean == Approx(0.5).margin(0.05));
  CHECK(m.variance == Approx(25.0 / 12.0).epsilon(0.03));

  auto gaussian = filler("gaussian");
  gaussian.set_mean(1.0f);
  gaussian.set_std(0.5f);
  detail::fill(gaussian, shape, v.data(), 6, "test");
  m = moments(v);
  CHECK(m.mean == Approx(1.0).margin(0.01));
  CHECK(std::sqrt(m.variance) == Approx(0.5).epsilon(0.02));

  // xavier: U(-sqrt(3/n), sqrt(3/n)) with n = fan_in, or the average of fan_in and fan_out.
  auto xavier = filler("xavier");
  detail::fill(xavier, shape, v.data(), 7, "test");
  m = moments(v);
  const double bound = std::sqrt(3.0 / 288.0);
  CHECK(m.max <= bound);
  CHECK(m.min >= -bound);
  CHECK(m.max > 0.99 * bound);
  CHECK(m.variance == Approx(1.0 / 288.0).epsilon(0.03));
  xavier.set_variance_norm(hybridnn::proto::FillerParameter::AVERAGE);
  detail::fill(xavier, shape, v.data(), 7, "test");
  CHECK(moments(v).variance == Approx(1.0 / 432.0).epsilon(0.03));

  // msra: N(0, sqrt(2/n)).
  auto msra = filler("msra");
  msra.set_variance_norm(hybridnn::proto::FillerParameter::FAN_OUT);
  detail::fill(msra, shape, v.data(), 8, "test");
  m = moments(v);
  CHECK(m.mean == Approx(0.0).margin(0.003));
  CHECK(m.variance == Approx(2.0 / 576.0).epsilon(0.03));
}

TEST_CASE("Random fillers depend on the seed only") {
  std::vector<float> a(100), b(100), c(100);
  detail::fill(filler("xavier"), Shape({10, 10}), a.data(), 42, "test");
  detail::fill(filler("xavier"), Shape({10, 10}), b.data(), 42, "test");
  detail::fill(filler("xavier"), Shape({10, 10}), c.data(), 43, "test");
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("Sparse gaussian filler keeps about sparse over num_outputs of the weights") {
  auto f = filler("gaussian");
  f.set_sparse(5);
  std::vector<float> v(20 * 500);
  detail::fill(f, Shape({20, 500}), v.data(), 3, "test");
  const double zeros = static_cast<double>(std::count(v.begin(), v.end(), 0.0f));
  CHECK(zeros / static_cast<double>(v.size()) == Approx(0.75).margin(0.02));
}

TEST_CASE("Bilinear filler gives the upsampling kernel of Caffe's formula") {
  // Kernel 4: f = 2, c = (2*2 - 1 - 0) / 4 = 0.75; weight = (1-|x/2-0.75|)(1-|y/2-0.75|).
  const float axis[4] = {0.25f, 0.75f, 0.75f, 0.25f};
  std::vector<float> v(2 * 1 * 4 * 4);
  detail::fill(filler("bilinear"), Shape({2, 1, 4, 4}), v.data(), 1, "test");
  for (int k = 0; k < 2; ++k)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 4; ++x)
        CHECK(v[static_cast<std::size_t>(k * 16 + y * 4 + x)] == Approx(axis[y] * axis[x]));
  CHECK_THROWS_WITH(detail::fill(filler("bilinear"), Shape({2, 3}), v.data(), 1, "layer 'up'"),
                    Catch::Contains("layer 'up'") && Catch::Contains("2x3"));
}

TEST_CASE("Positive unitball filler rows sum to one") {
  std::vector<float> v(3 * 7);
  detail::fill(filler("positive_unitball"), Shape({3, 7}), v.data(), 1, "test");
  for (int r = 0; r < 3; ++r) {
    double sum = 0;
    for (int j = 0; j < 7; ++j) {
      CHECK(v[static_cast<std::size_t>(r * 7 + j)] >= 0.0f);
      sum += v[static_cast<std::size_t>(r * 7 + j)];
    }
    CHECK(sum == Approx(1.0));
  }
}

TEST_CASE("Unknown filler type is an error listing the known ones") {
  std::vector<float> v(4);
  CHECK_THROWS_WITH(
      detail::fill(filler("orthogonal"), Shape({2, 2}), v.data(), 1, "layer 'ip'"),
      Catch::Contains("layer 'ip'") && Catch::Contains("orthogonal") && Catch::Contains("xavier"));
}

}  // namespace
}  // namespace hn
