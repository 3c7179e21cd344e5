// InnerProduct (fully connected) layer with Caffe's parameters: num_output, bias_term,
// axis and transpose.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct InnerProductParams {
  index_t num_output = 0;
  bool bias_term = true;
  // The first axis flattened into each row's K inputs: axes [0, axis) index the rows
  // (M = count(0, axis)), axes [axis, end) the inputs (K = count(axis)). Negative counts
  // from the end.
  int axis = 1;
  // Caffe's meaning: weights are stored [K][N] when true, [N][K] (the default) otherwise.
  bool transpose = false;
};

// Output shape: the input's axes [0, axis) followed by num_output. Params: weights
// ([num_output][K], or [K][num_output] with transpose), then bias [num_output] when
// bias_term. y = x W^T + b (y = x W + b with transpose).
std::unique_ptr<Layer> make_inner_product_layer(std::string name, InnerProductParams params);

}  // namespace hn
