// What the training tests under mpirun share: the ring communicator they run on and the
// comparison of weight vectors.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "lib/comm/comm.h"

namespace hn::test {

// The ring backend with a deadline short enough for a test.
inline std::unique_ptr<Communicator> ring() {
  CommOptions options;
  options.timeout_seconds = 120;
  return make_communicator("ring", options);
}

// The largest element-wise difference relative to the largest magnitude of `a`.
inline double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double scale = 0.0, difference = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
    difference = std::max(difference, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return scale > 0.0 ? difference / scale : difference;
}

}  // namespace hn::test
