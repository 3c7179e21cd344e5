// Device names: parsing, printing and errors.
#include <catch2/catch.hpp>

#include "hybridnn/device.h"
#include "hybridnn/error.h"

using hn::Device;
using hn::DeviceKind;

TEST_CASE("device names parse to kind and index and print canonically", "[device]") {
  CHECK(Device::parse("reference") == Device{DeviceKind::reference, 0});
  CHECK(Device::parse("cpu") == Device{DeviceKind::cpu, 0});
  CHECK(Device::parse("cpu:0") == Device{DeviceKind::cpu, 0});
  CHECK(Device::parse("cpu:3") == Device{DeviceKind::cpu, 3});
  CHECK(Device::parse("cuda") == Device{DeviceKind::cuda, 0});
  CHECK(Device::parse("cuda:1") == Device{DeviceKind::cuda, 1});
  CHECK(Device{DeviceKind::cpu, 0}.name() == "cpu");
  CHECK(Device{DeviceKind::cpu, 2}.name() == "cpu:2");
  CHECK(Device{DeviceKind::cuda, 0}.name() == "cuda:0");
  CHECK(Device{DeviceKind::reference, 0}.name() == "reference");
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
