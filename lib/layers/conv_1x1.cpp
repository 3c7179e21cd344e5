// Convolution algorithm direct_1x1: a 1x1 kernel with stride 1 and no padding needs no
// lowering, each image [C][plane] already is the lowered matrix.
#include "lib/layers/conv_algorithm.h"

namespace hn::detail {

namespace {

class Direct1x1 final : public ConvAlgorithm {
 public:
  Lowering id() const override { return Lowering::direct_1x1; }
  bool applies(const ConvolutionLayer& layer, const Driver& driver) const override {
    static_cast<void>(driver);
    return layer.geometry().one_by_one();
  }
  void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const override;
  void backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const override;
};

// Per image and group, one GEMM straight from the input into the output.
void Direct1x1::forward(const ConvolutionLayer& layer, const LayerSlice& slice) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output, groups = layer.config().group;
  Driver& d = *slice.driver;
  const index_t m = num_output / groups, k = geo.channels / groups;
  const index_t plane = geo.out_h * geo.out_w;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  const float* weights = slice.params[0].x();
  for (index_t i = 0; i < slice.rows(); ++i) {
    for (index_t g = 0; g < groups; ++g) {
      d.gemm(Transpose::no, Transpose::no, m, plane, k, 1.0f, weights + g * m * k, k,
             x + (i * geo.channels + g * k) * plane, plane, 0.0f,
             y + (i * num_output + g * m) * plane, plane);
    }
    layer.add_bias(slice, i, 1);
  }
}

void Direct1x1::backward(const ConvolutionLayer& layer, const LayerSlice& slice,
                         Wanted want) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output, groups = layer.config().group;
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const index_t m = num_output / groups, k = geo.channels / groups;
  const index_t plane = geo.out_h * geo.out_w;
  const float* dy = slice.outputs[0].dx();
  for (index_t i = 0; i < slice.rows(); ++i) {
    for (index_t g = 0; g < groups; ++g) {
      const float* dy_g = dy + (i * num_output + g * m) * plane;
      const index_t x_offset = (i * geo.channels + g * k) * plane;
      if (want.dw) {
        d.gemm(Transpose::no, Transpose::yes, m, k, plane, 1.0f, dy_g, plane, in.x() + x_offset,
               plane, 1.0f, weights.mutable_dx() + g * m * k, k);
      }
      if (want.dx) {
        d.gemm(Transpose::yes, Transpose::no, k, plane, m, 1.0f, weights.x() + g * m * k, k, dy_g,
               plane, 0.0f, in.mutable_dx() + x_offset, plane);
      }
    }
  }
  if (want.db) layer.add_bias_gradient(slice);
}

}  // namespace

const ConvAlgorithm& conv_direct_1x1() {
  static const Direct1x1 algorithm;
  return algorithm;
}

}  // namespace hn::detail
