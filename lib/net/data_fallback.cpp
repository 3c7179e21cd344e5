// TEMPORARY (removed when lib/data lands): lets the library link before the data feeds exist.
#include "lib/check.h"
#include "lib/data/data.h"

namespace hn::detail {

__attribute__((weak)) std::unique_ptr<DataFeed> open_data_feed(
    const hybridnn::proto::LayerParameter& layer, const FeedOptions&) {
  fail("layer '{}': data feeds are not built yet", layer.name());
}

}  // namespace hn::detail
