// Direct convolution through oneDNN (convolution_forward / _backward_data /
// _backward_weights). The caller's activations are NCHW, nChw16c or nChw8c (Layout, shapes.h) and
// its weights [out][in/g][kh][kw]; oneDNN picks its own (blocked) layouts and the calls
// reorder in and out where the caller's differ. Primitives and their internal buffers are
// cached per shape: creating them costs milliseconds.
// conv_primitives.cpp makes and caches the primitives (conv_internal.h); this file runs them.
#include "lib/drivers/cpu/conv.h"

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/core/check.h"
#include "lib/drivers/cpu/conv_depthwise.h"
#include "lib/drivers/cpu/conv_small.h"
#include "lib/drivers/cpu/kernels.h"

#if HYBRIDNN_WITH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "lib/drivers/cpu/conv_internal.h"
#endif

namespace hn::detail::cpu {

#if HYBRIDNN_WITH_ONEDNN

namespace {

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

// Binds `op`'s inner memory at `*at` and advances it.
void bind_inner(const Operand& op, char*& at) {
  if (!op.reordered) return;
  op.inner.set_data_handle(at);
  at += arena_bytes(op);
}

}  // namespace

bool DirectConvolution::available() {
  return true;
}

bool DirectConvolution::fuses(const Activation& activation) {
  return activation.kind == Activation::Kind::relu ||
         (activation.kind == Activation::Kind::clip && activation.lo == 0.0f);
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

const char* DirectConvolution::isa() {
  static const char* const name = [] {
    const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const std::pair<dnnl::cpu_isa, const char*> levels[] = {
        {dnnl::cpu_isa::avx512_core, "avx512_core"},
        {dnnl::cpu_isa::avx2, "avx2"},
        {dnnl::cpu_isa::avx, "avx"},
    };
    for (const auto& [level, level_name] : levels) {
      const auto bits = static_cast<unsigned>(level);
      if ((effective & bits) == bits) return level_name;
    }
    return "sse41";
  }();
  return name;
}

bool DirectConvolution::bf16_available() {
  static const bool available = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return available;
}

const char* DirectConvolution::bf16_isa() {
  static const char* const name = [] {
    if (!bf16_available()) return "";
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
    return (isa & amx) == amx ? "AMX" : "AVX512_BF16";
  }();
  return name;
}

DirectConvolution::DirectConvolution() = default;
DirectConvolution::~DirectConvolution() = default;

namespace {

// A depthwise weight gradient that oneDNN would compute with its GEMM-based kernel (its
// depthwise one takes 3x3 windows only): conv_depthwise.h's instead.
bool own_depthwise(const Entry& e, const LoweringShape& shape, index_t out_channels) {
  return depthwise_own(shape, out_channels) && e.implementation.find("gemm") != std::string::npos;
}

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
// the primitive's layout (then operand b needs no arena); the forward call takes the
// weights from `weights_inner` when given, already in the primitive's layout (the driver's
// copy, Impl::weights_in_layout).
void execute(const dnnl::stream& stream, Call call, const Entry& e,
             const std::array<const float*, 4>& at, void* scratch, char* arena,
             const memory* diff_dst = nullptr, void* weights_inner = nullptr,
             const float* residual = nullptr) {
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
    if (i != 1 || (diff_dst == nullptr && weights_inner == nullptr)) bind_inner(*ops[i], arena);
  }
  if (weights_inner != nullptr) e.b.inner.set_data_handle(weights_inner);
  std::unordered_map<int, memory> args;
  if (e.scratch) {
    e.scratch.set_data_handle(scratch);
    args.emplace(DNNL_ARG_SCRATCHPAD, e.scratch);
  }
  switch (call) {
    case Call::forward:
      load(stream, e.a, scratch);
      if (weights_inner == nullptr) load(stream, e.b, scratch);
      args.emplace(DNNL_ARG_SRC, e.a.inner);
      args.emplace(DNNL_ARG_WEIGHTS, e.b.inner);
      args.emplace(DNNL_ARG_DST, e.d.inner);
      if (at[2] != nullptr) {
        load(stream, e.c, scratch);
        args.emplace(DNNL_ARG_BIAS, e.c.inner);
      }
      if (residual != nullptr) {
        e.residual.set_data_handle(const_cast<float*>(residual));
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, e.residual);
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
                                const float* x, const float* weights, const float* bias, float* y,
                                const Activation& activation, const float* residual) {
  // The post-ops: the residual's sum, then the activation where oneDNN applies it.
  const bool apart = residual != nullptr
                         ? activation.kind != Activation::Kind::none && !fuses(activation)
                         : !fuses(activation);
  const index_t n = shape.batch * out_channels * shape.out_h() * shape.out_w();
  const auto after = [&] {
    if (residual != nullptr && activation.kind == Activation::Kind::relu)
      return lincomb_relu(par, n, 1.0f, y, 1.0f, residual, activation.slope, y);
    if (residual != nullptr) lincomb(par, n, 1.0f, y, 1.0f, residual, y);
    if (activation.kind == Activation::Kind::relu) relu_forward(par, n, activation.slope, y, y);
    if (activation.kind == Activation::Kind::clip)
      clip_forward(par, n, activation.lo, activation.hi, y, y);
  };
  if (small_conv_supported(shape)) {
    if (residual == nullptr)
      return small_conv_forward(par, shape, out_channels, x, weights, bias, activation, y);
    small_conv_forward(par, shape, out_channels, x, weights, bias, Activation{}, y);
    return after();
  }
  if (depthwise_plain(shape, out_channels)) {
    depthwise_forward(par, shape, x, weights, bias, y);
    return after();
  }
  bool separate = apart;
  run(Call::forward, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const bool sum = residual != nullptr;
    const Entry* fused = nullptr;
    if (!apart) {
      fused = fused_entry(shape, out_channels, bias != nullptr, activation, sum);
    }
    separate = fused == nullptr;
    const Entry& e = fused != nullptr ? *fused
                                      : impl_->entry(Call::forward, shape, out_channels,
                                                     bias != nullptr, bf16_for(shape));
    void* weights_inner = nullptr;
    if (shape.weights_version != 0 && !e.per_group && e.b.reordered)
      weights_inner = impl_->weights_in_layout(e, weights, shape.weights_version);
    execute(impl_->stream, Call::forward, e, {x, weights, bias, y}, impl_->scratch.get(),
            impl_->reserve_arena(e.inner_bytes()), nullptr, weights_inner,
            fused != nullptr ? residual : nullptr);
    impl_->stream.wait();
  });
  if (separate) after();
}

// The forward call with post-ops (the residual's sum when `sum`, then `activation`), or null
// where the kernel without them should run and the driver's passes apply them after it.
// The post-ops only where they keep the kernel the call has without them: oneDNN's
// Winograd takes no such chain (ResNet-50's 3x3 layers fell back to its direct kernel:
// 1,090 -> 1,255 ms forward at batch 32), and its GEMM-based and reference kernels apply
// post-ops element by element after the fact (MobileNet v2's 24 -> 144 1x1 layers: 155 ms
// instead of 12). The residual only where the kernel writes y in the caller's layout (the
// sum reads it in that layout) and not group by group. Decided once per entry.
const Entry* DirectConvolution::fused_entry(const LoweringShape& shape, index_t out_channels,
                                            bool has_bias, const Activation& activation, bool sum) {
  Entry* fused = nullptr;
  try {
    fused = &impl_->entry(Call::forward, shape, out_channels, has_bias, bf16_for(shape), activation,
                          sum);
  } catch (const dnnl::error&) {
    if (!sum) throw;
    return nullptr;  // no kernel takes this residual: the driver's sum after the call
  }
  if (!fused->use_post_ops) {
    const std::string alone =
        impl_->entry(Call::forward, shape, out_channels, has_bias, bf16_for(shape)).implementation;
    // Looked up again: making the other entry may have evicted this one.
    Entry& again = impl_->entry(Call::forward, shape, out_channels, has_bias, bf16_for(shape),
                                activation, sum);
    const std::string& impl = again.implementation;
    again.use_post_ops = impl == alone && impl.find("gemm") == std::string::npos &&
                         impl.find("ref") == std::string::npos &&
                         (!sum || (again.residual && !again.d.reordered && !again.per_group));
    fused = &again;
  }
  return *fused->use_post_ops ? fused : nullptr;
}

void DirectConvolution::backward_data(Parallel& par, Blas blas, const LoweringShape& shape,
                                      index_t out_channels, const float* weights, const float* dy,
                                      float* dx) {
  if (small_conv_supported(shape)) {
    small_conv_backward_data(par, shape, out_channels, weights, dy, dx);
    return;
  }
  if (depthwise_plain(shape, out_channels)) {
    depthwise_backward_data(par, shape, weights, dy, dx);
    return;
  }
  run(Call::backward_data, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::backward_data, shape, out_channels, false, bf16_for(shape));
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
  if (depthwise_plain(shape, out_channels)) {
    depthwise_backward_weights(par, shape, x, dy, dweights, dbias);
    return;
  }
  run(Call::backward_weights, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    const Entry& e = impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr,
                                  bf16_for(shape));
    if (own_depthwise(e, shape, out_channels)) {
      depthwise_backward_weights(par, shape, x, dy, dweights, dbias);
      return;
    }
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
  if (dx == nullptr || dweights == nullptr || small_conv_supported(shape) ||
      depthwise_plain(shape, out_channels)) {
    return apart();
  }
  bool shared = false;
  run(Call::backward_data, par.threads(), shape, out_channels, [&] {
    if (!impl_) impl_ = std::make_unique<Impl>();
    impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr, bf16_for(shape));
    const Entry& data =
        impl_->entry(Call::backward_data, shape, out_channels, false, bf16_for(shape));
    // Looked up again: making the second entry may have evicted the first.
    const Entry& grads = impl_->entry(Call::backward_weights, shape, out_channels, dbias != nullptr,
                                      bf16_for(shape));
    // Both primitives read dy in the same layout: reorder it once.
    if (own_depthwise(grads, shape, out_channels) || data.lowered || data.per_group ||
        grads.per_group || !data.b.reordered || !grads.b.reordered ||
        data.b.inner.get_desc() != grads.b.inner.get_desc()) {
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

bool DirectConvolution::fuses(const Activation&) {
  return false;
}

Layout DirectConvolution::preferred_layout() {
  return Layout::nchw16c;
}

bool DirectConvolution::bf16_available() {
  return false;
}

const char* DirectConvolution::bf16_isa() {
  return "";
}

const char* DirectConvolution::isa() {
  return "none";
}

DirectConvolution::DirectConvolution() = default;
DirectConvolution::~DirectConvolution() = default;

void DirectConvolution::forward(Parallel&, const LoweringShape&, index_t, const float*,
                                const float*, const float*, float*, const Activation&,
                                const float*) {
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
