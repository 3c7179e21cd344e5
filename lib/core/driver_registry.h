// The driver registry: one entry per kind of device ("reference", "cpu", "cuda", ...), each
// with its factory, how many devices of the kind are present, and the options its driver
// reads. The runtime, device names, the tool's device_query and the tests enumerate it; no
// part of the library lists the kinds itself. The built-in kinds come from the drivers'
// floor, not from here: its register_builtin_drivers() (lib/drivers/builtin.h), which the
// C ABI's entry points and the C++ programs' mains call; a program may register a driver
// of its own with register_driver_kind() before naming its devices.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/device.h"

namespace hn {

class Driver;

// Options a driver reads when made: name=value text pairs. Which names a kind accepts is
// part of its registry entry; an option its kind does not declare is an hn::Error.
class DriverOptions {
 public:
  DriverOptions() = default;
  DriverOptions(std::initializer_list<std::pair<const std::string, std::string>> values)
      : values_(values) {}

  DriverOptions& set(const std::string& name, std::string value) {
    values_[name] = std::move(value);
    return *this;
  }
  // Text, not the bool a pointer converts to ahead of std::string.
  DriverOptions& set(const std::string& name, const char* value) {
    return set(name, std::string(value));
  }
  DriverOptions& set(const std::string& name, int value) {
    return set(name, std::to_string(value));
  }
  DriverOptions& set(const std::string& name, bool value) {
    return set(name, std::string(value ? "true" : "false"));
  }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  const std::map<std::string, std::string>& values() const { return values_; }

  // Typed reads; a malformed value is an hn::Error naming the option and the device.
  std::string text(const std::string& name, const std::string& fallback = {}) const;
  int integer(const std::string& name, int fallback, const Device& device) const;
  bool flag(const std::string& name, bool fallback, const Device& device) const;

 private:
  std::map<std::string, std::string> values_;
};

struct DriverOption {
  std::string name;
  std::string help;                  // one line: what it sets, its default
  std::vector<std::string> choices;  // the allowed values when they form a fixed set
};

struct DriverKind {
  std::string name;     // the device names' prefix: "cpu" names cpu, cpu:1, ...
  std::string summary;  // one line for device_query
  // Further instances of any index share one piece of hardware ("cpu:1" is a second CPU
  // driver); otherwise the index names hardware, and is always printed ("cuda:0").
  bool any_index = false;
  // Devices of this kind compute on ordinary host memory whatever their options.
  bool host_memory = false;
  // A test oracle, far slower than any other kind (reference): automatic splits and
  // defaults leave it out.
  bool oracle = false;
  // Computes on hardware of its own (a GPU): the driver's thread only drives it, and takes
  // one host core while it waits (cuda).
  bool accelerator = false;
  // Runs a team of host threads, one per core unless told (option `threads`): drivers of
  // such kinds side by side divide the host's cores among them (cpu).
  bool multithreaded = false;
  // Devices present now (any_index kinds: 1). Null or 0: none.
  std::function<int()> count;
  // Makes the driver; null when this build lacks it (then `missing` says why).
  std::function<std::unique_ptr<Driver>(const Device&, const DriverOptions&)> make;
  std::string missing;
  std::vector<DriverOption> options;

  // The allowed values of `option` (empty when any value goes or there is no such option).
  std::vector<std::string> choices(const std::string& option) const {
    for (const DriverOption& declared : options) {
      if (declared.name == option) return declared.choices;
    }
    return {};
  }
};

// Adds a kind; throws hn::Error when one of that name is present.
void register_driver_kind(DriverKind kind);
// Every registered kind, in registration order (built-in ones first).
std::vector<DriverKind> driver_kinds();
std::optional<DriverKind> find_driver_kind(std::string_view name);
// The kind of `name`; throws hn::Error listing the registered kinds when there is none.
DriverKind driver_kind(std::string_view name);
// The device a program runs on when it names none: the first registered kind that computes
// on the host and is no oracle ("cpu").
Device default_device();
// `options` less the names `kind` does not read (one set of options for several kinds).
DriverOptions options_for(const DriverKind& kind, const DriverOptions& options);

}  // namespace hn
