// The layer registry: one entry per layer type, keyed by Caffe's type string, with the
// converter from Caffe's LayerParameter and the traits the Net plans with (fillers, output
// cuts, fusion, element-wise chains), so that no part of the library above the layers
// names a layer type. The built-in types are listed once, in lib/layers/builtin.cpp, each
// entry made by a function in the layer's own file; a program may register a type of its
// own with register_layer_type() before building a Net that names it.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/layers/layer.h"

namespace hybridnn::proto {
class FillerParameter;
class LayerParameter;
}  // namespace hybridnn::proto

namespace hn {

// A layer type's part in the Net's fusion of layers (NetOptions::fuse_layers; the Net reads
// the role, then asks the layers through Layer's fusion calls).
enum class FusionRole {
  none,
  norm,       // normalises with stored statistics (BatchNorm): heads a norm chain
  affine,     // per-channel scale and shift that can run a norm chain before it (Scale)
  rectifier,  // in-place rectifier that the layer before it may run (ReLU, Clip)
  sum,        // element-wise sum that can run the rectifier after it (Eltwise)
  conv,       // convolution that can run the rectifier after it (Convolution)
};

// How a layer's outputs can be cut across devices (split_axis: OUTPUT) or ranks
// (model_parallel): each part is the same layer with fewer outputs, holding its own rows of
// the parameters.
struct OutputCut {
  // The outputs the layer computes (InnerProduct's num_output).
  std::function<index_t(const hybridnn::proto::LayerParameter&)> outputs;
  // The part's LayerParameter: `param` computing `count` outputs.
  std::function<void(hybridnn::proto::LayerParameter& param, index_t count)> set_outputs;
  // The axis of parameter `index` along which its outputs lie (its rows are cut along it).
  std::function<int(const hybridnn::proto::LayerParameter&, int index)> param_axis;
  // The axis of the input along which the layer's rows lie before the outputs' axis
  // (InnerProduct's `axis`): rows of every rank are gathered along axis 0 and must come
  // first.
  std::function<int(const hybridnn::proto::LayerParameter&)> input_axis;
  // The axis of the output blob the outputs lie on (negative: from the end). The values
  // after it go with their output: a part holds, of each row (the axes before it), the
  // outputs' blocks [begin * inner, end * inner) (InnerProduct: the last axis, inner 1;
  // Convolution: the channels, inner H x W).
  int output_axis = -1;
  // Whether model_parallel may cut it across ranks too (else only split_axis: OUTPUT).
  bool across_ranks = true;
  // Whether a split cuts it by outputs when its split_axis is unset, where that moves less
  // memory than cutting its batch (the fully connected trick of Caffe con Troll: a batch
  // cut makes every device write and merge a whole weight gradient; lib/net/net_output_cut.cpp).
  bool by_default = false;
  // Why this layer's outputs cannot be cut (a shape or field the cut does not handle), or
  // empty; null: always.
  std::function<std::string(const hybridnn::proto::LayerParameter&)> refusal;
};

struct LayerType {
  std::string name;  // Caffe's type string, e.g. "Convolution"
  // Constructs (does not set up) the layer `param` describes; throws hn::Error naming the
  // layer for a field it cannot honour.
  std::function<std::unique_ptr<Layer>(const hybridnn::proto::LayerParameter& param)> make;
  // The filler of parameter `index` (nullptr or unset: the Net zeroes it; the layer may
  // fill its own in setup, as Scale does).
  std::function<const hybridnn::proto::FillerParameter*(const hybridnn::proto::LayerParameter&,
                                                        int index)>
      filler;
  // The parameters are running statistics, never learned (BatchNorm): the solver leaves
  // them alone whatever the param specs say.
  bool statistics = false;
  // In place, each output value from the same input value only (ReLU, Dropout): the layer
  // may run on a blob held as columns by layers cut by outputs (lib/net/net_output_cut.cpp).
  bool element_wise = false;
  // Draws from the iteration's random stream (Dropout's masks, LayerCall::seed): a recorded
  // iteration would fix the draws, so the Solver does not record a training net with one.
  bool draws_per_iteration = false;
  FusionRole fusion = FusionRole::none;
  // Set when the outputs can be cut (absent: the Net refuses split_axis: OUTPUT and
  // model_parallel for this type, naming it).
  std::optional<OutputCut> cut;
};

// Adds a type; throws hn::Error when one of the same name is registered already, or for a
// type without a name or a `make`.
void register_layer_type(LayerType type);
// The registered type of that name, or nullptr. Entries live as long as the program.
const LayerType* find_layer_type(std::string_view name);
// The registered type names, sorted.
std::vector<std::string> layer_type_names();

}  // namespace hn
