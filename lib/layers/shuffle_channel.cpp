// ShuffleChannel layer (ShuffleNet's channel shuffle, its inputs joined along the channels
// first and its output cut along them last): with K = C / group, shuffled channel
// k * group + j is channel j * K + k of the joined input. Each input's channels that fall in
// group j go to every group-th shuffled channel from one place on, and those that fall in
// one output to every group-th channel of it: one strided copy of the whole batch per input,
// group and output (rows: those channels, a row: one channel's pixels). ShuffleNet v2's
// unit, Concat -> shuffle -> chunk(2), is one pass: two inputs, two groups, two outputs.
#include <algorithm>
#include <limits>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {
namespace {

// Ceiling of x / d for d > 0, 0 for x <= 0.
index_t ceil_div(index_t x, index_t d) {
  return x <= 0 ? 0 : (x + d - 1) / d;
}

// Calls move(input, output, rows, input offset, output offset, output row stride) for every
// run of channels, offsets in floats from the start of that input's and that output's first
// image.
template <class Move>
void for_each_run(const std::vector<Operand>& inputs, const std::vector<Operand>& outputs,
                  index_t group, Move&& move) {
  index_t channels = 0;
  for (const Operand& x : inputs)
    channels += x.shape[1];
  const index_t inner = inputs[0].shape.count(2, inputs[0].shape.axes());
  const index_t per_group = channels / group;
  index_t first = 0;  // the input's first channel in the joined input
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const index_t own = inputs[i].shape[1];
    for (index_t j = 0; j < group; ++j) {
      // Joined channels j * per_group + k, k in [k_lo, k_hi), are the input's in group j;
      // each goes to shuffled channel k * group + j.
      const index_t k_lo = std::max(first, j * per_group) - j * per_group;
      const index_t k_hi = std::min(first + own, (j + 1) * per_group) - j * per_group;
      if (k_lo >= k_hi) continue;
      index_t out_first = 0;  // the output's first shuffled channel
      for (std::size_t o = 0; o < outputs.size(); ++o) {
        const index_t out_own = outputs[o].shape[1];
        const index_t a = std::max(k_lo, ceil_div(out_first - j, group));
        const index_t b = std::min(k_hi, ceil_div(out_first + out_own - j, group));
        if (a < b)
          move(i, o, b - a, (j * per_group + a - first) * inner,
               (a * group + j - out_first) * inner, group * inner);
        out_first += out_own;
      }
    }
    first += own;
  }
}

}  // namespace

ShuffleChannelLayer::ShuffleChannelLayer(std::string name, ShuffleChannelParams params,
                                         int num_outputs)
    : Layer(std::move(name)),
      param_(std::move(params)),
      num_outputs_(num_outputs > 0 ? num_outputs
                                   : static_cast<int>(param_.slice_point.size()) + 1) {}

std::vector<Shape> ShuffleChannelLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, std::numeric_limits<int>::max());
  const Shape& first = inputs[0];
  HN_CHECK(first.axes() >= 2, "{}: input 0 is {}: it needs a batch and a channel axis", describe(),
           first.to_string());
  std::vector<index_t> dims = first.dims();
  for (std::size_t i = 1; i < inputs.size(); ++i) {
    const Shape& in = inputs[i];
    bool match = in.axes() == first.axes();
    for (int a = 0; match && a < first.axes(); ++a)
      match = a == 1 || in[a] == first[a];
    HN_CHECK(match,
             "{}: inputs must have the same shape except along the channels; input 0 is {}, "
             "input {} is {}",
             describe(), first.to_string(), i, in.to_string());
    dims[1] += in[1];
  }
  HN_CHECK(param_.group >= 1 && dims[1] % param_.group == 0,
           "{}: group {} does not divide the {} channels of the input{} ({})", describe(),
           param_.group, dims[1], inputs.size() > 1 ? "s joined" : "", first.to_string());
  // The outputs: the shuffled channels cut as a Slice along axis 1 cuts them.
  const std::vector<index_t> sizes = detail::cut_sizes(describe(), dims[1], param_.slice_point,
                                                       num_outputs_, "the channels", first);
  std::vector<Shape> outputs;
  for (const index_t size : sizes) {
    std::vector<index_t> piece = first.dims();
    piece[1] = size;
    outputs.emplace_back(std::move(piece));
  }
  return outputs;
}

void ShuffleChannelLayer::forward(const LayerSlice& slice) {
  const index_t inner = slice.outputs[0].shape.count(2, slice.outputs[0].shape.axes());
  for_each_run(
      slice.inputs, slice.outputs, param_.group,
      [&](std::size_t i, std::size_t o, index_t rows, index_t from, index_t to, index_t to_ld) {
        const Operand &x = slice.inputs[i], &y = slice.outputs[o];
        slice.driver->copy_strided_batched(slice.rows(), rows, inner, x.x() + from, inner,
                                           x.shape[1] * inner, y.mutable_x() + to, to_ld,
                                           y.shape[1] * inner);
      });
}

// Each input's gradient: its channels of the outputs' dy, moved back. The runs tile every
// input, so they overwrite all of dx.
void ShuffleChannelLayer::backward(const LayerSlice& slice) {
  const index_t inner = slice.outputs[0].shape.count(2, slice.outputs[0].shape.axes());
  for_each_run(
      slice.inputs, slice.outputs, param_.group,
      [&](std::size_t i, std::size_t o, index_t rows, index_t from, index_t to, index_t to_ld) {
        if (!slice.propagate_down[i]) return;
        const Operand &x = slice.inputs[i], &y = slice.outputs[o];
        slice.driver->copy_strided_batched(slice.rows(), rows, inner, y.dx() + to, to_ld,
                                           y.shape[1] * inner, x.mutable_dx() + from, inner,
                                           x.shape[1] * inner);
      });
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_shuffle_channel(const pb::LayerParameter& p) {
  ShuffleChannelParams params;
  params.group = to_int(p, "group", p.shuffle_channel_param().group());
  params.slice_point = to_indices(p.shuffle_channel_param().slice_point());
  return std::make_unique<ShuffleChannelLayer>(p.name(), std::move(params), p.top_size());
}

}  // namespace

LayerType shuffle_channel_layer_type() {
  LayerType type;
  type.name = "ShuffleChannel";
  type.make = make_shuffle_channel;
  return type;
}

}  // namespace hn
