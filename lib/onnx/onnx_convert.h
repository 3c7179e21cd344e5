// ONNX files to Caffe's (issue 37, `hybridnn convert`): the other way is Net::save_onnx.
#pragma once

#include <string>

namespace hn {

// Reads the ONNX model at `onnx_path` as the importer does (read_onnx_model) and writes it
// as Caffe's two files: the net's layers without their weights as a prototxt at
// `prototxt_path`, the weights as a .caffemodel at `caffemodel_path` (each through a
// temporary file and a rename). Errors name the file, node and operator at fault; nothing
// is written then.
void onnx_to_caffe(const std::string& onnx_path, const std::string& prototxt_path,
                   const std::string& caffemodel_path);

namespace detail {

// Whether `path` names an ONNX model: its extension is ".onnx" (any case).
bool is_onnx_path(const std::string& path);

}  // namespace detail
}  // namespace hn
