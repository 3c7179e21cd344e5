// Convolution algorithm type1 (CcT's lowering type 1): im2col over a chunk of images, one GEMM
// per group, lift to NCHW. The plainest: it runs every convolution.
#include "lib/layers/conv_algorithm.h"

#include <algorithm>

namespace hn::detail {

namespace {

// The lowered chunk is [C*kh*kw][chunk*plane]; group g's rows are the contiguous block g,
// so group g's GEMM is weights_g [M/g x K/g] times columns_g [K/g x chunk*plane], giving
// [C_out][chunk][plane]. With one image per chunk that already is NCHW and the GEMM writes
// the output directly; otherwise swap_axes moves it into place.
class Type1 final : public ConvAlgorithm {
 public:
  Lowering id() const override { return Lowering::type1; }
  bool applies(const ConvolutionLayer& layer, const Driver& driver) const override {
    static_cast<void>(layer);
    static_cast<void>(driver);
    return true;
  }
  std::size_t workspace(const ConvolutionLayer& layer, index_t rows) const override;
  void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const override;
  // Adds the bias gradient chunk by chunk.
  void backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const override;
};

std::size_t Type1::workspace(const ConvolutionLayer& layer, index_t rows) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t chunk = std::max(layer.forward_chunk(Lowering::type1, rows),
                                 layer.backward_chunk(Lowering::type1, rows));
  const index_t out_plane = geo.out_h * geo.out_w, kernel = geo.kernel_h * geo.kernel_w;
  // columns, plus the GEMM output / transposed dy in [C_out][chunk][plane] order
  const index_t columns = aligned(geo.channels * kernel * chunk * out_plane);
  const index_t swapped = chunk > 1 ? aligned(layer.config().num_output * chunk * out_plane) : 0;
  return floats_bytes(columns + swapped);
}

void Type1::forward(const ConvolutionLayer& layer, const LayerSlice& slice) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output;
  Driver& d = *slice.driver;
  const index_t rows = slice.rows(), chunk = layer.forward_chunk(Lowering::type1, rows);
  const index_t groups = layer.config().group, m = num_output / groups;
  const index_t k = geo.channels / groups * geo.kernel_h * geo.kernel_w;
  const index_t out_plane = geo.out_h * geo.out_w, in_image = geo.channels * geo.height * geo.width;
  const index_t out_image = num_output * out_plane;
  Carver carve(slice.workspace, workspace(layer, rows), layer.describe());
  float* columns = carve.take(k * groups * chunk * out_plane);
  float* swapped = chunk > 1 ? carve.take(num_output * chunk * out_plane) : nullptr;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  const float* weights = slice.params[0].x();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = layer.lowering_shape(images);
    d.im2col(s, x + first * in_image, columns);
    const index_t n = images * out_plane;
    float* product = images > 1 ? swapped : y + first * out_image;
    for (index_t g = 0; g < groups; ++g) {
      d.gemm(Transpose::no, Transpose::no, m, n, k, 1.0f, weights + g * m * k, k,
             columns + g * k * n, n, 0.0f, product + g * m * n, n);
    }
    if (images > 1) d.swap_axes(num_output, images, out_plane, swapped, y + first * out_image);
    layer.add_bias(slice, first, images);
  }
}

void Type1::backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const {
  const ConvGeometry& geo = layer.geometry();
  const index_t num_output = layer.config().num_output;
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const auto [want_dx, want_dw, want_db] = want;
  const index_t rows = slice.rows(), chunk = layer.backward_chunk(Lowering::type1, rows);
  const index_t groups = layer.config().group, m = num_output / groups;
  const index_t k = geo.channels / groups * geo.kernel_h * geo.kernel_w;
  const index_t out_plane = geo.out_h * geo.out_w, in_image = geo.channels * geo.height * geo.width;
  const index_t out_image = num_output * out_plane;
  Carver carve(slice.workspace, workspace(layer, rows), layer.describe());
  float* columns = carve.take(k * groups * chunk * out_plane);
  float* swapped = chunk > 1 ? carve.take(num_output * chunk * out_plane) : nullptr;
  const float* dy = slice.outputs[0].dx();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = layer.lowering_shape(images);
    const index_t n = images * out_plane;
    const float* dy_t = dy + first * out_image;  // [C_out][images][plane]
    if (images > 1) {
      d.swap_axes(images, num_output, out_plane, dy_t, swapped);
      dy_t = swapped;
    }
    if (want_db) {  // dy_t viewed as [1][C_out][images * plane]
      d.bias_backward(AxisShape{1, num_output, n}, dy_t, 1.0f, slice.params[1].mutable_dx());
    }
    if (want_dw) {
      d.im2col(s, in.x() + first * in_image, columns);
      for (index_t g = 0; g < groups; ++g) {
        d.gemm(Transpose::no, Transpose::yes, m, k, n, 1.0f, dy_t + g * m * n, n,
               columns + g * k * n, n, 1.0f, weights.mutable_dx() + g * m * k, k);
      }
    }
    if (want_dx) {
      for (index_t g = 0; g < groups; ++g) {
        d.gemm(Transpose::yes, Transpose::no, k, n, m, 1.0f, weights.x() + g * m * k, k,
               dy_t + g * m * n, n, 0.0f, columns + g * k * n, n);
      }
      d.col2im(s, columns, in.mutable_dx() + first * in_image);
    }
  }
}

}  // namespace

const ConvAlgorithm& conv_type1() {
  static const Type1 algorithm;
  return algorithm;
}

}  // namespace hn::detail
