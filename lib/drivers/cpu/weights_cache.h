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
  // At most `max_bytes` are kept, all entries together. Past it, weights that find no room are
  // laid out in one scratch buffer at every call. (Emptying the whole cache instead, as it
  // did, made every layer of a net whose laid-out weights exceed it free and allocate its
  // buffer at every call: ResNet-50's Winograd kernels built for AVX2, 361 MB, took its res5
  // layers' forward from 30 to 63 ms.)
  explicit WeightsCache(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  // The buffer of `count` floats for these weights, and whether it already holds them laid
  // out (false: the caller fills it). Version 0 (contents unknown): the scratch buffer, never
  // kept, filled at every call. Room for new weights is made only from entries unused for
  // twice as many calls as there are weights known (the weights of a net since destroyed,
  // or of a layer that changed its algorithm), never from those a net's iterations go
  // through in turn, which would then push each other out at every call.
  std::pair<float*, bool> get(const float* weights, int tag, std::uint64_t version,
                              std::size_t count) {
    ++clock_;
    if (version == 0) return scratch(count);
    Entry& entry = entries_[Key{weights, tag}];  // new: known, nothing kept
    entry.used = clock_;
    if (entry.kept && entry.floats.size() == count) {
      if (entry.version == version) return {entry.floats.data(), true};
      entry.version = version;
      return {entry.floats.data(), false};
    }
    release(entry);
    const std::size_t bytes = count * sizeof(float);
    if (bytes_ + bytes > max_bytes_) make_room(bytes);
    if (bytes_ + bytes > max_bytes_) return scratch(count);
    entry.floats.resize(count);
    entry.kept = true;
    entry.version = version;
    bytes_ += bytes;
    return {entry.floats.data(), false};
  }

  std::size_t kept_bytes() const { return bytes_; }

 private:
  using Key = std::pair<const float*, int>;
  struct Entry {
    bool kept = false;  // floats hold a layout of these weights (else they are in scratch)
    std::uint64_t version = 0;
    std::uint64_t used = 0;  // the clock at its last call
    std::vector<float> floats;
  };

  std::pair<float*, bool> scratch(std::size_t count) {
    scratch_.resize(count);
    return {scratch_.data(), false};
  }

  void release(Entry& entry) {
    if (entry.kept) bytes_ -= entry.floats.size() * sizeof(float);
    entry.kept = false;
    entry.version = 0;
    std::vector<float>().swap(entry.floats);
  }

  // Forgets stale weights, the longest unused first, until `bytes` more fit.
  void make_room(std::size_t bytes) {
    const std::uint64_t stale = 2 * static_cast<std::uint64_t>(entries_.size());
    std::multimap<std::uint64_t, std::map<Key, Entry>::iterator> oldest;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (clock_ - it->second.used > stale) oldest.emplace(it->second.used, it);
    }
    for (const auto& [used, it] : oldest) {
      static_cast<void>(used);
      release(it->second);
      entries_.erase(it);
      if (bytes_ + bytes <= max_bytes_) return;
    }
  }

  std::size_t max_bytes_;
  std::map<Key, Entry> entries_;
  std::size_t bytes_ = 0;
  std::uint64_t clock_ = 0;
  std::vector<float> scratch_;
};

}  // namespace hn::detail::cpu
