// The CPU driver's cache of weights laid out by its own kernels (lib/drivers/cpu/weights_cache.h):
// a layout is kept per weights, direction and version within a budget; weights past it are laid
// out in a scratch buffer at every call, and only weights unused for a while make room.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lib/drivers/cpu/weights_cache.h"

using hn::detail::cpu::WeightsCache;

namespace {

constexpr std::size_t kFloats = 1000;  // every weights' layout here
constexpr std::size_t kBytes = kFloats * sizeof(float);

}  // namespace

TEST_CASE("the weights cache keeps a layout per weights and direction until their version changes",
          "[cpu][weights_cache]") {
  WeightsCache cache(4 * kBytes);
  std::vector<float> w(10);
  const auto first = cache.get(w.data(), 0, 7, kFloats);
  CHECK_FALSE(first.second);  // to fill
  const auto again = cache.get(w.data(), 0, 7, kFloats);
  CHECK(again.second);
  CHECK(again.first == first.first);
  const auto other_direction = cache.get(w.data(), 1, 7, kFloats);
  CHECK_FALSE(other_direction.second);
  CHECK(other_direction.first != first.first);
  const auto updated = cache.get(w.data(), 0, 8, kFloats);  // after a solver step
  CHECK_FALSE(updated.second);
  CHECK(updated.first == first.first);  // filled again where it was
  CHECK(cache.kept_bytes() == 2 * kBytes);
  CHECK_FALSE(cache.get(w.data(), 2, 0, kFloats).second);  // version 0: never kept
  CHECK_FALSE(cache.get(w.data(), 2, 0, kFloats).second);
  CHECK(cache.kept_bytes() == 2 * kBytes);
}

TEST_CASE(
    "a net whose laid-out weights exceed the cache keeps what fits from call to call, the rest "
    "in scratch, and never exceeds the budget",
    "[cpu][weights_cache]") {
  // The bug: past the budget the cache emptied itself, so in every iteration of a net with
  // more laid-out weights than that each layer found nothing kept and allocated again.
  WeightsCache cache(3 * kBytes);
  std::vector<float> w(5);  // five layers' weights, called in turn, the version unchanged
  std::vector<float*> kept_at(w.size(), nullptr);
  for (int iteration = 0; iteration < 4; ++iteration) {
    int hits = 0;
    for (std::size_t l = 0; l < w.size(); ++l) {
      const auto [buffer, laid_out] = cache.get(&w[l], 0, 1, kFloats);
      hits += laid_out ? 1 : 0;
      if (l < 3 && iteration > 0) {
        CHECK(laid_out);
        CHECK(buffer == kept_at[l]);
      }
      if (l >= 3) CHECK_FALSE(laid_out);
      if (iteration == 0) kept_at[l] = buffer;
    }
    CHECK(hits == (iteration == 0 ? 0 : 3));
    CHECK(cache.kept_bytes() <= 3 * kBytes);
  }
}

TEST_CASE("weights no longer called make room for new ones", "[cpu][weights_cache]") {
  WeightsCache cache(2 * kBytes);
  std::vector<float> old_net(2), new_net(1);
  cache.get(&old_net[0], 0, 1, kFloats);
  cache.get(&old_net[1], 0, 1, kFloats);
  CHECK(cache.kept_bytes() == 2 * kBytes);
  // The old net's weights are not called again: once they have been unused for twice as
  // many calls as there are weights known, the new net's take their room.
  bool kept = false;
  for (int call = 0; call < 20 && !kept; ++call)
    kept = cache.get(&new_net[0], 0, 1, kFloats).second;
  CHECK(kept);
  CHECK(cache.kept_bytes() <= 2 * kBytes);
}
