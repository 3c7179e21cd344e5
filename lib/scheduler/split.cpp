// Split: parsing, validation, the rounding of fractions to rows, and the file of per-layer
// splits that `--split-save` writes and `--split-file` reads.
#include "lib/scheduler/split.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>

#include "lib/core/check.h"
#include "lib/core/files.h"
#include "lib/core/runtime.h"

namespace hn {

namespace {

std::string_view trim(std::string_view text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::optional<double> number(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  // std::from_chars for double needs GCC 11; strtod on a copy is enough here.
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size()) return std::nullopt;
  return value;
}

// "a, b,,c" -> {"a", "b", "", "c"}.
std::vector<std::string_view> comma_entries(std::string_view text) {
  std::vector<std::string_view> entries;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    entries.push_back(
        trim(text.substr(begin, comma == std::string_view::npos ? comma : comma - begin)));
    if (comma == std::string_view::npos) return entries;
    begin = comma + 1;
  }
}

bool is_device(std::string_view text) {
  try {
    Device::parse(trim(text));
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

namespace {

// `label` names the split in messages: the text it was parsed from, or its shares.
void check_distinct(const std::vector<Device>& devices, const std::string& label) {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      HN_CHECK(devices[j] != devices[i], "split {}: {} appears twice", label, devices[i].name());
    }
  }
}

void validate(const std::vector<SplitShare>& shares, const std::string& label) {
  HN_CHECK(!shares.empty(), "split {}: no device", label);
  double total = 0.0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const SplitShare& share = shares[i];
    HN_CHECK(std::isfinite(share.fraction) && share.fraction >= 0.0,
             "split {}: the fraction of {} must be a non-negative number, got {}", label,
             share.device.name(), share.fraction);
    total += share.fraction;
  }
  std::vector<Device> devices;
  for (const SplitShare& share : shares)
    devices.push_back(share.device);
  check_distinct(devices, label);
  HN_CHECK(std::fabs(total - 1.0) <= 1e-6, "split {}: the fractions sum to {}, not 1", label,
           total);
}

// Up to 6 significant digits, always with a point or an exponent so that parse() reads a
// fraction back. With `last_takes_rest` the last share is written as what the others leave
// (never below 0), so the written fractions sum to 1 within validate()'s tolerance however
// many shares round the same way (three thirds would otherwise read back as 0.999999), and
// parse(to_string()) writes the same text again.
std::string describe(const std::vector<SplitShare>& shares, bool last_takes_rest) {
  std::string text;
  double written = 0.0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const bool last = last_takes_rest && i + 1 == shares.size() && i > 0;
    const double value = last ? std::max(0.0, 1.0 - written) : shares[i].fraction;
    std::string fraction = fmt::format("{:.6g}", value);
    if (fraction.find_first_of(".e") == std::string::npos) fraction += ".0";
    written += std::strtod(fraction.c_str(), nullptr);
    if (!text.empty()) text += ',';
    text += fmt::format("{}:{}", shares[i].device.name(), fraction);
  }
  return text;
}

}  // namespace

Split::Split(std::vector<SplitShare> shares) : shares_(std::move(shares)) {
  validate(shares_, describe(shares_, false));
}

Split Split::only(const std::vector<Device>& devices, const Device& device) {
  std::vector<SplitShare> shares;
  for (const Device& each : devices)
    shares.push_back(SplitShare{each, each == device ? 1.0 : 0.0});
  return Split(std::move(shares));
}

Split Split::proportional(const std::vector<Device>& devices, const std::vector<double>& weights) {
  HN_CHECK(devices.size() == weights.size(), "Split::proportional: {} devices, {} weights",
           devices.size(), weights.size());
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<SplitShare> shares;
  double given = 0.0;
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const double fraction =
        d + 1 < devices.size() ? weights[d] / total : std::max(0.0, 1.0 - given);
    given += fraction;
    shares.push_back(SplitShare{devices[d], fraction});
  }
  return Split(std::move(shares));
}

Split Split::balanced(index_t rows, const std::vector<double>& busy_seconds) const {
  HN_CHECK(busy_seconds.size() == shares_.size(), "Split::balanced: {} shares, {} busy times",
           shares_.size(), busy_seconds.size());
  const auto bounds = partition(rows);
  std::vector<double> speeds;
  for (std::size_t s = 0; s < bounds.size(); ++s) {
    const double held = static_cast<double>(bounds[s].second - bounds[s].first);
    if (held > 0.0 && !(busy_seconds[s] > 0.0 && std::isfinite(busy_seconds[s]))) return Split();
    speeds.push_back(held > 0.0 ? held / busy_seconds[s] : 0.0);
  }
  return proportional(devices(), speeds);
}

Split Split::automatic(std::vector<Device> devices) {
  Split split;
  split.automatic_ = true;
  split.automatic_devices_ = std::move(devices);
  check_distinct(split.automatic_devices_, split.to_string());
  return split;
}

std::vector<Device> Split::devices() const {
  std::vector<Device> devices = measured_devices();
  for (const SplitShare& share : shares_)
    devices.push_back(share.device);
  return devices;
}

std::vector<Device> Split::measured_devices() const {
  if (!automatic_ || !automatic_devices_.empty()) return automatic_devices_;
  std::vector<Device> devices;
  for (const Device& device : available_devices()) {
    if (!driver_kind(device.kind).oracle) devices.push_back(device);
  }
  return devices;
}

Split Split::parse(std::string_view text) {
  const std::string quoted(text);
  if (trim(text) == "auto") return automatic();
  if (const std::string_view auto_prefix = "auto:";
      trim(text).substr(0, auto_prefix.size()) == auto_prefix) {
    std::vector<Device> devices;
    for (std::string_view entry : comma_entries(trim(text).substr(auto_prefix.size()))) {
      HN_CHECK(!entry.empty(), "split '{}': an empty entry (write auto:DEVICE,DEVICE,...)", quoted);
      try {
        devices.push_back(Device::parse(entry));
      } catch (const Error& error) {
        detail::fail("split '{}': {}", quoted, error.what());
      }
    }
    check_distinct(devices, fmt::format("'{}'", quoted));
    return automatic(std::move(devices));
  }
  std::vector<SplitShare> shares;
  int open = -1;  // the entry without a fraction
  double given = 0.0;
  for (std::string_view entry : comma_entries(text)) {
    HN_CHECK(!entry.empty(), "split '{}': an empty entry (write DEVICE:FRACTION,...)", quoted);
    std::string_view device_text = entry;
    std::optional<double> fraction;
    if (const auto eq = entry.find('='); eq != std::string_view::npos) {
      device_text = trim(entry.substr(0, eq));
      fraction = number(entry.substr(eq + 1));
      HN_CHECK(fraction.has_value(), "split '{}': '{}' is not a fraction", quoted,
               entry.substr(eq + 1));
    } else if (const auto colon = entry.rfind(':'); colon != std::string_view::npos) {
      // The suffix is a fraction when what precedes it is a device and the suffix is not a
      // device index: "cuda:0:0.4", "cuda:0:1", "cpu:0.6", "cpu:1.0"; but "cpu:1" and
      // "cuda:1" name devices (write the fraction with a point, or "cpu=1").
      const std::string_view prefix = entry.substr(0, colon), suffix = entry.substr(colon + 1);
      const std::optional<double> value = number(suffix);
      const bool index_like = suffix.find_first_not_of("0123456789") == std::string_view::npos &&
                              prefix.find(':') == std::string_view::npos;
      const bool fraction_here = value && !index_like;
      if (fraction_here && is_device(prefix)) {
        device_text = prefix;
        fraction = value;
      }
    }
    Device device;
    try {
      device = Device::parse(trim(device_text));
    } catch (const Error& error) {
      detail::fail("split '{}': {}", quoted, error.what());
    }
    if (fraction) {
      given += *fraction;
    } else {
      HN_CHECK(open < 0, "split '{}': only one device may leave out its fraction", quoted);
      open = static_cast<int>(shares.size());
    }
    shares.push_back(SplitShare{device, fraction.value_or(0.0)});
  }
  if (open >= 0) shares[open].fraction = std::max(0.0, 1.0 - given);
  validate(shares, fmt::format("'{}'", quoted));
  return Split(std::move(shares));
}

std::vector<std::pair<index_t, index_t>> Split::partition(index_t rows) const {
  HN_CHECK(!automatic_, "split auto has no fractions until they are measured");
  HN_CHECK(rows >= 0, "split: cannot partition {} rows", rows);
  std::vector<std::pair<index_t, index_t>> slices;
  double cumulative = 0.0;
  index_t begin = 0;
  for (std::size_t i = 0; i < shares_.size(); ++i) {
    cumulative += shares_[i].fraction;
    index_t end =
        i + 1 == shares_.size()
            ? rows
            : static_cast<index_t>(std::floor(cumulative * static_cast<double>(rows) + 0.5));
    end = std::min(std::max(end, begin), rows);
    slices.emplace_back(begin, end);
    begin = end;
  }
  return slices;
}

void Split::check_devices(const Runtime& runtime) const {
  for (const Device& device : devices()) {
    if (runtime.find(device) != nullptr) continue;
    std::vector<std::string> present;
    for (const Driver* driver : runtime.drivers())
      present.push_back(driver->name());
    detail::fail("split {}: no driver for {} (present: {})", to_string(), device.name(),
                 present.empty() ? "none" : fmt::format("{}", fmt::join(present, ", ")));
  }
}

std::string Split::to_string() const {
  if (!automatic_) return describe(shares_, true);
  std::vector<std::string> names;
  for (const Device& device : automatic_devices_)
    names.push_back(device.name());
  return names.empty() ? "auto" : fmt::format("auto:{}", fmt::join(names, ","));
}

void write_layer_splits(const std::string& path, const LayerSplits& splits) {
  std::string text = fmt::format(
      "# hybridnn layer splits: one \"LAYER DEVICE:FRACTION,...\" line per layer, as measured "
      "by --split auto.\n# Reuse them with `hybridnn time|test|train --split-file {}` "
      "(NetOptions::layer_splits).\n",
      path);
  for (const auto& [layer, split] : splits) {
    HN_CHECK(
        !layer.empty() && layer.find_first_of(" \t\r\n") == std::string::npos && layer[0] != '#',
        "write_layer_splits '{}': layer name '{}' cannot be written (empty, whitespace "
        "or a leading '#')",
        path, layer);
    HN_CHECK(!split.empty() && !split.is_automatic(),
             "write_layer_splits '{}': layer {} has split '{}'; the file holds measured "
             "fractions (calibrate the net first)",
             path, layer, split.to_string());
    text += fmt::format("{} {}\n", layer, split.to_string());
  }
  detail::replace_file(path, text, "write_layer_splits");
}

LayerSplits read_layer_splits(const std::string& path) {
  std::ifstream file = detail::open_input_file(path, "read_layer_splits");
  LayerSplits splits;
  std::map<std::string, int> first_line;  // of each layer
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // written on Windows
    const std::string_view content = trim(line);
    if (content.empty() || content[0] == '#') continue;
    const std::size_t space = content.find_first_of(" \t");
    const std::string layer(content.substr(0, space));
    const std::string_view text =
        space == std::string_view::npos ? std::string_view() : trim(content.substr(space));
    HN_CHECK(!text.empty(), "{}:{}: layer {} has no split (write LAYER DEVICE:FRACTION,...)", path,
             number, layer);
    Split split;
    try {
      split = Split::parse(text);
    } catch (const Error& error) {
      detail::fail("{}:{}: layer {}: {}", path, number, layer, error.what());
    }
    HN_CHECK(!split.is_automatic(),
             "{}:{}: layer {}: split '{}' is automatic; the file holds measured fractions", path,
             number, layer, text);
    const auto [previous, inserted] = first_line.emplace(layer, number);
    HN_CHECK(inserted, "{}:{}: layer {} is named twice (first on line {})", path, number, layer,
             previous->second);
    splits.emplace_back(layer, std::move(split));
  }
  HN_CHECK(!file.bad(), "read_layer_splits: error while reading '{}'", path);
  return splits;
}

}  // namespace hn
