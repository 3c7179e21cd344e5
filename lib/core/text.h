// Comma-separated lists: flags (--stage, --weights), NetOptions and hn_* option strings,
// solver weight lists and CIFAR-10 file lists; and excerpts of input for error messages.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hn::detail {

enum class EmptyItems { keep, drop };

// The items of `text` between commas; an empty `text` has none. With EmptyItems::keep,
// "a,,b" has an empty item in the middle (for a caller that reports it); with drop, two items.
inline std::vector<std::string> split_commas(const std::string& text, EmptyItems empty) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    std::string item = text.substr(begin, comma - begin);
    if (!item.empty() || empty == EmptyItems::keep) items.push_back(std::move(item));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

// At most `limit` characters of `text` for an error message, bytes outside printable ASCII
// as \xHH and the length when cut: a file's line may be 50 MB or binary.
inline std::string excerpt(const std::string& text, std::size_t limit = 80) {
  std::string shown;
  for (std::size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      shown += static_cast<char>(c);
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      shown += escaped;
    }
  }
  if (text.size() > limit) shown += "... (" + std::to_string(text.size()) + " bytes)";
  return shown;
}

}  // namespace hn::detail
