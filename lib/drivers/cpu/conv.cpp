// Direct convolution through oneDNN (convolution_forward / _backward_data /
// _backward_weights). The caller's activations are NCHW, nChw16c or nChw8c (Layout, shapes.h) and
// its weights [out][in/g][kh][kw]; oneDNN picks its own (blocked) layouts and the calls
// reorder in and out where the caller's differ. Primitives and their internal buffers are
// cached per shape: creating them costs milliseconds.
#include "lib/drivers/cpu/conv.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cpu/conv_small.h"
#include "lib/drivers/cpu/kernels.h"

#if HYBRIDNN_WITH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace hn::detail::cpu {

#if HYBRIDNN_WITH_ONEDNN

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Call { forward, backward_data, backward_weights };

const char* call_name(Call call) {
  switch (call) {
    case Call::forward:
      return "conv_forward";
    case Call::backward_data:
      return "conv_backward_data";
    case Call::backward_weights:
      return "conv_backward_weights";
  }
  return "conv";
}

// Batch slices of different sizes are different shapes: enough room for a few nets' worth.
// GoogLeNet alone makes 171 (57 convolutions, 3 calls each); with 64, every call of it missed
// and made its primitive again (1.5 s per iteration became 2.2 s).
constexpr std::size_t kMaxCachedShapes = 1024;

using Key = std::array<index_t, 19>;

Key make_key(Call call, const LoweringShape& s, index_t out_channels, bool has_bias) {
  return {static_cast<index_t>(call),
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

// One tensor of a call: `user` wraps the caller's buffer (address set per call),
// `inner` is what the primitive reads or writes. They are the same memory when the layouts
// agree; otherwise `reorder` copies user -> inner (inputs) or inner -> user (outputs; with
// a sum post-op when the call accumulates).
struct Operand {
  memory user, inner;
  dnnl::reorder reorder;
  memory scratch;  // the reorder's scratchpad (empty when it needs none)
  bool reordered = false;

  void bind(const void* address) const { user.set_data_handle(const_cast<void*>(address)); }
};

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

void reorder(const dnnl::stream& stream, const Operand& op, const memory& from, const memory& to,
             void* scratch) {
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  if (op.scratch) {
    op.scratch.set_data_handle(scratch);
    args.emplace(DNNL_ARG_SCRATCHPAD, op.scratch);
  }
  op.reorder.execute(stream, args);
}

void load(const dnnl::stream& stream, const Operand& op, void* scratch) {
  if (op.reordered) reorder(stream, op, op.user, op.inner, scratch);
}

void store(const dnnl::stream& stream, const Operand& op, void* scratch) {
  if (op.reordered) reorder(stream, op, op.inner, op.user, scratch);
}

// Reordered operands live in one arena the driver owns, at offsets bound at each call:
// buffers kept per cached primitive held every shape's and direction's reordered
// activations at once (CaffeNet: about 100 MB of its peak), while one call needs only its
// own. Sizes are rounded to cache lines.
constexpr std::size_t kArenaAlign = 64;

std::size_t arena_bytes(const Operand& op) {
  if (!op.reordered) return 0;
  return (op.inner.get_desc().get_size() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// Binds `op`'s inner memory at `*at` and advances it.
void bind_inner(const Operand& op, char*& at) {
  if (!op.reordered) return;
  op.inner.set_data_handle(at);
  at += arena_bytes(op);
}

// oneDNN's descriptors of one convolution shape: the caller's layouts (`user`: NCHW or
// blocked activations, plain weights and bias), plain NCHW, `any` (left to the primitive)
// and channels-last. With `one_group`, the shape's first group as a convolution of its
// own: the caller's activations are views into the whole tensors (the other groups are the
// same views, shifted; blocked too, when a group's channels fill whole blocks).
struct Geometry {
  memory::desc src_user, dst_user;
  memory::desc src_plain, weights_plain, dst_plain, bias_plain;
  memory::desc src_any, weights_any, dst_any, bias_any;
  memory::desc src_nhwc, dst_nhwc;
  index_t in_per_group, out_per_group;
  memory::dims strides, dilates, pad_l, pad_r;

  Geometry(const LoweringShape& s, index_t out_channels, bool has_bias, bool one_group = false) {
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

// `auto` lets oneDNN pick Winograd for 3x3 stride-1 shapes where it pays (CaffeNet conv3 at
// batch 32 on 2 AVX-512 threads: 22 ms vs 30 ms direct; the other layers are unchanged).
// Winograd's error is ~10x direct's: 4e-6 of the largest output instead of 3e-7 there.
constexpr dnnl::algorithm kAlgorithm = dnnl::algorithm::convolution_auto;

// How a call lays out its activations inside oneDNN: `blocked` lets the primitive choose
// (nChw16c on AVX-512, nChw8c on AVX2), `nhwc` asks for channels-last, `plain` keeps NCHW (oneDNN
// then falls back to its im2col + GEMM implementation).
enum class Inner { blocked, nhwc, plain };

// Blocked layouts pad channels to 16 (AVX-512) or 8 (AVX2). A blocked call whose activations carry
// this much padding (input-channel padding times output-channel padding, i.e. the share of wasted
// multiply-adds), and that channels-last does not rescue, runs on NCHW instead (oneDNN's GEMM-based
// kernels) or, for the data gradient, lowered by the driver itself (lowered_backward_data): 3 input
// channels padded to 16 for CaffeNet conv1's data gradient ran at 45 GFLOP/s blocked, 136 through
// oneDNN's GEMM kernel, and the lowering takes 2/3 of that kernel's time.
constexpr double kMaxPaddingRatio = 2.0;
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

double padding(const Operand& op) {
  return static_cast<double>(op.inner.get_desc().get_size()) /
         static_cast<double>(op.user.get_desc().get_size());
}

// `channels` rounded up to whole vectors of this machine's kernels.
index_t padded_to_vectors(index_t channels) {
  const index_t lanes = layout_block(DirectConvolution::preferred_layout());
  return (channels + lanes - 1) / lanes * lanes;
}

// The descriptors a call of `layout` asks for: weights and bias stay `any` except in
// plain calls.
struct Descs {
  memory::desc src, weights, bias, dst;
};

Descs descs(const Geometry& geo, Inner layout) {
  switch (layout) {
    case Inner::plain:
      return {geo.src_plain, geo.weights_plain, geo.bias_plain, geo.dst_plain};
    case Inner::nhwc:
      return {geo.src_nhwc, geo.weights_any, geo.bias_any, geo.dst_nhwc};
    case Inner::blocked:
      break;
  }
  return {geo.src_any, geo.weights_any, geo.bias_any, geo.dst_any};
}

dnnl::convolution_forward::primitive_desc forward_desc(const dnnl::engine& engine,
                                                       const Geometry& geo, Inner layout) {
  const Descs d = descs(geo, layout);
  const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_training, kAlgorithm, d.src,
                                             d.weights, d.bias, d.dst, geo.strides, geo.dilates,
                                             geo.pad_l, geo.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, user_scratchpad(), engine);
}

// A cached call: the primitive and the operands in the order the call lists them.
struct Entry {
  dnnl::primitive primitive;
  memory scratch;  // the primitive's scratchpad (empty when it needs none)
  Operand a, b, c, d;
  std::string implementation;  // oneDNN's name for the kernel, e.g. "jit:avx512_core"
  // Multiply-adds done per useful one: the channel padding of the input-side activations
  // times that of the output-side ones (or of their gradients).
  double padding = 1.0;
  // Data gradient computed by lowered_backward_data instead of a primitive (no primitive).
  bool lowered = false;
  // Set when the groups run one after the other as convolutions of their own (for
  // Winograd): `per_group` is group 0's call, and group g's operands are group 0's
  // shifted by g * group_step floats (operands in the order of a, b, c, d).
  std::shared_ptr<const Entry> per_group;
  index_t group_count = 0;
  std::array<index_t, 4> group_step{};

  // Arena bytes of one call of this entry (its reordered operands).
  std::size_t inner_bytes() const {
    if (per_group) return per_group->inner_bytes();
    return arena_bytes(a) + arena_bytes(b) + arena_bytes(c) + arena_bytes(d);
  }
};

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

struct DirectConvolution::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;
  std::deque<Key> order;  // insertion order, for eviction
  // The scratchpad every primitive of this driver uses (one call runs at a time).
  std::unique_ptr<void, decltype(&std::free)> scratch{nullptr, &std::free};
  std::size_t scratch_capacity = 0;

  // The reordered operands' arena (one call at a time, like the scratchpad).
  std::unique_ptr<void, decltype(&std::free)> arena{nullptr, &std::free};
  std::size_t arena_capacity = 0;

  char* reserve_arena(std::size_t bytes) {
    if (bytes > arena_capacity) {
      const std::size_t rounded = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
      arena.reset(std::aligned_alloc(kArenaAlign, rounded));
      HN_CHECK(arena != nullptr, "conv (onednn): cannot allocate a {}-byte operand arena", rounded);
      arena_capacity = rounded;
    }
    return static_cast<char*>(arena.get());
  }

  void reserve_scratch(std::size_t bytes) {
    if (bytes <= scratch_capacity) return;
    constexpr std::size_t kAlign = 64;
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    scratch.reset(std::aligned_alloc(kAlign, rounded));
    HN_CHECK(scratch != nullptr, "conv (onednn): cannot allocate a {}-byte scratchpad", rounded);
    scratch_capacity = rounded;
  }

  Entry& entry(Call call, const LoweringShape& s, index_t out_channels, bool has_bias) {
    const Key key = make_key(call, s, out_channels, has_bias);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= kMaxCachedShapes) {
      cache.erase(order.front());
      order.pop_front();
    }
    Entry made = create(call, s, out_channels, has_bias);
    reserve_scratch(scratch_bytes(made));
    order.push_back(key);
    return cache.emplace(key, std::move(made)).first->second;
  }

  // The primitive on oneDNN's preferred (blocked) layouts, unless their channel padding
  // wastes much: then channels-last where that wastes less and oneDNN has a direct kernel
  // for it, else plain NCHW (the data gradient: the driver's own lowering). Plain NCHW too
  // when the caller asks for it (LoweringShape::plain_kernel, a candidate the tuner times).
  Entry create(Call call, const LoweringShape& s, index_t out_channels, bool has_bias) const {
    if (s.plain_kernel)
      return build(call, Geometry(s, out_channels, has_bias), has_bias, Inner::plain);
    const index_t in_per_group = s.channels / s.groups, out_per_group = out_channels / s.groups;
    // A group of blocked activations is a view only when its channels fill whole blocks.
    const bool views = in_per_group % layout_block(s.layout) == 0 &&
                       out_per_group % layout_block(s.out_layout) == 0;
    if (s.groups > 1 && in_per_group >= kMinGroupChannels && out_per_group >= kMinGroupChannels &&
        views) {
      // oneDNN 2.6 has Winograd only for ungrouped convolutions; where it takes one group
      // alone, the groups run one by one (CaffeNet conv4 and conv5, 3x3 on 13x13, batch
      // 32, one thread: forward + both gradients 95 ms instead of 123, and 59 instead of 82).
      // Not for thin groups: a depthwise convolution (one channel per group) run as 32 to
      // 1024 convolutions of one channel took 60 % of MobileNet v1, where oneDNN's
      // depthwise kernel does all the groups in one call.
      Entry part = build(call, Geometry(s, out_channels, has_bias, true), has_bias, Inner::blocked);
      if (part.implementation.find("wino") != std::string::npos) {
        Entry split;
        split.implementation = part.implementation + " per group";
        split.group_count = s.groups;
        split.group_step = group_steps(call, s, out_channels);
        split.per_group = std::make_shared<const Entry>(std::move(part));
        return split;
      }
    }
    const Geometry geo(s, out_channels, has_bias);
    Entry blocked = build(call, geo, has_bias, Inner::blocked);
    const double waste = blocked.padding;
    const index_t vector_channels =
        call == Call::backward_data ? geo.in_per_group : geo.out_per_group;
    const double nhwc_waste = static_cast<double>(padded_to_vectors(vector_channels)) /
                              static_cast<double>(vector_channels);
    if (waste > kNhwcGain * nhwc_waste) {
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
    if (waste > kMaxPaddingRatio) {
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

  Entry build(Call call, const Geometry& geo, bool has_bias, Inner layout) const {
    const auto fwd = forward_desc(engine, geo, layout);
    const Descs want = descs(geo, layout);
    Entry e;
    switch (call) {
      case Call::forward: {
        e.primitive = dnnl::convolution_forward(fwd);
        e.scratch = scratch_memory(engine, fwd.scratchpad_desc());
        e.implementation = fwd.impl_info_str();
        e.a = make_input(engine, geo.src_user, fwd.src_desc());
        e.b = make_input(engine, geo.weights_plain, fwd.weights_desc());
        if (has_bias) e.c = make_input(engine, geo.bias_plain, fwd.bias_desc());
        e.d = make_output(engine, geo.dst_user, fwd.dst_desc(), false);
        e.padding = padding(e.a) * padding(e.d);
        break;
      }
      case Call::backward_data: {
        const dnnl::convolution_backward_data::desc desc(kAlgorithm, want.src, want.weights,
                                                         want.dst, geo.strides, geo.dilates,
                                                         geo.pad_l, geo.pad_r);
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
        const dnnl::convolution_backward_weights::desc desc(kAlgorithm, want.src, want.weights,
                                                            want.bias, want.dst, geo.strides,
                                                            geo.dilates, geo.pad_l, geo.pad_r);
        const dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(), engine,
                                                                    fwd);
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
};

bool DirectConvolution::available() {
  return true;
}

Layout DirectConvolution::preferred_layout() {
  // Asked once: Capabilities (which reports it) is read on every layer call.
  static const Layout layout = [] {
    // The ISA values are bit sets: AVX2 with VNNI is above avx512_core numerically.
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & avx512) == avx512 ? Layout::nchw16c : Layout::nchw8c;
  }();
  return layout;
}

DirectConvolution::DirectConvolution() = default;
DirectConvolution::~DirectConvolution() = default;

namespace {

// Runs `body` with oneDNN's OpenMP team at the driver's size (primitives size their work
// split when they are created, so this precedes creation too), turning dnnl::error into
// hn::Error naming the call and the shape.
template <class Body>
void run(Call call, int threads, const LoweringShape& shape, index_t out_channels,
         const Body& body) {
  omp_set_num_threads(threads);
  try {
    body();
  } catch (const dnnl::error& e) {
    fail("{} (onednn): {} (status {}) ({} out_channels={})", call_name(call), e.what(),
         static_cast<int>(e.status), shape.to_string(), out_channels);
  }
}

// Bound on the lowered rows a data-gradient GEMM writes before col2im reads them back, so
// they are read from L2 or near it (2 MiB per core on the Xeon, 1 on the EPYC): CaffeNet
// conv1's lowered image is 4.4 MB, and col2im reading it from memory took a third of the
// time. 1 MiB cut SqueezeNet's conv1 (3 channels, 3x3) into GEMMs of 9 and 18 rows: 21.7 ms
// at batch 32 on the EPYC, 17.2 with 2 MiB (one GEMM of 27 rows); CaffeNet conv1 42.7 -> 40.3.
constexpr std::size_t kLoweredBlockBytes = std::size_t{2} << 20;

// The data gradient as type-1 lowering does it, for shapes whose oneDNN kernels pad the
// input channels heavily (CaffeNet conv1: 3 channels; oneDNN's own GEMM-based kernel took
// 104 ms at batch 32 on one thread, this 70): per image and block of input channels,
// columns = W_block^T dy (one GEMM), then col2im into those channels of dx. Images are
// independent, so they are spread over the threads, each GEMM on one thread: results do
// not depend on the thread count.
void lowered_backward_data(Parallel& par, Blas blas, const LoweringShape& s, index_t out_channels,
                           const float* weights, const float* dy, float* dx) {
  const index_t groups = s.groups, m = out_channels / groups, cg = s.channels / groups;
  const index_t taps = s.kernel_h * s.kernel_w, plane_out = s.out_h() * s.out_w();
  const index_t plane_in = s.height * s.width;
  const index_t block = std::clamp<index_t>(
      static_cast<index_t>(kLoweredBlockBytes / (sizeof(float) * taps * plane_out)), 1, cg);
  const index_t dy_block = layout_block(s.out_layout);
  auto image = [&](index_t n, int gemm_threads, Parallel& col2im_par, std::vector<float>& columns,
                   std::vector<float>& dy_plain) {
    columns.resize(static_cast<std::size_t>(block * taps * plane_out));
    const float* dy_n = dy + n * out_channels * plane_out;
    if (dy_block > 1) {
      // Blocked -> NCHW for this image only (it stays in L2 for the GEMMs that read it).
      dy_plain.resize(static_cast<std::size_t>(out_channels * plane_out));
      for (index_t b = 0; b < out_channels / dy_block; ++b) {
        const float* in = dy_n + b * plane_out * dy_block;
        float* out = dy_plain.data() + b * dy_block * plane_out;
        for (index_t p = 0; p < plane_out; ++p) {
          for (index_t c = 0; c < dy_block; ++c)
            out[c * plane_out + p] = in[p * dy_block + c];
        }
      }
      dy_n = dy_plain.data();
    }
    for (index_t g = 0; g < groups; ++g) {
      const float* w_g = weights + g * m * cg * taps;
      const float* dy_g = dy_n + g * m * plane_out;
      for (index_t c0 = 0; c0 < cg; c0 += block) {
        const index_t channels = std::min(block, cg - c0);
        sgemm(blas, gemm_threads, true, false, channels * taps, plane_out, m, 1.0f, w_g + c0 * taps,
              cg * taps, dy_g, plane_out, 0.0f, columns.data(), plane_out);
        LoweringShape part = s;
        part.batch = 1;
        part.channels = channels;
        part.groups = 1;
        col2im(col2im_par, part, columns.data(), dx + (n * s.channels + g * cg + c0) * plane_in);
      }
    }
  };
  if (blas != Blas::onednn || par.threads() == 1) {
    // OpenBLAS sets its thread count process-wide: no GEMMs from several threads at once.
    std::vector<float> columns, dy_plain;
    for (index_t n = 0; n < s.batch; ++n)
      image(n, par.threads(), par, columns, dy_plain);
    return;
  }
  const index_t flops = 2 * out_channels * cg * taps * plane_out;
  par.for_range(s.batch, flops / 8, [&](index_t first, index_t last) {
    thread_local std::vector<float> columns, dy_plain;
    Parallel serial(1);
    for (index_t n = first; n < last; ++n)
      image(n, 1, serial, columns, dy_plain);
  });
}

}  // namespace

namespace {

// Runs a cached call on the caller's buffers (operands in the entry's order a, b, c, d;
// null where the call has no such operand), its reordered operands in `arena` (at least
// e.inner_bytes()). The gradients' calls take dy from `diff_dst` when given: dy already in
// the primitive's layout (then operand b needs no arena).
void execute(const dnnl::stream& stream, Call call, const Entry& e,
             const std::array<const float*, 4>& at, void* scratch, char* arena,
             const memory* diff_dst = nullptr) {
  if (e.per_group) {
    for (index_t g = 0; g < e.group_count; ++g) {
      std::array<const float*, 4> part{};
      for (std::size_t i = 0; i < at.size(); ++i) {
        part[i] = at[i] != nullptr ? at[i] + g * e.group_step[i] : nullptr;
      }
      execute(stream, call, *e.per_group, part, scratch, arena);
    }
    return;
  }
  const std::array<const Operand*, 4> ops{&e.a, &e.b, &e.c, &e.d};
  for (std::size_t i = 0; i < at.size(); ++i) {
    if (at[i] != nullptr) ops[i]->bind(at[i]);
    if (i != 1 || diff_dst == nullptr) bind_inner(*ops[i], arena);
  }
  std::unordered_map<int, memory> args;
  if (e.scratch) {
    e.scratch.set_data_handle(scratch);
    args.emplace(DNNL_ARG_SCRATCHPAD, e.scratch);
  }
  switch (call) {
    case Call::forward:
      load(stream, e.a, scratch);
      load(stream, e.b, scratch);
      args.emplace(DNNL_ARG_SRC, e.a.inner);
      args.emplace(DNNL_ARG_WEIGHTS, e.b.inner);
      args.emplace(DNNL_ARG_DST, e.d.inner);
      if (at[2] != nullptr) {
        load(stream, e.c, scratch);
        args.emplace(DNNL_ARG_BIAS, e.c.inner);
      }
      e.primitive.execute(stream, args);
      store(stream, e.d, scratch);
      break;
    case Call::backward_data:
      load(stream, e.a, scratch);
      if (diff_dst == nullptr) load(stream, e.b, scratch);
      args.emplace(DNNL_ARG_WEIGHTS, e.a.inner);
      args.emplace(DNNL_ARG_DIFF_DST, diff_dst != nullptr ? *diff_dst : e.b.inner);
      args.emplace(DNNL_ARG_DIFF_SRC, e.c.inner);
      e.primitive.execute(stream, args);
      store(stream, e.c, scratch);
      break;
    case Call::backward_weights:
      load(stream, e.a, scratch);
      if (diff_dst == nullptr) load(stream, e.b, scratch);
      args.emplace(DNNL_ARG_SRC, e.a.inner);
      args.emplace(DNNL_ARG_DIFF_DST, diff_dst != nullptr ? *diff_dst : e.b.inner);
      args.emplace(DNNL_ARG_DIFF_WEIGHTS, e.c.inner);
      if (at[3] != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, e.d.inner);
      e.primitive.execute(stream, args);
      store(stream, e.c, scratch);  // adds into dweights
      if (at[3] != nullptr) store(stream, e.d, scratch);
      break;
  }
}

}  // namespace

void DirectConvolution::forward(Parallel& par, const LoweringShape& shape, index_t out_channels,
                                const float* x, const float* weights, const float* bias, float* y) {
  if (small_conv_supported(shape)) {
    small_conv_forward(par, shape, out_channels, x, weights, bias, y);
    return;
  }
  run(Call::forward, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::forward, shape, out_channels, bias != nullptr);
    execute(impl_->stream, Call::forward, e, {x, weights, bias, y}, impl_->scratch.get(),
            impl_->reserve_arena(e.inner_bytes()));
    impl_->stream.wait();
  });
}

void DirectConvolution::backward_data(Parallel& par, Blas blas, const LoweringShape& shape,
                                      index_t out_channels, const float* weights, const float* dy,
                                      float* dx) {
  run(Call::backward_data, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::backward_data, shape, out_channels, false);
    if (e.lowered) {
      lowered_backward_data(par, blas, shape, out_channels, weights, dy, dx);
      return;
    }
    execute(impl_->stream, Call::backward_data, e, {weights, dy, dx, nullptr}, impl_->scratch.get(),
            impl_->reserve_arena(e.inner_bytes()));
    impl_->stream.wait();
  });
}

void DirectConvolution::backward_weights(Parallel& par, const LoweringShape& shape,
                                         index_t out_channels, const float* x, const float* dy,
                                         float* dweights, float* dbias) {
  if (small_conv_supported(shape)) {
    small_conv_backward_weights(par, shape, out_channels, x, dy, dweights, dbias);
    return;
  }
  run(Call::backward_weights, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr);
    execute(impl_->stream, Call::backward_weights, e, {x, dy, dweights, dbias},
            impl_->scratch.get(), impl_->reserve_arena(e.inner_bytes()));
    impl_->stream.wait();
  });
}

void DirectConvolution::backward(Parallel& par, Blas blas, const LoweringShape& shape,
                                 index_t out_channels, const float* x, const float* weights,
                                 const float* dy, float* dx, float* dweights, float* dbias) {
  const auto apart = [&] {
    if (dweights != nullptr) backward_weights(par, shape, out_channels, x, dy, dweights, dbias);
    if (dx != nullptr) backward_data(par, blas, shape, out_channels, weights, dy, dx);
  };
  if (dx == nullptr || dweights == nullptr || small_conv_supported(shape)) return apart();
  bool shared = false;
  run(Call::backward_data, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr);
    const Entry& data = impl_->entry(Call::backward_data, shape, out_channels, false);
    // Looked up again: making the second entry may have evicted the first.
    const Entry& grads =
        impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr);
    // Both primitives read dy in the same layout: reorder it once.
    if (data.lowered || data.per_group || grads.per_group || !data.b.reordered ||
        !grads.b.reordered || data.b.inner.get_desc() != grads.b.inner.get_desc()) {
      return;
    }
    shared = true;
    void* scratch = impl_->scratch.get();
    // The arena: the reordered dy, then the weight gradient's operands, then the data
    // gradient's (both calls skip operand b, given as diff_dst).
    char* arena = impl_->reserve_arena(grads.inner_bytes() + data.inner_bytes());
    char* after_dy = arena;
    bind_inner(data.b, after_dy);
    data.b.bind(dy);
    load(impl_->stream, data.b, scratch);
    execute(impl_->stream, Call::backward_weights, grads, {x, dy, dweights, dbias}, scratch,
            after_dy, &data.b.inner);
    execute(impl_->stream, Call::backward_data, data, {weights, dy, dx, nullptr}, scratch,
            after_dy + grads.inner_bytes(), &data.b.inner);
    impl_->stream.wait();
  });
  if (!shared) apart();
}

#else  // no oneDNN: the driver reports convolution = false and never gets here

struct DirectConvolution::Impl {};

bool DirectConvolution::available() {
  return false;
}

Layout DirectConvolution::preferred_layout() {
  return Layout::nchw16c;
}

DirectConvolution::DirectConvolution() = default;
DirectConvolution::~DirectConvolution() = default;

void DirectConvolution::forward(Parallel&, const LoweringShape&, index_t, const float*,
                                const float*, const float*, float*) {
  fail("conv_forward: this build has no oneDNN");
}
void DirectConvolution::backward_data(Parallel&, Blas, const LoweringShape&, index_t, const float*,
                                      const float*, float*) {
  fail("conv_backward_data: this build has no oneDNN");
}
void DirectConvolution::backward_weights(Parallel&, const LoweringShape&, index_t, const float*,
                                         const float*, float*, float*) {
  fail("conv_backward_weights: this build has no oneDNN");
}
void DirectConvolution::backward(Parallel&, Blas, const LoweringShape&, index_t, const float*,
                                 const float*, const float*, float*, float*, float*) {
  fail("conv_backward: this build has no oneDNN");
}

#endif

}  // namespace hn::detail::cpu
