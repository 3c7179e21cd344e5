// The hybrid split of a batch among devices: a list of {device, fraction}, written
// "cuda:0:0.6,cpu:0.4" (or "cuda:0=0.6,cpu=0.4") on the command line and as repeated
// `split { device: "cuda:0" fraction: 0.6 }` entries in a prototxt, or "auto" for fractions
// measured at run time ("auto:cpu,cuda:0" names the devices to measure). Rounding to whole
// rows is deterministic (see partition()).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/core/device.h"
#include "lib/core/shapes.h"

namespace hn {

class Runtime;

struct SplitShare {
  Device device;
  double fraction = 0.0;
};

class Split {
 public:
  // No shares: "not set" (a layer without its own split uses the net's).
  Split() = default;
  // Throws hn::Error unless every fraction is finite and non-negative, they sum to 1 within
  // 1e-6, and no device appears twice.
  explicit Split(std::vector<SplitShare> shares);
  static Split single(const Device& device) { return Split({SplitShare{device, 1.0}}); }
  // Every device of `devices` listed, `device` with the whole batch and the others with none
  // (how a measurement says "this device alone").
  static Split only(const std::vector<Device>& devices, const Device& device);
  // Shares in proportion to `weights` (one per device, non-negative, not all zero): device
  // d gets weights[d] / their sum, the last what the others leave, so that the fractions
  // sum to 1.
  static Split proportional(const std::vector<Device>& devices, const std::vector<double>& weights);
  // This split balanced by what its slices of `rows` took: each device with rows gets a share
  // in proportion to its speed, its rows over `busy_seconds[i]` (the seconds share i was
  // busy, measured in the same moments as the others'); a device without rows keeps none.
  // Empty when a device with rows has no busy time to go by.
  Split balanced(index_t rows, const std::vector<double>& busy_seconds) const;
  // Fractions measured at run time among `devices` (empty: every available device but the
  // oracles, see measured_devices()). Throws when a device appears twice.
  static Split automatic(std::vector<Device> devices = {});

  // Parses "DEVICE[:FRACTION],..." or "DEVICE=FRACTION,..." or "auto[:DEVICE,...]". An integer
  // after a bare device kind is a device index ("cpu:1", "cuda:1"); a fraction has a point or
  // follows a full device name ("cpu:0.5", "cuda:1:1"). One entry may leave out its
  // fraction and takes what the others leave (a lone device: all). Errors quote the text
  // and say what is wrong.
  static Split parse(std::string_view text);

  bool empty() const { return shares_.empty() && !automatic_; }
  bool is_automatic() const { return automatic_; }
  // The devices an automatic split names (empty: none named, see measured_devices()).
  const std::vector<Device>& automatic_devices() const { return automatic_devices_; }
  // The devices an automatic split measures: those it names, else every available device
  // (available_devices()) whose kind is not an oracle: the reference driver is far slower
  // than any other, and measuring it would only hand it a sliver of every layer. The same
  // at every door (the tool's --split auto, the C ABI's and Python's split "auto",
  // Split::automatic()).
  std::vector<Device> measured_devices() const;
  const std::vector<SplitShare>& shares() const { return shares_; }
  // Every device the split names: its shares' (in order), or those an automatic split
  // measures (measured_devices()).
  std::vector<Device> devices() const;

  // Rows [begin, end) of each share for a batch of `rows`, in share order. Boundary i is the
  // cumulative fraction of shares 0..i times rows, rounded half up (the last is `rows`), so
  // slices are contiguous, sum to the batch, each is within one row of its exact share, and
  // a share may get no rows.
  std::vector<std::pair<index_t, index_t>> partition(index_t rows) const;

  // Throws hn::Error naming the device and the devices present when a share's device has
  // no driver in `runtime`.
  void check_devices(const Runtime& runtime) const;

  // "cuda:0:0.6,cpu:0.4" (fractions with up to 6 significant digits; parse() reads it back
  // exactly as written), or "auto" / "auto:cpu,cuda:0".
  std::string to_string() const;

 private:
  std::vector<SplitShare> shares_;
  bool automatic_ = false;
  std::vector<Device> automatic_devices_;
};

// Splits per layer name, in net order: what a Net measured for `--split auto`, saved to be
// reused (NetOptions::layer_splits).
using LayerSplits = std::vector<std::pair<std::string, Split>>;

// The file format: one "LAYER SPLIT" line per layer ("conv1 cpu:0.75,cuda:0:0.25"); blank
// lines and lines starting with '#' are ignored. Written through a temporary file and a
// rename. Reading throws hn::Error naming the file and line of a malformed entry or a layer
// named twice.
void write_layer_splits(const std::string& path, const LayerSplits& splits);
LayerSplits read_layer_splits(const std::string& path);

// What the split scheduler measured for one device's slices of one layer, summed over the
// calls since the last reset_profile(). Copies are the bytes moved between memory spaces
// to give this device its operands (and to bring its parameter-gradient partial back).
struct SliceProfile {
  Device device;
  index_t rows = 0;           // rows of the latest call
  double forward_busy = 0.0;  // seconds computing, synchronised at the end
  double backward_busy = 0.0;
  // Seconds of the layer's wall time this device sat idle. In a run of layers cut alike
  // (Scheduler::run_rows) the devices wait only at its end: the run's idle time is shared
  // among its layers in proportion to how far short of each layer's wall time the device's
  // slice was, so busy + waiting never exceed a layer's wall time.
  double waiting = 0.0;
  double copy_seconds = 0.0;
  std::size_t copy_bytes = 0;
};

struct LayerProfile {
  std::string name;
  std::string type;
  int forward_calls = 0, backward_calls = 0;
  double forward_seconds = 0.0, backward_seconds = 0.0;  // wall time of the whole layer
  std::vector<SliceProfile> devices;  // in split order; the Net's driver for unsplit layers
  // The algorithm the layer runs with (Layer::algorithm), "DEVICE: ALGORITHM; ..." for a
  // split layer; empty for layers with one algorithm.
  std::string algorithm;
};

}  // namespace hn
