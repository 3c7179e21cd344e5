// The Net's memory plan: blob versions grouped by shared memory, each group live over an
// interval of the forward-then-backward schedule; groups whose intervals do not overlap
// share a slot.
#include "lib/net/net_impl.h"

#include <fmt/ranges.h>

#include <new>
#include <string>
#include <vector>

namespace hn {

void Net::Impl::plan_memory() {
  const int n = static_cast<int>(layers.size());
  bool any_backward = false;
  for (const NetLayer& nl : layers)
    any_backward = any_backward || nl.needs_backward;
  // Steps: forward of layer l = 2l; loss gradients are set at 2n; backward of layer l =
  // 2n + 1 + 2(n - 1 - l).
  auto fwd = [](int l) { return 2 * l; };
  auto bwd = [n](int l) { return 2 * n + 1 + 2 * (n - 1 - l); };
  auto touch = [&](int group, int step) {
    Group& g = groups[group];
    g.first = std::min(g.first, step);
    g.last = std::max(g.last, step);
  };
  // On a host driver, a blob too large for the machine is named here, before anything is
  // allocated.
  const bool on_host = driver->memory_space() == host_space();
  for (std::size_t b = 0; b < blobs.size(); ++b) {
    const BlobVersion& blob = blobs[b];
    // A convolution's output that it adds into a sum instead is never written or read.
    if (!blob.summed_by.empty()) continue;
    if (on_host) {
      check_host_bytes(sizeof(float) * static_cast<std::size_t>(blob.shape.count()), [&] {
        return fmt::format("{}: top '{}' ({})", where(blob.producer), blob.name,
                           blob.shape.to_string());
      });
    }
    touch(blob.data_group, fwd(blob.producer));
    for (int c : blob.consumers) {
      touch(blob.data_group, fwd(c));
      if (layers[c].needs_backward) touch(blob.data_group, bwd(c));
    }
    if (layers[blob.producer].needs_backward) touch(blob.data_group, bwd(blob.producer));
    // Input and DummyData values are written once (by the caller, or by a constant filler)
    // and read every iteration; the caller reads Input gradients.
    const Kind source = layers[blob.producer].kind;
    const bool input = source == Kind::input || source == Kind::dummy;
    if (blob.keep || input || !options.reuse_memory) groups[blob.data_group].pinned = true;
    // Gradients: written by the consumer's backward (or set as a loss weight), read by the
    // producer's backward. A top whose gradient nothing writes must read as zeros: pinned.
    Group& diff = groups[blob.diff_group];
    const NetLayer& producer = layers[blob.producer];
    if (!any_backward) continue;
    bool written = false;
    for (int c : blob.consumers) {
      for (std::size_t i = 0; i < layers[c].bottoms.size(); ++i) {
        if (layers[c].bottoms[i] == static_cast<int>(b) && layers[c].propagate_down[i]) {
          touch(blob.diff_group, bwd(c));
          written = true;
        }
      }
    }
    for (std::size_t t = 0; t < producer.tops.size(); ++t) {
      if (producer.tops[t] == static_cast<int>(b) && producer.loss_weights[t] != 0.0f) {
        touch(blob.diff_group, 2 * n);
        written = true;
      }
    }
    if (producer.needs_backward) touch(blob.diff_group, bwd(blob.producer));
    if (!written || blob.keep || input || !options.reuse_memory) diff.pinned = true;
  }
  // A convolution running the sum after it (plan_fusion) writes the sum's output and reads
  // its other input in its own steps, before the sum's.
  for (int l = 0; l < n; ++l) {
    const NetLayer& conv = layers[static_cast<std::size_t>(l)];
    if (conv.fused_residual < 0) continue;
    const NetLayer& sum = layers[static_cast<std::size_t>(conv.fused_residual)];
    for (int blob : {sum.tops[0], sum.bottoms[0], sum.bottoms[1]}) {
      const BlobVersion& version = blobs[static_cast<std::size_t>(blob)];
      if (!version.summed_by.empty()) continue;
      touch(version.data_group, fwd(l));
      if (any_backward && conv.needs_backward) touch(version.diff_group, bwd(l));
    }
  }
  // Groups never touched (no backward) need no memory. The rest are placed largest first,
  // each in the smallest slot none of whose groups is live while it is (best fit): a slot is
  // as large as its first group and never grows. (Placed in schedule order instead, first
  // fit, CaffeNet's gradients grew small slots to the size of the conv1 gradient: 233 MiB
  // of activations at batch 32 against 191 now; every blob live at once would take 256.)
  std::vector<int> order;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    bytes_without_reuse += groups[g].last >= 0 ? groups[g].bytes : 0;
    if (groups[g].last >= 0) order.push_back(static_cast<int>(g));
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (groups[a].bytes != groups[b].bytes) return groups[a].bytes > groups[b].bytes;
    return groups[a].first != groups[b].first ? groups[a].first < groups[b].first : a < b;
  });
  struct Slot {
    std::size_t bytes = 0;
    bool pinned = false;
    std::vector<int> members;  // groups placed here, live over disjoint steps
  };
  const auto overlap = [&](int a, int b) {
    return groups[a].first <= groups[b].last && groups[b].first <= groups[a].last;
  };
  std::vector<Slot> plan;
  for (int g : order) {
    Group& group = groups[g];
    int chosen = -1;
    if (!group.pinned) {
      for (std::size_t s = 0; s < plan.size(); ++s) {
        if (plan[s].pinned || (chosen >= 0 && plan[s].bytes >= plan[chosen].bytes)) continue;
        const auto& members = plan[s].members;
        if (std::none_of(members.begin(), members.end(), [&](int m) { return overlap(m, g); }))
          chosen = static_cast<int>(s);
      }
    }
    if (chosen < 0) {
      chosen = static_cast<int>(plan.size());
      plan.push_back(Slot{group.bytes, group.pinned, {}});
    }
    plan[chosen].members.push_back(g);
    group.slot = chosen;
  }
  // Groups nothing touches (gradients in a net without backward) share an empty memory.
  const int unused = static_cast<int>(plan.size());
  plan.push_back(Slot{0, true, {}});
  for (Group& group : groups) {
    if (group.slot < 0) group.slot = unused;
  }
  // Each group begins with a write: its producer's forward, a consumer's backward, or the
  // loss weight its producer's backward sets (step 2n).
  starts.assign(layers.size(), {});
  slot_holder.assign(plan.size(), -1);
  std::vector<int> loss_writer(groups.size(), -1);
  for (const NetLayer& nl : layers) {
    for (std::size_t t = 0; t < nl.tops.size(); ++t) {
      const int group = blobs[static_cast<std::size_t>(nl.tops[t])].diff_group;
      if (nl.loss_weights[t] != 0.0f && group >= 0)
        loss_writer[static_cast<std::size_t>(group)] = static_cast<int>(&nl - layers.data());
    }
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const int first = groups[g].last >= 0 ? groups[g].first : -1;
    if (first < 0) continue;
    if (first < 2 * n) {
      starts[static_cast<std::size_t>(first / 2)].forward.push_back(static_cast<int>(g));
    } else if (first == 2 * n && loss_writer[g] >= 0) {
      starts[static_cast<std::size_t>(loss_writer[g])].backward.push_back(static_cast<int>(g));
    } else if (first > 2 * n) {
      starts[static_cast<std::size_t>(bwd(0) - first) / 2].backward.push_back(static_cast<int>(g));
    }
  }
  for (const Slot& slot : plan) {
    slots.push_back(std::make_unique<SyncedMemory>(slot.bytes));
    bytes_with_reuse += slot.bytes;
  }
  if (on_host) {
    check_host_bytes(bytes_with_reuse, [&] {
      return fmt::format(
          "{}: the blobs of net '{}' (data and gradients, shared where their lifetimes allow)",
          origin, name);
    });
  }
  // Every slot is allocated now (zero-filled, as new memory reads) on the net's driver, so
  // that running out of memory is an error here, naming the blobs, rather than in the middle
  // of some layer's forward.
  for (std::size_t s = 0; s < slots.size(); ++s) {
    if (slots[s]->bytes() == 0) continue;
    const auto describe = [&] {
      std::vector<std::string> names;
      for (const BlobVersion& blob : blobs) {
        const std::string shape = blob.shape.to_string();
        if (groups[blob.data_group].slot == static_cast<int>(s))
          names.push_back(fmt::format("blob '{}' ({})", blob.name, shape));
        if (any_backward && groups[blob.diff_group].slot == static_cast<int>(s))
          names.push_back(fmt::format("the gradient of blob '{}' ({})", blob.name, shape));
      }
      const std::size_t shown = std::min<std::size_t>(names.size(), 3);
      std::string text = fmt::format("{}", fmt::join(names.begin(), names.begin() + shown, ", "));
      if (names.size() > shown)
        text += fmt::format(" and {} more sharing its memory", names.size() - shown);
      return fmt::format("{}: net '{}': allocating {} on {} for {}", origin, name,
                         format_bytes(slots[s]->bytes()), driver->name(), text);
    };
    try {
      slots[s]->write(*driver);
    } catch (const std::bad_alloc&) {
      throw Error(fmt::format("{}: out of memory", describe()));
    } catch (const Error& error) {
      throw Error(fmt::format("{}: {}", describe(), error.what()));
    }
  }
  // One workspace for every layer: the largest need.
  std::size_t workspace_bytes = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const NetLayer& nl = layers[l];
    if (!nl.layer) continue;
    index_t rows = batch;
    if (!nl.bottoms.empty() && blobs[nl.bottoms[0]].shape.axes() > 0) {
      rows = blobs[nl.bottoms[0]].shape[0];
    }
    workspace_bytes = std::max(workspace_bytes, nl.layer->workspace_bytes(*driver, rows));
  }
  scheduler->reserve_workspace(workspace_bytes);
}

}  // namespace hn
