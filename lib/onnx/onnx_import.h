// ONNX models in (issue 37): an ONNX file becomes Caffe's schema, a NetParameter whose
// layers carry their weights as blobs (what a .caffemodel holds), so that the Net builds
// it like any prototxt and everything downstream (splits, fusion, the memory plan, solvers,
// allreduce) is unchanged. docs/onnx.md lists the operators and attributes read.
#pragma once

#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/onnx/onnx_convert.h"

namespace hn::detail {

// Whether this build reads ONNX files (libonnx-dev was found).
bool onnx_supported();

// Reads the ONNX model at `path` (opset 7-17 of the default domain; initializers inline or
// in external data files beside it) as one Input layer per graph input that is not an
// initializer (a symbolic batch dimension becomes 1: NetOptions::batch_size sets it) and one
// or more layers per node, named by the node (or "OPTYPE_INDEX" when unnamed), the graph's
// value names as blob names, the initializers as the layers' blobs. An operator, attribute
// value or opset the importer does not support is an hn::Error naming the file, the node,
// its op type and the attribute; nothing is approximated.
struct OnnxModel {
  hybridnn::proto::NetParameter net;
  std::vector<std::string> inputs, outputs;  // the graph's, as blob names, in order
};
OnnxModel read_onnx_model(const std::string& path);

// Replaces every layer of type "ONNX" in `net` by its model's layers (read_onnx_model's,
// without the Input layers): the layer's bottoms stand for the graph's inputs and its tops
// for the graph's outputs, in order; every other blob and every layer is named
// "LAYER/NAME"; each layer gets the ONNX layer's include and exclude rules, and keeps its
// weights as blobs. onnx_param.source is looked for beside `origin` (the prototxt's path)
// first when relative. Errors name `origin`, the layer and the model.
void expand_onnx_layers(hybridnn::proto::NetParameter& net, const std::string& origin);

}  // namespace hn::detail
