// Eltwise layer with Caffe's EltwiseParameter: element-wise SUM (with coefficients), PROD
// and MAX of two or more inputs of one shape.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

enum class EltwiseOp { prod, sum, max };

struct EltwiseParams {
  EltwiseOp operation = EltwiseOp::sum;
  std::vector<float> coeff;  // SUM only: empty (all 1) or one per input
  // PROD backward: the product of the other inputs (true), or y / x_i (false, Caffe's faster
  // form, wrong where x_i == 0).
  bool stable_prod_grad = true;
};

// MAX keeps, per element, the index of the input that won (first wins on ties) in a state
// tensor shaped like the output, for backward.
std::unique_ptr<Layer> make_eltwise_layer(std::string name, EltwiseParams params = {});

}  // namespace hn
