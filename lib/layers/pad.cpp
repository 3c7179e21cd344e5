// Pad layer (ONNX's Pad): in constant mode the output is filled with the value, then the
// input copied into its interior. The trailing axes without padding form contiguous blocks
// in both; the last padded axis with them is one row of a strided copy whose rows run
// along the axis before it, one call per index of the axes before that (an NCHW image
// padded in H and W: one call per channel of each image).
//
// reflect and edge: the interior copied, then the borders filled axis by axis from the
// last padded one to the first, each border position of axis a a copy of the slab at its
// source position (mirrored, or the edge) over the whole extent of every other axis: one
// strided copy per position, its rows the indices of the axes before a. Rows at border
// positions of earlier axes get what is there for now, and the earlier axes' passes then
// overwrite them whole, corners included. Backward is the adjoint, in the reverse order:
// in a copy of the output's gradient, axis by axis from the first, each border slab added
// into its source slab (through two contiguous slabs of the workspace and an axpy), then
// the interior taken.
#include <algorithm>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"
#include "lib/layers/shape_layer.h"

namespace hn {
namespace {

// Copies between the input (`dims`, contiguous) and the interior of the padded output.
// to_output: input -> output (forward); else the output's interior -> input (backward).
void copy_interior(Driver& driver, const std::vector<index_t>& dims,
                   const std::vector<index_t>& before, const std::vector<index_t>& after,
                   bool to_output, const float* src, float* dst) {
  if (Shape(dims).count() == 0) return;  // nothing to copy (and no memory to offset into)
  const std::size_t rank = dims.size();
  std::size_t last = rank;  // the last padded axis
  for (std::size_t a = rank; a-- > 0;)
    if (before[a] != 0 || after[a] != 0) {
      last = a;
      break;
    }
  if (last == rank) {
    detail::copy_floats(driver, Shape(dims).count(), src, dst);
    return;
  }
  std::vector<index_t> out(rank), in_stride(rank, 1), out_stride(rank, 1);
  for (std::size_t a = 0; a < rank; ++a)
    out[a] = dims[a] + before[a] + after[a];
  for (std::size_t a = rank; a-- > 1;) {
    in_stride[a - 1] = in_stride[a] * dims[a];
    out_stride[a - 1] = out_stride[a] * out[a];
  }
  // setup keeps axis 0 unpadded, so `last` >= 1 and its rows run along axis last - 1.
  const std::size_t rows_axis = last - 1;
  const index_t rows = dims[rows_axis];
  const index_t cols = dims[last] * in_stride[last];
  index_t out_base = 0;
  for (std::size_t a = rows_axis; a < rank; ++a)
    out_base += before[a] * out_stride[a];
  std::vector<index_t> index(rows_axis, 0);
  while (true) {
    index_t in_at = 0, out_at = out_base;
    for (std::size_t a = 0; a < rows_axis; ++a) {
      in_at += index[a] * in_stride[a];
      out_at += (index[a] + before[a]) * out_stride[a];
    }
    if (to_output) {
      driver.copy_strided(rows, cols, src + in_at, in_stride[rows_axis], dst + out_at,
                          out_stride[rows_axis]);
    } else {
      driver.copy_strided(rows, cols, src + out_at, out_stride[rows_axis], dst + in_at,
                          in_stride[rows_axis]);
    }
    std::size_t a = rows_axis;
    while (a-- > 0) {
      if (++index[a] < dims[a]) break;
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) break;
  }
}

// The input's dims for `rows` rows of the batch.
std::vector<index_t> slice_dims(const Shape& shape, index_t rows) {
  std::vector<index_t> dims = shape.dims();
  dims[0] = rows;
  return dims;
}

// The position on an axis of `length` (padded by `before`) that border position `p` copies.
index_t source_position(PadMode mode, index_t p, index_t before, index_t length) {
  if (p < before) return mode == PadMode::reflect ? 2 * before - p : before;
  return mode == PadMode::reflect ? 2 * before + 2 * (length - 1) - p : before + length - 1;
}

// Every border slab of the padded output `y` (input dims `dims`), as the file's comment says:
// the forward's copies (`gradients` null), or their adjoint, adding each border slab of
// `y` into its source through `scratch` (two slabs).
void border_slabs(Driver& driver, PadMode mode, const std::vector<index_t>& dims,
                  const std::vector<index_t>& before, const std::vector<index_t>& after, float* y,
                  float* scratch) {
  const std::size_t rank = dims.size();
  std::vector<index_t> out(rank), stride(rank, 1);
  for (std::size_t a = 0; a < rank; ++a)
    out[a] = dims[a] + before[a] + after[a];
  if (Shape(out).count() == 0) return;  // no borders to fill
  for (std::size_t a = rank; a-- > 1;)
    stride[a - 1] = stride[a] * out[a];
  const auto slabs = [&](std::size_t a) {
    // The rows: every index of the axes before a; a row: every index of the axes after it.
    index_t rows = 1;
    for (std::size_t b = 0; b < a; ++b)
      rows *= out[b];
    const index_t cols = stride[a], ld = stride[a - 1];
    for (index_t p = 0; p < out[a]; ++p) {
      if (p >= before[a] && p < before[a] + dims[a]) continue;
      float* border = y + p * cols;
      float* source = y + source_position(mode, p, before[a], dims[a]) * cols;
      if (scratch == nullptr) {
        driver.copy_strided(rows, cols, source, ld, border, ld);
        continue;
      }
      float* gathered = scratch;
      float* target = scratch + rows * cols;
      driver.copy_strided(rows, cols, border, ld, gathered, cols);
      driver.copy_strided(rows, cols, source, ld, target, cols);
      driver.axpy(rows * cols, 1.0f, gathered, target);
      driver.copy_strided(rows, cols, target, cols, source, ld);
    }
  };
  // setup keeps axis 0 unpadded.
  if (scratch == nullptr) {
    for (std::size_t a = rank; a-- > 1;)
      if (before[a] != 0 || after[a] != 0) slabs(a);
  } else {
    for (std::size_t a = 1; a < rank; ++a)
      if (before[a] != 0 || after[a] != 0) slabs(a);
  }
}

}  // namespace

PadLayer::PadLayer(std::string name, PadParams params)
    : Layer(std::move(name)), param_(std::move(params)) {}

std::vector<Shape> PadLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  const int axis = detail::canonical_axis(describe(), "axis", param_.axis, in);
  HN_CHECK(axis >= 1,
           "{}: axis {} pads the batch axis of {}; the first padded axis must be 1 "
           "or later",
           describe(), param_.axis, in.to_string());
  const std::size_t padded = static_cast<std::size_t>(in.axes() - axis);
  const auto per_axis = [&](const std::vector<index_t>& counts, const char* field) {
    HN_CHECK(counts.size() == 1 || counts.size() == padded,
             "{}: {} has {} counts for {} padded axes (axes {} to {} of {}); give one for all or "
             "one per axis",
             describe(), field, counts.size(), padded, axis, in.axes() - 1, in.to_string());
    std::vector<index_t> full(static_cast<std::size_t>(in.axes()), 0);
    for (std::size_t k = 0; k < padded; ++k) {
      const index_t count = counts.size() == 1 ? counts[0] : counts[k];
      HN_CHECK(count >= 0, "{}: {} count {} is negative", describe(), field, count);
      full[static_cast<std::size_t>(axis) + k] = count;
    }
    return full;
  };
  HN_CHECK(!param_.before.empty(), "{}: pad_before is not set", describe());
  before_ = per_axis(param_.before, "pad_before");
  after_ = per_axis(param_.after.empty() ? param_.before : param_.after, "pad_after");
  std::vector<index_t> out = in.dims();
  for (std::size_t a = 0; a < out.size(); ++a) {
    const index_t pad = std::max(before_[a], after_[a]);
    if (pad == 0) continue;
    HN_CHECK(param_.mode != PadMode::reflect || pad < in[static_cast<int>(a)],
             "{}: reflect pads axis {} of {} by {}: a mirror needs pads below the axis's length",
             describe(), a, in.to_string(), pad);
    HN_CHECK(param_.mode != PadMode::edge || in[static_cast<int>(a)] > 0,
             "{}: edge pads axis {} of {}, which is empty", describe(), a, in.to_string());
    out[a] += before_[a] + after_[a];
  }
  output_ = Shape(out);
  return {output_};
}

std::size_t PadLayer::workspace_bytes(const Driver&, index_t rows) const {
  if (param_.mode == PadMode::constant) return 0;
  // The output's gradient, and two slabs of at most every element but one axis's.
  const index_t count = output_.count() / std::max<index_t>(output_[0], 1) * rows;
  index_t smallest = count;
  for (int a = 1; a < output_.axes(); ++a)
    if (before_[static_cast<std::size_t>(a)] != 0 || after_[static_cast<std::size_t>(a)] != 0)
      smallest = std::min(smallest, output_[a]);
  return static_cast<std::size_t>(count + 2 * (count / std::max<index_t>(smallest, 1))) *
         sizeof(float);
}

void PadLayer::forward(const LayerSlice& slice) {
  const Operand& y = slice.outputs[0];
  const std::vector<index_t> dims = slice_dims(slice.inputs[0].shape, slice.rows());
  if (param_.mode == PadMode::constant)
    slice.driver->fill(detail::slice_count(y.shape, slice.rows()), param_.value, y.mutable_x());
  copy_interior(*slice.driver, dims, before_, after_, true, slice.inputs[0].x(), y.mutable_x());
  if (param_.mode != PadMode::constant)
    border_slabs(*slice.driver, param_.mode, dims, before_, after_, y.mutable_x(), nullptr);
}

// dx = dy's interior, plus (reflect, edge) the gradients of the border positions that
// copied each element; a constant's go nowhere.
void PadLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const std::vector<index_t> dims = slice_dims(slice.inputs[0].shape, slice.rows());
  const float* dy = slice.outputs[0].dx();
  if (param_.mode != PadMode::constant) {
    const index_t count = detail::slice_count(slice.outputs[0].shape, slice.rows());
    float* gathered = slice.workspace.as<float>();
    detail::copy_floats(*slice.driver, count, dy, gathered);
    border_slabs(*slice.driver, param_.mode, dims, before_, after_, gathered, gathered + count);
    dy = gathered;
  }
  copy_interior(*slice.driver, dims, before_, after_, false, dy, slice.inputs[0].mutable_dx());
}

// ---- the registry entry: the LayerParameter's pad_param -------------------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_pad(const pb::LayerParameter& p) {
  const pb::PadParameter& pad = p.pad_param();
  PadParams params;
  params.axis = pad.axis();
  for (const std::uint32_t count : pad.pad_before())
    params.before.push_back(count);
  for (const std::uint32_t count : pad.pad_after())
    params.after.push_back(count);
  params.value = pad.value();
  if (pad.mode() == "reflect") {
    params.mode = PadMode::reflect;
  } else if (pad.mode() == "edge") {
    params.mode = PadMode::edge;
  } else {
    HN_CHECK(pad.mode() == "constant", "Pad layer '{}': mode '{}' (constant, reflect or edge)",
             p.name(), pad.mode());
  }
  return std::make_unique<PadLayer>(p.name(), std::move(params));
}

}  // namespace

LayerType pad_layer_type() {
  LayerType type;
  type.name = "Pad";
  type.make = make_pad;
  return type;
}

}  // namespace hn
