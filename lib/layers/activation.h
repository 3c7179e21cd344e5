// Element-wise neuron layers with Caffe semantics: ReLU (negative_slope), Sigmoid, TanH, Swish
// (beta), Clip (min, max) and Dropout (dropout_ratio, scaled at train time, identity at
// test). Each keeps the input's shape and splits by rows; those whose backward reads only
// the output may run in place (output 0 sharing input 0's memory).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct ReluParams {
  float negative_slope = 0.0f;
};

// y = x > 0 ? x : negative_slope * x.
std::unique_ptr<Layer> make_relu_layer(std::string name, ReluParams params = {});

// y = 1 / (1 + exp(-x)); backward reads y only, so in place is allowed.
std::unique_ptr<Layer> make_sigmoid_layer(std::string name);

// y = tanh(x); backward reads y only, so in place is allowed.
std::unique_ptr<Layer> make_tanh_layer(std::string name);

struct SwishParams {
  float beta = 1.0f;
};

// Caffe's Swish (PyTorch's SiLU at beta 1): y = x * sigmoid(beta * x). Backward reads x, so
// not in place.
std::unique_ptr<Layer> make_swish_layer(std::string name, SwishParams params = {});

struct ClipParams {
  float min = 0.0f, max = 0.0f;  // min <= max
};

// y = min(max(x, min), max); dx = dy where min <= x <= max, else 0 (Caffe's Clip, PyTorch's
// clamp, ONNX's Clip). Backward reads x, so not in place.
std::unique_ptr<Layer> make_clip_layer(std::string name, ClipParams params);

struct DropoutParams {
  float dropout_ratio = 0.5f;  // in [0, 1)
};

// Train phase: each element is kept with probability 1 - dropout_ratio and scaled by
// 1 / (1 - dropout_ratio); test phase: the identity. The keep mask (a state tensor shaped
// like the input) comes from the driver's counter-based generator, keyed by the slice's
// seed mixed with a hash of the layer name (so two dropout layers draw differently) and
// counted from the slice's first element (so any batch split draws the whole-batch mask).
std::unique_ptr<Layer> make_dropout_layer(std::string name, DropoutParams params = {});

}  // namespace hn
