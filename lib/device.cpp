// Device names: parsing and printing.
#include "hybridnn/device.h"

#include <charconv>

#include "lib/check.h"

namespace hn {

Device Device::parse(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view kind_text = text.substr(0, colon);
  Device device;
  if (kind_text == "reference") {
    device.kind = DeviceKind::reference;
  } else if (kind_text == "cpu") {
    device.kind = DeviceKind::cpu;
  } else if (kind_text == "cuda") {
    device.kind = DeviceKind::cuda;
  } else {
    detail::fail("unknown device '{}': expected reference, cpu, cpu:N or cuda:N", text);
  }
  if (colon != std::string_view::npos) {
    const std::string_view number = text.substr(colon + 1);
    const char* end = number.data() + number.size();
    const auto [ptr, ec] = std::from_chars(number.data(), end, device.index);
    HN_CHECK(!number.empty() && ec == std::errc() && ptr == end && device.index >= 0,
             "bad device index in '{}': expected a non-negative integer after ':'", text);
  }
  return device;
}

std::string Device::name() const {
  switch (kind) {
    case DeviceKind::reference:
      return index == 0 ? "reference" : fmt::format("reference:{}", index);
    case DeviceKind::cpu:
      return index == 0 ? "cpu" : fmt::format("cpu:{}", index);
    case DeviceKind::cuda:
      return fmt::format("cuda:{}", index);
  }
  return "unknown";
}

}  // namespace hn
