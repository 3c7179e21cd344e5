// ONNX models out (issue 37): a Net's layers and weights (Caffe's schema, as Net::save
// writes them) become an ONNX model (opset 13) that ONNX Runtime, PyTorch's tools and this
// library's importer read. docs/onnx.md lists which layer becomes which operator.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hybridnn.pb.h"

namespace hn::detail {

struct OnnxExport {
  std::vector<std::string> inputs, outputs;  // the graph's, in order
  std::vector<std::string> left_out;         // the losses and accuracies, by layer name
};

// Writes `net` (one phase's layers, each with its weights as blobs) as an ONNX model at
// `path` (through a temporary file and a rename). `shapes` holds every blob's shape by name.
// The tops of layers without bottoms (Input and the data layers) become the graph's
// inputs, their first dimension the symbolic batch "N", where some exported layer reads
// them; losses and accuracies are left out (an exported model is the inference graph), and
// the values no exported layer reads are the graph's outputs. A layer or parameter with no
// ONNX equivalent is an hn::Error naming `origin`, the layer, its type and the parameter;
// nothing is written then.
OnnxExport write_onnx_model(const hybridnn::proto::NetParameter& net,
                            const std::map<std::string, std::vector<std::int64_t>>& shapes,
                            const std::string& path, const std::string& origin);

}  // namespace hn::detail
