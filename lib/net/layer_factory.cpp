// Caffe LayerParameter -> hybridnn layer, through the layer registry (lib/layers/
// registry.h): each type's converter lives in the layer's own file.
#include "lib/net/layer_factory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "lib/core/check.h"
#include "lib/layers/registry.h"

namespace hn::detail {
namespace {

// Caffe's layers that take no bottoms and produce the net's inputs.
constexpr std::array<std::string_view, 7> kDataLayers{
    "Data", "DummyData", "HDF5Data", "ImageData", "Input", "MemoryData", "WindowData"};

}  // namespace

std::unique_ptr<Layer> make_layer(const hybridnn::proto::LayerParameter& param) {
  const std::string& type = param.type();
  if (const LayerType* entry = find_layer_type(type)) return entry->make(param);
  HN_CHECK(!is_data_layer_type(type), "layer '{}': type '{}' is a data layer, handled by the Net",
           param.name(), type);
  fail("layer '{}': unknown layer type '{}'; known types: {}", param.name(), type,
       fmt::join(known_layer_types(), ", "));
}

std::vector<std::string> known_layer_types() {
  return layer_type_names();
}

bool is_data_layer_type(const std::string& type) {
  return std::find(kDataLayers.begin(), kDataLayers.end(), type) != kDataLayers.end();
}

}  // namespace hn::detail
