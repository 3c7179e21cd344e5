// A Pad layer's counts per axis, as the importer and the export both read them from its
// pad_param (lib/layers/pad.cpp applies the same rules to PadParams).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"

namespace hn::detail {

// {before, after} for every axis of a bottom of `rank` axes: axes [axis, rank) take
// pad_before (one count for all of them or one each) and pad_after (the same, or
// pad_before's where unset); the others 0. Empty where the parameter does not fit the rank
// (the batch axis padded, a count list of another length, no pad_before).
inline std::optional<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> pad_counts(
    const hybridnn::proto::PadParameter& p, std::int64_t rank) {
  const std::int64_t axis = p.axis() < 0 ? p.axis() + rank : p.axis();
  if (rank == 0 || axis < 1 || axis >= rank || p.pad_before_size() == 0) return std::nullopt;
  const auto padded = static_cast<int>(rank - axis);
  const auto counts = [&](const auto& field, std::vector<std::int64_t>& full) {
    if (field.size() != 1 && field.size() != padded) return false;
    full.assign(static_cast<std::size_t>(rank), 0);
    for (int k = 0; k < padded; ++k)
      full[static_cast<std::size_t>(axis + k)] = field.Get(field.size() == 1 ? 0 : k);
    return true;
  };
  std::vector<std::int64_t> before, after;
  if (!counts(p.pad_before(), before)) return std::nullopt;
  if (p.pad_after_size() == 0) {
    after = before;
  } else if (!counts(p.pad_after(), after)) {
    return std::nullopt;
  }
  return std::make_pair(std::move(before), std::move(after));
}

}  // namespace hn::detail
