// The convolution algorithms (internal): one class per way to compute a convolution, each in
// its own file (conv_direct.cpp, conv_1x1.cpp, conv_type3.cpp, conv_type1.cpp), and their list.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "lib/core/check.h"
#include "lib/layers/convolution_layer.h"

namespace hn::detail {

// One algorithm of a ConvolutionLayer, named by its Lowering. Stateless: the layer (after
// setup) gives the geometry, the slice the operands.
class ConvAlgorithm {
 public:
  using Wanted = ConvolutionLayer::Wanted;

  virtual ~ConvAlgorithm() = default;
  virtual Lowering id() const = 0;
  // Whether it can run `layer` on `driver` with NCHW operands.
  virtual bool applies(const ConvolutionLayer& layer, const Driver& driver) const = 0;
  // The workspace a slice of `rows` (> 0) images needs; none by default.
  virtual std::size_t workspace(const ConvolutionLayer& layer, index_t rows) const {
    static_cast<void>(layer);
    static_cast<void>(rows);
    return 0;
  }
  // Computes y, with the layer's fused activation (ConvolutionLayer::activation) where
  // applies_activation(); the layer applies it after the others.
  // With a fused residual (ConvolutionLayer::residual), also adds the slice's second input
  // before the activation where applies_activation(); the layer adds it after the others.
  virtual void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const = 0;
  virtual bool applies_activation() const { return false; }
  // The gradients `want` asks for, the bias gradient included.
  virtual void backward(const ConvolutionLayer& layer, const LayerSlice& slice,
                        Wanted want) const = 0;
  // The fused ReLU's gradient (its negative slope) on the slice's dy in place, then
  // backward, in one driver call (Driver::conv_backward_relu); false where the algorithm has
  // none for `want`, having done nothing.
  virtual bool backward_relu(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want,
                             float slope) const {
    static_cast<void>(layer);
    static_cast<void>(slice);
    static_cast<void>(want);
    static_cast<void>(slope);
    return false;
  }
};

// The algorithms, in the order they are tried: the most specialised first, ending with the
// plainest (type 1, which runs every convolution). candidates() keeps the applicable ones.
const std::vector<const ConvAlgorithm*>& conv_algorithms();
// The algorithm of `lowering` (any but automatic).
const ConvAlgorithm& conv_algorithm(Lowering lowering);

// Each algorithm's one instance, defined in its file.
const ConvAlgorithm& conv_direct();        // conv_direct.cpp
const ConvAlgorithm& conv_direct_plain();  // conv_direct.cpp
const ConvAlgorithm& conv_winograd();      // conv_direct.cpp
const ConvAlgorithm& conv_pointwise();     // conv_direct.cpp
const ConvAlgorithm& conv_direct_fp32();   // conv_direct.cpp
const ConvAlgorithm& conv_direct_1x1();    // conv_1x1.cpp
const ConvAlgorithm& conv_type3();         // conv_type3.cpp
const ConvAlgorithm& conv_type1();         // conv_type1.cpp

// Whether Winograd F(4x4, 3x3) computes a convolution of this geometry (Lowering::winograd):
// a 3x3 kernel, stride 1, no dilation, padding at most 2, any groups (each run apart; on
// blocked operands each group's channels must also be whole blocks) (conv_direct.cpp).
bool winograd_shape(const ConvGeometry& geo);
// A group of at least this many channels each way makes Winograd a candidate of the measured
// choice for a grouped layer (CaffeNet's conv4 and conv5: 192 and 128); thinner groups (a
// depthwise layer's one channel) would run as hundreds of tiny products, never the fastest.
constexpr index_t kMinWinogradGroupChannels = 16;
// Whether the driver's pointwise convolution computes this geometry (Lowering::pointwise): a
// 1x1 kernel, no padding or dilation, one group, equal strides; it also needs the operands
// in one blocked layout with channel counts that are multiples of its block
// (conv_direct.cpp).
bool pointwise_shape(const ConvGeometry& geo, index_t groups);

inline std::size_t floats_bytes(index_t count) {
  return static_cast<std::size_t>(count) * sizeof(float);
}

// Workspace sub-buffers start on 64-byte boundaries (16 floats) so BLAS sees aligned rows.
inline index_t aligned(index_t floats) {
  return (floats + 15) / 16 * 16;
}

// Carves consecutive float buffers out of the slice's workspace.
class Carver {
 public:
  Carver(const Pointer& workspace, std::size_t needed, const std::string& who)
      : base_(workspace.as<float>()) {
    HN_CHECK(workspace.bytes >= needed || needed == 0,
             "{}: workspace of {} bytes is smaller than the {} bytes the slice needs", who,
             workspace.bytes, needed);
  }
  float* take(index_t floats) {
    float* p = base_ + used_;
    used_ += aligned(floats);
    return p;
  }

 private:
  float* base_;
  index_t used_ = 0;
};

}  // namespace hn::detail
