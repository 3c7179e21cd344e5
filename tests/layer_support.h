// Layer test support: tensors filled from host vectors, and a finite-difference gradient
// checker in the style of Caffe's GradientChecker.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/layers/layer.h"

namespace hn::test {

void set_values(Tensor& tensor, const std::vector<float>& values);
std::vector<float> values(Tensor& tensor);
std::vector<float> diffs(Tensor& tensor);

struct GradientCheck {
  float step = 1e-2f;       // central-difference step
  double threshold = 1e-2;  // allowed |analytic - numeric| / max(1, |analytic|, |numeric|)
  // Skip input elements within `kink_range` of `kink` (ReLU at 0, max ties), as Caffe does.
  float kink = 0.0f;
  float kink_range = -1.0f;  // < 0: no kink
  bool check_params = true;
  Phase phase = Phase::train;
  std::uint64_t seed = 1;
  std::uint32_t projection_seed = 99;  // random weights r of the loss L = sum r * y
};

// Runs the layer on `driver` and checks, for every input the layer propagates to and (if
// check_params) every parameter, that backward's gradient of L = sum_k r_k * y_k (fixed
// random r over every output element) matches central differences of L. Reports each
// mismatch through Catch (with the tensor, element and both values). `inputs` hold the
// point to differentiate at; `outputs` must be set up by layer.setup already.
void check_gradients(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                     const std::vector<Tensor*>& outputs, const GradientCheck& options = {});

}  // namespace hn::test
