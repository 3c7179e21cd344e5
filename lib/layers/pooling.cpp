// Pooling layer: resolves Caffe's kernel/stride/pad fields and output size in setup, then
// one driver call per direction on the slice's images.
#include "hybridnn.pb.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/pooling_layer.h"
#include "lib/layers/registry.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "lib/core/check.h"
#include "lib/layers/common.h"

namespace hn {

static_assert(sizeof(float) == sizeof(std::int32_t), "MAX keeps int32 indices in a float tensor");

namespace {

struct Pair {
  index_t h, w;
};

// One of Caffe's field pairs: the square form, or the _h/_w form when it is set (both
// fields; 0 is a value there).
Pair resolve_pair(const std::string& who, const char* square_name, const char* base, index_t square,
                  const std::optional<index_t>& h, const std::optional<index_t>& w,
                  index_t square_default) {
  if (!h && !w) return {square, square};
  HN_CHECK(square == square_default,
           "{}: set {} OR {}_h and {}_w, not both (got {} {}, {}_h {}, {}_w {})", who, square_name,
           base, base, square_name, square, base, h.value_or(0), base, w.value_or(0));
  HN_CHECK(h && w, "{}: {}_h and {}_w must both be set (got {}_h {}, {}_w {})", who, base, base,
           base, h ? fmt::to_string(*h) : "unset", base, w ? fmt::to_string(*w) : "unset");
  return {*h, *w};
}

}  // namespace

PoolingLayer::PoolingLayer(std::string name, PoolingParams params)
    : Layer(std::move(name)), param_(params) {}

std::vector<Shape> PoolingLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 1, 1);
  const Shape& in = inputs[0];
  const std::string who = describe();
  HN_CHECK(in.axes() == 4, "{}: input must have 4 axes (N x C x H x W), got {}", who,
           in.to_string());
  const index_t height = in[2], width = in[3];
  HN_CHECK(in[1] > 0 && height > 0 && width > 0,
           "{}: channels, height and width must be > 0 (input {})", who, in.to_string());
  const PoolingParams& p = param_;

  Pair kernel{};
  if (p.global_pooling) {
    HN_CHECK(p.kernel_size == 0 && !p.kernel_h && !p.kernel_w,
             "{}: global_pooling takes the kernel from the input; kernel_size, kernel_h and "
             "kernel_w must not be set (input {})",
             who, in.to_string());
    kernel = {height, width};
  } else {
    HN_CHECK(p.kernel_size != 0 || p.kernel_h || p.kernel_w,
             "{}: needs kernel_size, or kernel_h and kernel_w, or global_pooling (input {})", who,
             in.to_string());
    kernel = resolve_pair(who, "kernel_size", "kernel", p.kernel_size, p.kernel_h, p.kernel_w, 0);
  }
  const Pair stride = resolve_pair(who, "stride", "stride", p.stride, p.stride_h, p.stride_w, 1);
  const Pair pad = resolve_pair(who, "pad", "pad", p.pad, p.pad_h, p.pad_w, 0);
  HN_CHECK(kernel.h > 0 && kernel.w > 0, "{}: kernel {}x{} must be > 0 (input {})", who, kernel.h,
           kernel.w, in.to_string());
  HN_CHECK(stride.h > 0 && stride.w > 0, "{}: stride {}x{} must be > 0 (input {})", who, stride.h,
           stride.w, in.to_string());
  HN_CHECK(pad.h >= 0 && pad.w >= 0, "{}: pad {}x{} must be >= 0 (input {})", who, pad.h, pad.w,
           in.to_string());
  if (p.global_pooling) {
    HN_CHECK(pad.h == 0 && pad.w == 0 && stride.h == 1 && stride.w == 1,
             "{}: global_pooling needs pad 0 and stride 1, got pad {}x{}, stride {}x{} (input {})",
             who, pad.h, pad.w, stride.h, stride.w, in.to_string());
  }
  // Caffe: a window must hold at least one input pixel.
  HN_CHECK(pad.h < kernel.h && pad.w < kernel.w,
           "{}: pad {}x{} must be smaller than the kernel {}x{} (input {})", who, pad.h, pad.w,
           kernel.h, kernel.w, in.to_string());

  shape_ = PoolShape{};
  shape_.batch = in[0];
  shape_.channels = in[1];
  shape_.height = height;
  shape_.width = width;
  shape_.kernel_h = kernel.h;
  shape_.kernel_w = kernel.w;
  shape_.stride_h = stride.h;
  shape_.stride_w = stride.w;
  shape_.pad_h = pad.h;
  shape_.pad_w = pad.w;
  shape_.ceil_mode = p.ceil_mode;
  shape_.count_include_pad = p.count_include_pad;
  // Caffe clips a kernel larger than the padded input to it (2x2 input, kernel 3, stride 2:
  // one window); no window at all is an error.
  HN_CHECK(shape_.out_h() > 0 && shape_.out_w() > 0,
           "{}: kernel {}x{} stride {}x{} leaves no window on the padded input {}x{} (input {})",
           who, kernel.h, kernel.w, stride.h, stride.w, height + 2 * pad.h, width + 2 * pad.w,
           in.to_string());
  const Shape out{in[0], in[1], shape_.out_h(), shape_.out_w()};

  if (p.pool == PoolMethod::max) {
    // The argmax indices: int32 stored bitwise in a float tensor (both are 4 bytes).
    detail::reshape_state(state_, out);
  } else {
    state_.clear();
  }
  return {out};
}

PoolShape PoolingLayer::slice_shape(const LayerSlice& slice) const {
  PoolShape shape = shape_;
  shape.batch = slice.rows();
  shape.layout = slice.inputs[0].layout;
  return shape;
}

void PoolingLayer::forward(const LayerSlice& slice) {
  const PoolShape shape = slice_shape(slice);
  const float* x = slice.inputs[0].x();
  float* y = slice.outputs[0].mutable_x();
  if (param_.pool == PoolMethod::max) {
    // The state tensor holds int32 indices bitwise (sizeof(float) == sizeof(int32_t)).
    auto* mask = slice.state[0].data.as<std::int32_t>();
    slice.driver->pool_max_forward(shape, x, y, mask);
  } else {
    slice.driver->pool_avg_forward(shape, x, y);
  }
}

void PoolingLayer::backward(const LayerSlice& slice) {
  if (!slice.propagate_down[0]) return;
  const PoolShape shape = slice_shape(slice);
  const float* dy = slice.outputs[0].dx();
  float* dx = slice.inputs[0].mutable_dx();
  if (param_.pool == PoolMethod::max) {
    const auto* mask = slice.state[0].data.as<const std::int32_t>();
    slice.driver->pool_max_backward(shape, dy, mask, dx);
  } else {
    slice.driver->pool_avg_backward(shape, dy, dx);
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_pooling(const pb::LayerParameter& p) {
  const pb::PoolingParameter& q = p.pooling_param();
  // PoolingParams marks an unset _h/_w form by 0, so Caffe's presence rules are checked here.
  if (q.global_pooling()) {
    HN_CHECK(!(q.has_kernel_size() || q.has_kernel_h() || q.has_kernel_w()),
             "{}: with global_pooling, kernel_size, kernel_h and kernel_w must not be set", who(p));
  } else {
    HN_CHECK(q.has_kernel_size() != (q.has_kernel_h() && q.has_kernel_w()),
             "{}: kernel is kernel_size OR kernel_h and kernel_w; not both", who(p));
    HN_CHECK(q.has_kernel_size() || (q.has_kernel_h() && q.has_kernel_w()),
             "{}: kernel_size, or kernel_h and kernel_w, is required", who(p));
  }
  HN_CHECK((!q.has_pad() && q.has_pad_h() && q.has_pad_w()) || (!q.has_pad_h() && !q.has_pad_w()),
           "{}: pad is pad OR pad_h and pad_w", who(p));
  HN_CHECK((!q.has_stride() && q.has_stride_h() && q.has_stride_w()) ||
               (!q.has_stride_h() && !q.has_stride_w()),
           "{}: stride is stride OR stride_h and stride_w", who(p));

  PoolingParams params;
  switch (q.pool()) {
    case pb::PoolingParameter::MAX:
      params.pool = PoolMethod::max;
      break;
    case pb::PoolingParameter::AVE:
      params.pool = PoolMethod::ave;
      break;
    case pb::PoolingParameter::STOCHASTIC:
      fail("{}: pool STOCHASTIC is not supported (MAX and AVE are)", who(p));
  }
  params.global_pooling = q.global_pooling();
  params.ceil_mode = q.round_mode() == pb::PoolingParameter::CEIL;
  params.count_include_pad = q.count_include_pad();
  params.kernel_size = q.kernel_size();
  if (q.has_kernel_h()) params.kernel_h = q.kernel_h();
  if (q.has_kernel_w()) params.kernel_w = q.kernel_w();
  params.stride = q.stride();
  if (q.has_stride_h()) params.stride_h = q.stride_h();
  if (q.has_stride_w()) params.stride_w = q.stride_w();
  params.pad = q.pad();
  if (q.has_pad_h()) params.pad_h = q.pad_h();
  if (q.has_pad_w()) params.pad_w = q.pad_w();
  return std::make_unique<PoolingLayer>(p.name(), params);
}

}  // namespace

LayerType pooling_layer_type() {
  LayerType type;
  type.name = "Pooling";
  type.make = make_pooling;
  return type;
}

}  // namespace hn
