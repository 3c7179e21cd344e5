// Scale (Caffe): multiplies the input by a scale broadcast over the axes around it, with an
// optional learned bias: y[o][d][i] = x[o][d][i] * scale[d] (+ bias[d]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct ScaleParams {
  int axis = 1;  // first axis of the input the scale covers; negative counts from the end
  // Axes the scale covers (one input only): -1 = to the last axis, 0 = a scalar. With two
  // inputs the second input's shape decides.
  int num_axes = 1;
  float filler_value = 1.0f;  // filler of the learned scale: constant (Caffe's default, 1)
  bool bias_term = false;
  float bias_filler_value = 0.0f;  // bias_filler: constant (Caffe's default, 0)
};

// One input: the scale is parameter 0 (shape = the input's dims [axis, axis + num_axes)).
// Two inputs: the scale is input 1 and receives a gradient like any input. With bias_term,
// the bias is the last parameter, shaped like the scale. In place (set_in_place before
// setup), it keeps a copy of the input as its state, which backward needs for the scale's
// gradient (as Caffe's temp_).
std::unique_ptr<Layer> make_scale_layer(std::string name, const ScaleParams& params = {});

}  // namespace hn
