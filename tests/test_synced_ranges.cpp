// SyncedMemory's per-range currency: slices of one array written on different drivers stay
// where they are, reads copy only the stale bytes (counted), and the whole array assembles
// correctly on the host. The two reference drivers in separate-memory mode play two devices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/core/tensor.h"

namespace hn {
namespace {

struct TwoDevices {
  Runtime runtime;
  Driver* a;
  Driver* b;
  TwoDevices() {
    DriverOptions separate;
    separate.set("separate_memory", true);
    a = &runtime.add(Device{"reference", 0}, separate);
    b = &runtime.add(Device{"reference", 1}, separate);
  }
  void reset() {
    a->reset_transfer_stats();
    b->reset_transfer_stats();
  }
};

// Writes `values` into `bytes` of a device range through the driver.
void put(Driver& driver, void* address, const std::vector<float>& values) {
  driver.copy_from_host(address, values.data(), values.size() * sizeof(float));
}

std::vector<float> get(Driver& driver, const void* address, std::size_t count) {
  std::vector<float> out(count);
  driver.copy_to_host(out.data(), address, count * sizeof(float));
  return out;
}

TEST_CASE("slices written on two devices assemble on the host, copying each slice once") {
  TwoDevices d;
  SyncedMemory memory(8 * sizeof(float));
  put(*d.a, memory.overwrite_range(*d.a, 0, 3 * sizeof(float)), {1, 2, 3});
  put(*d.b, memory.overwrite_range(*d.b, 3 * sizeof(float), 5 * sizeof(float)), {4, 5, 6, 7, 8});
  CHECK(memory.current_on(d.a->memory_space(), 0, 3 * sizeof(float)));
  CHECK_FALSE(memory.current_on(d.a->memory_space()));
  d.reset();
  const float* host = static_cast<const float*>(memory.host_read());
  CHECK(std::vector<float>(host, host + 8) == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(d.a->transfer_stats().to_host == 1);
  CHECK(d.a->transfer_stats().to_host_bytes == 3 * sizeof(float));
  CHECK(d.b->transfer_stats().to_host == 1);
  CHECK(d.b->transfer_stats().to_host_bytes == 5 * sizeof(float));
}

TEST_CASE("a slice already resident on its device is read there without any copy") {
  TwoDevices d;
  SyncedMemory memory(6 * sizeof(float));
  put(*d.a, memory.overwrite_range(*d.a, 0, 2 * sizeof(float)), {1, 2});
  put(*d.b, memory.overwrite_range(*d.b, 2 * sizeof(float), 4 * sizeof(float)), {3, 4, 5, 6});
  d.reset();
  const void* mine = memory.read_range(*d.b, 2 * sizeof(float), 4 * sizeof(float));
  CHECK(d.a->transfer_stats().total() == 0);
  CHECK(d.b->transfer_stats().total() == 0);
  CHECK(get(*d.b, mine, 4) == std::vector<float>{3, 4, 5, 6});
  // Reading the whole array on a copies only b's slice (through the host: separate spaces).
  d.reset();
  const float* all = static_cast<const float*>(memory.read(*d.a));
  CHECK(d.b->transfer_stats().to_host_bytes == 4 * sizeof(float));
  CHECK(d.a->transfer_stats().to_device_bytes == 4 * sizeof(float));
  CHECK(get(*d.a, all, 6) == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("writing a range makes only that range stale elsewhere") {
  TwoDevices d;
  SyncedMemory memory(4 * sizeof(float));
  float* host = static_cast<float*>(memory.host_overwrite());
  for (int i = 0; i < 4; ++i)
    host[i] = static_cast<float>(i);
  put(*d.a, memory.write_range(*d.a, sizeof(float), 2 * sizeof(float)), {10, 20});
  CHECK(memory.current_on(host_space(), 0, sizeof(float)));
  CHECK(memory.current_on(host_space(), 3 * sizeof(float), sizeof(float)));
  CHECK_FALSE(memory.current_on(host_space(), sizeof(float), sizeof(float)));
  d.reset();
  host = static_cast<float*>(const_cast<void*>(memory.host_read()));
  CHECK(std::vector<float>(host, host + 4) == std::vector<float>{0, 10, 20, 3});
  CHECK(d.a->transfer_stats().to_host_bytes == 2 * sizeof(float));
}

TEST_CASE("bytes never written read as zeros next to written ones") {
  TwoDevices d;
  SyncedMemory memory(5 * sizeof(float));
  put(*d.a, memory.overwrite_range(*d.a, 2 * sizeof(float), sizeof(float)), {7});
  const float* on_b = static_cast<const float*>(memory.read(*d.b));
  CHECK(get(*d.b, on_b, 5) == std::vector<float>{0, 0, 7, 0, 0});
  CHECK_THROWS_WITH(memory.read_range(*d.a, 4 * sizeof(float), 2 * sizeof(float)),
                    Catch::Contains("[16, 24)") && Catch::Contains("20 bytes"));
}

TEST_CASE("overlapping range writes on alternating devices keep the latest bytes") {
  TwoDevices d;
  const std::size_t n = 16;
  SyncedMemory memory(n * sizeof(float));
  std::vector<float> expected(n, 0.0f);
  // Deterministic pseudo-random ranges and devices, checked against a host model.
  std::uint32_t state = 12345;
  auto next = [&](std::uint32_t mod) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % mod;
  };
  for (int step = 0; step < 200; ++step) {
    Driver& driver = next(2) == 0 ? *d.a : *d.b;
    const std::size_t begin = next(n), length = 1 + next(static_cast<std::uint32_t>(n - begin));
    if (next(3) == 0) {
      CHECK(get(driver, memory.read_range(driver, begin * 4, length * 4), length) ==
            std::vector<float>(expected.begin() + static_cast<long>(begin),
                               expected.begin() + static_cast<long>(begin + length)));
    } else {
      std::vector<float> values(length);
      for (std::size_t i = 0; i < length; ++i)
        values[i] = static_cast<float>(step * 100 + static_cast<int>(i));
      void* target = next(2) == 0 ? memory.overwrite_range(driver, begin * 4, length * 4)
                                  : memory.write_range(driver, begin * 4, length * 4);
      put(driver, target, values);
      std::copy(values.begin(), values.end(), expected.begin() + static_cast<long>(begin));
    }
  }
  const float* host = static_cast<const float*>(memory.host_read());
  CHECK(std::vector<float>(host, host + n) == expected);
}

}  // namespace
TEST_CASE("every access that may change the contents gives them a new version, reads keep it",
          "[memory]") {
  TwoDevices d;
  SyncedMemory m(64), other(64);
  std::vector<std::uint64_t> seen{m.version(), other.version()};
  CHECK(seen[0] != seen[1]);  // unique in the process
  const auto fresh = [&](const char* what) {
    INFO(what);
    CHECK(m.version() != 0);
    CHECK(std::find(seen.begin(), seen.end(), m.version()) == seen.end());
    seen.push_back(m.version());
  };
  m.write(*d.a);
  fresh("write");
  const std::uint64_t after_write = m.version();
  m.read(*d.b);
  m.host_read();
  m.read_range(*d.a, 8, 8);
  CHECK(m.version() == after_write);  // reads and the copies they make keep it
  m.overwrite(*d.b);
  fresh("overwrite");
  m.host_write();
  fresh("host_write");
  m.host_overwrite();
  fresh("host_overwrite");
  m.write_range(*d.a, 0, 4);
  fresh("write_range");
  m.overwrite_range(*d.b, 4, 4);
  fresh("overwrite_range");
  m.resize(32);
  fresh("resize");
  // Memory someone else may write at any time has no version.
  m.retain();
  CHECK(m.version() == 0);
  m.host_write();
  CHECK(m.version() == 0);
  std::vector<float> caller(16);
  other.adopt(nullptr, caller.data());
  CHECK(other.version() == 0);
}

}  // namespace hn
