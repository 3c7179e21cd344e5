// The driver registry's table, device names, and typed driver options.
#include "lib/core/driver_registry.h"

#include <charconv>
#include <mutex>

#include "lib/core/check.h"
#include "lib/core/device.h"

namespace hn {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<DriverKind> kinds;
};

void add_locked(Registry& registry, DriverKind kind) {
  HN_CHECK(!kind.name.empty() && kind.name.find(':') == std::string::npos,
           "register_driver_kind: bad kind name '{}' (non-empty, no ':')", kind.name);
  for (const DriverKind& present : registry.kinds) {
    HN_CHECK(present.name != kind.name,
             "register_driver_kind: a driver kind '{}' is already registered", kind.name);
  }
  registry.kinds.push_back(std::move(kind));
}

Registry& registry() {
  static Registry table;
  return table;
}

std::string kind_list(const std::vector<DriverKind>& kinds) {
  // Empty only in a C++ program that named a device before registering the built-in
  // drivers (the C ABI registers them itself).
  if (kinds.empty())
    return "none (call hn::register_builtin_drivers(), lib/drivers/builtin.h, first)";
  std::string names;
  for (const DriverKind& kind : kinds)
    names += (names.empty() ? "" : ", ") + kind.name;
  return names;
}

}  // namespace

void register_driver_kind(DriverKind kind) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  add_locked(table, std::move(kind));
}

std::vector<DriverKind> driver_kinds() {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  return table.kinds;
}

std::optional<DriverKind> find_driver_kind(std::string_view name) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  for (const DriverKind& kind : table.kinds) {
    if (kind.name == name) return kind;
  }
  return std::nullopt;
}

DriverKind driver_kind(std::string_view name) {
  if (auto kind = find_driver_kind(name)) return *std::move(kind);
  detail::fail("unknown device kind '{}': the registered kinds are {}", name,
               kind_list(driver_kinds()));
}

Device default_device() {
  for (const DriverKind& kind : driver_kinds()) {
    if (kind.host_memory && !kind.oracle && !kind.accelerator) return Device{kind.name, 0};
  }
  detail::fail("no driver kind computes on the host (the registered kinds are {})",
               kind_list(driver_kinds()));
}

DriverOptions options_for(const DriverKind& kind, const DriverOptions& options) {
  DriverOptions kept;
  for (const auto& [name, value] : options.values()) {
    for (const DriverOption& option : kind.options) {
      if (option.name == name) kept.set(name, value);
    }
  }
  return kept;
}

std::string DriverOptions::text(const std::string& name, const std::string& fallback) const {
  const auto found = values_.find(name);
  return found == values_.end() ? fallback : found->second;
}

int DriverOptions::integer(const std::string& name, int fallback, const Device& device) const {
  const auto found = values_.find(name);
  if (found == values_.end()) return fallback;
  const std::string& text = found->second;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  HN_CHECK(!text.empty() && error == std::errc() && end == text.data() + text.size(),
           "driver {}: option {}='{}' is not an integer", device.name(), name, text);
  return value;
}

bool DriverOptions::flag(const std::string& name, bool fallback, const Device& device) const {
  const auto found = values_.find(name);
  if (found == values_.end()) return fallback;
  if (found->second == "true" || found->second == "1") return true;
  if (found->second == "false" || found->second == "0") return false;
  detail::fail("driver {}: option {}='{}' is not true or false", device.name(), name,
               found->second);
}

Device Device::parse(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view kind_text = text.substr(0, colon);
  const std::optional<DriverKind> kind = find_driver_kind(kind_text);
  if (!kind) {
    detail::fail("unknown device '{}': expected KIND or KIND:N, KIND one of {}", text,
                 kind_list(driver_kinds()));
  }
  Device device{std::string(kind_text), 0};
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
  if (index == 0) {
    const std::optional<DriverKind> found = find_driver_kind(kind);
    if (found && found->any_index) return kind;
  }
  return fmt::format("{}:{}", kind, index);
}

}  // namespace hn
