// Validation and derived sizes of the driver parameter structs.
#include "lib/core/shapes.h"

#include <cctype>
#include <cmath>

#include "lib/core/check.h"

namespace hn {

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::tf32:
      return "TF32";
    case MathMode::bf16:
      return "BF16";
    case MathMode::fp32:
      break;
  }
  return "FP32";
}

MathMode parse_math_mode(const std::string& text) {
  std::string upper = text;
  for (char& c : upper)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const MathMode mode : {MathMode::fp32, MathMode::tf32, MathMode::bf16}) {
    if (upper == math_mode_name(mode)) return mode;
  }
  detail::fail("math mode '{}': expected FP32, TF32 or BF16", text);
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::nchw16c:
      return "nChw16c";
    case Layout::nchw8c:
      return "nChw8c";
    case Layout::nchw:
      break;
  }
  return "NCHW";
}

namespace {

// " layout=nChw16c" (or nChw8c) after a shape's fields when it is not NCHW.
std::string layout_suffix(const char* field, Layout layout) {
  return layout == Layout::nchw ? std::string() : fmt::format(" {}={}", field, layout_name(layout));
}

void check_layout(const char* call, const char* field, Layout layout, index_t channels,
                  const std::string& shape) {
  HN_CHECK(channels % layout_block(layout) == 0,
           "{}: {} {} needs channels in multiples of {}, got {} ({})", call, field,
           layout_name(layout), layout_block(layout), channels, shape);
}

}  // namespace

index_t LoweringShape::out_h() const {
  return (height + 2 * pad_h - (dilation_h * (kernel_h - 1) + 1)) / stride_h + 1;
}
index_t LoweringShape::out_w() const {
  return (width + 2 * pad_w - (dilation_w * (kernel_w - 1) + 1)) / stride_w + 1;
}

void Activation::validate(const char* call) const {
  HN_CHECK(kind != Kind::clip || lo <= hi, "{}: activation {}: lo must be <= hi", call,
           to_string());
}

std::string Activation::to_string() const {
  switch (kind) {
    case Kind::none:
      return "none";
    case Kind::relu:
      return fmt::format("relu slope {}", slope);
    case Kind::clip:
      return fmt::format("clip [{}, {}]", lo, hi);
  }
  return "?";
}

std::string LoweringShape::to_string() const {
  return fmt::format(
             "batch={} channels={} height={} width={} kernel={}x{} pad={}x{} stride={}x{} "
             "dilation={}x{} groups={}",
             batch, channels, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w,
             dilation_h, dilation_w, groups) +
         layout_suffix("layout", layout) + layout_suffix("out_layout", out_layout) +
         (plain_kernel ? " plain_kernel" : "") + (fp32_kernel ? " fp32_kernel" : "");
}

void LoweringShape::validate(const char* call) const {
  HN_CHECK(batch >= 0 && channels > 0 && height > 0 && width > 0,
           "{}: batch must be >= 0 and channels, height, width > 0 ({})", call, to_string());
  HN_CHECK(kernel_h > 0 && kernel_w > 0 && stride_h > 0 && stride_w > 0 && dilation_h > 0 &&
               dilation_w > 0 && pad_h >= 0 && pad_w >= 0,
           "{}: kernel, stride and dilation must be > 0 and pad >= 0 ({})", call, to_string());
  HN_CHECK(groups > 0 && channels % groups == 0, "{}: channels {} not divisible by groups {} ({})",
           call, channels, groups, to_string());
  HN_CHECK(out_h() > 0 && out_w() > 0,
           "{}: dilated kernel larger than the padded image, output would be {}x{} ({})", call,
           out_h(), out_w(), to_string());
  check_layout(call, "layout", layout, channels, to_string());
}

namespace {

// Caffe's pooled size (PoolingLayer::Reshape): round up (or down), then, when either axis
// is padded, drop a last window that would start in the padding, on both axes.
index_t pooled_size(index_t in, index_t kernel, index_t stride, index_t pad, bool padded,
                    bool ceil_mode) {
  const double windows = static_cast<double>(in + 2 * pad - kernel) / static_cast<double>(stride);
  index_t out = static_cast<index_t>(ceil_mode ? std::ceil(windows) : std::floor(windows)) + 1;
  if (padded && (out - 1) * stride >= in + pad) --out;
  return out;
}

}  // namespace

index_t PoolShape::out_h() const {
  return pooled_size(height, kernel_h, stride_h, pad_h, pad_h > 0 || pad_w > 0, ceil_mode);
}
index_t PoolShape::out_w() const {
  return pooled_size(width, kernel_w, stride_w, pad_w, pad_h > 0 || pad_w > 0, ceil_mode);
}

std::string PoolShape::to_string() const {
  return fmt::format(
             "batch={} channels={} height={} width={} kernel={}x{} stride={}x{} pad={}x{}{}{}",
             batch, channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w,
             ceil_mode ? "" : " round=FLOOR", count_include_pad ? "" : " count_include_pad=0") +
         layout_suffix("layout", layout);
}

void PoolShape::validate(const char* call) const {
  HN_CHECK(batch >= 0 && channels > 0 && height > 0 && width > 0,
           "{}: batch must be >= 0 and channels, height, width > 0 ({})", call, to_string());
  HN_CHECK(kernel_h > 0 && kernel_w > 0 && stride_h > 0 && stride_w > 0,
           "{}: kernel and stride must be > 0 ({})", call, to_string());
  HN_CHECK(pad_h >= 0 && pad_w >= 0 && pad_h < kernel_h && pad_w < kernel_w,
           "{}: pad must be >= 0 and smaller than the kernel ({})", call, to_string());
  HN_CHECK(out_h() > 0 && out_w() > 0, "{}: no window fits the padded input ({})", call,
           to_string());
  check_layout(call, "layout", layout, channels, to_string());
}

std::string LrnShape::to_string() const {
  return fmt::format("batch={} channels={} height={} width={} size={} alpha={} beta={} k={} {}",
                     batch, channels, height, width, size, alpha, beta, k,
                     region == LrnRegion::across_channels ? "ACROSS_CHANNELS" : "WITHIN_CHANNEL") +
         layout_suffix("layout", layout);
}

void LrnShape::validate(const char* call) const {
  HN_CHECK(batch >= 0 && channels > 0 && height > 0 && width > 0,
           "{}: batch must be >= 0 and channels, height, width > 0 ({})", call, to_string());
  HN_CHECK(size > 0 && size % 2 == 1, "{}: local_size must be odd and positive ({})", call,
           to_string());
  check_layout(call, "layout", layout, channels, to_string());
  HN_CHECK(layout == Layout::nchw ||
               (region == LrnRegion::across_channels && size <= 2 * layout_block(layout) + 1),
           "{}: {} takes ACROSS_CHANNELS windows of up to {} channels only ({})", call,
           layout_name(layout), 2 * layout_block(layout) + 1, to_string());
}

std::string AxisShape::to_string() const {
  return fmt::format("outer={} channels={} inner={}", outer, channels, inner) +
         layout_suffix("layout", layout);
}

void AxisShape::validate(const char* call) const {
  HN_CHECK(outer >= 0 && channels > 0 && inner > 0,
           "{}: outer must be >= 0 and channels, inner > 0 ({})", call, to_string());
  check_layout(call, "layout", layout, channels, to_string());
}

}  // namespace hn
