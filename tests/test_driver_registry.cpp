// The driver registry: the built-in kinds, a program's own kind, and the errors a user
// meets naming a kind or an option that does not exist.
#include <catch2/catch.hpp>

#include <algorithm>

#include "hybridnn/error.h"
#include "lib/core/driver_registry.h"
#include "lib/core/runtime.h"

using Catch::Matchers::Contains;
using namespace hn;

namespace {

std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (const DriverKind& kind : driver_kinds())
    names.push_back(kind.name);
  return names;
}

// A kind of the test's own: a second name for the reference driver, counting the drivers
// it makes, so a test can see the runtime go through the registry.
int toy_made = 0;
void register_toy_kind() {
  if (find_driver_kind("toy")) return;
  DriverKind toy;
  toy.name = "toy";
  toy.summary = "the reference driver under another name (tests only)";
  toy.count = [] { return 2; };
  toy.options = {{"separate_memory", "true: a memory space of its own", {"true", "false"}}};
  toy.make = [](const Device& device, const DriverOptions& options) {
    ++toy_made;
    return driver_kind("reference").make(device, options);
  };
  register_driver_kind(std::move(toy));
}

}  // namespace

TEST_CASE("the built-in driver kinds are registered in order", "[registry]") {
  const std::vector<std::string> names = kind_names();
  REQUIRE(names.size() >= 3);
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 3) ==
        std::vector<std::string>{"reference", "cpu", "cuda"});
  CHECK(driver_kind("cpu").any_index);
  CHECK(driver_kind("cpu").host_memory);
  CHECK_FALSE(driver_kind("cuda").any_index);
  CHECK_FALSE(driver_kind("cpu").choices("blas").empty());
  CHECK(driver_kind("cpu").choices("no such option").empty());
  // Every built-in kind says what it is, and a kind this build lacks says why.
  for (const DriverKind& kind : driver_kinds()) {
    CHECK_FALSE(kind.summary.empty());
    if (!kind.make) CHECK_FALSE(kind.missing.empty());
  }
  // available_devices() lists one device of every kind whose index is free.
  const std::vector<Device> present = available_devices();
  CHECK(std::count(present.begin(), present.end(), Device{"reference", 0}) == 1);
  CHECK(std::count(present.begin(), present.end(), Device{"cpu", 0}) == 1);
  CHECK(device_count("cpu") == 1);
  CHECK(device_count("no such kind") == 0);
}

TEST_CASE("an unknown kind is an error listing the registered kinds", "[registry]") {
  CHECK_THROWS_WITH(driver_kind("tpu"),
                    Contains("unknown device kind 'tpu'") && Contains("reference, cpu, cuda"));
  CHECK_THROWS_WITH(Device::parse("tpu:1"),
                    Contains("unknown device 'tpu:1'") && Contains("reference, cpu, cuda"));
  CHECK_FALSE(find_driver_kind("tpu").has_value());
}

TEST_CASE("a program registers a driver kind of its own and the runtime makes it", "[registry]") {
  register_toy_kind();
  CHECK_THROWS_WITH(register_driver_kind(driver_kind("toy")),
                    Contains("'toy' is already registered"));
  DriverKind bad;
  bad.name = "bad:name";
  CHECK_THROWS_WITH(register_driver_kind(bad), Contains("bad kind name 'bad:name'"));

  // Registered kinds name devices like the built-in ones, with the index always printed.
  const Device toy1 = Device::parse("toy:1");
  CHECK(toy1 == Device{"toy", 1});
  CHECK(Device{"toy", 0}.name() == "toy:0");
  CHECK(device_count("toy") == 2);
  const std::vector<Device> present = available_devices();
  CHECK(std::count(present.begin(), present.end(), Device{"toy", 1}) == 1);

  const int made_before = toy_made;
  Runtime runtime;
  Driver& driver = runtime.add(toy1, DriverOptions{{"separate_memory", "true"}});
  CHECK(toy_made == made_before + 1);
  CHECK(driver.device() == toy1);
  CHECK(runtime.driver("toy:1").device() == toy1);
  CHECK_FALSE(driver.capabilities().host_addressable);  // the option reached the driver
}

TEST_CASE("driver options a kind does not declare, or outside its choices, are errors",
          "[registry]") {
  register_toy_kind();
  CHECK_THROWS_WITH(make_driver(Device::parse("toy:0"), DriverOptions{{"threads", "2"}}),
                    Contains("driver toy:0: unknown option 'threads'") &&
                        Contains("its options: separate_memory"));
  CHECK_THROWS_WITH(make_driver(Device::parse("toy:0"), DriverOptions{{"separate_memory", "yes"}}),
                    Contains("option separate_memory='yes' is not one of true, false"));
  CHECK_THROWS_WITH(make_driver(Device::parse("cpu"), DriverOptions{{"blas", "mkl"}}),
                    Contains("driver cpu: option blas='mkl' is not one of"));
  CHECK_THROWS_WITH(make_driver(Device::parse("cpu"), DriverOptions{{"threads", "two"}}),
                    Contains("option threads='two' is not an integer"));
  // Thousands of threads: a clear error instead of OpenMP aborting the process.
  CHECK_THROWS_WITH(make_driver(Device::parse("cpu"), DriverOptions{{"threads", "4096"}}),
                    Contains("threads 4096 is too many") && Contains("at most"));
  CHECK(make_driver(Device::parse("cpu"), DriverOptions{{"threads", "64"}}) != nullptr);
  CHECK_THROWS_WITH(make_driver(Device::parse("reference"), DriverOptions{{"blas", "onednn"}}),
                    Contains("unknown option 'blas'") && Contains("its options: separate_memory"));
  // One set of options for several kinds: each kind keeps the names it declares.
  const DriverOptions mixed{{"threads", "1"}, {"separate_memory", "true"}};
  CHECK(options_for(driver_kind("cpu"), mixed).values().size() == 1);
  CHECK(options_for(driver_kind("cpu"), mixed).has("threads"));
  CHECK(options_for(driver_kind("reference"), mixed).has("separate_memory"));
  // A text option set from a literal keeps its text (not the bool a pointer converts to).
  DriverOptions literal;
  literal.set("cores", "any").set("blas", "onednn").set("separate_memory", true);
  CHECK(literal.text("cores") == "any");
  CHECK(literal.text("blas") == "onednn");
  CHECK(literal.text("separate_memory") == "true");
}
