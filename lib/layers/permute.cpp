// Permute layer (Caffe SSD's; ONNX's Transpose): the output is the input with its axes
// reordered. The axes at the end that keep their place form contiguous blocks in both;
// the rest is moved with the driver's strided copy (a core call: every driver runs it),
// one call per combination of the other axes, the largest remaining output axis taken as
// the call's rows so that the calls are few (a channel shuffle of ShuffleNet: 2 per image).
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {
namespace {

// dst = src with its axes permuted: dst's axis k is src's axis order[k]; `dims` are src's.
void permute(Driver& driver, const std::vector<index_t>& dims, const std::vector<int>& order,
             const float* src, float* dst) {
  const std::size_t rank = dims.size();
  std::vector<index_t> src_stride(rank, 1), out_dims(rank), dst_stride(rank, 1);
  for (std::size_t a = rank; a-- > 1;)
    src_stride[a - 1] = src_stride[a] * dims[a];
  for (std::size_t k = 0; k < rank; ++k)
    out_dims[k] = dims[static_cast<std::size_t>(order[k])];
  for (std::size_t k = rank; k-- > 1;)
    dst_stride[k - 1] = dst_stride[k] * out_dims[k];
  // The trailing axes in place: one block of `block` floats, contiguous in both.
  std::size_t moved = rank;
  index_t block = 1;
  while (moved > 0 && order[moved - 1] == static_cast<int>(moved - 1)) {
    --moved;
    block *= dims[moved];
  }
  if (moved == 0) {
    detail::copy_floats(driver, block, src, dst);
    return;
  }
  // The rows of each strided copy: the largest moved output axis.
  std::size_t rows_axis = 0;
  for (std::size_t k = 1; k < moved; ++k)
    if (out_dims[k] > out_dims[rows_axis]) rows_axis = k;
  const index_t rows = out_dims[rows_axis];
  const index_t src_ld = src_stride[static_cast<std::size_t>(order[rows_axis])];
  const index_t dst_ld = dst_stride[rows_axis];
  // Every index of the other moved output axes.
  std::vector<index_t> index(moved, 0);
  while (true) {
    index_t from = 0, to = 0;
    for (std::size_t k = 0; k < moved; ++k) {
      if (k == rows_axis) continue;
      from += index[k] * src_stride[static_cast<std::size_t>(order[k])];
      to += index[k] * dst_stride[k];
    }
    driver.copy_strided(rows, block, src + from, src_ld, dst + to, dst_ld);
    std::size_t k = moved;
    while (k-- > 0) {
      if (k == rows_axis) continue;
      if (++index[k] < out_dims[k]) break;
      index[k] = 0;
    }
    if (k == static_cast<std::size_t>(-1)) break;
  }
}

// src (of `dims`) permuted by `order` into dst, for `rows` rows of the batch: with the batch
// first and kept, each row on its own (the order without axis 0); else the whole tensor (a
// scalar, of no axes, is copied).
void permute_slice(Driver& driver, const std::vector<index_t>& dims, const std::vector<int>& order,
                   index_t rows, const float* src, float* dst) {
  if (order.empty() || order[0] != 0) {
    permute(driver, dims, order, src, dst);
    return;
  }
  const std::vector<index_t> row_dims(dims.begin() + 1, dims.end());
  std::vector<int> row_order;
  for (std::size_t k = 1; k < order.size(); ++k)
    row_order.push_back(order[k] - 1);
  const index_t per_row = Shape(row_dims).count();
  for (index_t r = 0; r < rows; ++r)
    permute(driver, row_dims, row_order, src + r * per_row, dst + r * per_row);
}

}  // namespace

PermuteLayer::PermuteLayer(std::string name, PermuteParams params)
    : Layer(std::move(name)), param_(std::move(params)) {}

std::vector<Shape> PermuteLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  const int rank = in.axes();
  HN_CHECK(static_cast<int>(param_.order.size()) <= rank,
           "{}: order has {} axes for an input of {} ({})", describe(), param_.order.size(), rank,
           in.to_string());
  order_.clear();
  std::vector<bool> used(static_cast<std::size_t>(rank), false);
  for (const int axis : param_.order) {
    HN_CHECK(axis >= 0 && axis < rank && !used[static_cast<std::size_t>(axis)],
             "{}: order {} is not a permutation of the input's axes ({})", describe(),
             fmt::join(param_.order, ","), in.to_string());
    used[static_cast<std::size_t>(axis)] = true;
    order_.push_back(axis);
  }
  for (int axis = 0; axis < rank; ++axis)
    if (!used[static_cast<std::size_t>(axis)]) order_.push_back(axis);
  std::vector<index_t> out;
  for (const int axis : order_)
    out.push_back(in[axis]);
  return {Shape(out)};
}

void PermuteLayer::forward(const LayerSlice& slice) {
  permute_slice(*slice.driver, slice.inputs[0].shape.dims(), order_, slice.rows(),
                slice.inputs[0].x(), slice.outputs[0].mutable_x());
}

// dx = dy with the inverse permutation.
void PermuteLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  std::vector<int> inverse(order_.size());
  for (std::size_t k = 0; k < order_.size(); ++k)
    inverse[static_cast<std::size_t>(order_[k])] = static_cast<int>(k);
  permute_slice(*slice.driver, slice.outputs[0].shape.dims(), inverse, slice.rows(),
                slice.outputs[0].dx(), slice.inputs[0].mutable_dx());
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_permute(const pb::LayerParameter& p) {
  PermuteParams params;
  for (const std::uint32_t axis : p.permute_param().order())
    params.order.push_back(to_int(p, "order", axis));
  return std::make_unique<PermuteLayer>(p.name(), std::move(params));
}

}  // namespace

LayerType permute_layer_type() {
  LayerType type;
  type.name = "Permute";
  type.make = make_permute;
  return type;
}

}  // namespace hn
