// Dropout layer: train-phase masking through the driver's counter-based generator,
// identity at test time.
#include <cstdint>
#include <utility>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/registry.h"

namespace hn {

namespace {

// FNV-1a: a stable hash of the layer name, the same on every platform and run.
std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// SplitMix64's finaliser: nearby (seed, name) pairs give unrelated generator keys.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

DropoutLayer::DropoutLayer(std::string name, DropoutParams params)
    : Layer(std::move(name)), param_(params), name_hash_(fnv1a(this->name())) {}

std::uint64_t DropoutLayer::mask_seed(std::uint64_t slice_seed) const {
  return mix(slice_seed ^ name_hash_);
}

std::vector<Shape> DropoutLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  HN_CHECK(param_.dropout_ratio >= 0.0f && param_.dropout_ratio < 1.0f,
           "{}: dropout_ratio must lie in [0, 1), got {} (input {})", describe(),
           param_.dropout_ratio, inputs[0].to_string());
  detail::reshape_state(state_, inputs[0]);  // the keep mask: 1.0f or 0.0f per element
  return {inputs[0]};
}

void DropoutLayer::forward(const LayerSlice& slice) {
  const Operand& x = slice.inputs[0];
  const Operand& y = slice.outputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  if (slice.phase == Phase::train && slice.columns > 0) {
    // A column block: each row's elements are counted where they lie in the whole blob's
    // row, so a layer cut by outputs draws the uncut mask.
    const index_t width = detail::slice_count(x.shape, 1);
    for (index_t r = 0; r < slice.rows(); ++r) {
      const auto offset =
          static_cast<std::uint64_t>((slice.begin + r) * slice.columns + slice.column_begin);
      slice.driver->dropout_forward(width, param_.dropout_ratio, mask_seed(slice.seed), offset,
                                    x.x() + r * width, y.mutable_x() + r * width,
                                    slice.state[0].mutable_x() + r * width);
    }
  } else if (slice.phase == Phase::train) {
    // Counting from the slice's first element makes a split draw the whole-batch mask.
    const auto offset = static_cast<std::uint64_t>(detail::slice_count(x.shape, slice.begin));
    if (x.layout == Layout::nchw) {
      slice.driver->dropout_forward(n, param_.dropout_ratio, mask_seed(slice.seed), offset, x.x(),
                                    y.mutable_x(), slice.state[0].mutable_x());
    } else {
      // Blocked images: each element draws its NCHW position's counter.
      const AxisShape shape{slice.rows(), x.shape[1], x.shape.count(2, x.shape.axes()), x.layout};
      slice.driver->dropout_forward_layout(shape, param_.dropout_ratio, mask_seed(slice.seed),
                                           offset, x.x(), y.mutable_x(),
                                           slice.state[0].mutable_x());
    }
  } else {
    detail::copy_floats(*slice.driver, n, x.x(), y.mutable_x());
  }
}

void DropoutLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const Operand& x = slice.inputs[0];
  const Operand& y = slice.outputs[0];
  const index_t n = detail::slice_count(x.shape, slice.rows());
  if (slice.phase == Phase::train) {
    slice.driver->dropout_backward(n, param_.dropout_ratio, slice.state[0].x(), y.dx(),
                                   x.mutable_dx());
  } else {
    detail::copy_floats(*slice.driver, n, y.dx(), x.mutable_dx());
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_dropout(const pb::LayerParameter& p) {
  DropoutParams params;
  params.dropout_ratio = p.dropout_param().dropout_ratio();
  return std::make_unique<DropoutLayer>(p.name(), params);
}

}  // namespace

LayerType dropout_layer_type() {
  LayerType type;
  type.name = "Dropout";
  type.make = make_dropout;
  type.element_wise = true;
  type.draws_per_iteration = true;
  return type;
}

}  // namespace hn
