// Split: parsing, validation and the rounding of fractions to rows.
#include "hybridnn/split.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <optional>

#include "hybridnn/runtime.h"
#include "lib/check.h"

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
void validate(const std::vector<SplitShare>& shares, const std::string& label) {
  HN_CHECK(!shares.empty(), "split {}: no device", label);
  double total = 0.0;
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const SplitShare& share = shares[i];
    HN_CHECK(std::isfinite(share.fraction) && share.fraction >= 0.0,
             "split {}: the fraction of {} must be a non-negative number, got {}", label,
             share.device.name(), share.fraction);
    for (std::size_t j = 0; j < i; ++j) {
      HN_CHECK(shares[j].device != share.device, "split {}: {} appears twice", label,
               share.device.name());
    }
    total += share.fraction;
  }
  HN_CHECK(std::fabs(total - 1.0) <= 1e-6, "split {}: the fractions sum to {}, not 1", label,
           total);
}

std::string describe(const std::vector<SplitShare>& shares) {
  std::string text;
  for (const SplitShare& share : shares) {
    if (!text.empty()) text += ',';
    // Always with a point or an exponent, so that parse() reads it back as a fraction.
    std::string fraction = fmt::format("{:.6g}", share.fraction);
    if (fraction.find_first_of(".e") == std::string::npos) fraction += ".0";
    text += fmt::format("{}:{}", share.device.name(), fraction);
  }
  return text;
}

}  // namespace

Split::Split(std::vector<SplitShare> shares) : shares_(std::move(shares)) {
  validate(shares_, describe(shares_));
}

Split Split::automatic() {
  Split split;
  split.automatic_ = true;
  return split;
}

Split Split::parse(std::string_view text) {
  const std::string quoted(text);
  if (trim(text) == "auto") return automatic();
  std::vector<std::string_view> entries;
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    entries.push_back(
        trim(text.substr(begin, comma == std::string_view::npos ? comma : comma - begin)));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  std::vector<SplitShare> shares;
  int open = -1;  // the entry without a fraction
  double given = 0.0;
  for (std::string_view entry : entries) {
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
  for (const SplitShare& share : shares_) {
    if (runtime.find(share.device) != nullptr) continue;
    std::vector<std::string> present;
    for (const Driver* driver : runtime.drivers())
      present.push_back(driver->name());
    detail::fail("split {}: no driver for {} (present: {})", to_string(), share.device.name(),
                 present.empty() ? "none" : fmt::format("{}", fmt::join(present, ", ")));
  }
}

std::string Split::to_string() const {
  return automatic_ ? "auto" : describe(shares_);
}

}  // namespace hn
