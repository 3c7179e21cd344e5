// The scheduler: runs one layer call, whole on one driver or cut by rows among several
// drivers at once, and measures how to cut it.
//
// A LayerCall says everything the scheduler needs: the layer, the memory of its input,
// output and parameter tensors, which input gradients to propagate and the split. The Net
// builds one per compute layer and pass; run_forward/run_backward build one for a layer on
// the caller's tensors (the one-device case). The scheduler resolves the operands on each
// device (copying what is stale there), runs the slices concurrently (the home driver's on
// the calling thread, every other driver's on its device thread), sums the slices'
// parameter-gradient partials in device order, and records what each device did.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/core/transfer.h"
#include "lib/layers/layer.h"
#include "lib/scheduler/split.h"

namespace hn::detail {

// A tensor of a layer call: its shape, its value and gradient memory (diff may be null
// when no gradient is read or written) and how both lie in memory.
struct CallTensor {
  Shape shape;
  SyncedMemory* data = nullptr;
  SyncedMemory* diff = nullptr;
  Layout layout = Layout::nchw;
};

struct LayerCall {
  Layer* layer = nullptr;
  std::string_view where;  // what errors name: "FILE: layer 'NAME' (TYPE)"; outlives the call
  std::vector<CallTensor> inputs, outputs, params;  // state: the layer's own
  std::vector<bool> propagate_down;                 // backward: per input
  Phase phase = Phase::train;
  std::uint64_t seed = 0;
  // The devices that share the rows; empty: the home driver alone, on rows [begin, end)
  // (end < 0: to the end of the batch).
  Split split;
  index_t begin = 0, end = -1;
  index_t column_begin = 0, columns = 0;  // LayerSlice's: a column block of a cut blob

  // The batch: axis 0 of the first input (of the first output for layers without inputs).
  index_t rows() const;
  // Whether the layer may be cut into row slices run at the same time.
  bool splittable() const;
};

// One device's part of a layer call.
struct SliceRun {
  Driver* on = nullptr;
  index_t begin = 0, end = 0;
  LayerSlice slice;
  SyncedMemory* partial = nullptr;  // parameter gradients of this slice, when not the first
  std::size_t partial_offset = 0;   // where in `partial` they start
  double busy = 0.0, copy_seconds = 0.0;
  std::size_t copy_bytes = 0;
  DeferredCopies copies;  // the operand copies left for the device's thread
};

class Scheduler {
 public:
  // `runtime` gives the drivers a split names and their device threads; it may be null
  // when every call runs on `home` alone.
  Scheduler(Runtime* runtime, Driver& home) : runtime_(runtime), home_(home) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  Driver& home() const { return home_; }
  // Allocates the home driver's workspace now (the Net plans the largest any layer needs).
  void reserve_workspace(std::size_t bytes);

  // Runs `call` forward or backward and reduces its parameter-gradient partials. Errors
  // in a slice are rethrown once every slice has finished, naming call.where, the pass and
  // the device. With `profile`, adds what each device did.
  void run(const LayerCall& call, bool backward, LayerProfile* profile = nullptr);
  // Runs consecutive calls that cut the same rows among the same devices (one split): each
  // device runs its rows of every call in turn without waiting for the other devices in
  // between, then the calls' parameter-gradient partials are added call by call in device
  // order, as run would. The Net makes sure no call reads rows another device writes (the
  // calls' tensors are cut alike). Errors as run's; profiles[i] (may be null) gets call i.
  void run_rows(const std::vector<LayerCall>& calls, bool backward,
                const std::vector<LayerProfile*>& profiles);
  // Runs each call whole on its device (its split's one share, or home when it has none),
  // all at the same time, each on its driver's thread; the calls must write disjoint memory
  // (the parts of a layer cut by outputs). Errors as run's.
  void run_parts(const std::vector<LayerCall>& calls, bool backward,
                 LayerProfile* profile = nullptr);

  // Lets the layer measure its algorithms (Layer::tune) on each device of the call's split,
  // for the rows that device gets, on the device's thread.
  void tune(const LayerCall& call, Tuner& tuner);
  // The driver of `device`: home, or the runtime's.
  Driver& driver(const Device& device) const;

  // Measures `call` on `devices`, first each alone on growing slices, then side by side
  // until the rows settle, and returns the fastest split measured side by side, or the
  // fastest device alone (the others at fraction 0) where that is as fast; parameter
  // gradients are as before.
  Split calibrate(const LayerCall& call, bool with_backward, const std::vector<Device>& devices);
  // Seconds `call` takes whole on `device` (forward, and backward with `with_backward`), the
  // second of two runs; parameter gradients are added to, input gradients go to scratch.
  double time_whole(const LayerCall& call, bool with_backward, const Device& device);

 private:
  // The slice for rows [begin, end) on `on`, its operands resolved there. Parameter
  // gradients go to `partial` when given; input gradients to `scratch` when given (probes).
  // A `staged` slice (run_staged) reads the parameters and takes no gradient for them; the
  // parameter gradients start at `partial_offset` in `partial`.
  LayerSlice prepare(const LayerCall& call, Driver& on, index_t begin, index_t end, bool backward,
                     SyncedMemory* partial, SyncedMemory* scratch, bool staged = false,
                     std::size_t partial_offset = 0);
  // The slices per the call's split, run at the same time. A probe sends input gradients
  // to scratch memory; the partials are left for reduce_partials.
  std::vector<SliceRun> run_slices(const LayerCall& call, bool backward, const Split& split,
                                   bool probe);
  // The slices of a layer needing sums over the batch (Layer::batch_sums): each stage on
  // every device at once, then the rows' sums added on the home driver in row order; after
  // a forward, the layer's finish on the home driver. One run per device with rows.
  std::vector<SliceRun> run_staged(const LayerCall& call, bool backward, const Split& split,
                                   bool probe);
  void reduce_partials(const LayerCall& call, std::vector<SliceRun>& runs);
  // Runs task(i) for every i at the same time, each on on[i]'s thread (home's on this one,
  // in order; at most one task per other driver), waits for all, then rethrows the first
  // error naming where(i) of the task that threw, the pass and the device.
  void on_devices(const std::vector<Driver*>& on, const std::function<void(std::size_t)>& task,
                  const std::function<std::string_view(std::size_t)>& where, bool backward);
  // Runs prepared runs (runs[i] of layers[i]) at the same time, each on its driver's thread,
  // home's on this one, waits for all, then rethrows the first error naming `where`.
  void execute(std::vector<SliceRun>& runs, const std::vector<Layer*>& layers, bool backward,
               std::string_view where);
  // Adds what each device did in `runs` (`wall` seconds) to `profile`; `cut`: the split,
  // whose devices without rows waited the whole time. Each run's waiting is `waiting`'s
  // entry where given (a run of calls: the calls before its last waited for nothing), else
  // the wall time it did not account for.
  void record(LayerProfile& profile, const std::vector<SliceRun>& runs, bool backward, double wall,
              const Split* cut, const std::vector<double>& waiting = {});
  // Runs `task` on `on`'s thread (the calling thread for home) and waits.
  void run_on(Driver& on, const std::function<void()>& task);
  double probe(const LayerCall& call, bool with_backward, Driver& on, index_t rows);
  // A split's wall time (forward, backward and the merge of parameter gradients) and each
  // share's busy seconds and rows, as the second of two runs.
  struct SplitTiming {
    double wall = 0.0;
    std::vector<double> busy;
    std::vector<index_t> rows;
  };
  SplitTiming time_split(const LayerCall& call, bool with_backward, const Split& split);
  Pointer workspace(Driver& on, std::size_t bytes);

  Runtime* runtime_;
  Driver& home_;
  std::map<Driver*, Buffer> workspaces_;  // per driver, grown on demand
  // Per device: the parameter-gradient partial sums of its slices (all but a call's first).
  std::map<Driver*, SyncedMemory> grad_partials_;
  // A staged call's per-row sums (each quantity over the batch) and their totals.
  SyncedMemory row_sums_, batch_totals_;
};

}  // namespace hn::detail
