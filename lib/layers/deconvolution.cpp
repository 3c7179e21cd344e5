// Deconvolution layer (Caffe's; ONNX's ConvTranspose): the convolution from its output back
// to its input, run the other way. With that convolution (input: this layer's output,
// num_output channels; output: this layer's input, C channels; weights [C][num_output /
// group][kh][kw], the layer's own), forward is its data gradient, the data gradient is its
// forward, and the weight gradient is its weight gradient with the two tensors' roles
// swapped. Every driver has the three calls (oneDNN on the CPU, cuDNN on CUDA, the reference
// kernels elsewhere); the bias is added and summed per output channel.
#include <string>
#include <utility>
#include <vector>

#include "hybridnn.pb.h"
#include "lib/core/check.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/common.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/registry.h"

namespace hn {

namespace {

using namespace detail;

class DeconvolutionLayer final : public Layer {
 public:
  DeconvolutionLayer(std::string name, ConvolutionParams params)
      : Layer(std::move(name)), config_(std::move(params)) {}
  const char* type() const override { return "Deconvolution"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  double forward_flops(index_t rows) const override {
    // One multiply-add per weight per input pixel.
    return 2.0 * static_cast<double>(rows) * static_cast<double>(channels_) *
           static_cast<double>(geo_.height * geo_.width) *
           static_cast<double>(config_.num_output / config_.group * geo_.kernel_h * geo_.kernel_w);
  }

 private:
  // The convolution whose data gradient this layer's forward is, for `rows` images.
  LoweringShape reverse(index_t rows) const;

  ConvolutionParams config_;
  // The window (kernel, stride, pad, dilation); height and width: the OUTPUT's, channels
  // num_output (the reverse convolution's input); out_h, out_w: this layer's input.
  ConvGeometry geo_;
  index_t channels_ = 0;  // this layer's input channels
};

std::vector<Shape> DeconvolutionLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const std::string who = describe();
  const Shape& in = inputs[0];
  HN_CHECK(in.axes() == 4, "{}: input must be 4-D (N x C x H x W), got {}", who, in.to_string());
  const ConvolutionParams& p = config_;
  detail::resolve_window(who, p, geo_);
  HN_CHECK(p.output_pad.size() <= 2, "{}: output_pad takes 1 or 2 values (height, width), got {}",
           who, p.output_pad.size());
  const index_t extra_h = p.output_pad.empty() ? 0 : p.output_pad[0];
  const index_t extra_w = p.output_pad.empty() ? 0 : p.output_pad.back();
  // Below the stride: the extra rows are those a convolution of the output would leave
  // unread (ONNX and PyTorch also allow up to the dilation; not read here).
  HN_CHECK(extra_h >= 0 && extra_w >= 0 && extra_h < geo_.stride_h && extra_w < geo_.stride_w,
           "{}: output_pad {}x{} must be below the stride {}x{}", who, extra_h, extra_w,
           geo_.stride_h, geo_.stride_w);
  channels_ = in[1];
  HN_CHECK(channels_ > 0 && in[2] > 0 && in[3] > 0,
           "{}: input {} has an empty channel or spatial axis", who, in.to_string());
  HN_CHECK(channels_ % p.group == 0, "{}: input channels {} not divisible by group {} (input {})",
           who, channels_, p.group, in.to_string());
  HN_CHECK(p.num_output % p.group == 0, "{}: num_output {} not divisible by group {}", who,
           p.num_output, p.group);
  const index_t extent_h = geo_.dilation_h * (geo_.kernel_h - 1) + 1;
  const index_t extent_w = geo_.dilation_w * (geo_.kernel_w - 1) + 1;
  geo_.channels = p.num_output;
  geo_.height = geo_.stride_h * (in[2] - 1) + extent_h - 2 * geo_.pad_h + extra_h;
  geo_.width = geo_.stride_w * (in[3] - 1) + extent_w - 2 * geo_.pad_w + extra_w;
  HN_CHECK(geo_.height > 0 && geo_.width > 0,
           "{}: pad {}x{} leaves no output ({}x{}) for input {} with kernel {}x{} stride {}x{}",
           who, geo_.pad_h, geo_.pad_w, geo_.height, geo_.width, in.to_string(), geo_.kernel_h,
           geo_.kernel_w, geo_.stride_h, geo_.stride_w);
  geo_.out_h = in[2];
  geo_.out_w = in[3];
  // The reverse convolution maps the output back onto exactly the input.
  const LoweringShape r = reverse(1);
  HN_CHECK(r.out_h() == in[2] && r.out_w() == in[3],
           "{}: internal: the reverse convolution of {}x{} gives {}x{}, not the input {}", who,
           geo_.height, geo_.width, r.out_h(), r.out_w(), in.to_string());
  const Shape weight_shape{channels_, p.num_output / p.group, geo_.kernel_h, geo_.kernel_w};
  const std::size_t param_count = p.bias_term ? 2 : 1;
  if (params_.size() != param_count || params_[0].shape() != weight_shape) {
    params_.clear();
    params_.emplace_back(weight_shape);
    if (p.bias_term) params_.emplace_back(Shape{p.num_output});
  }
  return {Shape{in[0], p.num_output, geo_.height, geo_.width}};
}

LoweringShape DeconvolutionLayer::reverse(index_t rows) const {
  LoweringShape s;
  s.batch = rows;
  s.channels = geo_.channels;
  s.height = geo_.height;
  s.width = geo_.width;
  s.kernel_h = geo_.kernel_h;
  s.kernel_w = geo_.kernel_w;
  s.pad_h = geo_.pad_h;
  s.pad_w = geo_.pad_w;
  s.stride_h = geo_.stride_h;
  s.stride_w = geo_.stride_w;
  s.dilation_h = geo_.dilation_h;
  s.dilation_w = geo_.dilation_w;
  s.groups = config_.group;
  return s;
}

void DeconvolutionLayer::forward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  float* y = slice.outputs[0].mutable_x();
  slice.driver->conv_backward_data(reverse(slice.rows()), channels_, slice.params[0].x(),
                                   slice.inputs[0].x(), y);
  if (config_.bias_term) {
    slice.driver->bias_forward(
        AxisShape{slice.rows(), config_.num_output, geo_.height * geo_.width}, slice.params[1].x(),
        y);
  }
}

void DeconvolutionLayer::backward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  const LoweringShape r = reverse(slice.rows());
  const float* dy = slice.outputs[0].dx();
  if (config_.bias_term && slice.params[1].diff.address != nullptr) {
    slice.driver->bias_backward(
        AxisShape{slice.rows(), config_.num_output, geo_.height * geo_.width}, dy, 1.0f,
        slice.params[1].mutable_dx());
  }
  if (slice.params[0].diff.address != nullptr) {
    // The reverse convolution's weight gradient: its input is dy, its output's gradient x.
    slice.driver->conv_backward_weights(r, channels_, dy, slice.inputs[0].x(),
                                        slice.params[0].mutable_dx(), nullptr);
  }
  if (!slice.propagate_down.empty() && slice.propagate_down[0] &&
      slice.inputs[0].diff.address != nullptr) {
    slice.driver->conv_forward(r, channels_, dy, slice.params[0].x(), nullptr,
                               slice.inputs[0].mutable_dx());
  }
}

std::unique_ptr<Layer> make_deconvolution(const pb::LayerParameter& p) {
  return std::make_unique<DeconvolutionLayer>(p.name(), detail::convolution_params(p));
}

}  // namespace

std::unique_ptr<Layer> make_deconvolution_layer(std::string name, ConvolutionParams params) {
  return std::make_unique<DeconvolutionLayer>(std::move(name), std::move(params));
}

LayerType deconvolution_layer_type() {
  LayerType type;
  type.name = "Deconvolution";
  type.make = make_deconvolution;
  type.filler = [](const pb::LayerParameter& p, int index) {
    return index == 0 ? &p.convolution_param().weight_filler()
                      : &p.convolution_param().bias_filler();
  };
  return type;
}

}  // namespace hn
