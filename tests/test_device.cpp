// Device names: parsing, printing and errors.
#include <catch2/catch.hpp>

#include "hybridnn/error.h"
#include "lib/core/device.h"

using hn::Device;

TEST_CASE("device names parse to kind and index and print canonically", "[device]") {
  CHECK(Device::parse("reference") == Device{"reference", 0});
  CHECK(Device::parse("cpu") == Device{"cpu", 0});
  CHECK(Device::parse("cpu:0") == Device{"cpu", 0});
  CHECK(Device::parse("cpu:3") == Device{"cpu", 3});
  CHECK(Device::parse("cuda") == Device{"cuda", 0});
  CHECK(Device::parse("cuda:1") == Device{"cuda", 1});
  CHECK(Device{"cpu", 0}.name() == "cpu");
  CHECK(Device{"cpu", 2}.name() == "cpu:2");
  CHECK(Device{"cuda", 0}.name() == "cuda:0");
  CHECK(Device{"reference", 0}.name() == "reference");
  for (const char* name : {"reference", "cpu", "cpu:7", "cuda:0", "cuda:12"}) {
    CHECK(Device::parse(name).name() == name);
  }
}

TEST_CASE("malformed device names throw an error quoting the text", "[device]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(Device::parse("gpu:0"), Contains("unknown device 'gpu:0'"));
  CHECK_THROWS_WITH(Device::parse("cpu:"), Contains("'cpu:'"));
  CHECK_THROWS_WITH(Device::parse("cpu:x"), Contains("'cpu:x'"));
  CHECK_THROWS_WITH(Device::parse("cuda:-1"), Contains("'cuda:-1'"));
  CHECK_THROWS_AS(Device::parse(""), hn::Error);
}
