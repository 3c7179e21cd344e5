// The C ABI's runtimes and drivers (hn_runtime_*, hn_driver_*, hn_available_devices).
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/core/runtime.h"
#include "lib/core/text.h"

// ---- runtime and drivers -----------------------------------------------------------------

extern "C" {

hn_status hn_runtime_create(hn_runtime** out) {
  return guarded([&] {
    auto runtime = std::make_unique<hn_runtime>();
    runtime->box = std::make_shared<RuntimeBox>();
    set_out(out, std::move(runtime), "hn_runtime_create");
  });
}

void hn_runtime_destroy(hn_runtime* runtime) {
  delete runtime;
}

hn_status hn_runtime_add_driver(hn_runtime* runtime, const char* device, const char* options,
                                hn_driver** out) {
  return guarded([&] {
    RuntimeBox& box = *checked(runtime, "hn_runtime_add_driver").box;
    const hn::Device parsed =
        hn::Device::parse(checked_text(device, "hn_runtime_add_driver: device"));
    hn::Driver* driver = box.runtime.find(parsed);
    std::vector<std::string> items =
        hn::detail::split_commas(options != nullptr ? options : "", hn::detail::EmptyItems::drop);
    std::sort(items.begin(), items.end());
    if (driver != nullptr && !items.empty() && items != box.options[parsed.name()]) {
      // A driver's options are fixed when it is made; dropping these silently would run
      // with others than the caller asked for.
      const std::vector<std::string>& had = box.options[parsed.name()];
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_runtime_add_driver: {} is already in this runtime with options '{}'; "
                       "add it with the same options or none to get it, or add another "
                       "instance (e.g. cpu:1) for '{}'",
                       parsed.name(), joined(had), options));
    }
    if (driver == nullptr) {
      hn::DriverOptions driver_options;
      for (const std::string& item : items) {
        const std::size_t equals = item.find('=');
        if (equals == std::string::npos || equals == 0) {
          fail(HN_ERROR_INVALID_ARGUMENT,
               fmt::format("hn_runtime_add_driver: option '{}' is not key=value", item));
        }
        driver_options.set(item.substr(0, equals), item.substr(equals + 1));
      }
      const std::vector<hn::Device> present = hn::available_devices();
      // Kinds of any index (cpu:1 is a second CPU driver) need no hardware of that index.
      if (std::find(present.begin(), present.end(), parsed) == present.end() &&
          !hn::driver_kind(parsed.kind).any_index) {
        std::vector<std::string> names;
        for (const hn::Device& d : present)
          names.push_back(d.name());
        fail(HN_ERROR_NOT_FOUND,
             fmt::format("hn_runtime_add_driver: no device {} here (devices: {})", parsed.name(),
                         joined(names)));
      }
      driver = &box.runtime.add(parsed, driver_options);
      box.options[parsed.name()] = items;
    }
    auto handle = std::make_unique<hn_driver>();
    handle->box = runtime->box;
    handle->driver = driver;
    handle->name = driver->name();
    handle->description = driver->description();
    set_out(out, std::move(handle), "hn_runtime_add_driver");
  });
}

hn_status hn_available_devices(const char** out) {
  thread_local std::string devices;
  return guarded([&] {
    std::vector<std::string> names;
    for (const hn::Device& device : hn::available_devices())
      names.push_back(device.name());
    devices = joined(names);
    set_out(out, devices.c_str(), "hn_available_devices");
  });
}

void hn_driver_destroy(hn_driver* driver) {
  delete driver;
}

const char* hn_driver_name(const hn_driver* driver) {
  return driver != nullptr ? driver->name.c_str() : "";
}

const char* hn_driver_description(const hn_driver* driver) {
  return driver != nullptr ? driver->description.c_str() : "";
}

}  // extern "C"
