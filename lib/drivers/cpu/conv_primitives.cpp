// The CPU driver's oneDNN convolution primitives (conv.h): for each call and shape the one on
// the layouts that waste least, with its operands' reorders, made once and cached.
#include "lib/drivers/cpu/conv.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "lib/core/check.h"

#if HYBRIDNN_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include "lib/drivers/cpu/conv_internal.h"
#endif

namespace hn::detail::cpu {

#if HYBRIDNN_WITH_ONEDNN

namespace {

using Tag = memory::format_tag;

// Batch slices of different sizes are different shapes: enough room for a few nets' worth.
// GoogLeNet alone makes 171 (57 convolutions, 3 calls each); with 64, every call of it missed
// and made its primitive again (1.5 s per iteration became 2.2 s).
constexpr std::size_t kMaxCachedShapes = 1024;

index_t float_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

Key make_key(Call call, const LoweringShape& s, index_t out_channels, bool has_bias, bool bf16,
             const Activation& activation, bool residual) {
  return {static_cast<index_t>(call),
          static_cast<index_t>(activation.kind),
          residual ? 1 : 0,
          float_bits(activation.kind == Activation::Kind::relu ? activation.slope : activation.lo),
          float_bits(activation.hi),
          bf16 ? 1 : 0,
          s.batch,
          s.channels,
          s.height,
          s.width,
          s.kernel_h,
          s.kernel_w,
          s.pad_h,
          s.pad_w,
          s.stride_h,
          s.stride_w,
          s.dilation_h,
          s.dilation_w,
          s.groups,
          out_channels,
          has_bias ? 1 : 0,
          static_cast<index_t>(s.layout),
          static_cast<index_t>(s.out_layout),
          s.plain_kernel ? 1 : 0};
}

// Every primitive takes its scratchpad from the caller (the driver's own buffer): with
// oneDNN's default (library) mode the scratchpad belongs to the thread that created the
// primitive, and a driver may be driven by another thread later (the hybrid split's device
// threads): executing there crashed.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// A memory for `pd`'s scratchpad, bound to the driver's buffer at each call; empty when the
// primitive needs none.
memory scratch_memory(const dnnl::engine& engine, const memory::desc& desc) {
  return desc.get_size() > 0 ? memory(desc, engine, nullptr) : memory();
}

std::size_t scratch_bytes(const memory& scratch) {
  return scratch ? scratch.get_desc().get_size() : 0;
}

Operand make_input(const dnnl::engine& engine, const memory::desc& plain,
                   const memory::desc& wanted) {
  Operand op;
  op.user = memory(plain, engine, nullptr);
  if (wanted == plain) {
    op.inner = op.user;
  } else {
    op.inner = memory(wanted, engine, nullptr);  // in the driver's arena, bound per call
    const dnnl::reorder::primitive_desc pd(op.user, op.inner, user_scratchpad());
    op.reorder = dnnl::reorder(pd);
    op.scratch = scratch_memory(engine, pd.scratchpad_desc());
    op.reordered = true;
  }
  return op;
}

Operand make_output(const dnnl::engine& engine, const memory::desc& plain,
                    const memory::desc& wanted, bool accumulate) {
  Operand op;
  op.user = memory(plain, engine, nullptr);
  if (wanted == plain && !accumulate) {
    op.inner = op.user;
    return op;
  }
  op.inner = memory(wanted, engine, nullptr);  // in the driver's arena, bound per call
  dnnl::primitive_attr attr = user_scratchpad();
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  const dnnl::reorder::primitive_desc pd(op.inner, op.user, attr);
  op.reorder = dnnl::reorder(pd);
  op.scratch = scratch_memory(engine, pd.scratchpad_desc());
  op.reordered = true;
  return op;
}

}  // namespace

// oneDNN's descriptors of one convolution shape: the caller's layouts (`user`: NCHW or
// blocked activations, plain weights and bias), plain NCHW, `any` (left to the primitive)
// and channels-last. With `one_group`, the shape's first group as a convolution of its
// own: the caller's activations are views into the whole tensors (the other groups are the
// same views, shifted; blocked too, when a group's channels fill whole blocks). With
// `bf16`, the `any` and channels-last descriptors also come as BF16 (`*_16`), which the
// blocked and channels-last calls ask for their inputs (descs()).
struct Geometry {
  memory::desc src_user, dst_user;
  memory::desc src_plain, weights_plain, dst_plain, bias_plain;
  memory::desc src_any, weights_any, dst_any, bias_any;
  memory::desc src_nhwc, dst_nhwc;
  memory::desc src_any_16, weights_any_16, dst_any_16, src_nhwc_16, dst_nhwc_16;
  index_t in_per_group, out_per_group;
  memory::dims strides, dilates, pad_l, pad_r;
  bool bf16;
  // The forward call's post-ops (the gradients' calls ignore them): the residual's sum
  // (a binary add of a tensor in the caller's layout of y), then the activation.
  Activation activation;
  bool residual = false;

  Geometry(const LoweringShape& s, index_t out_channels, bool has_bias, bool one_group = false,
           bool with_bf16 = false)
      : bf16(with_bf16) {
    const index_t g = one_group ? 1 : s.groups;
    in_per_group = s.channels / s.groups;
    out_per_group = out_channels / s.groups;
    const index_t in_c = one_group ? in_per_group : s.channels;
    const index_t out_c = one_group ? out_per_group : out_channels;
    const index_t out_h = s.out_h(), out_w = s.out_w();
    const memory::dims src{s.batch, in_c, s.height, s.width};
    const memory::dims dst{s.batch, out_c, out_h, out_w};
    const memory::dims weights = g == 1
                                     ? memory::dims{out_c, in_c, s.kernel_h, s.kernel_w}
                                     : memory::dims{g, out_c / g, in_c / g, s.kernel_h, s.kernel_w};
    const auto f32 = memory::data_type::f32;
    // NCHW strides of the whole tensors, whatever the channels described.
    src_plain =
        memory::desc(src, f32, {s.channels * s.height * s.width, s.height * s.width, s.width, 1});
    dst_plain = memory::desc(dst, f32, {out_channels * out_h * out_w, out_h * out_w, out_w, 1});
    const auto user = [&](Layout layout, const memory::desc& plain, index_t channels,
                          index_t height, index_t width, const memory::dims& dims) {
      if (layout == Layout::nchw) return plain;
      const memory::desc whole({s.batch, channels, height, width}, f32,
                               layout == Layout::nchw8c ? Tag::nChw8c : Tag::nChw16c);
      return one_group ? whole.submemory_desc(dims, {0, 0, 0, 0}) : whole;
    };
    src_user = user(s.layout, src_plain, s.channels, s.height, s.width, src);
    dst_user = user(s.out_layout, dst_plain, out_channels, out_h, out_w, dst);
    weights_plain = memory::desc(weights, f32, g == 1 ? Tag::oihw : Tag::goihw);
    src_any = memory::desc(src, f32, Tag::any);
    dst_any = memory::desc(dst, f32, Tag::any);
    weights_any = memory::desc(weights, f32, Tag::any);
    src_nhwc = memory::desc(src, f32, Tag::nhwc);
    dst_nhwc = memory::desc(dst, f32, Tag::nhwc);
    if (bf16) {
      const auto b16 = memory::data_type::bf16;
      src_any_16 = memory::desc(src, b16, Tag::any);
      dst_any_16 = memory::desc(dst, b16, Tag::any);
      weights_any_16 = memory::desc(weights, b16, Tag::any);
      src_nhwc_16 = memory::desc(src, b16, Tag::nhwc);
      dst_nhwc_16 = memory::desc(dst, b16, Tag::nhwc);
    }
    if (has_bias) {
      bias_plain = memory::desc({out_c}, f32, Tag::x);
      bias_any = memory::desc({out_c}, f32, Tag::any);
    }
    strides = {s.stride_h, s.stride_w};
    dilates = {s.dilation_h - 1, s.dilation_w - 1};  // oneDNN counts the gaps
    // Caffe's floor rounding leaves any unused bottom/right rows out; oneDNN accepts the
    // symmetric padding because it rounds the output size the same way.
    pad_l = {s.pad_h, s.pad_w};
    pad_r = {s.pad_h, s.pad_w};
  }
};

// How a call lays out its activations inside oneDNN: `blocked` lets the primitive choose
// (nChw16c on AVX-512, nChw8c on AVX2), `nhwc` asks for channels-last, `plain` keeps NCHW (oneDNN
// then falls back to its im2col + GEMM implementation).
enum class Inner { blocked, nhwc, plain };

namespace {

// `auto` lets oneDNN pick Winograd for 3x3 stride-1 shapes where it pays (CaffeNet conv3 at
// batch 32 on 2 AVX-512 threads: 22 ms vs 30 ms direct; the other layers are unchanged).
// Winograd's error is ~10x direct's: 4e-6 of the largest output instead of 3e-7 there.
constexpr dnnl::algorithm kAlgorithm = dnnl::algorithm::convolution_auto;

// Blocked layouts pad channels to 16 (AVX-512) or 8 (AVX2). A blocked call whose activations carry
// this much padding (input-channel padding times output-channel padding, i.e. the share of wasted
// multiply-adds), and that channels-last does not rescue, runs on NCHW instead (oneDNN's GEMM-based
// kernels) or, for the data gradient, lowered by the driver itself (lowered_backward_data): 3 input
// channels padded to 16 for CaffeNet conv1's data gradient ran at 45 GFLOP/s blocked, 136 through
// oneDNN's GEMM kernel, and the lowering takes 2/3 of that kernel's time.
constexpr double kMaxPaddingRatio = 2.0;
// Input channels per group up to which the data gradient is lowered wherever oneDNN would
// compute it with its GEMM-based kernel (create_fp32).
constexpr index_t kFewChannels = 4;
// Channels-last kernels vectorise over one channel axis only (output channels forward and
// for the weight gradient, input channels for the data gradient) and handle its tail with
// masks, so they waste less than the blocked kernels when channel counts are not
// multiples of 16. They replace a blocked call that wastes this much more (LeNet conv2, 20
// -> 50 channels, batch 64, one thread: forward 1.6 ms nhwc vs 2.7 blocked vs 3.1 plain;
// data gradient 2.0 vs 2.6 vs 3.5; weight gradient 1.8 vs 2.9 vs 3.4). On CaffeNet's
// layers (multiples of 16) the two are within noise, with the blocked reorders cheaper.
constexpr double kNhwcGain = 1.2;
// Groups run one by one (for Winograd) only when each has at least this many input and
// output channels.
constexpr index_t kMinGroupChannels = 16;

// Elements, padding included, whatever their type (a BF16 operand has half the bytes).
double elements(const memory::desc& desc) {
  const auto type = static_cast<memory::data_type>(desc.data.data_type);
  return static_cast<double>(desc.get_size()) / static_cast<double>(memory::data_type_size(type));
}

double padding(const Operand& op) {
  return elements(op.inner.get_desc()) / elements(op.user.get_desc());
}

// `channels` rounded up to whole vectors of this machine's kernels.
index_t padded_to_vectors(index_t channels) {
  const index_t lanes = layout_block(DirectConvolution::preferred_layout());
  return (channels + lanes - 1) / lanes * lanes;
}

// The descriptors a call of `layout` asks for: weights and bias stay `any` except in
// plain calls. With geo.bf16 (blocked and channels-last calls), the call's inputs are BF16:
// src and weights forward, weights and dst (dy) for the data gradient, src and dst (dy)
// for the weight gradient; its output and the bias stay FP32.
struct Descs {
  memory::desc src, weights, bias, dst;
};

Descs descs(const Geometry& geo, Inner layout, Call call) {
  switch (layout) {
    case Inner::plain:
      return {geo.src_plain, geo.weights_plain, geo.bias_plain, geo.dst_plain};
    case Inner::nhwc:
      if (!geo.bf16) return {geo.src_nhwc, geo.weights_any, geo.bias_any, geo.dst_nhwc};
      return {call == Call::backward_data ? geo.src_nhwc : geo.src_nhwc_16,
              call == Call::backward_weights ? geo.weights_any : geo.weights_any_16, geo.bias_any,
              call == Call::forward ? geo.dst_nhwc : geo.dst_nhwc_16};
    case Inner::blocked:
      break;
  }
  if (!geo.bf16) return {geo.src_any, geo.weights_any, geo.bias_any, geo.dst_any};
  return {call == Call::backward_data ? geo.src_any : geo.src_any_16,
          call == Call::backward_weights ? geo.weights_any : geo.weights_any_16, geo.bias_any,
          call == Call::forward ? geo.dst_any : geo.dst_any_16};
}

// The forward call's primitive descriptor, also the hint of the gradients' calls.
// With `post_op`, geo.activation applied to the result as eltwise post-ops, which oneDNN's
// JIT kernels apply to each output block while it is in registers (a ReLU, or a clip from 0:
// DirectConvolution::fuses). A NaN must not come out finite, but oneDNN's x64 `clip`,
// `clip_v2`, `bounded_relu` and slope-0 `relu` are max/min instructions, which return the
// bound for a NaN. A `relu` with a slope compares (NaN fails x > 0) and multiplies (NaN *
// slope is NaN): a slope-0 ReLU is three ReLUs of slope FLT_MIN (2^-126, the smallest
// normal float), taking x < 0 to at most 4, then 2^-124, then -0 exactly (2^-250 rounds to
// zero, flushed or not), NaN staying NaN. The slope must be normal: with the driver's
// denormals flushed (denormals.h), a denormal slope reads as 0 where oneDNN tests it when
// making the primitive, and it picks its max instruction (FLT_TRUE_MIN's two passes did
// so); those two passes also made a denormal of nearly every negative output.
// A clip's upper bound is a `clip_v2` from -infinity after that: a NaN comes out as
// -infinity (the max returns the bound), not finite; every finite result is the clip's.
dnnl::convolution_forward::primitive_desc forward_desc(const dnnl::engine& engine,
                                                       const Geometry& geo, Inner layout,
                                                       bool post_op = false) {
  const Descs d = descs(geo, layout, Call::forward);
  const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_training, kAlgorithm, d.src,
                                             d.weights, d.bias, d.dst, geo.strides, geo.dilates,
                                             geo.pad_l, geo.pad_r);
  dnnl::primitive_attr attr = user_scratchpad();
  if (post_op && (geo.activation.kind != Activation::Kind::none || geo.residual)) {
    dnnl::post_ops ops;
    if (geo.residual) ops.append_binary(dnnl::algorithm::binary_add, geo.dst_user);
    const Activation& a = geo.activation;
    if (a.kind == Activation::Kind::none) {
      // the residual alone
    } else if (a.kind == Activation::Kind::relu && a.slope != 0.0f) {
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, a.slope, 0.0f);
    } else {
      const float tiny = std::numeric_limits<float>::min();
      for (int pass = 0; pass < 3; ++pass)
        ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, tiny, 0.0f);
      if (a.kind == Activation::Kind::clip) {
        ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip_v2,
                           -std::numeric_limits<float>::infinity(), a.hi);
      }
    }
    attr.set_post_ops(ops);
  }
  return dnnl::convolution_forward::primitive_desc(desc, attr, engine);
}

// The largest scratchpad any primitive of the call needs.
std::size_t scratch_bytes(const Entry& e) {
  std::size_t bytes = e.per_group ? scratch_bytes(*e.per_group) : 0;
  for (const memory* scratch : {&e.scratch, &e.a.scratch, &e.b.scratch, &e.c.scratch, &e.d.scratch})
    bytes = std::max(bytes, scratch_bytes(*scratch));
  return bytes;
}

// Floats between consecutive groups' operands of a call, in the order of its operands.
std::array<index_t, 4> group_steps(Call call, const LoweringShape& s, index_t out_channels) {
  const index_t cg = s.channels / s.groups, og = out_channels / s.groups;
  const index_t src = cg * s.height * s.width, dst = og * s.out_h() * s.out_w();
  const index_t weights = og * cg * s.kernel_h * s.kernel_w, bias = og;
  switch (call) {
    case Call::forward:
      return {src, weights, bias, dst};
    case Call::backward_data:
      return {weights, dst, src, 0};
    case Call::backward_weights:
      return {src, dst, weights, bias};
  }
  return {};
}

}  // namespace

char* DirectConvolution::Impl::reserve_arena(std::size_t bytes) {
  if (bytes > arena_capacity) {
    const std::size_t rounded = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    arena.reset(std::aligned_alloc(kArenaAlign, rounded));
    HN_CHECK(arena != nullptr, "conv (onednn): cannot allocate a {}-byte operand arena", rounded);
    arena_capacity = rounded;
  }
  return static_cast<char*>(arena.get());
}

void* DirectConvolution::Impl::weights_in_layout(const Entry& e, const float* weights,
                                                 std::uint64_t version) {
  const memory::desc desc = e.b.inner.get_desc();
  auto found = laid_out.find(weights);
  if (found != laid_out.end() && found->second.version == version && found->second.desc == desc) {
    found->second.used = ++laid_out_clock;
    return found->second.buffer.get();
  }
  const std::size_t bytes = arena_bytes(e.b);
  if (bytes > kMaxLaidOutBytes) return nullptr;
  if (found != laid_out.end()) {
    laid_out_bytes -= found->second.bytes;
    laid_out.erase(found);
  }
  while (laid_out_bytes + bytes > kMaxLaidOutBytes) {
    const auto oldest = std::min_element(
        laid_out.begin(), laid_out.end(),
        [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    laid_out_bytes -= oldest->second.bytes;
    laid_out.erase(oldest);
  }
  LaidOutWeights& held = laid_out[weights];
  held.buffer.reset(std::aligned_alloc(kArenaAlign, bytes));
  if (held.buffer == nullptr) {
    laid_out.erase(weights);
    return nullptr;  // the arena's path, which reports a failed allocation itself
  }
  held.bytes = bytes;
  laid_out_bytes += bytes;
  held.desc = desc;
  held.used = ++laid_out_clock;
  e.b.bind(weights);
  e.b.inner.set_data_handle(held.buffer.get());
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, e.b.user}, {DNNL_ARG_TO, e.b.inner}};
  if (e.b.scratch) {
    e.b.scratch.set_data_handle(scratch.get());
    args.emplace(DNNL_ARG_SCRATCHPAD, e.b.scratch);
  }
  e.b.reorder.execute(stream, args);
  stream.wait();
  held.version = version;  // 0 (never a hit) had the reorder thrown
  return held.buffer.get();
}

void DirectConvolution::Impl::reserve_scratch(std::size_t bytes) {
  if (bytes <= scratch_capacity) return;
  constexpr std::size_t kAlign = 64;
  const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  scratch.reset(std::aligned_alloc(kAlign, rounded));
  HN_CHECK(scratch != nullptr, "conv (onednn): cannot allocate a {}-byte scratchpad", rounded);
  scratch_capacity = rounded;
}

Entry& DirectConvolution::Impl::entry(Call call, const LoweringShape& s, index_t out_channels,
                                      bool has_bias, bool bf16, const Activation& activation,
                                      bool residual) {
  const Key key = make_key(call, s, out_channels, has_bias, bf16, activation, residual);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedShapes) {
    cache.erase(order.front());
    order.pop_front();
  }
  Entry made = create(call, s, out_channels, has_bias, bf16, activation, residual);
  reserve_scratch(scratch_bytes(made));
  order.push_back(key);
  return cache.emplace(key, std::move(made)).first->second;
}

// In BF16, the call on BF16 inputs in the layout the FP32 call chose, where that is
// blocked or channels-last and oneDNN has a fast kernel for it (JIT, or brgemm-based:
// `brgconv`, its forward kernels on AMX, which the check for "jit" alone took for slow ones
// and left the forward in FP32 there); else the FP32 call.
Entry DirectConvolution::Impl::create(Call call, const LoweringShape& s, index_t out_channels,
                                      bool has_bias, bool bf16, const Activation& activation,
                                      bool residual) const {
  Entry fp32 = create_fp32(call, s, out_channels, has_bias, activation, residual);
  if (!bf16 || fp32.lowered || fp32.per_group || s.plain_kernel) return fp32;
  const Inner layout = fp32.inner_layout;
  if (layout == Inner::plain) return fp32;
  try {
    Geometry geo(s, out_channels, has_bias, false, true);
    geo.activation = activation;
    geo.residual = residual;
    Entry half = build(call, geo, has_bias, layout);
    const std::string& impl = half.implementation;
    const bool fast = impl.find("jit") != std::string::npos || impl.find("brg") == 0;
    if (fast && impl.find("gemm") == std::string::npos && impl.find("ref") == std::string::npos) {
      return half;
    }
  } catch (const dnnl::error&) {
    // no BF16 kernel for this shape and layout: FP32
  }
  return fp32;
}

// The primitive on oneDNN's preferred (blocked) layouts, unless their channel padding
// wastes much: then channels-last where that wastes less and oneDNN has a direct kernel
// for it, else plain NCHW (the data gradient: the driver's own lowering). Plain NCHW too
// when the caller asks for it (LoweringShape::plain_kernel, a candidate the tuner times).
Entry DirectConvolution::Impl::create_fp32(Call call, const LoweringShape& s, index_t out_channels,
                                           bool has_bias, const Activation& activation,
                                           bool residual) const {
  const auto geometry = [&](bool one_group) {
    Geometry geo(s, out_channels, has_bias, one_group);
    geo.activation = activation;
    geo.residual = residual && !one_group;
    return geo;
  };
  if (s.plain_kernel) return build(call, geometry(false), has_bias, Inner::plain);
  const index_t in_per_group = s.channels / s.groups, out_per_group = out_channels / s.groups;
  // A group of blocked activations is a view only when its channels fill whole blocks.
  const bool views =
      in_per_group % layout_block(s.layout) == 0 && out_per_group % layout_block(s.out_layout) == 0;
  if (s.groups > 1 && in_per_group >= kMinGroupChannels && out_per_group >= kMinGroupChannels &&
      views) {
    // oneDNN 2.6 has Winograd only for ungrouped convolutions; where it takes one group
    // alone, the groups run one by one (CaffeNet conv4 and conv5, 3x3 on 13x13, batch
    // 32, one thread: forward + both gradients 95 ms instead of 123, and 59 instead of 82).
    // Not for thin groups: a depthwise convolution (one channel per group) run as 32 to
    // 1024 convolutions of one channel took 60 % of MobileNet v1, where oneDNN's
    // depthwise kernel does all the groups in one call.
    Entry part = build(call, geometry(true), has_bias, Inner::blocked);
    if (part.implementation.find("wino") != std::string::npos) {
      Entry split;
      split.implementation = part.implementation + " per group";
      split.group_count = s.groups;
      split.group_step = group_steps(call, s, out_channels);
      split.per_group = std::make_shared<const Entry>(std::move(part));
      return split;
    }
  }
  const Geometry geo = geometry(false);
  Entry blocked = build(call, geo, has_bias, Inner::blocked);
  const double waste = blocked.padding;
  const index_t vector_channels =
      call == Call::backward_data ? geo.in_per_group : geo.out_per_group;
  const double nhwc_waste = static_cast<double>(padded_to_vectors(vector_channels)) /
                            static_cast<double>(vector_channels);
  // Channels-last reorders the vectorised side's activations from and to the caller's
  // layout, which the blocked kernels read as they are when the caller's are blocked: there,
  // while the blocked call's padding is moderate, it stays (MobileNet v2's 24 -> 144 1x1
  // layers at 56x56, batch 32: 13 ms on NCHW kernels, 14 channels-last with the 58 MB output
  // reordered, 6 blocked with the input's 24 channels padded to 32).
  const Layout vectorised = call == Call::backward_data ? s.layout : s.out_layout;
  const bool keep_blocked = vectorised != Layout::nchw && waste <= kMaxPaddingRatio;
  if (waste > kNhwcGain * nhwc_waste && !keep_blocked) {
    try {
      Entry nhwc = build(call, geo, has_bias, Inner::nhwc);
      const std::string& impl = nhwc.implementation;
      if (impl.find("gemm") == std::string::npos && impl.find("ref") == std::string::npos) {
        return nhwc;
      }
    } catch (const dnnl::error&) {
      // no channels-last implementation for this shape: keep looking
    }
  }
  // Where oneDNN takes its GEMM-based kernel for the data gradient of few input channels
  // itself (3 with AVX2, on NCHW: no blocked kernel pads them), the driver's lowering is
  // faster too: CaffeNet conv1's, batch 32, on a 2-core Xeon held to AVX2, 41 ms against
  // 100 (hybridnn-bench layers --force-backward --layout nchw, alternating).
  const bool gemm_data_gradient = call == Call::backward_data && s.layout == Layout::nchw &&
                                  geo.in_per_group <= kFewChannels &&
                                  blocked.implementation.find("gemm") != std::string::npos;
  if (waste > kMaxPaddingRatio || gemm_data_gradient) {
    // The driver's own lowering writes dx as NCHW (dy may be blocked: unblocked per image).
    if (call == Call::backward_data && s.layout == Layout::nchw) {
      Entry lowered;
      lowered.lowered = true;
      lowered.implementation = "hybridnn:gemm+col2im";
      return lowered;
    }
    return build(call, geo, has_bias, Inner::plain);
  }
  return blocked;
}

Entry DirectConvolution::Impl::build(Call call, const Geometry& geo, bool has_bias,
                                     Inner layout) const {
  const auto fwd = forward_desc(engine, geo, layout, call == Call::forward);
  const Descs want = descs(geo, layout, call);
  Entry e;
  e.inner_layout = layout;
  switch (call) {
    case Call::forward: {
      e.primitive = dnnl::convolution_forward(fwd);
      e.scratch = scratch_memory(engine, fwd.scratchpad_desc());
      e.implementation = fwd.impl_info_str();
      if (geo.residual) e.residual = memory(geo.dst_user, engine, nullptr);
      e.a = make_input(engine, geo.src_user, fwd.src_desc());
      e.b = make_input(engine, geo.weights_plain, fwd.weights_desc());
      if (has_bias) e.c = make_input(engine, geo.bias_plain, fwd.bias_desc());
      e.d = make_output(engine, geo.dst_user, fwd.dst_desc(), false);
      e.padding = padding(e.a) * padding(e.d);
      break;
    }
    case Call::backward_data: {
      const dnnl::convolution_backward_data::desc desc(kAlgorithm, want.src, want.weights, want.dst,
                                                       geo.strides, geo.dilates, geo.pad_l,
                                                       geo.pad_r);
      const dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), engine,
                                                               fwd);
      e.primitive = dnnl::convolution_backward_data(pd);
      e.scratch = scratch_memory(engine, pd.scratchpad_desc());
      e.implementation = pd.impl_info_str();
      e.a = make_input(engine, geo.weights_plain, pd.weights_desc());
      e.b = make_input(engine, geo.dst_user, pd.diff_dst_desc());
      e.c = make_output(engine, geo.src_user, pd.diff_src_desc(), false);
      e.padding = padding(e.c) * padding(e.b);
      break;
    }
    case Call::backward_weights: {
      const auto make_pd = [&](dnnl::algorithm algorithm) {
        const dnnl::convolution_backward_weights::desc desc(algorithm, want.src, want.weights,
                                                            want.bias, want.dst, geo.strides,
                                                            geo.dilates, geo.pad_l, geo.pad_r);
        return dnnl::convolution_backward_weights::primitive_desc(desc, user_scratchpad(), engine,
                                                                  fwd);
      };
      dnnl::convolution_backward_weights::primitive_desc pd = make_pd(kAlgorithm);
      // Where the forward call runs Winograd, so does the weight gradient: oneDNN's `auto`
      // declines it below about 16 images per thread, where it is 1.9-2.6x faster (128 ->
      // 128 channels, 3x3 on 28x28: 16 images on one thread 19.2 ms against 39.7 direct, 32
      // on two threads 18.2 against 34.5; ResNet-50 at batch 32 on 2 threads 3,106 -> 3,025 ms
      // per iteration, GoogLeNet 1,261 -> 1,202; the halves of a split gain the most). Its
      // error is the forward's (kAlgorithm).
      if (std::string(pd.impl_info_str()).find("wino") == std::string::npos &&
          std::string(fwd.impl_info_str()).find("wino") != std::string::npos) {
        try {
          pd = make_pd(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error&) {
        }
      }
      e.primitive = dnnl::convolution_backward_weights(pd);
      e.scratch = scratch_memory(engine, pd.scratchpad_desc());
      e.implementation = pd.impl_info_str();
      e.a = make_input(engine, geo.src_user, pd.src_desc());
      e.b = make_input(engine, geo.dst_user, pd.diff_dst_desc());
      e.c = make_output(engine, geo.weights_plain, pd.diff_weights_desc(), true);
      if (has_bias) e.d = make_output(engine, geo.bias_plain, pd.diff_bias_desc(), true);
      e.padding = padding(e.a) * padding(e.b);
      break;
    }
  }
  return e;
}

#endif  // HYBRIDNN_WITH_ONEDNN

}  // namespace hn::detail::cpu
