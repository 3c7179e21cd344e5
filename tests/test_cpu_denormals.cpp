// The CPU driver's denormals option (lib/drivers/cpu/denormals.h): flushed to zero inside
// its calls by default, on the calling thread and the OpenMP threads computing for it, kept
// with denormals=keep; the caller's own setting is the same after a call as before.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "lib/core/device.h"
#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"
#include "lib/core/runtime.h"
#include "lib/drivers/cpu/denormals.h"

using namespace hn;

namespace {

// Large enough that the driver cuts the loop across its 2 threads (parallel.h): an element
// left denormal would be one a worker thread computed without the flags.
constexpr index_t kCount = index_t{1} << 21;

// x[i] = start, then scale(x, alpha) on `driver`; the values it leaves.
std::vector<float> scaled(Driver& driver, float start, float alpha) {
  std::vector<float> x(kCount, start);
  driver.scale(kCount, alpha, x.data());
  return x;
}

bool denormal(float v) {
  return v != 0.0f && std::fabs(v) < std::numeric_limits<float>::min();
}

}  // namespace

TEST_CASE(
    "cpu driver: denormal results and inputs are zero in its calls, kept with "
    "denormals=keep, the caller's setting unchanged",
    "[cpu_denormals]") {
#if !(defined(__x86_64__) || defined(__i386__))
  SKIP("flushing denormals is done on x86 only (MXCSR)");
#endif
  const auto flush = make_driver(Device::parse("cpu"), DriverOptions{{"threads", "2"}});
  const auto keep =
      make_driver(Device::parse("cpu"), DriverOptions{{"threads", "2"}, {"denormals", "keep"}});
  const auto reference = make_driver(Device::parse("reference"));
  CHECK_THAT(keep->description(), Catch::Matchers::Contains("denormals kept"));
  REQUIRE_FALSE(detail::cpu::flushing_denormals());

  // A denormal result (1e-20 * 1e-20 = 1e-40): zero when flushed, the IEEE value kept.
  const float tiny = 1e-20f;
  const std::vector<float> expected = scaled(*reference, tiny, tiny);
  REQUIRE(denormal(expected[0]));
  const std::vector<float> kept = scaled(*keep, tiny, tiny);
  CHECK(kept.front() == expected.front());
  CHECK(std::equal(kept.begin(), kept.end(), expected.begin()));
  const std::vector<float> flushed = scaled(*flush, tiny, tiny);
  CHECK(std::count(flushed.begin(), flushed.end(), 0.0f) == kCount);
  CHECK_FALSE(detail::cpu::flushing_denormals());

  // A denormal input (1e-40 * 1e30): read as zero when flushed, 1e-10 kept.
  const std::vector<float> grown = scaled(*reference, expected[0], 1e30f);
  REQUIRE(grown[0] > 0.0f);
  const std::vector<float> big = scaled(*keep, expected[0], 1e30f);
  CHECK(big.front() == grown.front());
  CHECK(std::equal(big.begin(), big.end(), grown.begin()));
  const std::vector<float> zeroed = scaled(*flush, expected[0], 1e30f);
  CHECK(std::count(zeroed.begin(), zeroed.end(), 0.0f) == kCount);
  CHECK_FALSE(detail::cpu::flushing_denormals());

  // A call that throws restores the caller's setting too.
  CHECK_THROWS(flush->scale(-1, 1.0f, nullptr));
  CHECK_FALSE(detail::cpu::flushing_denormals());
}
