// Softmax layer (Caffe's SoftmaxParameter: axis): normalises exp(x) over one axis; and
// LogSoftmax (ONNX's and PyTorch's), its logarithm computed directly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct SoftmaxParams {
  int axis = 1;      // negative counts from the end
  bool log = false;  // LogSoftmax: y = x - max - log(sum exp(x - max)), type "LogSoftmax"
};

// The input is viewed as [count(0, axis)][shape[axis]][count(axis + 1)]; the output has the
// input's shape. Splits by rows unless the axis is the batch axis.
std::unique_ptr<Layer> make_softmax_layer(std::string name, SoftmaxParams params = {});

}  // namespace hn
