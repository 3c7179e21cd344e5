// Weights a CPU kernel keeps in a layout of its own between calls (Winograd's transformed
// kernels, the pointwise convolution's packed panels), by the weights' address, a tag (the
// direction) and their version (LoweringShape::weights_version).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace hn::detail::cpu {

class WeightsCache {
 public:
  // Past this many bytes, all entries together, the cache starts again empty (a net's
  // weights are laid out again at its next call).
  explicit WeightsCache(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  // The buffer of `count` floats for these weights, and whether it already holds them laid
  // out (false: the caller fills it). Version 0 (contents unknown): a scratch buffer, never
  // kept, filled at every call.
  std::pair<float*, bool> get(const float* weights, int tag, std::uint64_t version,
                              std::size_t count) {
    if (version == 0) {
      scratch_.resize(count);
      return {scratch_.data(), false};
    }
    Entry& kept = entries_[{weights, tag}];
    if (kept.version == version && kept.floats.size() == count) return {kept.floats.data(), true};
    bytes_ += (count - kept.floats.size()) * sizeof(float);  // wraps back where it shrinks
    if (bytes_ > max_bytes_) {
      entries_.clear();
      bytes_ = count * sizeof(float);
    }
    Entry& fresh = entries_[{weights, tag}];
    fresh.version = version;
    fresh.floats.resize(count);
    return {fresh.floats.data(), false};
  }

 private:
  struct Entry {
    std::uint64_t version = 0;
    std::vector<float> floats;
  };
  std::size_t max_bytes_;
  std::map<std::pair<const float*, int>, Entry> entries_;
  std::size_t bytes_ = 0;
  std::vector<float> scratch_;
};

}  // namespace hn::detail::cpu
