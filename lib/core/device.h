// Device names as used everywhere (API, command line, logs): a kind from the driver
// registry and an index, "reference", "cpu", "cpu:N", "cuda:N". A bare kind is index 0;
// kinds whose index names hardware print it always ("cuda:0").
#pragma once

#include <string>
#include <string_view>

namespace hn {

struct Device {
  std::string kind = "cpu";
  int index = 0;

  // Parses a device name; throws hn::Error quoting the text when it is not one, or when
  // its kind is not registered (the error lists the kinds).
  static Device parse(std::string_view text);
  // Canonical name: "reference", "cpu", "cpu:1", "cuda:0".
  std::string name() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

}  // namespace hn
