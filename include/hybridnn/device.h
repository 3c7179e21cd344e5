// Device names as used everywhere (API, command line, logs): "reference", "cpu", "cpu:N",
// "cuda:N". A bare "cpu" is "cpu:0" and a bare "cuda" is "cuda:0"; "reference:N" names a
// further reference driver instance.
#pragma once

#include <string>
#include <string_view>

namespace hn {

enum class DeviceKind { reference, cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  // Parses a device name; throws hn::Error quoting the text when it is not one.
  static Device parse(std::string_view text);
  // Canonical name: "reference", "cpu", "cpu:1", "cuda:0".
  std::string name() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

}  // namespace hn
