// Convolution algorithm type3 (CcT's lowering type 3, group 1): lower the kernel, lift the
// output.
#include "lib/layers/conv_algorithm.h"

#include <algorithm>

namespace hn::detail {

namespace {

// With the input in NHWC order X^T [(n,h,w)][C] and the kernel as W' [C][(co,kh,kw)], the
// products P = X^T W' hold every kernel tap applied at every input pixel; lift sums the
// taps that land on each output pixel. Backward: dP = lift_backward(dy), dW' += X dP,
// dX^T = dP W'^T.
class Type3 final : public ConvAlgorithm {
 public:
  Lowering id() const override { return Lowering::type3; }
  bool applies(const ConvolutionLayer& layer, const Driver& driver) const override {
    static_cast<void>(driver);
    return layer.config().group == 1;
  }
  std::size_t workspace(const ConvolutionLayer& layer, index_t rows) const override;
  void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const override;
  void backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const override;

 private:
  // The data and weight gradients.
  void backward_gemms(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const;
};

std::size_t Type3::workspace(const ConvolutionLayer& layer, index_t rows) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output;
  const index_t chunk = std::max(layer.forward_chunk(Lowering::type3, rows),
                                 layer.backward_chunk(Lowering::type3, rows));
  // kernel in [C][C_out * k] order, its gradient, NHWC input, products
  const index_t in_plane = geo.height * geo.width, kernel = geo.kernel_h * geo.kernel_w;
  const index_t weights = aligned(geo.channels * num_output * kernel);
  return floats_bytes(2 * weights + aligned(chunk * in_plane * geo.channels) +
                      aligned(chunk * in_plane * num_output * kernel));
}

void Type3::forward(const ConvolutionLayer& layer, const LayerSlice& slice) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output;
  Driver& d = *slice.driver;
  const index_t rows = slice.rows(), chunk = layer.forward_chunk(Lowering::type3, rows);
  const index_t c = geo.channels, taps = num_output * geo.kernel_h * geo.kernel_w;
  const index_t in_plane = geo.height * geo.width, in_image = c * in_plane;
  const index_t out_image = num_output * geo.out_h * geo.out_w;
  Carver carve(slice.workspace, workspace(layer, rows), layer.describe());
  float* kernel = carve.take(c * taps);
  carve.take(c * taps);  // the kernel gradient's place, used by backward
  float* x_t = carve.take(chunk * in_plane * c);
  float* products = carve.take(chunk * in_plane * taps);
  d.swap_axes(num_output, c, geo.kernel_h * geo.kernel_w, slice.params[0].x(), kernel);
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    for (index_t i = 0; i < images; ++i) {
      d.swap_axes(c, in_plane, 1, x + (first + i) * in_image, x_t + i * in_image);
    }
    d.gemm(Transpose::no, Transpose::no, images * in_plane, taps, c, 1.0f, x_t, c, kernel, taps,
           0.0f, products, taps);
    const LoweringShape s = layer.lowering_shape(images);
    d.lift(s, num_output, products, y + first * out_image);
    layer.add_bias(slice, first, images);
  }
}

void Type3::backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const {
  if (want.dx || want.dw) backward_gemms(layer, slice, want);
  if (want.db) layer.add_bias_gradient(slice);
}

void Type3::backward_gemms(const ConvolutionLayer& layer, const LayerSlice& slice,
                           Wanted want) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output;
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const bool want_dx = want.dx, want_dw = want.dw;
  const index_t rows = slice.rows(), chunk = layer.backward_chunk(Lowering::type3, rows);
  const index_t c = geo.channels, kernel_taps = geo.kernel_h * geo.kernel_w;
  const index_t taps = num_output * kernel_taps;
  const index_t in_plane = geo.height * geo.width, in_image = c * in_plane;
  const index_t out_image = num_output * geo.out_h * geo.out_w;
  Carver carve(slice.workspace, workspace(layer, rows), layer.describe());
  float* kernel = carve.take(c * taps);
  float* kernel_diff = carve.take(c * taps);
  float* x_t = carve.take(chunk * in_plane * c);
  float* products_diff = carve.take(chunk * in_plane * taps);
  if (want_dx) d.swap_axes(num_output, c, kernel_taps, weights.x(), kernel);
  // dW accumulates: bring it into W' order, add every chunk's part, move it back.
  if (want_dw) d.swap_axes(num_output, c, kernel_taps, weights.dx(), kernel_diff);
  const float* dy = slice.outputs[0].dx();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = layer.lowering_shape(images);
    d.lift_backward(s, num_output, dy + first * out_image, products_diff);
    const index_t n = images * in_plane;
    if (want_dw) {
      for (index_t i = 0; i < images; ++i) {
        d.swap_axes(c, in_plane, 1, in.x() + (first + i) * in_image, x_t + i * in_image);
      }
      d.gemm(Transpose::yes, Transpose::no, c, taps, n, 1.0f, x_t, c, products_diff, taps, 1.0f,
             kernel_diff, taps);
    }
    if (want_dx) {
      d.gemm(Transpose::no, Transpose::yes, n, c, taps, 1.0f, products_diff, taps, kernel, taps,
             0.0f, x_t, c);
      for (index_t i = 0; i < images; ++i) {
        d.swap_axes(in_plane, c, 1, x_t + i * in_image, in.mutable_dx() + (first + i) * in_image);
      }
    }
  }
  if (want_dw) d.swap_axes(c, num_output, kernel_taps, kernel_diff, weights.mutable_dx());
}

}  // namespace

const ConvAlgorithm& conv_type3() {
  static const Type3 algorithm;
  return algorithm;
}

}  // namespace hn::detail
