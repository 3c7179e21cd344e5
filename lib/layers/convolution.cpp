// Convolution layer: Caffe's parameter rules, the lowering cost model, and the three ways to
// turn a convolution into GEMMs (CcT lowering types 1 and 3, and the 1x1 direct case), all
// through driver calls only.
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/registry.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "lib/core/check.h"
#include "lib/layers/common.h"

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

constexpr std::array<ConvDirection, 3> kDirections{
    ConvDirection::forward, ConvDirection::backward_data, ConvDirection::backward_weights};

// ---- chunking and cost model ----------------------------------------------------------
//
// Chunking (type 1 and type 3): a slice is lowered a chunk of images at a time, so the
// workspace stays bounded whatever the batch and the lowered data is read back by the
// GEMM soon after it is written. The chunk is the largest number of images whose lowered
// data fits kChunkTargetBytes (at least one image). 18 MiB was the best single target for
// forward and backward over CaffeNet's conv1..conv5 at batch 32 on the development
// machine (2 cores, 2 MiB L2 each, oneDNN sgemm; docs/layers.md): chunks of 1-2 images
// starve the GEMMs of 13x13 layers (169 columns per image, weights repacked per call),
// chunks beyond ~20 MiB spill the lowered matrix further out of cache.
constexpr std::size_t kChunkTargetBytes = std::size_t{18} << 20;
// Forward runs image by image when one image already lowers to this much (CaffeNet's conv2:
// 7 MB, 729 columns): its GEMM is large enough alone, and chunks of two measured ~8 %
// slower (the transpose to NCHW, and twice the lowered data out of cache). Backward keeps
// the chunks: its weight-gradient GEMM gains from the longer inner dimension.
constexpr std::size_t kLargeImageBytes = std::size_t{6} << 20;

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

std::size_t floats_bytes(index_t count) {
  return static_cast<std::size_t>(count) * sizeof(float);
}

// Workspace sub-buffers start on 64-byte boundaries (16 floats) so BLAS sees aligned rows.
index_t aligned(index_t floats) {
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

std::vector<Shape> ConvolutionLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const std::string who = describe();
  const Shape& in = inputs[0];
  HN_CHECK(in.axes() == 4, "{}: input must be 4-D (N x C x H x W), got {}", who, in.to_string());
  const ConvolutionParams& p = config_;
  HN_CHECK(p.kernel_size.size() > 0 || p.kernel_h.has_value(),
           "{}: kernel_size (or kernel_h and kernel_w) must be given", who);
  std::tie(kernel_h_, kernel_w_) =
      resolve_pair(who, "kernel", p.kernel_size, p.kernel_h, p.kernel_w, 0);
  std::tie(stride_h_, stride_w_) = resolve_pair(who, "stride", p.stride, p.stride_h, p.stride_w, 1);
  std::tie(pad_h_, pad_w_) = resolve_pair(who, "pad", p.pad, p.pad_h, p.pad_w, 0);
  dilation_h_ = repeated(who, "dilation", p.dilation, 0, 1);
  dilation_w_ = repeated(who, "dilation", p.dilation, 1, 1);
  HN_CHECK(kernel_h_ > 0 && kernel_w_ > 0, "{}: kernel must be > 0, got {}x{}", who, kernel_h_,
           kernel_w_);
  HN_CHECK(stride_h_ > 0 && stride_w_ > 0, "{}: stride must be > 0, got {}x{}", who, stride_h_,
           stride_w_);
  HN_CHECK(pad_h_ >= 0 && pad_w_ >= 0, "{}: pad must be >= 0, got {}x{}", who, pad_h_, pad_w_);
  HN_CHECK(dilation_h_ > 0 && dilation_w_ > 0, "{}: dilation must be > 0, got {}x{}", who,
           dilation_h_, dilation_w_);
  HN_CHECK(p.num_output > 0, "{}: num_output must be > 0, got {}", who, p.num_output);
  HN_CHECK(p.group > 0, "{}: group must be > 0, got {}", who, p.group);

  if (channels_ != in[1] || height_ != in[2] || width_ != in[3]) chosen_.clear();
  channels_ = in[1];
  height_ = in[2];
  width_ = in[3];
  HN_CHECK(channels_ > 0 && height_ > 0 && width_ > 0,
           "{}: input {} has an empty channel or spatial axis", who, in.to_string());
  HN_CHECK(channels_ % p.group == 0, "{}: input channels {} not divisible by group {} (input {})",
           who, channels_, p.group, in.to_string());
  HN_CHECK(p.num_output % p.group == 0, "{}: num_output {} not divisible by group {}", who,
           p.num_output, p.group);
  const index_t extent_h = dilation_h_ * (kernel_h_ - 1) + 1;
  const index_t extent_w = dilation_w_ * (kernel_w_ - 1) + 1;
  HN_CHECK(extent_h <= height_ + 2 * pad_h_ && extent_w <= width_ + 2 * pad_w_,
           "{}: kernel {}x{} (dilated {}x{}) larger than the padded input {}x{} (input {})", who,
           kernel_h_, kernel_w_, extent_h, extent_w, height_ + 2 * pad_h_, width_ + 2 * pad_w_,
           in.to_string());
  out_h_ = (height_ + 2 * pad_h_ - extent_h) / stride_h_ + 1;
  out_w_ = (width_ + 2 * pad_w_ - extent_w) / stride_w_ + 1;

  const bool one_by_one = kernel_h_ == 1 && kernel_w_ == 1 && stride_h_ == 1 && stride_w_ == 1 &&
                          pad_h_ == 0 && pad_w_ == 0;
  switch (p.lowering) {
    case Lowering::type3:
      HN_CHECK(p.group == 1, "{}: lowering type3 needs group 1, got group {}", who, p.group);
      break;
    case Lowering::direct_1x1:
      HN_CHECK(one_by_one,
               "{}: lowering direct_1x1 needs a 1x1 kernel, stride 1 and pad 0, got kernel {}x{} "
               "stride {}x{} pad {}x{}",
               who, kernel_h_, kernel_w_, stride_h_, stride_w_, pad_h_, pad_w_);
      break;
    case Lowering::type1:
    case Lowering::automatic:
    case Lowering::direct:
    case Lowering::direct_plain:
      break;
  }
  lowering_ = p.lowering;
  if (lowering_ == Lowering::automatic) {
    // Costs per image (see the cost model above), type 1 with the chunk a batch of 32
    // would get; the input read and output write that all lowerings share are left out.
    const index_t rows = channels_ / p.group * kernel_h_ * kernel_w_;  // K of one group
    const index_t m = p.num_output / p.group, out_plane = out_h_ * out_w_;
    const index_t in_plane = height_ * width_, kernel = kernel_h_ * kernel_w_;
    const double flops1 = 2.0 * p.num_output * out_plane * rows;
    const index_t chunk1 = forward_chunk(32);
    const double bytes1 = 2.0 * floats_bytes(rows * p.group * out_plane) +
                          (chunk1 > 1 ? 2.0 * floats_bytes(p.num_output * out_plane) : 0.0);
    double best = flops1 / gemm_efficiency(m, chunk1 * out_plane, rows) + kFlopsPerByte * bytes1;
    lowering_ = Lowering::type1;
    if (p.group == 1) {
      const double flops3 = 2.0 * in_plane * channels_ * p.num_output * kernel;
      const double bytes3 = 2.0 * floats_bytes(in_plane * channels_) +
                            2.0 * floats_bytes(in_plane * p.num_output * kernel);
      const double cost3 = flops3 / gemm_efficiency(in_plane, p.num_output * kernel, channels_) +
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

  const Shape weight_shape{p.num_output, channels_ / p.group, kernel_h_, kernel_w_};
  const std::size_t param_count = p.bias_term ? 2 : 1;
  if (params_.size() != param_count || params_[0].shape() != weight_shape) {
    params_.clear();
    params_.emplace_back(weight_shape);
    if (p.bias_term) params_.emplace_back(Shape{p.num_output});
  }
  return {Shape{in[0], p.num_output, out_h_, out_w_}};
}

LoweringShape ConvolutionLayer::lowering_shape(index_t images) const {
  LoweringShape s;
  s.batch = images;
  s.channels = channels_;
  s.height = height_;
  s.width = width_;
  s.kernel_h = kernel_h_;
  s.kernel_w = kernel_w_;
  s.pad_h = pad_h_;
  s.pad_w = pad_w_;
  s.stride_h = stride_h_;
  s.stride_w = stride_w_;
  s.dilation_h = dilation_h_;
  s.dilation_w = dilation_w_;
  s.groups = config_.group;
  return s;
}

// Per-image lowered bytes: type 1 columns, or type 3 products and NHWC input.
std::size_t ConvolutionLayer::lowered_bytes_per_image(Lowering lowering) const {
  return floats_bytes(lowering == Lowering::type3
                          ? height_ * width_ *
                                (config_.num_output * kernel_h_ * kernel_w_ + channels_)
                          : channels_ * kernel_h_ * kernel_w_ * out_h_ * out_w_);
}

index_t ConvolutionLayer::chunk_for(Lowering lowering, index_t rows, std::size_t target) const {
  if (lowering == Lowering::direct_1x1 || rows <= 1) return 1;
  const index_t fit = static_cast<index_t>(target / lowered_bytes_per_image(lowering));
  return std::clamp<index_t>(fit, 1, rows);
}

index_t ConvolutionLayer::forward_chunk(Lowering lowering, index_t rows) const {
  if (config_.chunk_bytes > 0) return chunk_for(lowering, rows, config_.chunk_bytes);
  if (lowered_bytes_per_image(lowering) >= kLargeImageBytes) return 1;
  return chunk_for(lowering, rows, kChunkTargetBytes);
}

index_t ConvolutionLayer::backward_chunk(Lowering lowering, index_t rows) const {
  return chunk_for(lowering, rows,
                   config_.chunk_bytes > 0 ? config_.chunk_bytes : kChunkTargetBytes);
}

index_t ConvolutionLayer::forward_chunk(index_t rows) const {
  return forward_chunk(lowering_, rows);
}

index_t ConvolutionLayer::backward_chunk(index_t rows) const {
  return backward_chunk(lowering_, rows);
}

std::size_t ConvolutionLayer::workspace_for(Lowering lowering, index_t rows) const {
  if (rows <= 0) return 0;
  const index_t chunk = std::max(forward_chunk(lowering, rows), backward_chunk(lowering, rows));
  const index_t out_plane = out_h_ * out_w_, kernel = kernel_h_ * kernel_w_;
  switch (lowering) {
    case Lowering::type1: {
      // columns, plus the GEMM output / transposed dy in [C_out][chunk][plane] order
      const index_t columns = aligned(channels_ * kernel * chunk * out_plane);
      const index_t swapped = chunk > 1 ? aligned(config_.num_output * chunk * out_plane) : 0;
      return floats_bytes(columns + swapped);
    }
    case Lowering::type3: {
      // kernel in [C][C_out * k] order, its gradient, NHWC input, products
      const index_t in_plane = height_ * width_;
      const index_t weights = aligned(channels_ * config_.num_output * kernel);
      return floats_bytes(2 * weights + aligned(chunk * in_plane * channels_) +
                          aligned(chunk * in_plane * config_.num_output * kernel));
    }
    case Lowering::direct_1x1:
    case Lowering::automatic:
    case Lowering::direct:
    case Lowering::direct_plain:
      break;
  }
  return 0;
}

std::size_t ConvolutionLayer::workspace_bytes(const Driver& driver, index_t rows) const {
  std::size_t bytes = 0;
  for (ConvDirection direction :
       {ConvDirection::forward, ConvDirection::backward_data, ConvDirection::backward_weights})
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

Lowering ConvolutionLayer::lowering_for(const Driver& driver, ConvDirection direction) const {
  const auto chosen = chosen_.find(driver.name());
  if (blocked_on(driver)) {
    // Blocked operands go to the driver's convolution, on them or on NCHW copies.
    if (lowering_ == Lowering::direct_plain) return Lowering::direct_plain;
    if (chosen != chosen_.end() &&
        chosen->second[static_cast<std::size_t>(direction)] == Lowering::direct_plain) {
      return Lowering::direct_plain;
    }
    return Lowering::direct;
  }
  if (chosen != chosen_.end()) return chosen->second[static_cast<std::size_t>(direction)];
  if (lowering_ == Lowering::direct || lowering_ == Lowering::direct_plain) return lowering_;
  if (config_.lowering == Lowering::automatic && driver.capabilities().convolution) {
    return Lowering::direct;
  }
  return lowering_;
}

std::vector<Lowering> ConvolutionLayer::candidates(const Driver& driver) const {
  if (config_.lowering != Lowering::automatic) return {lowering_for(driver)};
  // The driver's kernels on the blocked operands, or on NCHW copies of them.
  if (blocked_on(driver)) return {Lowering::direct, Lowering::direct_plain};
  std::vector<Lowering> result;
  if (driver.capabilities().convolution) result.push_back(Lowering::direct);
  // A driver with blocked kernels may also run NCHW ones (oneDNN's GEMM-based).
  if (driver.capabilities().convolution && driver.capabilities().blocked_layout)
    result.push_back(Lowering::direct_plain);
  result.push_back(Lowering::type1);
  if (config_.group == 1) result.push_back(Lowering::type3);
  if (kernel_h_ == 1 && kernel_w_ == 1 && stride_h_ == 1 && stride_w_ == 1 && pad_h_ == 0 &&
      pad_w_ == 0) {
    result.push_back(Lowering::direct_1x1);
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
    for (ConvDirection d : kDirections)
      current[static_cast<std::size_t>(d)] = lowering_for(driver, d);
    found = chosen_.emplace(driver.name(), current).first;
  }
  found->second[static_cast<std::size_t>(direction)] = lowering;
}

double ConvolutionLayer::forward_flops(index_t rows) const {
  return 2.0 * static_cast<double>(rows) * static_cast<double>(config_.num_output) *
         static_cast<double>(out_h_ * out_w_) *
         static_cast<double>(channels_ / config_.group * kernel_h_ * kernel_w_);
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
  if (forward == data && data == weights) return name(forward);
  return fmt::format("forward {}, backward data {}, backward weights {}", name(forward), name(data),
                     name(weights));
}

namespace {

// A candidate whose scratch would exceed this is not measured (type 3 of a large early layer
// asks for gigabytes); the cost model would not pick it either.
constexpr std::size_t kMaxTuneWorkspace = std::size_t{512} << 20;

// Deterministic values in [-1, 1) for the tensors the measurements run on.
std::vector<float> tune_values(index_t count, std::uint32_t seed) {
  std::vector<float> values(static_cast<std::size_t>(count));
  std::uint32_t state = seed * 2654435761u + 1u;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return values;
}

Buffer tune_buffer(Driver& driver, index_t count, std::uint32_t seed) {
  Buffer buffer(driver, floats_bytes(count));
  if (count == 0) return buffer;
  if (seed == 0) {
    driver.fill(count, 0.0f, buffer.as<float>());
  } else {
    const std::vector<float> values = tune_values(count, seed);
    driver.copy_from_host(buffer.address(), values.data(), buffer.bytes());
  }
  return buffer;
}

}  // namespace

void ConvolutionLayer::tune(Driver& driver, index_t rows, Tuner& tuner) {
  if (tuner.mode() == TuneMode::off || rows <= 0) return;
  const bool blocked = blocked_on(driver);
  std::vector<Lowering> options = candidates(driver);
  options.erase(
      std::remove_if(options.begin(), options.end(),
                     [&](Lowering l) { return workspace_for(l, rows) > kMaxTuneWorkspace; }),
      options.end());
  if (options.size() < 2) return;
  const std::string shape = fmt::format(
      "Convolution {}x{}x{}x{} out {} kernel {}x{} stride {}x{} pad {}x{} dilation {}x{} group "
      "{} bias {}",
      rows, channels_, height_, width_, config_.num_output, kernel_h_, kernel_w_, stride_h_,
      stride_w_, pad_h_, pad_w_, dilation_h_, dilation_w_, config_.group,
      config_.bias_term ? 1 : 0);
  // Blocked operands: their layouts (input, output) are part of the shape.
  const std::string layouts =
      blocked ? fmt::format(" layout {}/{}", layout_name(in_layout_), layout_name(out_layout_))
              : std::string();
  const auto key = [&](ConvDirection d) { return shape + layouts + " " + direction_name(d); };
  std::array<Lowering, 3> choice{};
  bool cached = true;
  for (ConvDirection d : kDirections) {
    const std::optional<std::string> hit = tuner.lookup(driver, key(d));
    const auto known = std::find_if(options.begin(), options.end(), [&](Lowering l) {
      return hit.has_value() && *hit == hn::lowering_name(l);
    });
    if (known == options.end()) {
      cached = false;
      break;
    }
    choice[static_cast<std::size_t>(d)] = *known;
  }
  const auto started = std::chrono::steady_clock::now();
  if (!cached) {
    const index_t in_count = rows * channels_ * height_ * width_;
    const index_t out_count = rows * config_.num_output * out_h_ * out_w_;
    const index_t weight_count = params_[0].shape().count();
    const index_t bias_count = config_.bias_term ? config_.num_output : 0;
    std::size_t scratch = 0;
    for (Lowering l : options)
      scratch = std::max(scratch, workspace_for(l, rows));
    // y and dx are only written (by different directions): they share one buffer, which
    // keeps the measurements' memory below the net's own for its largest layers.
    const Buffer x = tune_buffer(driver, in_count, 1), dy = tune_buffer(driver, out_count, 2);
    const Buffer written = tune_buffer(driver, std::max(in_count, out_count), 0);
    const Buffer w = tune_buffer(driver, weight_count, 3),
                 dw = tune_buffer(driver, weight_count, 0);
    const Buffer b = tune_buffer(driver, bias_count, 4), db = tune_buffer(driver, bias_count, 0);
    const Buffer workspace(driver, scratch);
    LayerSlice slice;
    slice.driver = &driver;
    slice.end = rows;
    slice.inputs = {Operand{Shape{rows, channels_, height_, width_}, x.pointer(), written.pointer(),
                            blocked ? in_layout_ : Layout::nchw}};
    slice.outputs = {Operand{Shape{rows, config_.num_output, out_h_, out_w_}, written.pointer(),
                             dy.pointer(), blocked ? out_layout_ : Layout::nchw}};
    slice.params = {Operand{params_[0].shape(), w.pointer(), dw.pointer()}};
    if (config_.bias_term)
      slice.params.push_back(Operand{params_[1].shape(), b.pointer(), db.pointer()});
    slice.propagate_down = {true};
    slice.workspace = workspace.pointer();
    for (ConvDirection d : kDirections) {
      double best = 0.0;
      for (Lowering l : options) {
        // A candidate whose warm-up alone takes 1.5 times the best is not timed again.
        const double give_up = l == options.front() ? 0.5 : std::min(0.5, 1.5 * best);
        const double seconds = Tuner::time(
            driver,
            [&] {
              switch (d) {
                case ConvDirection::forward:
                  run_forward(slice, l);
                  break;
                case ConvDirection::backward_data:
                  run_backward(slice, l, Wanted{true, false, false});
                  break;
                case ConvDirection::backward_weights:
                  run_backward(slice, l, Wanted{false, true, config_.bias_term});
                  break;
              }
            },
            2, give_up);
        if (l == options.front() || seconds < best) {
          best = seconds;
          choice[static_cast<std::size_t>(d)] = l;
        }
      }
    }
  }
  // Under data parallelism every rank takes rank 0's choice (TuneOptions::agree).
  for (ConvDirection d : kDirections) {
    Lowering& mine = choice[static_cast<std::size_t>(d)];
    const std::string agreed = tuner.agree(hn::lowering_name(mine));
    const auto known = std::find_if(options.begin(), options.end(),
                                    [&](Lowering l) { return agreed == hn::lowering_name(l); });
    HN_CHECK(known != options.end(),
             "{}: the {} algorithm agreed on, '{}', is not one that {} has for this shape",
             describe(), direction_name(d), agreed, driver.name());
    if (!cached || *known != mine) tuner.record(driver, key(d), agreed);
    mine = *known;
  }
  chosen_[driver.name()] = choice;
  TuneReport report;
  report.layer = name();
  report.device = driver.name();
  report.algorithm = algorithm(driver);
  report.measured = !cached;
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  tuner.report(report);
}

// ---- direct: the driver's own convolution ----------------------------------------------

LoweringShape ConvolutionLayer::direct_shape(const LayerSlice& slice, bool plain_kernel) const {
  LoweringShape shape = lowering_shape(slice.rows());
  shape.layout = slice.inputs[0].layout;
  shape.out_layout = slice.outputs[0].layout;
  shape.plain_kernel = plain_kernel;
  return shape;
}

void ConvolutionLayer::forward_driver_conv(const LayerSlice& slice, bool plain_kernel) const {
  const float* bias = config_.bias_term ? slice.params[1].x() : nullptr;
  slice.driver->conv_forward(direct_shape(slice, plain_kernel), config_.num_output,
                             slice.inputs[0].x(), slice.params[0].x(), bias,
                             slice.outputs[0].mutable_x());
}

void ConvolutionLayer::backward_driver_conv(const LayerSlice& slice, Wanted want,
                                            bool plain_kernel) const {
  const LoweringShape shape = direct_shape(slice, plain_kernel);
  const Operand& weights = slice.params[0];
  float* dbias = want.db ? slice.params[1].mutable_dx() : nullptr;
  if (want.dw && want.dx) {
    slice.driver->conv_backward(shape, config_.num_output, slice.inputs[0].x(), weights.x(),
                                slice.outputs[0].dx(), slice.inputs[0].mutable_dx(),
                                weights.mutable_dx(), dbias);
    return;
  }
  if (want.dw) {
    slice.driver->conv_backward_weights(shape, config_.num_output, slice.inputs[0].x(),
                                        slice.outputs[0].dx(), weights.mutable_dx(), dbias);
  } else if (want.db) {
    add_bias_gradient(slice);
  }
  if (want.dx) {
    slice.driver->conv_backward_data(shape, config_.num_output, weights.x(), slice.outputs[0].dx(),
                                     slice.inputs[0].mutable_dx());
  }
}

namespace {

bool blocked_operands(const LayerSlice& slice) {
  return slice.inputs[0].layout != Layout::nchw || slice.outputs[0].layout != Layout::nchw;
}

}  // namespace

// The lowerings take NCHW only; blocked operands go to the driver's convolution (which
// rejects them where the driver has no blocked_layout capability), on them or on NCHW copies.
Lowering ConvolutionLayer::for_operands(const LayerSlice& slice, ConvDirection direction) const {
  const Lowering chosen = lowering_for(*slice.driver, direction);
  if (!blocked_operands(slice) || chosen == Lowering::direct_plain) return chosen;
  return Lowering::direct;
}

void ConvolutionLayer::forward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  run_forward(slice, for_operands(slice, ConvDirection::forward));
}

void ConvolutionLayer::run_forward(const LayerSlice& slice, Lowering lowering) const {
  switch (lowering) {
    case Lowering::direct:
    case Lowering::direct_plain:
      forward_driver_conv(slice, lowering == Lowering::direct_plain);
      break;
    case Lowering::type1:
      forward_type1(slice);
      break;
    case Lowering::type3:
      forward_type3(slice);
      break;
    case Lowering::direct_1x1:
      forward_direct(slice);
      break;
    case Lowering::automatic:
      detail::fail("{}: forward called before setup", describe());
  }
}

// Adds the bias to output rows [first, first + images) of the slice, right after a chunk
// is computed, while it is still in cache.
void ConvolutionLayer::add_bias(const LayerSlice& slice, index_t first, index_t images) const {
  if (!config_.bias_term) return;
  const index_t plane = out_h_ * out_w_;
  slice.driver->bias_forward(AxisShape{images, config_.num_output, plane}, slice.params[1].x(),
                             slice.outputs[0].mutable_x() + first * config_.num_output * plane);
}

// The gradients a backward call produces: dx where it is asked for and has memory, the
// parameter gradients where the caller passed their memory.
ConvolutionLayer::Wanted ConvolutionLayer::wanted(const LayerSlice& slice) const {
  return Wanted{!slice.propagate_down.empty() && slice.propagate_down[0] &&
                    slice.inputs[0].diff.address != nullptr,
                slice.params[0].diff.address != nullptr,
                config_.bias_term && slice.params[1].diff.address != nullptr};
}

// The data gradient and the parameter gradients may have different algorithms; the bias
// gradient goes with the weights'.
void ConvolutionLayer::backward(const LayerSlice& slice) {
  if (slice.rows() == 0) return;
  const Wanted want = wanted(slice);
  const Lowering data = for_operands(slice, ConvDirection::backward_data);
  const Lowering params = for_operands(slice, ConvDirection::backward_weights);
  if (data == params || !want.dx || !(want.dw || want.db)) {
    run_backward(slice, want.dx ? data : params, want);
    return;
  }
  run_backward(slice, params, Wanted{false, want.dw, want.db});
  run_backward(slice, data, Wanted{true, false, false});
}

void ConvolutionLayer::run_backward(const LayerSlice& slice, Lowering lowering, Wanted want) const {
  if (!want.dx && !want.dw && !want.db) return;
  switch (lowering) {
    case Lowering::direct:
    case Lowering::direct_plain:
      // adds the bias gradient itself
      backward_driver_conv(slice, want, lowering == Lowering::direct_plain);
      return;
    case Lowering::type1:
      backward_type1(slice, want);  // adds the bias gradient chunk by chunk
      return;
    case Lowering::type3:
      backward_type3(slice, want);
      break;
    case Lowering::direct_1x1:
      backward_direct(slice, want);
      break;
    case Lowering::automatic:
      detail::fail("{}: backward called before setup", describe());
  }
  if (want.db) add_bias_gradient(slice);
}

// Adds the bias gradient of the whole slice: dbias += sum of dy over images and positions.
void ConvolutionLayer::add_bias_gradient(const LayerSlice& slice) const {
  // A blocked dy (a bias learned with frozen weights) is summed in its layout.
  const AxisShape shape{slice.rows(), config_.num_output, out_h_ * out_w_, slice.outputs[0].layout};
  slice.driver->bias_backward(shape, slice.outputs[0].dx(), 1.0f, slice.params[1].mutable_dx());
}

// ---- type 1: im2col over a chunk, one GEMM per group, lift to NCHW ---------------------
//
// The lowered chunk is [C*kh*kw][chunk*plane]; group g's rows are the contiguous block g,
// so group g's GEMM is weights_g [M/g x K/g] times columns_g [K/g x chunk*plane], giving
// [C_out][chunk][plane]. With one image per chunk that already is NCHW and the GEMM writes
// the output directly; otherwise swap_axes moves it into place.

void ConvolutionLayer::forward_type1(const LayerSlice& slice) const {
  Driver& d = *slice.driver;
  const index_t rows = slice.rows(), chunk = forward_chunk(Lowering::type1, rows);
  const index_t groups = config_.group, m = config_.num_output / groups;
  const index_t k = channels_ / groups * kernel_h_ * kernel_w_;
  const index_t out_plane = out_h_ * out_w_, in_image = channels_ * height_ * width_;
  const index_t out_image = config_.num_output * out_plane;
  Carver carve(slice.workspace, workspace_for(Lowering::type1, rows), describe());
  float* columns = carve.take(k * groups * chunk * out_plane);
  float* swapped = chunk > 1 ? carve.take(config_.num_output * chunk * out_plane) : nullptr;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  const float* weights = slice.params[0].x();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = lowering_shape(images);
    d.im2col(s, x + first * in_image, columns);
    const index_t n = images * out_plane;
    float* product = images > 1 ? swapped : y + first * out_image;
    for (index_t g = 0; g < groups; ++g) {
      d.gemm(Transpose::no, Transpose::no, m, n, k, 1.0f, weights + g * m * k, k,
             columns + g * k * n, n, 0.0f, product + g * m * n, n);
    }
    if (images > 1) {
      d.swap_axes(config_.num_output, images, out_plane, swapped, y + first * out_image);
    }
    add_bias(slice, first, images);
  }
}

void ConvolutionLayer::backward_type1(const LayerSlice& slice, Wanted want) const {
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const auto [want_dx, want_dw, want_db] = want;
  const index_t rows = slice.rows(), chunk = backward_chunk(Lowering::type1, rows);
  const index_t groups = config_.group, m = config_.num_output / groups;
  const index_t k = channels_ / groups * kernel_h_ * kernel_w_;
  const index_t out_plane = out_h_ * out_w_, in_image = channels_ * height_ * width_;
  const index_t out_image = config_.num_output * out_plane;
  Carver carve(slice.workspace, workspace_for(Lowering::type1, rows), describe());
  float* columns = carve.take(k * groups * chunk * out_plane);
  float* swapped = chunk > 1 ? carve.take(config_.num_output * chunk * out_plane) : nullptr;
  const float* dy = slice.outputs[0].dx();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = lowering_shape(images);
    const index_t n = images * out_plane;
    const float* dy_t = dy + first * out_image;  // [C_out][images][plane]
    if (images > 1) {
      d.swap_axes(images, config_.num_output, out_plane, dy_t, swapped);
      dy_t = swapped;
    }
    if (want_db) {  // dy_t viewed as [1][C_out][images * plane]
      d.bias_backward(AxisShape{1, config_.num_output, n}, dy_t, 1.0f,
                      slice.params[1].mutable_dx());
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

// ---- type 3: lower the kernel, lift the output (group 1) -----------------------------
//
// With the input in NHWC order X^T [(n,h,w)][C] and the kernel as W' [C][(co,kh,kw)], the
// products P = X^T W' hold every kernel tap applied at every input pixel; lift sums the
// taps that land on each output pixel. Backward: dP = lift_backward(dy), dW' += X dP,
// dX^T = dP W'^T.

void ConvolutionLayer::forward_type3(const LayerSlice& slice) const {
  Driver& d = *slice.driver;
  const index_t rows = slice.rows(), chunk = forward_chunk(Lowering::type3, rows);
  const index_t c = channels_, taps = config_.num_output * kernel_h_ * kernel_w_;
  const index_t in_plane = height_ * width_, in_image = c * in_plane;
  const index_t out_image = config_.num_output * out_h_ * out_w_;
  Carver carve(slice.workspace, workspace_for(Lowering::type3, rows), describe());
  float* kernel = carve.take(c * taps);
  carve.take(c * taps);  // the kernel gradient's place, used by backward
  float* x_t = carve.take(chunk * in_plane * c);
  float* products = carve.take(chunk * in_plane * taps);
  d.swap_axes(config_.num_output, c, kernel_h_ * kernel_w_, slice.params[0].x(), kernel);
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    for (index_t i = 0; i < images; ++i) {
      d.swap_axes(c, in_plane, 1, x + (first + i) * in_image, x_t + i * in_image);
    }
    d.gemm(Transpose::no, Transpose::no, images * in_plane, taps, c, 1.0f, x_t, c, kernel, taps,
           0.0f, products, taps);
    const LoweringShape s = lowering_shape(images);
    d.lift(s, config_.num_output, products, y + first * out_image);
    add_bias(slice, first, images);
  }
}

void ConvolutionLayer::backward_type3(const LayerSlice& slice, Wanted want) const {
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const bool want_dx = want.dx, want_dw = want.dw;
  if (!want_dx && !want_dw) return;
  const index_t rows = slice.rows(), chunk = backward_chunk(Lowering::type3, rows);
  const index_t c = channels_, kernel_taps = kernel_h_ * kernel_w_;
  const index_t taps = config_.num_output * kernel_taps;
  const index_t in_plane = height_ * width_, in_image = c * in_plane;
  const index_t out_image = config_.num_output * out_h_ * out_w_;
  Carver carve(slice.workspace, workspace_for(Lowering::type3, rows), describe());
  float* kernel = carve.take(c * taps);
  float* kernel_diff = carve.take(c * taps);
  float* x_t = carve.take(chunk * in_plane * c);
  float* products_diff = carve.take(chunk * in_plane * taps);
  if (want_dx) d.swap_axes(config_.num_output, c, kernel_taps, weights.x(), kernel);
  // dW accumulates: bring it into W' order, add every chunk's part, move it back.
  if (want_dw) d.swap_axes(config_.num_output, c, kernel_taps, weights.dx(), kernel_diff);
  const float* dy = slice.outputs[0].dx();
  for (index_t first = 0; first < rows; first += chunk) {
    const index_t images = std::min(chunk, rows - first);
    const LoweringShape s = lowering_shape(images);
    d.lift_backward(s, config_.num_output, dy + first * out_image, products_diff);
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
  if (want_dw) d.swap_axes(c, config_.num_output, kernel_taps, kernel_diff, weights.mutable_dx());
}

// ---- direct 1x1: each image [C][plane] already is the lowered matrix ----------------

void ConvolutionLayer::forward_direct(const LayerSlice& slice) const {
  Driver& d = *slice.driver;
  const index_t groups = config_.group, m = config_.num_output / groups, k = channels_ / groups;
  const index_t plane = out_h_ * out_w_;
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  const float* weights = slice.params[0].x();
  for (index_t i = 0; i < slice.rows(); ++i) {
    for (index_t g = 0; g < groups; ++g) {
      d.gemm(Transpose::no, Transpose::no, m, plane, k, 1.0f, weights + g * m * k, k,
             x + (i * channels_ + g * k) * plane, plane, 0.0f,
             y + (i * config_.num_output + g * m) * plane, plane);
    }
    add_bias(slice, i, 1);
  }
}

void ConvolutionLayer::backward_direct(const LayerSlice& slice, Wanted want) const {
  Driver& d = *slice.driver;
  const Operand& in = slice.inputs[0];
  const Operand& weights = slice.params[0];
  const bool want_dx = want.dx, want_dw = want.dw;
  const index_t groups = config_.group, m = config_.num_output / groups, k = channels_ / groups;
  const index_t plane = out_h_ * out_w_;
  const float* dy = slice.outputs[0].dx();
  for (index_t i = 0; i < slice.rows(); ++i) {
    for (index_t g = 0; g < groups; ++g) {
      const float* dy_g = dy + (i * config_.num_output + g * m) * plane;
      const index_t x_offset = (i * channels_ + g * k) * plane;
      if (want_dw) {
        d.gemm(Transpose::no, Transpose::yes, m, k, plane, 1.0f, dy_g, plane, in.x() + x_offset,
               plane, 1.0f, weights.mutable_dx() + g * m * k, k);
      }
      if (want_dx) {
        d.gemm(Transpose::yes, Transpose::no, k, plane, m, 1.0f, weights.x() + g * m * k, k, dy_g,
               plane, 0.0f, in.mutable_dx() + x_offset, plane);
      }
    }
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_convolution(const pb::LayerParameter& p) {
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
  return std::make_unique<ConvolutionLayer>(p.name(), std::move(params));
}

}  // namespace

LayerType convolution_layer_type() {
  LayerType type;
  type.name = "Convolution";
  type.make = make_convolution;
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
