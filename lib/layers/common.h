// Helpers shared by the layer implementations: Caffe's axis arithmetic, the element counts
// of a batch slice, and the copies that several layers are made of.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "lib/core/check.h"
#include "lib/layers/layer.h"

namespace hn::detail {

// The axis in [0, shape.axes()) that `axis` names (negative counts from the end, as
// Caffe's CanonicalAxisIndex); `who` prefixes the error ("layer 'x' (T)").
inline int canonical_axis(const std::string& who, const char* field, int axis, const Shape& shape) {
  const int axes = shape.axes();
  HN_CHECK(-axes <= axis && axis < axes, "{}: {} {} is out of range for the {}-axis input {}", who,
           field, axis, axes, shape.to_string());
  return axis < 0 ? axis + axes : axis;
}

// The sizes of the `pieces` parts that Caffe's slice points cut an axis of size `dim` into
// (Slice, ShuffleChannel's cut): the points strictly increasing inside (0, dim), one fewer
// than the pieces, or none for equal parts. Errors name `who`, the axis (`along`: "axis 1",
// "the channels") and the input's shape (lib/layers/slice.cpp).
std::vector<index_t> cut_sizes(const std::string& who, index_t dim,
                               const std::vector<index_t>& points, int pieces,
                               const std::string& along, const Shape& input);

// Elements of `shape` in a slice of `rows` batch rows (a tensor without axes is one row).
inline index_t slice_count(const Shape& shape, index_t rows) {
  return shape.axes() == 0 ? shape.count() : rows * shape.count(1, shape.axes());
}

// count(0, axis) of `shape` for a slice of `rows` batch rows. Axis 0 gives 1: a layer
// working along the batch axis runs on the whole batch.
inline index_t outer_rows(const Shape& shape, int axis, index_t rows) {
  return axis == 0 ? 1 : rows * shape.count(1, axis);
}

// Makes `state` one tensor of `shape` (a layer's per-row state: masks, scales); keeps its
// memory when the count fits.
inline void reshape_state(std::vector<Tensor>& state, const Shape& shape) {
  if (state.size() != 1) {
    state.clear();
    state.emplace_back(shape);
  } else {
    state[0].reshape(shape);
  }
}

// Copies `n` floats within the slice's driver; nothing when src and dst are the same memory
// (a layer run in place).
inline void copy_floats(Driver& driver, index_t n, const float* src, float* dst) {
  if (src != dst) driver.copy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

// Forward of a layer whose output holds its input's values in the same order (Flatten,
// Reshape): a copy of the slice's elements.
inline void copy_input_to_output(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  copy_floats(*slice.driver, slice_count(x.shape, slice.rows()), x.x(),
              slice.outputs[0].mutable_x());
}

// The matching backward: dx = dy.
inline void copy_output_diff_to_input(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  copy_floats(*slice.driver, slice_count(x.shape, slice.rows()), slice.outputs[0].dx(),
              x.mutable_dx());
}

// Concat and Slice: a `whole` tensor viewed as [outer][whole_inner] whose columns hold the
// parts' [outer][inner] blocks side by side, in order (each part is shaped like the whole
// except along the axis).
struct AxisParts {
  index_t outer = 0, whole_inner = 0;
  std::vector<index_t> inners;  // per part: count(axis)
};

inline AxisParts axis_parts(const Shape& whole, const std::vector<Operand>& parts, int axis,
                            index_t rows) {
  AxisParts result;
  result.outer = outer_rows(whole, axis, rows);
  result.whole_inner = whole.count(axis, whole.axes());
  for (const Operand& part : parts)
    result.inners.push_back(part.shape.count(axis, part.shape.axes()));
  return result;
}

// Copies part i (skipped where parts[i] is null) into its columns of `whole`.
inline void gather_parts(Driver& driver, const AxisParts& layout,
                         const std::vector<const float*>& parts, float* whole) {
  index_t offset = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const index_t inner = layout.inners[i];
    if (parts[i] != nullptr) {
      driver.copy_strided(layout.outer, inner, parts[i], inner, whole + offset, layout.whole_inner);
    }
    offset += inner;
  }
}

// Copies the columns of `whole` that belong to part i into parts[i] (skipped where null).
inline void scatter_parts(Driver& driver, const AxisParts& layout, const float* whole,
                          const std::vector<float*>& parts) {
  index_t offset = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const index_t inner = layout.inners[i];
    if (parts[i] != nullptr) {
      driver.copy_strided(layout.outer, inner, whole + offset, layout.whole_inner, parts[i], inner);
    }
    offset += inner;
  }
}

// Element-wise layers with one driver call each way whose backward reads the output
// (Sigmoid, TanH): y = f(x); dx = g(y, dy).
using UnaryForward = void (Driver::*)(index_t, const float*, float*);
using UnaryBackward = void (Driver::*)(index_t, const float*, const float*, float*);

inline void unary_forward(const LayerSlice& slice, UnaryForward call) {
  const Operand& x = slice.inputs[0];
  (slice.driver->*call)(slice_count(x.shape, slice.rows()), x.x(), slice.outputs[0].mutable_x());
}

inline void unary_backward_from_output(const LayerSlice& slice, UnaryBackward call) {
  if (!slice.propagate_down[0]) return;
  const Operand& y = slice.outputs[0];
  (slice.driver->*call)(slice_count(y.shape, slice.rows()), y.x(), y.dx(),
                        slice.inputs[0].mutable_dx());
}

}  // namespace hn::detail
