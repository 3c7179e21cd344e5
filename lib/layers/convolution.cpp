// Convolution layer: Caffe's parameter rules, the lowering cost model, the choice among the
// algorithms (lib/layers/conv_algorithm.h, one file each) and the dispatch to them; the
// measured choice is lib/layers/conv_tune.cpp.
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/registry.h"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/layers/activation_layer.h"
#include "lib/layers/common.h"
#include "lib/layers/conv_algorithm.h"

namespace hn {

const char* lowering_name(Lowering lowering) {
  switch (lowering) {
    case Lowering::automatic:
      return "automatic";
    case Lowering::type1:
      return "type1";
    case Lowering::type3:
      return "type3";
    case Lowering::direct_1x1:
      return "direct_1x1";
    case Lowering::direct:
      return "direct";
    case Lowering::direct_plain:
      return "direct_plain";
    case Lowering::winograd:
      return "winograd";
    case Lowering::pointwise:
      return "pointwise";
    case Lowering::direct_fp32:
      return "direct_fp32";
  }
  return "unknown";
}

const char* direction_name(ConvDirection direction) {
  switch (direction) {
    case ConvDirection::forward:
      return "forward";
    case ConvDirection::backward_data:
      return "backward_data";
    case ConvDirection::backward_weights:
      return "backward_weights";
  }
  return "unknown";
}

namespace {

using detail::floats_bytes;

// ---- cost model ----------------------------------------------------------------------
//
// Cost model for Lowering::automatic (docs/layers.md): estimated time = GEMM flops /
// (peak * efficiency) + bytes moved by the lowering / bandwidth. Only the ratio of peak to
// bandwidth matters: kFlopsPerByte is the machine balance, about 340 GFLOP/s of sgemm
// against the ~18 GB/s at which the CPU driver's im2col writes on the development machine.
// GEMM efficiency falls when a dimension is thin (type 3 of CaffeNet's conv1 would have
// K = 3 input channels): efficiency(d) = d / (d + kThinDimension) for the smallest GEMM
// dimension d.
constexpr double kFlopsPerByte = 20.0;
constexpr double kThinDimension = 32.0;

double gemm_efficiency(index_t m, index_t n, index_t k) {
  const double d = static_cast<double>(std::min({m, n, k}));
  return d / (d + kThinDimension);
}

// One value of a repeated Caffe field: index 0 (height) or 1 (width).
index_t repeated(const std::string& who, const char* field, const std::vector<index_t>& values,
                 int axis, index_t fallback) {
  HN_CHECK(values.size() <= 2, "{}: {} takes 1 or 2 values (height, width), got {}", who, field,
           values.size());
  if (values.empty()) return fallback;
  return values.size() == 1 ? values[0] : values[static_cast<std::size_t>(axis)];
}

// A Caffe field that has a repeated form and an _h/_w pair (kernel, stride, pad).
std::pair<index_t, index_t> resolve_pair(const std::string& who, const char* field,
                                         const std::vector<index_t>& values,
                                         const std::optional<index_t>& h,
                                         const std::optional<index_t>& w, index_t fallback) {
  HN_CHECK(h.has_value() == w.has_value(), "{}: {}_h and {}_w must be given together", who, field,
           field);
  if (h.has_value()) {
    HN_CHECK(values.empty(), "{}: give either {} or {}_h/{}_w, not both", who, field, field, field);
    return {*h, *w};
  }
  return {repeated(who, field, values, 0, fallback), repeated(who, field, values, 1, fallback)};
}

}  // namespace

ConvolutionLayer::ConvolutionLayer(std::string name, ConvolutionParams params)
    : Layer(std::move(name)), config_(std::move(params)) {}

namespace detail {

void resolve_window(const std::string& who, const ConvolutionParams& p, ConvGeometry& geo) {
  HN_CHECK(p.kernel_size.size() > 0 || p.kernel_h.has_value(),
           "{}: kernel_size (or kernel_h and kernel_w) must be given", who);
  std::tie(geo.kernel_h, geo.kernel_w) =
      resolve_pair(who, "kernel", p.kernel_size, p.kernel_h, p.kernel_w, 0);
  std::tie(geo.stride_h, geo.stride_w) =
      resolve_pair(who, "stride", p.stride, p.stride_h, p.stride_w, 1);
  std::tie(geo.pad_h, geo.pad_w) = resolve_pair(who, "pad", p.pad, p.pad_h, p.pad_w, 0);
  geo.dilation_h = repeated(who, "dilation", p.dilation, 0, 1);
  geo.dilation_w = repeated(who, "dilation", p.dilation, 1, 1);
  HN_CHECK(geo.kernel_h > 0 && geo.kernel_w > 0, "{}: kernel must be > 0, got {}x{}", who,
           geo.kernel_h, geo.kernel_w);
  HN_CHECK(geo.stride_h > 0 && geo.stride_w > 0, "{}: stride must be > 0, got {}x{}", who,
           geo.stride_h, geo.stride_w);
  HN_CHECK(geo.pad_h >= 0 && geo.pad_w >= 0, "{}: pad must be >= 0, got {}x{}", who, geo.pad_h,
           geo.pad_w);
  HN_CHECK(geo.dilation_h > 0 && geo.dilation_w > 0, "{}: dilation must be > 0, got {}x{}", who,
           geo.dilation_h, geo.dilation_w);
  HN_CHECK(p.num_output > 0, "{}: num_output must be > 0, got {}", who, p.num_output);
  HN_CHECK(p.group > 0, "{}: group must be > 0, got {}", who, p.group);
}

}  // namespace detail

std::vector<Shape> ConvolutionLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const std::string who = describe();
  const Shape& in = inputs[0];
  HN_CHECK(in.axes() == 4, "{}: input must be 4-D (N x C x H x W), got {}", who, in.to_string());
  const ConvolutionParams& p = config_;
  ConvGeometry& geo = geometry_;
  detail::resolve_window(who, p, geo);
  HN_CHECK(p.output_pad.empty(), "{}: output_pad is Deconvolution's; a Convolution has none", who);

  if (geo.channels != in[1] || geo.height != in[2] || geo.width != in[3]) chosen_.clear();
  geo.channels = in[1];
  geo.height = in[2];
  geo.width = in[3];
  HN_CHECK(geo.channels > 0 && geo.height > 0 && geo.width > 0,
           "{}: input {} has an empty channel or spatial axis", who, in.to_string());
  HN_CHECK(geo.channels % p.group == 0,
           "{}: input channels {} not divisible by group {} (input {})", who, geo.channels, p.group,
           in.to_string());
  HN_CHECK(p.num_output % p.group == 0, "{}: num_output {} not divisible by group {}", who,
           p.num_output, p.group);
  const index_t extent_h = geo.dilation_h * (geo.kernel_h - 1) + 1;
  const index_t extent_w = geo.dilation_w * (geo.kernel_w - 1) + 1;
  HN_CHECK(extent_h <= geo.height + 2 * geo.pad_h && extent_w <= geo.width + 2 * geo.pad_w,
           "{}: kernel {}x{} (dilated {}x{}) larger than the padded input {}x{} (input {})", who,
           geo.kernel_h, geo.kernel_w, extent_h, extent_w, geo.height + 2 * geo.pad_h,
           geo.width + 2 * geo.pad_w, in.to_string());
  geo.out_h = (geo.height + 2 * geo.pad_h - extent_h) / geo.stride_h + 1;
  geo.out_w = (geo.width + 2 * geo.pad_w - extent_w) / geo.stride_w + 1;

  const bool one_by_one = geo.one_by_one();
  switch (p.lowering) {
    case Lowering::type3:
      HN_CHECK(p.group == 1, "{}: lowering type3 needs group 1, got group {}", who, p.group);
      break;
    case Lowering::direct_1x1:
      HN_CHECK(one_by_one,
               "{}: lowering direct_1x1 needs a 1x1 kernel, stride 1 and pad 0, got kernel {}x{} "
               "stride {}x{} pad {}x{}",
               who, geo.kernel_h, geo.kernel_w, geo.stride_h, geo.stride_w, geo.pad_h, geo.pad_w);
      break;
    case Lowering::winograd:
      HN_CHECK(detail::winograd_shape(geo),
               "{}: lowering winograd needs a 3x3 kernel, stride 1, dilation 1 and pad at most 2, "
               "got kernel {}x{} stride {}x{} dilation {}x{} pad {}x{}",
               who, geo.kernel_h, geo.kernel_w, geo.stride_h, geo.stride_w, geo.dilation_h,
               geo.dilation_w, geo.pad_h, geo.pad_w);
      break;
    case Lowering::pointwise:
      HN_CHECK(detail::pointwise_shape(geo, p.group),
               "{}: lowering pointwise needs a 1x1 kernel, pad 0, dilation 1, group 1 and equal "
               "strides, got kernel {}x{} stride {}x{} dilation {}x{} group {} pad {}x{}",
               who, geo.kernel_h, geo.kernel_w, geo.stride_h, geo.stride_w, geo.dilation_h,
               geo.dilation_w, p.group, geo.pad_h, geo.pad_w);
      break;
    case Lowering::type1:
    case Lowering::automatic:
    case Lowering::direct:
    case Lowering::direct_plain:
    case Lowering::direct_fp32:
      break;
  }
  lowering_ = p.lowering;
  if (lowering_ == Lowering::automatic) {
    // Costs per image (see the cost model above), type 1 with the chunk a batch of 32
    // would get; the input read and output write that all lowerings share are left out.
    const index_t rows = geo.channels / p.group * geo.kernel_h * geo.kernel_w;  // K of one group
    const index_t m = p.num_output / p.group, out_plane = geo.out_h * geo.out_w;
    const index_t in_plane = geo.height * geo.width, kernel = geo.kernel_h * geo.kernel_w;
    const double flops1 = 2.0 * p.num_output * out_plane * rows;
    const index_t chunk1 = forward_chunk(32);
    const double bytes1 = 2.0 * floats_bytes(rows * p.group * out_plane) +
                          (chunk1 > 1 ? 2.0 * floats_bytes(p.num_output * out_plane) : 0.0);
    double best = flops1 / gemm_efficiency(m, chunk1 * out_plane, rows) + kFlopsPerByte * bytes1;
    lowering_ = Lowering::type1;
    if (p.group == 1) {
      const double flops3 = 2.0 * in_plane * geo.channels * p.num_output * kernel;
      const double bytes3 = 2.0 * floats_bytes(in_plane * geo.channels) +
                            2.0 * floats_bytes(in_plane * p.num_output * kernel);
      const double cost3 = flops3 / gemm_efficiency(in_plane, p.num_output * kernel, geo.channels) +
                           kFlopsPerByte * bytes3;
      if (cost3 < best) {
        best = cost3;
        lowering_ = Lowering::type3;
      }
    }
    if (one_by_one) {
      // No lowering at all; per-image GEMMs of out_plane columns.
      const double cost_direct = flops1 / gemm_efficiency(m, out_plane, rows);
      if (cost_direct <= best) lowering_ = Lowering::direct_1x1;
    }
  }

  const Shape weight_shape{p.num_output, geo.channels / p.group, geo.kernel_h, geo.kernel_w};
  const std::size_t param_count = p.bias_term ? 2 : 1;
  if (params_.size() != param_count || params_[0].shape() != weight_shape) {
    params_.clear();
    params_.emplace_back(weight_shape);
    if (p.bias_term) params_.emplace_back(Shape{p.num_output});
  }
  return {Shape{in[0], p.num_output, geo.out_h, geo.out_w}};
}

LoweringShape ConvolutionLayer::lowering_shape(index_t images) const {
  const ConvGeometry& geo = geometry_;
  LoweringShape s;
  s.batch = images;
  s.channels = geo.channels;
  s.height = geo.height;
  s.width = geo.width;
  s.kernel_h = geo.kernel_h;
  s.kernel_w = geo.kernel_w;
  s.pad_h = geo.pad_h;
  s.pad_w = geo.pad_w;
  s.stride_h = geo.stride_h;
  s.stride_w = geo.stride_w;
  s.dilation_h = geo.dilation_h;
  s.dilation_w = geo.dilation_w;
  s.groups = config_.group;
  return s;
}

std::size_t ConvolutionLayer::workspace_for(Lowering lowering, index_t rows) const {
  if (rows <= 0 || lowering == Lowering::automatic) return 0;
  return detail::conv_algorithm(lowering).workspace(*this, rows);
}

std::size_t ConvolutionLayer::workspace_bytes(const Driver& driver, index_t rows) const {
  std::size_t bytes = 0;
  for (ConvDirection direction : kConvDirections)
    bytes = std::max(bytes, workspace_for(lowering_for(driver, direction), rows));
  return bytes;
}

void ConvolutionLayer::use_layouts(const std::vector<Layout>& inputs,
                                   const std::vector<Layout>& outputs) {
  in_layout_ = inputs.empty() ? Layout::nchw : inputs[0];
  out_layout_ = outputs.empty() ? Layout::nchw : outputs[0];
}

Layout ConvolutionLayer::blocked_layout_used() const {
  return out_layout_ != Layout::nchw ? out_layout_ : in_layout_;
}

bool ConvolutionLayer::blocked_on(const Driver& driver) const {
  return blocked_layout_used() != Layout::nchw && driver.capabilities().blocked_layout;
}

namespace {

// The driver's own calls besides direct that take blocked operands as they are: on NCHW
// copies (direct_plain), its Winograd convolution, its pointwise one, or direct in FP32.
bool takes_blocked(Lowering lowering) {
  return lowering == Lowering::direct_plain || lowering == Lowering::winograd ||
         lowering == Lowering::pointwise || lowering == Lowering::direct_fp32;
}

}  // namespace

Lowering ConvolutionLayer::lowering_for(const Driver& driver, ConvDirection direction) const {
  const auto chosen = chosen_.find(driver.name());
  if (blocked_on(driver)) {
    // Blocked operands go to the driver's convolution, on them or on NCHW copies, or to its
    // Winograd convolution.
    if (takes_blocked(lowering_)) return lowering_;
    if (chosen != chosen_.end()) {
      const Lowering l = chosen->second[static_cast<std::size_t>(direction)];
      if (takes_blocked(l)) return l;
    }
    return Lowering::direct;
  }
  if (chosen != chosen_.end()) return chosen->second[static_cast<std::size_t>(direction)];
  if (lowering_ == Lowering::direct || takes_blocked(lowering_)) return lowering_;
  if (config_.lowering == Lowering::automatic && driver.capabilities().convolution) {
    return Lowering::direct;
  }
  return lowering_;
}

std::vector<Lowering> ConvolutionLayer::candidates(const Driver& driver) const {
  if (config_.lowering != Lowering::automatic) return {lowering_for(driver)};
  // The driver's kernels on the blocked operands, or on NCHW copies of them, or its
  // Winograd convolution.
  if (blocked_on(driver)) {
    std::vector<Lowering> result{Lowering::direct, Lowering::direct_plain};
    if (detail::conv_winograd().applies(*this, driver)) result.push_back(Lowering::winograd);
    if (detail::conv_pointwise().applies(*this, driver)) result.push_back(Lowering::pointwise);
    if (detail::conv_direct_fp32().applies(*this, driver)) result.push_back(Lowering::direct_fp32);
    return result;
  }
  // Otherwise every algorithm that can run this layer, in the list's order.
  std::vector<Lowering> result;
  for (const detail::ConvAlgorithm* algorithm : detail::conv_algorithms()) {
    if (algorithm->applies(*this, driver)) result.push_back(algorithm->id());
  }
  return result;
}

void ConvolutionLayer::choose(const Driver& driver, ConvDirection direction, Lowering lowering) {
  const std::vector<Lowering> allowed = candidates(driver);
  HN_CHECK(std::find(allowed.begin(), allowed.end(), lowering) != allowed.end(),
           "{}: lowering {} cannot run this layer on {}", describe(), hn::lowering_name(lowering),
           driver.name());
  auto found = chosen_.find(driver.name());
  if (found == chosen_.end()) {
    std::array<Lowering, 3> current{};
    for (ConvDirection d : kConvDirections)
      current[static_cast<std::size_t>(d)] = lowering_for(driver, d);
    found = chosen_.emplace(driver.name(), current).first;
  }
  found->second[static_cast<std::size_t>(direction)] = lowering;
}

double ConvolutionLayer::forward_flops(index_t rows) const {
  const ConvGeometry& geo = geometry_;
  return 2.0 * static_cast<double>(rows) * static_cast<double>(config_.num_output) *
         static_cast<double>(geo.out_h * geo.out_w) *
         static_cast<double>(geo.channels / config_.group * geo.kernel_h * geo.kernel_w);
}

std::string ConvolutionLayer::algorithm(const Driver& driver) const {
  const bool blocked = blocked_on(driver);
  const auto name = [&](Lowering l) -> std::string {
    if (blocked && l == Lowering::direct)
      return fmt::format("direct ({})", layout_name(blocked_layout_used()));
    return hn::lowering_name(l);
  };
  const Lowering forward = lowering_for(driver, ConvDirection::forward);
  const Lowering data = lowering_for(driver, ConvDirection::backward_data);
  const Lowering weights = lowering_for(driver, ConvDirection::backward_weights);
  std::string sum = folded_ ? fmt::format(", folded: BatchNorm '{}' + Scale '{}'",
                                          folded_->batch_norm, folded_->scale)
                            : "";
  if (residual_) sum += fmt::format(", fused: + Eltwise '{}'", residual_->sum);
  if (forward == data && data == weights) return name(forward) + sum;
  return fmt::format("forward {}, backward data {}, backward weights {}{}", name(forward),
                     name(data), name(weights), sum);
}

// ---- dispatch: what runs each direction, by conv_algorithm ------------------------------

namespace {

bool blocked_operands(const LayerSlice& slice) {
  return slice.inputs[0].layout != Layout::nchw || slice.outputs[0].layout != Layout::nchw;
}

}  // namespace

// The lowerings take NCHW only; blocked operands go to the driver's convolution (which
// rejects them where the driver has no blocked_layout capability), on them or on NCHW copies.
Lowering ConvolutionLayer::for_operands(const LayerSlice& slice, ConvDirection direction) const {
  const Lowering chosen = lowering_for(*slice.driver, direction);
  if (!blocked_operands(slice) || takes_blocked(chosen)) return chosen;
  return Lowering::direct;
}

void ConvolutionLayer::forward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  run_forward(slice, for_operands(slice, ConvDirection::forward));
}

void ConvolutionLayer::run_forward(const LayerSlice& slice, Lowering lowering) const {
  HN_CHECK(lowering != Lowering::automatic, "{}: forward called before setup", describe());
  HN_CHECK(!residual_ || slice.inputs.size() == 2,
           "{}: runs the sum '{}' as its calls and takes its other input second, got {} inputs",
           describe(), residual_ ? residual_->sum : "", slice.inputs.size());
  const detail::ConvAlgorithm& algorithm = detail::conv_algorithm(lowering);
  algorithm.forward(*this, slice);
  if (algorithm.applies_activation()) return;
  const Operand& y = slice.outputs[0];
  const index_t n = detail::slice_count(y.shape, slice.rows());
  if (residual_) {
    add_activate(*slice.driver, n, slice.inputs[1].x(), activation(), y.mutable_x());
  } else if (fused_) {
    apply_activation(*slice.driver, n, fused_->activation, y.mutable_x());
  }
}

// What the in-place layer's backward would do: dy (its output's gradient, the same memory
// as its input's) becomes its input's gradient.
// Written to `to` (dy itself, or the fused residual's gradient).
void ConvolutionLayer::activation_backward(const LayerSlice& slice, float* to) const {
  const Operand& y = slice.outputs[0];
  const index_t n = detail::slice_count(y.shape, slice.rows());
  const Activation& a = fused_->activation;
  if (a.kind == Activation::Kind::relu) slice.driver->relu_backward(n, a.slope, y.x(), y.dx(), to);
  if (a.kind == Activation::Kind::clip)
    detail::clip_backward_from_output(*slice.driver, n, a.lo, a.hi, y.x(), y.dx(), to);
}

// The fused ReLU's gradient written to `to` (dy itself, or the fused residual's gradient)
// and the bias gradient of the whole slice added from it, in one driver call.
void ConvolutionLayer::relu_bias_backward(const LayerSlice& slice, float* to) const {
  const Operand& y = slice.outputs[0];
  const AxisShape shape{slice.rows(), config_.num_output, geometry_.out_h * geometry_.out_w,
                        y.layout};
  slice.driver->relu_backward_bias(shape, fused_->activation.slope, y.x(), y.dx(), to,
                                   slice.params[1].mutable_dx());
}

// Adds the bias to output rows [first, first + images) of the slice, right after a chunk
// is computed, while it is still in cache.
void ConvolutionLayer::add_bias(const LayerSlice& slice, index_t first, index_t images) const {
  if (!has_bias()) return;
  const index_t plane = geometry_.out_h * geometry_.out_w;
  slice.driver->bias_forward(AxisShape{images, config_.num_output, plane}, slice.params[1].x(),
                             slice.outputs[0].mutable_x() + first * config_.num_output * plane);
}

// The gradients a backward call produces: dx where it is asked for and has memory, the
// parameter gradients where the caller passed their memory.
ConvolutionLayer::Wanted ConvolutionLayer::wanted(const LayerSlice& slice) const {
  return Wanted{!slice.propagate_down.empty() && slice.propagate_down[0] &&
                    slice.inputs[0].diff.address != nullptr,
                slice.params[0].diff.address != nullptr,
                has_bias() && slice.params[1].diff.address != nullptr};
}

bool ConvolutionLayer::wants_residual_gradient(const LayerSlice& slice) const {
  return residual_ && slice.inputs.size() == 2 && slice.propagate_down.size() == 2 &&
         slice.propagate_down[1] && slice.inputs[1].diff.address != nullptr;
}

// The fused activation's gradient first, then the convolution's.
void ConvolutionLayer::backward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  const Wanted want = wanted(slice);
  const bool relu = fused_ && fused_->activation.kind == Activation::Kind::relu;
  if (!wants_residual_gradient(slice)) {
    // On blocked operands, the ReLU's gradient and the bias's in one pass over dy (the
    // driver's convolutions would make a pass of their own for the bias).
    if (relu && want.db && blocked_operands(slice)) {
      relu_bias_backward(slice, slice.outputs[0].mutable_dx());
      run_gradients(slice, Wanted{want.dx, want.dw, false});
      return;
    }
    // A ReLU's gradient and both of the convolution's in one driver call, where one
    // algorithm computes both (a driver may then read dy once).
    if (relu) {
      const Lowering data = for_operands(slice, ConvDirection::backward_data);
      if (data == for_operands(slice, ConvDirection::backward_weights) &&
          detail::conv_algorithm(data).backward_relu(*this, slice, want,
                                                     fused_->activation.slope)) {
        return;
      }
    }
    if (fused_ && (want.dx || want.dw || want.db))
      activation_backward(slice, slice.outputs[0].mutable_dx());
    run_gradients(slice, want);
    return;
  }
  // The sum's inputs' gradient is its output's: the activation's input gradient goes
  // straight into the other input's, which the convolution's gradients then read as their
  // dy (one pass over it: neither the in-place write nor a copy after it).
  float* dr = slice.inputs[1].mutable_dx();
  LayerSlice through = slice;
  through.outputs[0].diff = slice.inputs[1].diff;
  if (relu && want.db) {
    relu_bias_backward(slice, dr);
    run_gradients(through, Wanted{want.dx, want.dw, false});
    return;
  }
  if (fused_) {
    activation_backward(slice, dr);
  } else {
    const Operand& y = slice.outputs[0];
    detail::copy_floats(*slice.driver, detail::slice_count(y.shape, slice.rows()), y.dx(), dr);
  }
  run_gradients(through, want);
}

// The data gradient and the parameter gradients may have different algorithms; the bias
// gradient goes with the weights'.
void ConvolutionLayer::run_gradients(const LayerSlice& slice, Wanted want) const {
  const Lowering data = for_operands(slice, ConvDirection::backward_data);
  const Lowering params = for_operands(slice, ConvDirection::backward_weights);
  if (data == params || !want.dx || !(want.dw || want.db)) {
    run_backward(slice, want.dx ? data : params, want);
    return;
  }
  run_backward(slice, params, Wanted{false, want.dw, want.db});
  run_backward(slice, data, Wanted{true, false, false});
}

// Every algorithm adds the bias gradient itself where `want` asks for it.
void ConvolutionLayer::run_backward(const LayerSlice& slice, Lowering lowering, Wanted want) const {
  if (!want.dx && !want.dw && !want.db) return;
  HN_CHECK(lowering != Lowering::automatic, "{}: backward called before setup", describe());
  detail::conv_algorithm(lowering).backward(*this, slice, want);
}

// Adds the bias gradient of the whole slice: dbias += sum of dy over images and positions.
void ConvolutionLayer::add_bias_gradient(const LayerSlice& slice) const {
  // A blocked dy (a bias learned with frozen weights) is summed in its layout.
  const AxisShape shape{slice.rows(), config_.num_output, geometry_.out_h * geometry_.out_w,
                        slice.outputs[0].layout};
  slice.driver->bias_backward(shape, slice.outputs[0].dx(), 1.0f, slice.params[1].mutable_dx());
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace detail {

ConvolutionParams convolution_params(const pb::LayerParameter& p) {
  const pb::ConvolutionParameter& c = p.convolution_param();
  // Inputs are N x C x H x W: axis -3 is axis 1 (Caffe's CanonicalAxisIndex).
  HN_CHECK(c.axis() == 1 || c.axis() == -3,
           "{}: axis {} is not supported (channels must be axis 1 of the 4-D input)", who(p),
           c.axis());
  ConvolutionParams params;
  params.num_output = c.num_output();
  params.bias_term = c.bias_term();
  params.kernel_size = to_indices(c.kernel_size());
  params.stride = to_indices(c.stride());
  params.pad = to_indices(c.pad());
  params.dilation = to_indices(c.dilation());
  // As Caffe: either of an _h/_w pair selects that form, the other taking its proto default.
  if (c.has_kernel_h() || c.has_kernel_w()) {
    params.kernel_h = c.kernel_h();
    params.kernel_w = c.kernel_w();
  }
  if (c.has_stride_h() || c.has_stride_w()) {
    params.stride_h = c.stride_h();
    params.stride_w = c.stride_w();
  }
  if (c.has_pad_h() || c.has_pad_w()) {
    params.pad_h = c.pad_h();
    params.pad_w = c.pad_w();
  }
  params.group = c.group();
  params.output_pad = to_indices(c.output_pad());
  return params;
}

}  // namespace detail

namespace {

using namespace detail;

std::unique_ptr<Layer> make_convolution(const pb::LayerParameter& p) {
  return std::make_unique<ConvolutionLayer>(p.name(), detail::convolution_params(p));
}

}  // namespace

LayerType convolution_layer_type() {
  LayerType type;
  type.name = "Convolution";
  type.make = make_convolution;
  type.fusion = FusionRole::conv;
  type.filler = [](const pb::LayerParameter& p, int index) {
    return index == 0 ? &p.convolution_param().weight_filler()
                      : &p.convolution_param().bias_filler();
  };
  // Cut by output channels: weights [num_output][C][kh][kw] and bias [num_output] by rows,
  // each part a convolution of the same input into its channels of the output.
  OutputCut cut;
  cut.outputs = [](const pb::LayerParameter& p) {
    return static_cast<index_t>(p.convolution_param().num_output());
  };
  cut.set_outputs = [](pb::LayerParameter& p, index_t count) {
    p.mutable_convolution_param()->set_num_output(static_cast<std::uint32_t>(count));
  };
  cut.param_axis = [](const pb::LayerParameter&, int) { return 0; };
  cut.input_axis = [](const pb::LayerParameter&) { return 1; };
  cut.output_axis = 1;
  cut.across_ranks = false;
  cut.refusal = [](const pb::LayerParameter& p) {
    return p.convolution_param().group() == 1
               ? std::string()
               : fmt::format("its {} groups would need each part to hold whole groups",
                             p.convolution_param().group());
  };
  type.cut = std::move(cut);
  return type;
}

}  // namespace hn
