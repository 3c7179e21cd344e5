// ShuffleChannel layer (ShuffleNet's channel shuffle, its inputs joined along the channels
// first): with K = C / group, output channel k * group + j is channel j * K + k of the
// joined input. Each input's channels that fall in group j go to every group-th output
// channel from one place on: one strided copy (rows: those channels, a row: one channel's
// pixels), per image unless the input is exactly one group, when the rows of all images
// follow one stride (ShuffleNet v2: two inputs, two groups, one copy each).
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

// Calls move(input, rows, input offset, output offset, output row stride) for every run of
// channels, offsets in floats from the start of that input's and the output's first image;
// `inner` floats a channel, `images` images.
template <class Move>
void for_each_run(const std::vector<Operand>& inputs, index_t group, index_t images, Move&& move) {
  index_t channels = 0;
  for (const Operand& x : inputs)
    channels += x.shape[1];
  const index_t inner = inputs[0].shape.count(2, inputs[0].shape.axes());
  const index_t per_group = channels / group;
  index_t first = 0;  // the input's first channel in the joined input
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const index_t own = inputs[i].shape[1];
    for (index_t j = 0; j < group; ++j) {
      const index_t lo = std::max(first, j * per_group);
      const index_t hi = std::min(first + own, (j + 1) * per_group);
      if (lo >= hi) continue;
      const index_t k = lo - j * per_group;  // output channel k * group + j
      if (own == per_group && hi - lo == own) {
        move(i, images * own, index_t{0}, j * inner, group * inner);
        continue;
      }
      for (index_t n = 0; n < images; ++n)
        move(i, hi - lo, (n * own + lo - first) * inner, (n * channels + k * group + j) * inner,
             group * inner);
    }
    first += own;
  }
}

}  // namespace

ShuffleChannelLayer::ShuffleChannelLayer(std::string name, ShuffleChannelParams params)
    : Layer(std::move(name)), param_(params) {}

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
  return {Shape(dims)};
}

void ShuffleChannelLayer::forward(const LayerSlice& slice) {
  float* y = slice.outputs[0].mutable_x();
  const index_t inner = slice.outputs[0].shape.count(2, slice.outputs[0].shape.axes());
  for_each_run(slice.inputs, param_.group, slice.rows(),
               [&](std::size_t i, index_t rows, index_t from, index_t to, index_t to_ld) {
                 slice.driver->copy_strided(rows, inner, slice.inputs[i].x() + from, inner, y + to,
                                            to_ld);
               });
}

// Each input's gradient: its channels of dy, moved back.
void ShuffleChannelLayer::backward(const LayerSlice& slice) {
  const float* dy = slice.outputs[0].dx();
  const index_t inner = slice.outputs[0].shape.count(2, slice.outputs[0].shape.axes());
  for_each_run(slice.inputs, param_.group, slice.rows(),
               [&](std::size_t i, index_t rows, index_t from, index_t to, index_t to_ld) {
                 if (!slice.propagate_down[i]) return;
                 slice.driver->copy_strided(rows, inner, dy + to, to_ld,
                                            slice.inputs[i].mutable_dx() + from, inner);
               });
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_shuffle_channel(const pb::LayerParameter& p) {
  ShuffleChannelParams params;
  params.group = to_int(p, "group", p.shuffle_channel_param().group());
  return std::make_unique<ShuffleChannelLayer>(p.name(), params);
}

}  // namespace

LayerType shuffle_channel_layer_type() {
  LayerType type;
  type.name = "ShuffleChannel";
  type.make = make_shuffle_channel;
  return type;
}

}  // namespace hn
