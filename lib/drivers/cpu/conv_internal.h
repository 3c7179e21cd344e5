// The oneDNN side of the CPU driver's direct convolution shared by conv.cpp (running the
// calls) and conv_primitives.cpp (making and caching their primitives). Only with oneDNN.
#pragma once

#if HYBRIDNN_WITH_ONEDNN

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include "lib/core/shapes.h"
#include "lib/drivers/cpu/conv.h"

namespace hn::detail::cpu {

using dnnl::memory;

enum class Call { forward, backward_data, backward_weights };

// The cache's key: a call's kind and shape (make_key, conv_primitives.cpp).
using Key = std::array<index_t, 24>;

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

// Reordered operands live in one arena the driver owns, at offsets bound at each call:
// buffers kept per cached primitive held every shape's and direction's reordered
// activations at once (CaffeNet: about 100 MB of its peak), while one call needs only its
// own. Sizes are rounded to cache lines.
constexpr std::size_t kArenaAlign = 64;

inline std::size_t arena_bytes(const Operand& op) {
  if (!op.reordered) return 0;
  return (op.inner.get_desc().get_size() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

// Defined in conv_primitives.cpp: a shape's oneDNN descriptors, and the activation layout
// a call asks oneDNN for.
struct Geometry;
enum class Inner;

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
  // The activation layout the call asked oneDNN for (conv_primitives.cpp).
  Inner inner_layout{};
  // A forward call with post-ops: whether to use it (DirectConvolution::forward decides at
  // its first use: only where the call without them runs the same kernel).
  std::optional<bool> use_post_ops;
  // A forward call adding a residual (DirectConvolution::forward): the binary post-op's
  // second input, laid out as y (address set per call).
  memory residual;
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

  // The forward calls' weights in their primitives' layouts, by the caller's address, for
  // weights whose contents a version names (LoweringShape::weights_version): reordered
  // again when the version or the layout differs. At batch 1 the reorders took a third of
  // MobileNet v2's forward. At most kMaxLaidOutBytes, the least recently used dropped first
  // (the weights of a net destroyed since are never used again).
  struct LaidOutWeights {
    std::uint64_t version = 0;
    memory::desc desc;
    std::unique_ptr<void, decltype(&std::free)> buffer{nullptr, &std::free};
    std::size_t bytes = 0;
    std::uint64_t used = 0;  // laid_out_clock at the last use
  };
  static constexpr std::size_t kMaxLaidOutBytes = std::size_t{256} << 20;
  std::map<const void*, LaidOutWeights> laid_out;
  std::size_t laid_out_bytes = 0;
  std::uint64_t laid_out_clock = 0;

  char* reserve_arena(std::size_t bytes);
  // Entry e's weights operand holding `weights` of `version`, reordered into laid_out on a
  // miss; the address of the copy, or nullptr when it would not fit (then the call reorders
  // them into the arena as before).
  void* weights_in_layout(const Entry& e, const float* weights, std::uint64_t version);
  void reserve_scratch(std::size_t bytes);
  // `bf16`: the call's inputs as BF16 (DirectConvolution::set_bf16), where oneDNN has a
  // fast kernel for it; else the FP32 entry. `activation`: the forward call's post-op;
  // `residual`: a sum with a tensor laid out as y before it.
  Entry& entry(Call call, const LoweringShape& s, index_t out_channels, bool has_bias, bool bf16,
               const Activation& activation = {}, bool residual = false);
  Entry create(Call call, const LoweringShape& s, index_t out_channels, bool has_bias, bool bf16,
               const Activation& activation, bool residual) const;
  Entry create_fp32(Call call, const LoweringShape& s, index_t out_channels, bool has_bias,
                    const Activation& activation, bool residual) const;
  Entry build(Call call, const Geometry& geo, bool has_bias, Inner layout) const;
};

}  // namespace hn::detail::cpu

#endif  // HYBRIDNN_WITH_ONEDNN
