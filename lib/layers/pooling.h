// Pooling layer with Caffe's semantics: MAX and AVE, global_pooling, kernel/stride/pad in
// the square (kernel_size, stride, pad) or the _h/_w forms, and Caffe's output size (round
// up, or down with round_mode FLOOR, then drop a last window that would start in the
// padding).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

enum class PoolMethod { max, ave };

// Caffe's PoolingParameter. The square forms apply unless an _h/_w form is set (both of
// its fields, as in Caffe; 0 is a value there, e.g. pad_h: 1 pad_w: 0); setting both forms
// of one field is an error, as in Caffe.
struct PoolingParams {
  PoolMethod pool = PoolMethod::max;
  index_t kernel_size = 0;
  std::optional<index_t> kernel_h, kernel_w;
  index_t stride = 1;
  std::optional<index_t> stride_h, stride_w;
  index_t pad = 0;
  std::optional<index_t> pad_h, pad_w;
  bool global_pooling = false;  // kernel = the input's height x width; no kernel fields
  bool ceil_mode = true;        // Caffe's round_mode CEIL (the default); false: FLOOR
  // AVE's divisor counts the padding (Caffe's rule, true) or the window's input cells only
  // (PyTorch's and ONNX's count_include_pad 0).
  bool count_include_pad = true;
};

// Input N x C x H x W -> output N x C x out_h x out_w. MAX keeps, per output, the index
// h * W + w of the chosen input within its channel plane (first maximum wins) in a state
// tensor shaped like the output, for backward.
std::unique_ptr<Layer> make_pooling_layer(std::string name, PoolingParams params);

}  // namespace hn
