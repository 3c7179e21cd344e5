// Layers that move data without arithmetic, with Caffe's parameters: Concat, Slice, Split,
// Flatten and Reshape.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct ConcatParams {
  int axis = 1;         // negative counts from the end
  int concat_dim = -1;  // legacy (>= 0 when set); replaces axis, which must then stay 1
};

// Joins its inputs along `axis`; every other dimension must match. Along axis 0 (the batch
// axis) the inputs' batches differ, so the layer then runs on the whole batch only
// (splits_by_rows() false).
std::unique_ptr<Layer> make_concat_layer(std::string name, ConcatParams params = {});

struct SliceParams {
  int axis = 1;        // negative counts from the end
  int slice_dim = -1;  // legacy (>= 0 when set); replaces axis, which must then stay 1
  // Strictly increasing positions in (0, shape[axis]) where a new output starts; empty:
  // equal parts, one per output.
  std::vector<index_t> slice_point;
};

// Cuts its input along `axis` into `num_outputs` outputs (Caffe takes that number from the
// tops in the prototxt; 0 here means slice_point.size() + 1). Along axis 0 it runs on the
// whole batch only (splits_by_rows() false).
std::unique_ptr<Layer> make_slice_layer(std::string name, SliceParams params = {},
                                        int num_outputs = 0);

// One input to `num_outputs` identical outputs (what a Net inserts where one blob feeds
// several layers); backward sums the outputs' gradients. Caffe shares the data; this layer
// copies it (sharing is a Net-level optimisation for later).
std::unique_ptr<Layer> make_split_layer(std::string name, int num_outputs = 2);
// The type of the Split layers a Net inserts where a blob feeds several layers (Caffe's
// InsertSplits), as the registry names it.
inline constexpr const char kSplitLayerType[] = "Split";

struct FlattenParams {
  int axis = 1;       // first axis flattened; negative counts from the end
  int end_axis = -1;  // last axis flattened (inclusive)
};

// Merges axes [axis, end_axis] into one. The output holds the same values in the same
// order; forward and backward copy them (sharing the memory is a Net-level optimisation
// for later). Flattening the batch axis runs on the whole batch only.
std::unique_ptr<Layer> make_flatten_layer(std::string name, FlattenParams params = {});

// Caffe's ReshapeParameter: the input axes [axis, axis + num_axes) are replaced by `shape`,
// where 0 copies the input dimension at that position and one -1 is inferred from the
// count. axis < 0 counts from the end (-1: after the last axis); num_axes -1: to the end.
struct ReshapeParams {
  std::vector<index_t> shape;
  int axis = 0;
  int num_axes = -1;
};

// The output holds the input's values in the same order, copied (sharing the memory is a
// Net-level optimisation for later). When the output's first dimension is not the input's
// batch, the layer runs on the whole batch only.
std::unique_ptr<Layer> make_reshape_layer(std::string name, ReshapeParams params);

// Caffe SSD's PermuteParameter (ONNX's Transpose): output axis k is input axis order[k];
// axes left out keep their order after those given (SSD's rule). A permutation that keeps
// the batch axis first runs on each device's rows; one that moves it runs on the whole
// batch only.
struct PermuteParams {
  std::vector<int> order;
};
std::unique_ptr<Layer> make_permute_layer(std::string name, PermuteParams params);

// ShuffleNet's channel shuffle (the ShuffleChannel layer of its Caffe ports; ONNX's
// Reshape [N, g, C/g, ...] -> Transpose (1 2) -> Reshape [N, C, ...]): output channel
// k * group + j is input channel j * (C / group) + k. hybridnn's extensions, each in the
// same one pass: several inputs are first joined along the channels (axis 1) as Concat
// joins them (a ShuffleNet v2 unit's Concat and shuffle), and several outputs cut the
// shuffled channels as a Slice along axis 1 cuts them (the next unit's chunk in two), at
// `slice_point` or, without points, in equal parts. Every input has at least 2 axes, the
// same shape but for axis 1; C, their channels together, is a multiple of `group`.
struct ShuffleChannelParams {
  int group = 1;
  std::vector<index_t> slice_point;  // as SliceParams::slice_point, along the channels
};
std::unique_ptr<Layer> make_shuffle_channel_layer(std::string name, ShuffleChannelParams params,
                                                  int num_outputs = 0);

// Pads axes [axis, rank) with a constant (ONNX's Pad in constant mode, PyTorch's F.pad):
// `before` and `after` hold one count for every padded axis, or a single count for all of
// them; `after` empty takes `before`'s. axis >= 1: the batch axis is never padded.
// ONNX's Pad modes: the value; the input mirrored about its edge (the edge not repeated,
// every pad below the axis's length); the edge repeated.
enum class PadMode { constant, reflect, edge };
struct PadParams {
  int axis = 2;  // negative counts from the end
  std::vector<index_t> before;
  std::vector<index_t> after;
  float value = 0.0f;
  PadMode mode = PadMode::constant;
};
std::unique_ptr<Layer> make_pad_layer(std::string name, PadParams params);

// BVLC Caffe's Silence: consumes its inputs and outputs nothing; backward writes zeros into
// their gradients (a blob no other layer reads, such as a Slice's unused piece, then
// contributes nothing, instead of whatever its gradient memory held).
std::unique_ptr<Layer> make_silence_layer(std::string name);

}  // namespace hn
