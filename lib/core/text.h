// Comma-separated lists: flags (--stage, --weights), NetOptions and hn_* option strings,
// solver weight lists and CIFAR-10 file lists.
#pragma once

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

}  // namespace hn::detail
