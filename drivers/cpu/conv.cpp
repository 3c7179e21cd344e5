// Direct convolution through oneDNN (convolution_forward / _backward_data /
// _backward_weights). The caller's tensors are plain NCHW and [out][in/g][kh][kw]; oneDNN
// picks its own (blocked) layouts and the calls reorder in and out. Primitives and their
// internal buffers are cached per shape: creating them costs milliseconds.
#include "drivers/cpu/conv.h"

#include <array>
#include <deque>
#include <map>
#include <unordered_map>

#include "lib/check.h"

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
constexpr std::size_t kMaxCachedShapes = 64;

using Key = std::array<index_t, 16>;

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
          has_bias ? 1 : 0};
}

// One tensor of a call: `user` wraps the caller's plain buffer (address set per call),
// `inner` is what the primitive reads or writes. They are the same memory when the layouts
// agree; otherwise `reorder` copies user -> inner (inputs) or inner -> user (outputs; with
// a sum post-op when the call accumulates).
struct Operand {
  memory user, inner;
  dnnl::reorder reorder;
  bool reordered = false;

  void bind(const void* address) const { user.set_data_handle(const_cast<void*>(address)); }
};

Operand make_input(const dnnl::engine& engine, const memory::desc& plain,
                   const memory::desc& wanted) {
  Operand op;
  op.user = memory(plain, engine, nullptr);
  if (wanted == plain) {
    op.inner = op.user;
  } else {
    op.inner = memory(wanted, engine);
    op.reorder = dnnl::reorder(op.user, op.inner);
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
  op.inner = memory(wanted, engine);
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
  op.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(op.inner, op.user, attr));
  op.reordered = true;
  return op;
}

// dnnl::reorder::execute takes non-const memory references; the copies share the buffers.
void load(const dnnl::stream& stream, const Operand& op) {
  memory user = op.user, inner = op.inner;
  if (op.reordered) op.reorder.execute(stream, user, inner);
}

void store(const dnnl::stream& stream, const Operand& op) {
  memory user = op.user, inner = op.inner;
  if (op.reordered) op.reorder.execute(stream, inner, user);
}

// oneDNN's descriptors of one convolution shape: plain (the caller's layouts) and `any`
// (left to the primitive).
struct Geometry {
  memory::desc src_plain, weights_plain, dst_plain, bias_plain;
  memory::desc src_any, weights_any, dst_any, bias_any;
  memory::dims strides, dilates, pad_l, pad_r;

  Geometry(const LoweringShape& s, index_t out_channels, bool has_bias) {
    const memory::dims src{s.batch, s.channels, s.height, s.width};
    const memory::dims dst{s.batch, out_channels, s.out_h(), s.out_w()};
    const index_t g = s.groups;
    const memory::dims weights =
        g == 1 ? memory::dims{out_channels, s.channels, s.kernel_h, s.kernel_w}
               : memory::dims{g, out_channels / g, s.channels / g, s.kernel_h, s.kernel_w};
    const auto f32 = memory::data_type::f32;
    src_plain = memory::desc(src, f32, Tag::nchw);
    dst_plain = memory::desc(dst, f32, Tag::nchw);
    weights_plain = memory::desc(weights, f32, g == 1 ? Tag::oihw : Tag::goihw);
    src_any = memory::desc(src, f32, Tag::any);
    dst_any = memory::desc(dst, f32, Tag::any);
    weights_any = memory::desc(weights, f32, Tag::any);
    if (has_bias) {
      bias_plain = memory::desc({out_channels}, f32, Tag::x);
      bias_any = memory::desc({out_channels}, f32, Tag::any);
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

// An internal layout this much larger than the plain one is mostly channel padding (e.g.
// 3 input channels blocked by 16 for conv1's backward data: 45 GFLOP/s blocked, 136 plain).
constexpr std::size_t kMaxPaddingRatio = 2;

dnnl::convolution_forward::primitive_desc forward_desc(const dnnl::engine& engine,
                                                       const Geometry& geo, bool plain) {
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_training, kAlgorithm, plain ? geo.src_plain : geo.src_any,
      plain ? geo.weights_plain : geo.weights_any, plain ? geo.bias_plain : geo.bias_any,
      plain ? geo.dst_plain : geo.dst_any, geo.strides, geo.dilates, geo.pad_l, geo.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, engine);
}

// A cached call: the primitive and the operands in the order the call lists them.
struct Entry {
  dnnl::primitive primitive;
  Operand a, b, c, d;
};

}  // namespace

struct DirectConvolution::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;
  std::deque<Key> order;  // insertion order, for eviction

  Entry& entry(Call call, const LoweringShape& s, index_t out_channels, bool has_bias) {
    const Key key = make_key(call, s, out_channels, has_bias);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    if (cache.size() >= kMaxCachedShapes) {
      cache.erase(order.front());
      order.pop_front();
    }
    Entry made = create(call, s, out_channels, has_bias);
    order.push_back(key);
    return cache.emplace(key, std::move(made)).first->second;
  }

  // The primitive on oneDNN's preferred layouts, unless they pad a tensor heavily.
  Entry create(Call call, const LoweringShape& s, index_t out_channels, bool has_bias) const {
    const Geometry geo(s, out_channels, has_bias);
    Entry blocked = build(call, geo, has_bias, false);
    for (const Operand* op : {&blocked.a, &blocked.b, &blocked.c, &blocked.d}) {
      if (op->reordered &&
          op->inner.get_desc().get_size() > kMaxPaddingRatio * op->user.get_desc().get_size()) {
        return build(call, geo, has_bias, true);
      }
    }
    return blocked;
  }

  Entry build(Call call, const Geometry& geo, bool has_bias, bool plain) const {
    const auto fwd = forward_desc(engine, geo, plain);
    Entry e;
    switch (call) {
      case Call::forward: {
        e.primitive = dnnl::convolution_forward(fwd);
        e.a = make_input(engine, geo.src_plain, fwd.src_desc());
        e.b = make_input(engine, geo.weights_plain, fwd.weights_desc());
        if (has_bias) e.c = make_input(engine, geo.bias_plain, fwd.bias_desc());
        e.d = make_output(engine, geo.dst_plain, fwd.dst_desc(), false);
        break;
      }
      case Call::backward_data: {
        const dnnl::convolution_backward_data::desc desc(
            kAlgorithm, plain ? geo.src_plain : geo.src_any,
            plain ? geo.weights_plain : geo.weights_any, plain ? geo.dst_plain : geo.dst_any,
            geo.strides, geo.dilates, geo.pad_l, geo.pad_r);
        const dnnl::convolution_backward_data::primitive_desc pd(desc, engine, fwd);
        e.primitive = dnnl::convolution_backward_data(pd);
        e.a = make_input(engine, geo.weights_plain, pd.weights_desc());
        e.b = make_input(engine, geo.dst_plain, pd.diff_dst_desc());
        e.c = make_output(engine, geo.src_plain, pd.diff_src_desc(), false);
        break;
      }
      case Call::backward_weights: {
        const dnnl::convolution_backward_weights::desc desc(
            kAlgorithm, plain ? geo.src_plain : geo.src_any,
            plain ? geo.weights_plain : geo.weights_any, plain ? geo.bias_plain : geo.bias_any,
            plain ? geo.dst_plain : geo.dst_any, geo.strides, geo.dilates, geo.pad_l, geo.pad_r);
        const dnnl::convolution_backward_weights::primitive_desc pd(desc, engine, fwd);
        e.primitive = dnnl::convolution_backward_weights(pd);
        e.a = make_input(engine, geo.src_plain, pd.src_desc());
        e.b = make_input(engine, geo.dst_plain, pd.diff_dst_desc());
        e.c = make_output(engine, geo.weights_plain, pd.diff_weights_desc(), true);
        if (has_bias) e.d = make_output(engine, geo.bias_plain, pd.diff_bias_desc(), true);
        break;
      }
    }
    return e;
  }
};

bool DirectConvolution::available() {
  return true;
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

}  // namespace

void DirectConvolution::forward(int threads, const LoweringShape& shape, index_t out_channels,
                                const float* x, const float* weights, const float* bias, float* y) {
  run(Call::forward, threads, shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::forward, shape, out_channels, bias != nullptr);
    dnnl::stream& stream = impl_->stream;
    e.a.bind(x);
    e.b.bind(weights);
    if (bias != nullptr) e.c.bind(bias);
    e.d.bind(y);
    load(stream, e.a);
    load(stream, e.b);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, e.a.inner}, {DNNL_ARG_WEIGHTS, e.b.inner}, {DNNL_ARG_DST, e.d.inner}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, e.c.inner);
    e.primitive.execute(stream, args);
    store(stream, e.d);
    stream.wait();
  });
}

void DirectConvolution::backward_data(int threads, const LoweringShape& shape, index_t out_channels,
                                      const float* weights, const float* dy, float* dx) {
  run(Call::backward_data, threads, shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::backward_data, shape, out_channels, false);
    dnnl::stream& stream = impl_->stream;
    e.a.bind(weights);
    e.b.bind(dy);
    e.c.bind(dx);
    load(stream, e.a);
    load(stream, e.b);
    e.primitive.execute(stream, {{DNNL_ARG_WEIGHTS, e.a.inner},
                                 {DNNL_ARG_DIFF_DST, e.b.inner},
                                 {DNNL_ARG_DIFF_SRC, e.c.inner}});
    store(stream, e.c);
    stream.wait();
  });
}

void DirectConvolution::backward_weights(int threads, const LoweringShape& shape,
                                         index_t out_channels, const float* x, const float* dy,
                                         float* dweights, float* dbias) {
  run(Call::backward_weights, threads, shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const bool has_bias = dbias != nullptr;
    const Entry& e = impl_->entry(Call::backward_weights, shape, out_channels, has_bias);
    dnnl::stream& stream = impl_->stream;
    e.a.bind(x);
    e.b.bind(dy);
    e.c.bind(dweights);
    if (has_bias) e.d.bind(dbias);
    load(stream, e.a);
    load(stream, e.b);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, e.a.inner},
                                         {DNNL_ARG_DIFF_DST, e.b.inner},
                                         {DNNL_ARG_DIFF_WEIGHTS, e.c.inner}};
    if (has_bias) args.emplace(DNNL_ARG_DIFF_BIAS, e.d.inner);
    e.primitive.execute(stream, args);
    store(stream, e.c);  // adds into dweights
    if (has_bias) store(stream, e.d);
    stream.wait();
  });
}

#else  // no oneDNN: the driver reports convolution = false and never gets here

struct DirectConvolution::Impl {};

bool DirectConvolution::available() {
  return false;
}

DirectConvolution::DirectConvolution() = default;
DirectConvolution::~DirectConvolution() = default;

void DirectConvolution::forward(int, const LoweringShape&, index_t, const float*, const float*,
                                const float*, float*) {
  fail("conv_forward: this build has no oneDNN");
}
void DirectConvolution::backward_data(int, const LoweringShape&, index_t, const float*,
                                      const float*, float*) {
  fail("conv_backward_data: this build has no oneDNN");
}
void DirectConvolution::backward_weights(int, const LoweringShape&, index_t, const float*,
                                         const float*, float*, float*) {
  fail("conv_backward_weights: this build has no oneDNN");
}

#endif

}  // namespace hn::detail::cpu
