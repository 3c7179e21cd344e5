// The inner product layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/inner_product.h.
#pragma once

#include <string>
#include <vector>

#include "lib/layers/inner_product.h"

namespace hn {

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
  double forward_flops(index_t rows) const override;

 private:
  InnerProductParams config_;
  int axis_ = 1;                // canonical (set by setup())
  index_t inputs_per_row_ = 0;  // K
  index_t gemm_rows_ = 0;       // M: the input's count before axis
  index_t input_rows_ = 1;      // the input's axis 0
};

}  // namespace hn
