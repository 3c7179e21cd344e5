// Caffe's fillers, with Philox draws (see filler.h).
#include "lib/net/filler.h"

#include <cmath>

#include "lib/core/check.h"
#include "lib/core/philox.h"

namespace hn::detail {

namespace {

// Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
double open_uniform(std::uint64_t seed, std::uint64_t counter) {
  return (static_cast<double>(philox_bits(seed, counter)) + 1.0) / 4294967296.0;
}

double gaussian(std::uint64_t seed, std::uint64_t index) {
  const double u1 = open_uniform(seed, 2 * index);
  const double u2 = open_uniform(seed, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double uniform(std::uint64_t seed, std::uint64_t index, double low, double high) {
  return low + (high - low) * (static_cast<double>(philox_bits(seed, index)) / 4294967296.0);
}

// Caffe's fan-in and fan-out: count / shape[0] and count / shape[1].
double fan(const hybridnn::proto::FillerParameter& filler, const Shape& shape) {
  const double count = static_cast<double>(shape.count());
  const double fan_in = shape.axes() > 0 && shape[0] > 0 ? count / shape[0] : count;
  const double fan_out = shape.axes() > 1 && shape[1] > 0 ? count / shape[1] : count;
  switch (filler.variance_norm()) {
    case hybridnn::proto::FillerParameter::FAN_OUT:
      return fan_out;
    case hybridnn::proto::FillerParameter::AVERAGE:
      return (fan_in + fan_out) / 2.0;
    default:
      return fan_in;
  }
}

}  // namespace

void fill(const hybridnn::proto::FillerParameter& filler, const Shape& shape, float* data,
          std::uint64_t seed, const std::string& who) {
  const std::string& type = filler.type();
  const index_t count = shape.count();
  if (type == "constant") {
    for (index_t i = 0; i < count; ++i)
      data[i] = filler.value();
  } else if (type == "uniform") {
    HN_CHECK(filler.min() <= filler.max(), "{}: uniform filler with min {} > max {}", who,
             filler.min(), filler.max());
    for (index_t i = 0; i < count; ++i)
      data[i] = static_cast<float>(
          uniform(seed, static_cast<std::uint64_t>(i), filler.min(), filler.max()));
  } else if (type == "gaussian") {
    for (index_t i = 0; i < count; ++i)
      data[i] = static_cast<float>(filler.mean() +
                                   filler.std() * gaussian(seed, static_cast<std::uint64_t>(i)));
    if (filler.sparse() >= 0) {
      // Caffe keeps each weight with probability sparse / num_outputs (shape[0]).
      HN_CHECK(shape.axes() >= 1 && shape[0] > 0, "{}: sparse gaussian filler needs a shape[0]",
               who);
      const double keep = static_cast<double>(filler.sparse()) / static_cast<double>(shape[0]);
      const std::uint64_t mask_seed = seed ^ 0x5bd1e995u;
      for (index_t i = 0; i < count; ++i) {
        if (uniform(mask_seed, static_cast<std::uint64_t>(i), 0.0, 1.0) >= keep) data[i] = 0.0f;
      }
    }
  } else if (type == "xavier" || type == "msra") {
    const double n = fan(filler, shape);
    HN_CHECK(n > 0, "{}: {} filler on an empty shape {}", who, type, shape.to_string());
    if (type == "xavier") {
      const double scale = std::sqrt(3.0 / n);
      for (index_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(uniform(seed, static_cast<std::uint64_t>(i), -scale, scale));
    } else {
      const double std = std::sqrt(2.0 / n);
      for (index_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(std * gaussian(seed, static_cast<std::uint64_t>(i)));
    }
  } else if (type == "bilinear") {
    HN_CHECK(shape.axes() == 4 && shape[2] == shape[3],
             "{}: bilinear filler needs a 4-axis shape with square kernels, got {}", who,
             shape.to_string());
    const index_t width = shape[3], height = shape[2];
    const double f = std::ceil(static_cast<double>(width) / 2.0);
    const double c = (2.0 * f - 1.0 - std::fmod(f, 2.0)) / (2.0 * f);
    for (index_t i = 0; i < count; ++i) {
      const double x = static_cast<double>(i % width);
      const double y = static_cast<double>((i / width) % height);
      data[i] = static_cast<float>((1.0 - std::fabs(x / f - c)) * (1.0 - std::fabs(y / f - c)));
    }
  } else if (type == "positive_unitball") {
    // Caffe: uniform [0, 1), then each row (shape[0] rows) scaled to sum to one.
    HN_CHECK(shape.axes() >= 1 && shape[0] > 0, "{}: positive_unitball filler needs a shape[0]",
             who);
    const index_t rows = shape[0], dim = count / rows;
    for (index_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (index_t j = 0; j < dim; ++j) {
        const double v = uniform(seed, static_cast<std::uint64_t>(r * dim + j), 0.0, 1.0);
        data[r * dim + j] = static_cast<float>(v);
        sum += v;
      }
      for (index_t j = 0; j < dim; ++j)
        data[r * dim + j] = static_cast<float>(data[r * dim + j] / sum);
    }
  } else {
    fail(
        "{}: unknown filler type '{}'; known types: constant, uniform, gaussian, xavier, msra, "
        "bilinear, positive_unitball",
        who, type);
  }
}

}  // namespace hn::detail
