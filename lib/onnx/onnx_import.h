// ONNX models in (issue 37): an ONNX file becomes Caffe's schema, a NetParameter whose
// layers carry their weights as blobs (what a .caffemodel holds), so that the Net builds
// it like any prototxt and everything downstream (splits, fusion, the memory plan, solvers,
// allreduce) is unchanged. docs/onnx.md lists the operators and attributes read.
#pragma once

#include <string>

#include "hybridnn.pb.h"

namespace hn::detail {

// Whether `path` names an ONNX model: its extension is ".onnx" (any case).
bool is_onnx_path(const std::string& path);

// Whether this build reads ONNX files (libonnx-dev was found).
bool onnx_supported();

// Reads the ONNX model at `path` (opset 7-17 of the default domain; initializers inline or
// in external data files beside it) as one Input layer per graph input that is not an
// initializer (a symbolic batch dimension becomes 1: NetOptions::batch_size sets it) and one
// or more layers per node, named by the node (or "OPTYPE_INDEX" when unnamed), the graph's
// value names as blob names, the initializers as the layers' blobs. An operator, attribute
// value or opset the importer does not support is an hn::Error naming the file, the node,
// its op type and the attribute; nothing is approximated.
hybridnn::proto::NetParameter read_onnx_model(const std::string& path);

}  // namespace hn::detail
