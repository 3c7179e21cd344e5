// The Net's choice of activation layout (NetOptions::blocked_layout): a blob is kept in the
// driver's preferred blocked layout (nChw16c or nChw8c) when its producer and every consumer
// compute on it (Layer::blocked_layout) on the Net's own driver, which must have
// Capabilities::blocked_layout, or on every device of their split where each has it in the
// same layout, so the layers between the edges (inputs, outputs, kept blobs, layers without
// a blocked kernel, layers split with a device without it) never reorder it.
#include "lib/net/net_impl.h"

namespace hn {

namespace {

// Tensors of one pixel per channel lie the same way in every layout.
bool one_pixel(const Shape& shape) {
  return shape.axes() == 4 && shape[2] * shape[3] == 1;
}

}  // namespace

void Net::Impl::plan_layouts() {
  const Capabilities caps = driver->capabilities();
  if (!options.blocked_layout || !caps.blocked_layout) return;
  const Layout layout = caps.preferred_blocked_layout;
  // A layer cut by rows computes blocked where every device of its split does so in the
  // Net's driver's layout (two CPU drivers): a blocked image's rows lie as an NCHW one's do,
  // each image whole, so the slices are the same byte ranges.
  const auto devices_block = [&](const NetLayer& nl) {
    const std::vector<Device> devices = nl.automatic ? nl.auto_devices : nl.split.devices();
    return std::all_of(devices.begin(), devices.end(), [&](const Device& d) {
      const Driver* on =
          d == driver->device() ? driver : (runtime != nullptr ? runtime->find(d) : nullptr);
      if (on == nullptr) return false;
      const Capabilities theirs = on->capabilities();
      return theirs.blocked_layout && theirs.preferred_blocked_layout == layout;
    });
  };
  using Support = Layer::BlockedLayout;
  const auto support = [&](int l) {
    const NetLayer& nl = layers[static_cast<std::size_t>(l)];
    if (nl.kind == Kind::split) return Support::uniform;  // aliases and sums
    if (nl.kind != Kind::compute || !nl.parts.empty()) return Support::none;
    if ((!nl.split.empty() || nl.automatic) && !devices_block(nl)) return Support::none;
    return nl.layer->blocked_layout();
  };
  // Per data group (in-place chains and split aliases share one): whether it may be blocked.
  std::vector<bool> blocked(groups.size(), true);
  for (const BlobVersion& blob : blobs) {
    bool ok = blob.shape.axes() == 4 && blob.shape[1] % layout_block(layout) == 0 && !blob.keep &&
              support(blob.producer) != Support::none;
    for (int c : blob.consumers)
      ok = ok && support(c) != Support::none;
    if (!ok) blocked[static_cast<std::size_t>(blob.data_group)] = false;
  }
  // A uniform layer's operands share one layout (one-pixel ones aside): where some cannot
  // be blocked, none is. Repeated until nothing changes, as that may undo another layer's.
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      if (support(static_cast<int>(l)) != Support::uniform) continue;
      const NetLayer& nl = layers[l];
      std::vector<int> operands;
      for (const std::vector<int>* list : {&nl.bottoms, &nl.tops})
        for (int b : *list)
          if (!one_pixel(blobs[static_cast<std::size_t>(b)].shape)) operands.push_back(b);
      const auto group_blocked = [&](int b) {
        return blocked[static_cast<std::size_t>(blobs[static_cast<std::size_t>(b)].data_group)];
      };
      if (std::all_of(operands.begin(), operands.end(), group_blocked) ||
          std::none_of(operands.begin(), operands.end(), group_blocked)) {
        continue;
      }
      for (int b : operands)
        blocked[static_cast<std::size_t>(blobs[static_cast<std::size_t>(b)].data_group)] = false;
      changed = true;
    }
  }
  for (BlobVersion& blob : blobs) {
    if (blocked[static_cast<std::size_t>(blob.data_group)] && !one_pixel(blob.shape))
      blob.layout = layout;
  }
  for (NetLayer& nl : layers) {
    if (nl.kind != Kind::compute) continue;
    std::vector<Layout> inputs, outputs;
    for (int b : nl.bottoms)
      inputs.push_back(blobs[static_cast<std::size_t>(b)].layout);
    for (int t : nl.tops)
      outputs.push_back(blobs[static_cast<std::size_t>(t)].layout);
    nl.layer->use_layouts(inputs, outputs);
  }
}

}  // namespace hn
