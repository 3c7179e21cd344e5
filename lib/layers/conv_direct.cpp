// Convolution algorithms direct, direct_plain, winograd, pointwise and direct_fp32: the
// driver's own convolution (oneDNN on the CPU, cuDNN on CUDA), no lowering; direct_plain asks
// for its NCHW kernels, winograd for its Winograd convolution (the CPU driver's,
// conv_winograd.h), pointwise for its own 1x1 kernels (the CPU driver's, conv_pointwise.h),
// direct_fp32 for FP32 where its math mode would let it round.
#include "lib/layers/conv_algorithm.h"

namespace hn::detail {

namespace {

class DriverConvolution final : public ConvAlgorithm {
 public:
  explicit DriverConvolution(Lowering kind) : kind_(kind) {}
  Lowering id() const override { return kind_; }
  // A driver with blocked kernels may also run NCHW ones (oneDNN's GEMM-based); Winograd
  // where the driver has it and the layer is 3x3, stride 1, with wide enough groups.
  bool applies(const ConvolutionLayer& layer, const Driver& driver) const override {
    const Capabilities capabilities = driver.capabilities();
    switch (kind_) {
      case Lowering::direct_plain:
        return capabilities.convolution && capabilities.blocked_layout;
      case Lowering::direct_fp32:
        return capabilities.convolution && capabilities.fp32_convolution;
      case Lowering::winograd: {
        const ConvGeometry& geo = layer.geometry();
        const index_t groups = layer.config().group;
        if (!capabilities.winograd || !winograd_shape(geo)) return false;
        if (groups == 1) return true;
        const index_t in = geo.channels / groups, out = layer.config().num_output / groups;
        return in >= kMinWinogradGroupChannels && out >= kMinWinogradGroupChannels &&
               in % layout_block(layer.input_layout()) == 0 &&
               out % layout_block(layer.output_layout()) == 0;
      }
      case Lowering::pointwise: {
        // x and y in one blocked layout with whole blocks of channels, or both NCHW with
        // stride 1.
        const Layout layout = layer.input_layout();
        const index_t block = layout_block(layout);
        const ConvGeometry& geo = layer.geometry();
        if (!capabilities.pointwise || layer.output_layout() != layout ||
            !pointwise_shape(geo, layer.config().group)) {
          return false;
        }
        if (layout == Layout::nchw) return geo.stride_h == 1;
        return capabilities.blocked_layout && block > 1 && geo.channels % block == 0 &&
               layer.config().num_output % block == 0;
      }
      default:
        return capabilities.convolution;
    }
  }
  // In the driver's call (conv_forward_activation, or conv_forward_residual).
  void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const override;
  bool applies_activation() const override { return true; }
  // Adds the bias gradient itself.
  void backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const override;
  // Where both gradients are wanted.
  bool backward_relu(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want,
                     float slope) const override;

 private:
  LoweringShape shape(const ConvolutionLayer& layer, const LayerSlice& slice) const {
    LoweringShape s = layer.lowering_shape(slice.rows());
    s.layout = slice.inputs[0].layout;
    s.out_layout = slice.outputs[0].layout;
    s.plain_kernel = kind_ == Lowering::direct_plain;
    s.winograd = kind_ == Lowering::winograd;
    s.pointwise = kind_ == Lowering::pointwise;
    s.fp32_kernel = kind_ == Lowering::direct_fp32;
    s.weights_version = slice.params[0].version;
    return s;
  }

  Lowering kind_;
};

void DriverConvolution::forward(const ConvolutionLayer& layer, const LayerSlice& slice) const {
  const ConvolutionParams& p = layer.config();
  const float* bias = layer.has_bias() ? slice.params[1].x() : nullptr;
  const Activation activation = layer.activation();
  if (layer.residual()) {
    slice.driver->conv_forward_residual(shape(layer, slice), p.num_output, slice.inputs[0].x(),
                                        slice.params[0].x(), bias, slice.inputs[1].x(), activation,
                                        slice.outputs[0].mutable_x());
    return;
  }
  if (activation.kind != Activation::Kind::none) {
    slice.driver->conv_forward_activation(shape(layer, slice), p.num_output, slice.inputs[0].x(),
                                          slice.params[0].x(), bias, activation,
                                          slice.outputs[0].mutable_x());
    return;
  }
  slice.driver->conv_forward(shape(layer, slice), p.num_output, slice.inputs[0].x(),
                             slice.params[0].x(), bias, slice.outputs[0].mutable_x());
}

void DriverConvolution::backward(const ConvolutionLayer& layer, const LayerSlice& slice,
                                 Wanted want) const {
  const LoweringShape s = shape(layer, slice);
  const index_t num_output = layer.config().num_output;
  const Operand& weights = slice.params[0];
  float* dbias = want.db ? slice.params[1].mutable_dx() : nullptr;
  if (want.dw && want.dx) {
    slice.driver->conv_backward(s, num_output, slice.inputs[0].x(), weights.x(),
                                slice.outputs[0].dx(), slice.inputs[0].mutable_dx(),
                                weights.mutable_dx(), dbias);
    return;
  }
  if (want.dw) {
    slice.driver->conv_backward_weights(s, num_output, slice.inputs[0].x(), slice.outputs[0].dx(),
                                        weights.mutable_dx(), dbias);
  } else if (want.db) {
    layer.add_bias_gradient(slice);
  }
  if (want.dx) {
    slice.driver->conv_backward_data(s, num_output, weights.x(), slice.outputs[0].dx(),
                                     slice.inputs[0].mutable_dx());
  }
}

bool DriverConvolution::backward_relu(const ConvolutionLayer& layer, const LayerSlice& slice,
                                      Wanted want, float slope) const {
  if (!want.dx || !want.dw) return false;
  const Operand& weights = slice.params[0];
  slice.driver->conv_backward_relu(
      shape(layer, slice), layer.config().num_output, slice.inputs[0].x(), weights.x(),
      slice.outputs[0].x(), slope, slice.outputs[0].mutable_dx(), slice.inputs[0].mutable_dx(),
      weights.mutable_dx(), want.db ? slice.params[1].mutable_dx() : nullptr);
  return true;
}

}  // namespace

const ConvAlgorithm& conv_direct() {
  static const DriverConvolution algorithm(Lowering::direct);
  return algorithm;
}

const ConvAlgorithm& conv_direct_plain() {
  static const DriverConvolution algorithm(Lowering::direct_plain);
  return algorithm;
}

const ConvAlgorithm& conv_direct_fp32() {
  static const DriverConvolution algorithm(Lowering::direct_fp32);
  return algorithm;
}

const ConvAlgorithm& conv_winograd() {
  static const DriverConvolution algorithm(Lowering::winograd);
  return algorithm;
}

const ConvAlgorithm& conv_pointwise() {
  static const DriverConvolution algorithm(Lowering::pointwise);
  return algorithm;
}

bool winograd_shape(const ConvGeometry& geo) {
  return geo.kernel_h == 3 && geo.kernel_w == 3 && geo.stride_h == 1 && geo.stride_w == 1 &&
         geo.dilation_h == 1 && geo.dilation_w == 1 && geo.pad_h <= 2 && geo.pad_w <= 2;
}

bool pointwise_shape(const ConvGeometry& geo, index_t groups) {
  return groups == 1 && geo.kernel_h == 1 && geo.kernel_w == 1 && geo.pad_h == 0 &&
         geo.pad_w == 0 && geo.dilation_h == 1 && geo.dilation_w == 1 &&
         geo.stride_h == geo.stride_w;
}

}  // namespace hn::detail
