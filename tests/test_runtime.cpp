// Conformance of the memory runtime: Buffer, Pointer/View and SyncedMemory/Tensor, with the
// copies each rule allows counted through the drivers' transfer statistics.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/core/tensor.h"

using namespace hn;
using Catch::Matchers::Contains;

namespace {

const Device kReference{"reference", 0};
const Device kReference1{"reference", 1};
const Device kCpu{"cpu", 0};

DriverOptions separate() {
  DriverOptions options;
  options.set("separate_memory", true);
  return options;
}

DriverOptions one_thread() {
  DriverOptions options;
  options.set("threads", 1);
  return options;
}

std::vector<float> download(Driver& driver, const void* address, std::size_t count) {
  std::vector<float> out(count);
  driver.copy_to_host(out.data(), address, count * sizeof(float));
  return out;
}

}  // namespace

TEST_CASE("a view aliases the memory when the driver can address it, copying nothing",
          "[runtime]") {
  Runtime runtime;
  Driver& cpu = runtime.add(kCpu, one_thread());
  Driver& reference = runtime.add(kReference);
  std::vector<float> host{1, 2, 3, 4};
  const Pointer pointer{kCpu, host.data(), host.size() * sizeof(float)};

  View view = runtime.view(pointer, reference, Access::read_write);
  CHECK_FALSE(view.staged());
  CHECK(view.address() == host.data());
  view.as<float>()[0] = 10;
  CHECK(host[0] == 10);  // no commit needed: it is the same memory
  view.commit();         // a no-op for aliases
  CHECK(reference.transfer_stats().total() == 0);
  CHECK(cpu.transfer_stats().total() == 0);
}

TEST_CASE("a view stages a copy when the driver cannot address the memory", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  std::vector<float> host{1, 2, 3, 4, 5};
  const Pointer pointer{kCpu, host.data(), host.size() * sizeof(float)};

  SECTION("a read view is filled from the source with one copy") {
    View view = runtime.view(pointer, device, Access::read);
    CHECK(view.staged());
    CHECK(view.address() != host.data());
    CHECK(device.owns(view.address(), view.bytes()));
    CHECK(device.transfer_stats().to_device == 1);
    CHECK(device.transfer_stats().to_device_bytes == 20);
    CHECK(download(device, view.address(), 5) == host);
    CHECK_THROWS_WITH(view.commit(), Contains("read-only"));
  }
  SECTION("a write-only view copies nothing in") {
    View view = runtime.view(pointer, device, Access::write);
    CHECK(view.staged());
    CHECK(device.transfer_stats().total() == 0);
  }
}

TEST_CASE("writes to a staged view reach the source only on commit", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  std::vector<float> host{1, 2, 3};
  const Pointer pointer{kCpu, host.data(), host.size() * sizeof(float)};

  View view = runtime.view(pointer, device, Access::read_write);
  device.scale(3, 2.0f, view.as<float>());
  CHECK(host == std::vector<float>{1, 2, 3});  // not yet
  device.reset_transfer_stats();
  view.commit();
  CHECK(host == std::vector<float>{2, 4, 6});
  CHECK(device.transfer_stats().to_host == 1);
  CHECK(device.transfer_stats().to_host_bytes == 12);
}

TEST_CASE("a view between two separate memory spaces stages through the host", "[runtime]") {
  Runtime runtime;
  Driver& a = runtime.add(kReference, separate());
  Driver& b = runtime.add(kReference1, separate());
  Buffer source(a, 4 * sizeof(float));
  const std::vector<float> values{4, 3, 2, 1};
  a.copy_from_host(source.address(), values.data(), 16);
  a.reset_transfer_stats();

  View view = runtime.view(source.pointer(), b, Access::read_write);
  CHECK(view.staged());
  CHECK(b.owns(view.address(), 16));
  CHECK_FALSE(a.owns(view.address(), 16));
  CHECK(a.transfer_stats().to_host == 1);
  CHECK(b.transfer_stats().to_device == 1);
  b.fill(4, 7.0f, view.as<float>());
  view.commit();
  CHECK(download(a, source.address(), 4) == std::vector<float>{7, 7, 7, 7});
}

TEST_CASE("a Pointer used on the wrong device is an error naming the call and sizes", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  std::vector<float> host(8, 1.0f);
  CHECK_THROWS_WITH(device.fill(8, 0.0f, host.data()),
                    Contains("fill") && Contains("32 bytes") && Contains("reference"));
  Buffer small(device, 4 * sizeof(float));
  CHECK_THROWS_WITH(device.fill(8, 0.0f, small.as<float>()),
                    Contains("fill") && Contains("32 bytes"));
  const Pointer on_gpu{Device{"cuda", 0}, host.data(), 32};
  CHECK_THROWS_WITH(runtime.view(on_gpu, device, Access::read),
                    Contains("no driver for device cuda:0") && Contains("reference"));
  const Pointer pointer{kCpu, host.data(), 32};
  CHECK_THROWS_WITH(pointer.slice(16, 20), Contains("[16, 36)") && Contains("32 bytes"));
  CHECK(pointer.slice(16, 16).as<float>() == host.data() + 4);
}

TEST_CASE("a Buffer frees its memory through its driver when it dies", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  void* address = nullptr;
  {
    Buffer buffer(device, 64);
    address = buffer.address();
    CHECK(device.owns(address, 64));
    Buffer moved = std::move(buffer);
    CHECK(buffer.address() == nullptr);
    CHECK(moved.address() == address);
  }
  CHECK_FALSE(device.owns(address, 64));
}

TEST_CASE("new synced memory reads as zeros on every driver", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  SyncedMemory on_device(5 * sizeof(float));
  CHECK(download(device, on_device.read(device), 5) == std::vector<float>(5, 0.0f));
  CHECK(device.transfer_stats().to_device == 0);  // zeroed in place, nothing copied
  SyncedMemory on_host(5 * sizeof(float));
  const auto* host = static_cast<const float*>(on_host.host_read());
  CHECK(std::vector<float>(host, host + 5) == std::vector<float>(5, 0.0f));
}

TEST_CASE("synced memory copies only to refresh a stale copy", "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  Driver& cpu = runtime.add(kCpu, one_thread());
  Driver& reference_host = runtime.add(kReference1);  // host memory, like cpu
  SyncedMemory memory(4 * sizeof(float));
  auto* host = static_cast<float*>(memory.host_overwrite());
  for (int i = 0; i < 4; ++i)
    host[i] = static_cast<float>(i + 1);

  // First read on the device: one copy in. Second read: already current, no copy.
  const void* on_device = memory.read(device);
  CHECK(device.transfer_stats().to_device == 1);
  CHECK(memory.read(device) == on_device);
  CHECK(device.transfer_stats().to_device == 1);
  CHECK(memory.current_on(host_space()));
  CHECK(memory.current_on(device.memory_space()));

  // Host-addressable drivers share the host copy: no copies at all.
  CHECK(memory.read(cpu) == host);
  CHECK(memory.read(reference_host) == host);
  CHECK(cpu.transfer_stats().total() == 0);
  CHECK(reference_host.transfer_stats().total() == 0);

  // A write on the device makes the host copy stale; reading on the host refreshes it once.
  device.scale(4, 10.0f, static_cast<float*>(memory.write(device)));
  CHECK_FALSE(memory.current_on(host_space()));
  const auto* refreshed = static_cast<const float*>(memory.host_read());
  CHECK(std::vector<float>(refreshed, refreshed + 4) == std::vector<float>{10, 20, 30, 40});
  CHECK(device.transfer_stats().to_host == 1);
  memory.host_read();
  CHECK(device.transfer_stats().to_host == 1);

  // A host write makes the device copy stale: the next device read copies in again.
  static_cast<float*>(memory.host_write())[0] = -1.0f;
  CHECK_FALSE(memory.current_on(device.memory_space()));
  CHECK(download(device, memory.read(device), 1) == std::vector<float>{-1.0f});
  CHECK(device.transfer_stats().to_device == 2);

  // overwrite() does not refresh: the caller promises to write every byte.
  memory.host_write();
  memory.overwrite(device);
  CHECK(device.transfer_stats().to_device == 2);
  CHECK_FALSE(memory.current_on(host_space()));
}

TEST_CASE("synced memory moves between two separate spaces through the host", "[runtime]") {
  Runtime runtime;
  Driver& a = runtime.add(kReference, separate());
  Driver& b = runtime.add(kReference1, separate());
  SyncedMemory memory(3 * sizeof(float));
  a.fill(3, 2.5f, static_cast<float*>(memory.overwrite(a)));
  CHECK(download(b, memory.read(b), 3) == std::vector<float>(3, 2.5f));
  CHECK(a.transfer_stats().to_host == 1);
  CHECK(b.transfer_stats().to_device == 1);
}

TEST_CASE("a tensor keeps its memory when a reshape fits and grows when it does not", "[runtime]") {
  Tensor tensor(Shape{2, 3, 4});
  CHECK(tensor.count() == 24);
  CHECK(tensor.shape().to_string() == "2x3x4");
  CHECK(tensor.shape()[-1] == 4);
  CHECK(tensor.shape().count(1, 3) == 12);
  float* data = tensor.host_data_mut();
  data[5] = 42.0f;
  tensor.reshape(Shape{4, 6});
  CHECK(tensor.host_data() == data);
  CHECK(tensor.host_data()[5] == 42.0f);
  tensor.reshape(Shape{5, 6});
  CHECK(tensor.count() == 30);
  CHECK(tensor.host_data()[5] == 0.0f);  // new memory reads as zeros
  CHECK_THROWS_WITH(tensor.shape()[2], Contains("5x6") && Contains("axis 2"));
  CHECK_THROWS_WITH(Shape({2, -1}), Contains("negative"));
  // Element counts that would overflow are refused at construction, naming the shape; a
  // zero dimension elsewhere does not hide them (count() over a sub-range would overflow).
  CHECK_THROWS_WITH(Shape({4, 4611686018427387905}),
                    Contains("4x4611686018427387905") && Contains("too large"));
  CHECK_THROWS_WITH(Shape({0, 1 << 30, 1 << 30, 8}), Contains("too large"));
  CHECK(Shape({1 << 30, 1 << 30}).count() == index_t{1} << 60);
}

TEST_CASE("adopted memory is the caller's own copy: current at adoption, refreshed on read",
          "[runtime]") {
  Runtime runtime;
  Driver& device = runtime.add(kReference, separate());
  std::vector<float> mine{1, 2, 3, 4};
  SyncedMemory memory(4 * sizeof(float));
  memory.adopt(nullptr, mine.data());
  CHECK(memory.host_read() == mine.data());  // no copy: the caller's array itself
  CHECK(memory.current_on(host_space()));
  // Computed on the device, brought back into the caller's array by a host read.
  device.scale(4, 10.0f, static_cast<float*>(memory.write(device)));
  CHECK(mine[0] == 1.0f);
  memory.host_read();
  CHECK(mine == std::vector<float>{10, 20, 30, 40});
  // The caller changes the array and adopts again: the device copy is stale and refreshed.
  mine[3] = -1.0f;
  memory.adopt(nullptr, mine.data());
  CHECK_FALSE(memory.current_on(device.memory_space()));
  CHECK(download(device, memory.read(device), 4) == std::vector<float>{10, 20, 30, -1});
  // Memory of a device driver adopted there: the host copy is what gets refreshed.
  Buffer on_device(device, 4 * sizeof(float));
  device.fill(4, 7.0f, on_device.as<float>());
  SyncedMemory adopted(4 * sizeof(float));
  adopted.adopt(&device, on_device.address());
  CHECK(adopted.read(device) == on_device.address());
  const auto* host = static_cast<const float*>(adopted.host_read());
  CHECK(std::vector<float>(host, host + 4) == std::vector<float>(4, 7.0f));
}

TEST_CASE("a runtime holds one driver per device and names the present ones", "[runtime]") {
  Runtime runtime;
  runtime.add(kReference);
  CHECK_THROWS_WITH(runtime.add(kReference), Contains("already present"));
  CHECK_THROWS_WITH(runtime.driver("cpu:1"), Contains("cpu:1") && Contains("present: reference"));
  CHECK(&runtime.driver("reference") == runtime.find(kReference));
  CHECK(runtime.space_of(kCpu) == host_space());
}

TEST_CASE("asking for a GPU that is not there is an error naming it", "[runtime]") {
  if (device_count("cuda") > 0) {
    WARN("a GPU is present; this case checks the error path only without one");
    return;
  }
  CHECK_THROWS_WITH(make_driver(Device::parse("cuda:0")), Contains("cuda:0"));
}
