// CPU drivers bound to cores (affinity.h, binding.h): core lists read and written as taskset
// does, a Runtime's teams side by side on cores of their own with the last left to the
// accelerators, each driver's device thread and OpenMP team bound where it computes, and a
// program's own thread left as it was.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/affinity.h"
#include "lib/core/device.h"
#include "lib/core/driver.h"
#include "lib/core/driver_registry.h"
#include "lib/core/runtime.h"
#include "lib/core/worker.h"

using namespace hn;
using Catch::Matchers::Contains;

namespace {

// Large enough that a driver of 2 threads cuts the loop across both (parallel.h).
constexpr index_t kCount = index_t{1} << 21;

void compute(Driver& driver) {
  std::vector<float> x(kCount, 1.0f);
  driver.scale(kCount, 2.0f, x.data());
  REQUIRE(x.back() == 2.0f);
}

// The cores the calling thread may run on after `driver` computed on a device thread of
// its own.
std::vector<int> cores_on_device_thread(Runtime& runtime, Driver& driver) {
  std::vector<int> cores;
  detail::DeviceWorker& thread = detail::RuntimeThreads::of(runtime, driver);
  thread.submit([&] {
    compute(driver);
    cores = detail::allowed_cores();
  });
  REQUIRE(thread.wait() == nullptr);
  return cores;
}

// How many of this process's threads may run on exactly `cores` (/proc/self/task/*/status).
int threads_on(const std::string& cores) {
  int count = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
      const std::string listed = line.substr(line.find_first_not_of(" \t", 18));
      count += listed == cores ? 1 : 0;
    }
  }
  return count;
}

}  // namespace

TEST_CASE("core lists read and written as taskset's, bad ones an error naming the text",
          "[cpu_binding]") {
  CHECK(detail::format_cores({0, 1, 2, 3, 6}) == "0-3,6");
  CHECK(detail::format_cores({1}) == "1");
  CHECK(detail::format_cores({0, 2, 3, 5, 6, 7}) == "0,2-3,5-7");
  CHECK(detail::format_cores({}).empty());
  const std::vector<int> allowed = detail::allowed_cores();
  REQUIRE(!allowed.empty());
  CHECK(detail::parse_cores(detail::format_cores(allowed), "cores") == allowed);
  CHECK(detail::parse_cores("0,0", "cores") == std::vector<int>{0});
  if (allowed.back() >= 1) CHECK(detail::parse_cores("1,0", "cores") == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(detail::parse_cores("", "cores"), Contains("not a list of cores"));
  CHECK_THROWS_WITH(detail::parse_cores("a", "cores"), Contains("'a'"));
  CHECK_THROWS_WITH(detail::parse_cores("0,", "cores"), Contains("not a list of cores"));
  CHECK_THROWS_WITH(detail::parse_cores("1-0", "cores"), Contains("runs backwards"));
  CHECK_THROWS_WITH(detail::parse_cores("100000", "cores"), Contains("is beyond this machine's"));
  CHECK_THROWS_WITH(make_driver(Device::parse("cpu"), DriverOptions{{"cores", "0-x"}}),
                    Contains("cpu driver cpu: cores"));
}

TEST_CASE("cores shared out among teams side by side, the last left to the accelerators",
          "[cpu_binding]") {
  const std::vector<int> sixteen{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  using Shares = std::vector<std::vector<int>>;
  CHECK(detail::share_cores(sixteen, 1, 1) ==
        Shares{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}});
  CHECK(detail::share_cores(sixteen, 2, 1) ==
        Shares{{0, 1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12, 13}});
  CHECK(detail::share_cores({0, 1}, 2, 0) == Shares{{0}, {1}});
  CHECK(detail::share_cores({4, 6, 9}, 1, 2) == Shares{{4}});
  // One core beside a GPU: the team keeps it; more teams than cores share the last.
  CHECK(detail::share_cores({3}, 1, 1) == Shares{{3}});
  CHECK(detail::share_cores({0, 1}, 3, 0) == Shares{{0}, {1}, {1}});
}

TEST_CASE("CPU drivers side by side compute on cores of their own, a program's thread as it was",
          "[cpu_binding]") {
  const std::vector<int> allowed = detail::allowed_cores();
  if (allowed.size() < 2) {
    WARN("skipped: one core: nothing to share out");
    return;
  }
  Runtime runtime;
  runtime.provide({Device::parse("cpu"), Device::parse("cpu:1")});
  Driver& first = runtime.driver("cpu");
  Driver& second = runtime.driver("cpu:1");
  const std::vector<std::vector<int>> shares = detail::share_cores(allowed, 2, 0);
  CHECK_THAT(first.description(), Contains("on cores " + detail::format_cores(shares[0])));
  CHECK_THAT(second.description(), Contains("on cores " + detail::format_cores(shares[1])));
  CHECK(cores_on_device_thread(runtime, first) == shares[0]);
  CHECK(cores_on_device_thread(runtime, second) == shares[1]);
  // The program's thread computes for a bound driver and keeps its own cores.
  compute(first);
  CHECK(detail::allowed_cores() == allowed);
  // Cores named: none shared out.
  Runtime named;
  named.set_driver_options(DriverOptions{{"cores", "any"}});
  named.provide({Device::parse("cpu"), Device::parse("cpu:1")});
  CHECK_THAT(named.driver("cpu:1").description(), !Contains("on cores"));
  CHECK(cores_on_device_thread(named, named.driver("cpu:1")) == allowed);
}

TEST_CASE("a CPU driver's team of threads is bound to its cores", "[cpu_binding]") {
  const std::vector<int> allowed = detail::allowed_cores();
  if (allowed.size() < 2) {
    WARN("skipped: one core: a bound team could not be told from an unbound one");
    return;
  }
  const std::string last = std::to_string(allowed.back());
  const std::string first = std::to_string(allowed.front());
  Runtime runtime;
  Driver& on_last =
      runtime.add(Device::parse("cpu:1"), DriverOptions{{"threads", "2"}, {"cores", last}});
  CHECK(cores_on_device_thread(runtime, on_last) == std::vector<int>{allowed.back()});
  // The device thread and its team's second thread.
  CHECK(threads_on(last) >= 2);
  // From the program's thread: its team's other thread bound, the thread itself not.
  const int before = threads_on(first);
  Driver& on_first =
      runtime.add(Device::parse("cpu:2"), DriverOptions{{"threads", "2"}, {"cores", first}});
  compute(on_first);
  CHECK(detail::allowed_cores() == allowed);
  CHECK(threads_on(first) >= std::max(1, before));
  CHECK_THROWS_WITH(
      make_driver(Device::parse("cpu"),
                  DriverOptions{{"cores", "0-" + std::to_string(allowed.back() + 1)}}),
      Contains("is beyond this machine's") || Contains("not one this process may run on"));
}
