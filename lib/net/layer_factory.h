// Builds hybridnn layers from Caffe's LayerParameter through the layer registry
// (lib/layers/registry.h: each type's converter of its *_param message into our params
// struct, keeping Caffe's defaults and rules, lives in the layer's own file), and knows
// Caffe's data layer types, which the Net handles itself. Fillers and pretrained blobs are
// the Net's business.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/layers/layer.h"

namespace hn::detail {

// Constructs (does not set up) the layer `param` describes. Throws hn::Error naming the layer
// for an unknown type, a data layer type (those are the Net's), or a field we cannot honour.
std::unique_ptr<Layer> make_layer(const hybridnn::proto::LayerParameter& param);

// The Caffe type strings make_layer accepts, sorted.
std::vector<std::string> known_layer_types();

// Caffe's data layer types (Data, Input, ImageData, ...): they produce the net's inputs.
bool is_data_layer_type(const std::string& type);

}  // namespace hn::detail
