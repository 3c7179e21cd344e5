// Convolution algorithms direct and direct_plain: the driver's own convolution (oneDNN on the
// CPU, cuDNN on CUDA), no lowering; direct_plain asks for its NCHW kernels.
#include "lib/layers/conv_algorithm.h"

namespace hn::detail {

namespace {

class DriverConvolution final : public ConvAlgorithm {
 public:
  explicit DriverConvolution(bool plain_kernel) : plain_kernel_(plain_kernel) {}
  Lowering id() const override { return plain_kernel_ ? Lowering::direct_plain : Lowering::direct; }
  // A driver with blocked kernels may also run NCHW ones (oneDNN's GEMM-based).
  bool applies(const ConvolutionLayer& layer, const Driver& driver) const override {
    static_cast<void>(layer);
    const Capabilities capabilities = driver.capabilities();
    return capabilities.convolution && (!plain_kernel_ || capabilities.blocked_layout);
  }
  // In the driver's call (conv_forward_activation).
  void forward(const ConvolutionLayer& layer, const LayerSlice& slice) const override;
  bool applies_activation() const override { return true; }
  // Adds the bias gradient itself.
  void backward(const ConvolutionLayer& layer, const LayerSlice& slice, Wanted want) const override;

 private:
  LoweringShape shape(const ConvolutionLayer& layer, const LayerSlice& slice) const {
    LoweringShape s = layer.lowering_shape(slice.rows());
    s.layout = slice.inputs[0].layout;
    s.out_layout = slice.outputs[0].layout;
    s.plain_kernel = plain_kernel_;
    s.weights_version = slice.params[0].version;
    return s;
  }

  bool plain_kernel_;
};

void DriverConvolution::forward(const ConvolutionLayer& layer, const LayerSlice& slice) const {
  const ConvolutionParams& p = layer.config();
  const float* bias = p.bias_term ? slice.params[1].x() : nullptr;
  const Activation activation = layer.activation();
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

}  // namespace

const ConvAlgorithm& conv_direct() {
  static const DriverConvolution algorithm(false);
  return algorithm;
}

const ConvAlgorithm& conv_direct_plain() {
  static const DriverConvolution algorithm(true);
  return algorithm;
}

}  // namespace hn::detail
