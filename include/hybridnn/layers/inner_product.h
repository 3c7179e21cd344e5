// InnerProduct (fully connected) layer with Caffe's parameters: num_output, bias_term,
// axis and transpose.
#pragma once

#include <string>
#include <vector>

#include "hybridnn/layer.h"

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
class InnerProductLayer final : public Layer {
 public:
  InnerProductLayer(std::string name, InnerProductParams params);
  const char* type() const override { return "InnerProduct"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  // With axis 0 the whole tensor is one row, so the batch cannot be cut.
  bool splits_by_rows() const override { return axis_ != 0; }

 private:
  InnerProductParams config_;
  int axis_ = 1;                // canonical (set by setup())
  index_t inputs_per_row_ = 0;  // K
};

}  // namespace hn
