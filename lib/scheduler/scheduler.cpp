// The scheduler (scheduler.h): slices, operand preparation, partial reduction, calibration
// and profiling of one layer call.
#include "lib/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <new>

#include "lib/core/check.h"
#include "lib/core/transfer.h"
#include "lib/core/worker.h"

namespace hn::detail {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

enum class Want { read, write, overwrite };

// Rows [begin, end) of a batch-major array of `shape` (axis 0 == batch) in `memory` on
// `on`; the whole array when it is not batch-major.
Pointer rows(SyncedMemory& memory, const Shape& shape, index_t batch, index_t begin, index_t end,
             Driver& on, Want want) {
  const bool by_rows = shape.axes() > 0 && shape[0] == batch && batch > 0;
  const std::size_t row = by_rows ? static_cast<std::size_t>(shape.count() / batch) : 0;
  const std::size_t offset = by_rows ? static_cast<std::size_t>(begin) * row * sizeof(float) : 0;
  const std::size_t bytes = by_rows ? static_cast<std::size_t>(end - begin) * row * sizeof(float)
                                    : static_cast<std::size_t>(shape.count()) * sizeof(float);
  void* address = nullptr;
  switch (want) {
    case Want::read:
      address = const_cast<void*>(memory.read_range(on, offset, bytes));
      break;
    case Want::write:
      address = memory.write_range(on, offset, bytes);
      break;
    case Want::overwrite:
      address = memory.overwrite_range(on, offset, bytes);
      break;
  }
  return Pointer{on.device(), address, bytes};
}

// Sets run.slice to what `resolve` returns (the slice's operands resolved on run.on), the
// copies into run.on's memory from host memory left for run.on's thread (compute makes
// them, while the other devices compute), and charges every copy to the run.
template <class Resolve>
void resolve_deferred(SliceRun& run, Resolve&& resolve) {
  TransferTally& tally = transfer_tally();
  const TransferTally before = tally;
  {
    DeferTransfers defer(run.copies, *run.on);
    run.slice = resolve();
  }
  run.copy_bytes += tally.bytes - before.bytes + run.copies.bytes();
  run.copy_seconds += tally.seconds - before.seconds;
}

// Runs `run` (its deferred operand copies, then the layer, clearing its gradient partials
// first) on the calling thread, its driver's, and waits for the driver.
void compute(Layer& layer, SliceRun& run, bool backward) {
  if (!run.copies.empty()) run.copy_seconds += run.copies.make();
  const auto start = Clock::now();
  if (run.partial != nullptr) {
    for (const Operand& param : run.slice.params) {
      // A read-only parameter (a fused BatchNorm's statistics) has no gradient.
      if (param.diff.address != nullptr)
        run.on->fill(param.shape.count(), 0.0f, param.mutable_dx());
    }
  }
  if (backward) {
    layer.backward(run.slice);
  } else {
    layer.forward(run.slice);
  }
  run.on->synchronize();
  run.busy = seconds_since(start);
}

SliceProfile& profile_of(LayerProfile& profile, const Device& device) {
  for (SliceProfile& slice : profile.devices)
    if (slice.device == device) return slice;
  profile.devices.push_back(SliceProfile{device});
  return profile.devices.back();
}

// Room for a probe's input gradients: every gradient wanted.
std::size_t probe_scratch_bytes(const LayerCall& call) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < call.inputs.size(); ++i) {
    if (call.propagate_down[i])
      bytes += static_cast<std::size_t>(call.inputs[i].shape.count()) * sizeof(float);
  }
  return bytes;
}

}  // namespace

// ---- the call ----------------------------------------------------------------------------

index_t LayerCall::rows() const {
  const Shape* first =
      !inputs.empty() ? &inputs[0].shape : (!outputs.empty() ? &outputs[0].shape : nullptr);
  return first != nullptr && first->axes() > 0 ? (*first)[0] : 1;
}

bool LayerCall::splittable() const {
  // A layer needing sums over the batch is cut in stages, its parameters written once.
  const bool staged = layer->batch_sums(phase, false).stages > 0;
  if (!(layer->splits_by_rows() || staged)) return false;
  if (layer->updates_params_in_forward() && !staged) return false;
  // Outputs and state written by several slices at once must be cut by rows too.
  const index_t batch = rows();
  auto by_rows = [&](const Shape& shape) { return shape.axes() > 0 && shape[0] == batch; };
  for (const CallTensor& output : outputs)
    if (!by_rows(output.shape)) return false;
  for (const Tensor& state : layer->state())
    if (!by_rows(state.shape())) return false;
  return batch > 0;
}

// ---- operands ----------------------------------------------------------------------------

void Scheduler::reserve_workspace(std::size_t bytes) {
  static_cast<void>(workspace(home_, bytes));
}

Pointer Scheduler::workspace(Driver& on, std::size_t bytes) {
  Buffer& buffer = workspaces_[&on];
  if (buffer.bytes() < bytes) buffer = Buffer(on, bytes);
  return buffer.pointer();
}

Driver& Scheduler::driver(const Device& device) const {
  if (device == home_.device()) return home_;
  HN_CHECK(runtime_ != nullptr, "no runtime gives a driver for {} (this call runs on {} alone)",
           device.name(), home_.name());
  return runtime_->driver(device);
}

LayerSlice Scheduler::prepare(const LayerCall& call, Driver& on, index_t begin, index_t end,
                              bool backward, SyncedMemory* partial, SyncedMemory* scratch,
                              bool staged, std::size_t partial_offset) {
  Layer& layer = *call.layer;
  const index_t batch = call.rows();
  LayerSlice slice;
  slice.driver = &on;
  slice.phase = call.phase;
  slice.seed = call.seed;
  slice.begin = begin;
  slice.end = end;
  slice.column_begin = call.column_begin;
  slice.columns = call.columns;
  slice.workspace = workspace(on, layer.workspace_bytes(on, end - begin));
  // In place: an output that shares an input's memory is read and written, not overwritten.
  auto shares_input_data = [&](const CallTensor& output) {
    for (const CallTensor& input : call.inputs)
      if (input.data == output.data) return true;
    return false;
  };
  auto shares_output_diff = [&](const CallTensor& input) {
    for (const CallTensor& output : call.outputs)
      if (output.diff == input.diff) return true;
    return false;
  };
  if (!backward) {
    for (const CallTensor& input : call.inputs) {
      slice.inputs.push_back(
          Operand{input.shape,
                  rows(*input.data, input.shape, batch, begin, end, on, Want::read),
                  {},
                  input.layout});
    }
    for (const CallTensor& output : call.outputs) {
      const Want want = shares_input_data(output) ? Want::write : Want::overwrite;
      slice.outputs.push_back(Operand{output.shape,
                                      rows(*output.data, output.shape, batch, begin, end, on, want),
                                      {},
                                      output.layout});
    }
    // A staged slice leaves the parameters to the call's finish (run_staged).
    const Want param_want = layer.updates_params_in_forward() && !staged ? Want::write : Want::read;
    for (const CallTensor& param : call.params) {
      slice.params.push_back(
          Operand{param.shape, rows(*param.data, param.shape, 0, 0, 0, on, param_want), {}});
      slice.params.back().version = param.data->version();
    }
    for (Tensor& state : layer.state()) {
      slice.state.push_back(
          Operand{state.shape(),
                  rows(state.data(), state.shape(), batch, begin, end, on, Want::write),
                  {}});
    }
    return slice;
  }
  slice.propagate_down = call.propagate_down;
  std::size_t scratch_offset = 0;
  for (std::size_t i = 0; i < call.inputs.size(); ++i) {
    const CallTensor& input = call.inputs[i];
    const Pointer x = rows(*input.data, input.shape, batch, begin, end, on, Want::read);
    Pointer dx{};
    if (call.propagate_down[i] && scratch != nullptr) {
      // A probe: the gradient lands in scratch, not in memory another tensor may be using.
      dx = Pointer{on.device(), scratch->overwrite_range(on, scratch_offset, x.bytes), x.bytes};
      scratch_offset += x.bytes;
    } else if (call.propagate_down[i]) {
      dx = rows(*input.diff, input.shape, batch, begin, end, on,
                shares_output_diff(input) ? Want::write : Want::overwrite);
    }
    slice.inputs.push_back(Operand{input.shape, x, dx, input.layout});
  }
  for (const CallTensor& output : call.outputs) {
    slice.outputs.push_back(Operand{
        output.shape, rows(*output.data, output.shape, batch, begin, end, on, Want::read),
        rows(*output.diff, output.shape, batch, begin, end, on, Want::read), output.layout});
  }
  for (const CallTensor& param : call.params) {
    Pointer diff;
    if (param.diff == nullptr || staged) {
      // Read-only in this call (a fused layer's statistics), or a stage of a layer whose
      // batch sums take no parameter gradient: no gradient.
    } else if (partial != nullptr) {
      const std::size_t bytes = static_cast<std::size_t>(param.shape.count()) * sizeof(float);
      diff = Pointer{on.device(), partial->overwrite_range(on, partial_offset, bytes), bytes};
      partial_offset += bytes;
    } else {
      diff = rows(*param.diff, param.shape, 0, 0, 0, on, Want::write);
    }
    slice.params.push_back(
        Operand{param.shape, rows(*param.data, param.shape, 0, 0, 0, on, Want::read), diff});
    slice.params.back().version = param.data->version();
  }
  for (Tensor& state : layer.state()) {
    slice.state.push_back(Operand{
        state.shape(), rows(state.data(), state.shape(), batch, begin, end, on, Want::read), {}});
  }
  return slice;
}

// ---- running -----------------------------------------------------------------------------

void Scheduler::run_on(Driver& on, const std::function<void()>& task) {
  if (&on == &home_) {
    task();
    return;
  }
  HN_CHECK(runtime_ != nullptr, "no runtime gives {} a device thread", on.name());
  DeviceWorker& thread = RuntimeThreads::of(*runtime_, on);
  thread.submit(task);
  if (std::exception_ptr error = thread.wait()) std::rethrow_exception(error);
}

void Scheduler::tune(const LayerCall& call, Tuner& tuner) {
  if (tuner.mode() == TuneMode::off) return;
  const index_t batch = call.rows();
  if (call.split.empty()) {
    const index_t end = call.end < 0 ? batch : call.end;
    run_on(home_, [&] { call.layer->tune(home_, end - call.begin, tuner); });
    return;
  }
  const auto bounds = call.split.partition(batch);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    const index_t rows = bounds[i].second - bounds[i].first;
    if (rows == 0) continue;
    Driver& on = driver(call.split.shares()[i].device);
    run_on(on, [&] { call.layer->tune(on, rows, tuner); });
  }
}

std::vector<SliceRun> Scheduler::run_slices(const LayerCall& call, bool backward,
                                            const Split& split, bool probe) {
  Layer& layer = *call.layer;
  const index_t batch = call.rows();
  const bool cut = !split.empty();
  std::vector<SliceRun> runs;
  // 1. Operands, resolved on this thread while every driver is idle: a copy may need the
  // driver of any device that holds current data. Copies a device can make alone (from host
  // memory) wait for its thread, so they overlap the other devices' slices.
  std::vector<std::pair<index_t, index_t>> bounds;
  if (cut) {
    bounds = split.partition(batch);
  } else {
    const index_t end = call.end < 0 ? batch : call.end;
    HN_CHECK(0 <= call.begin && call.begin <= end && end <= batch,
             "{}: rows [{}, {}) outside the batch of {}", call.where, call.begin, end, batch);
    HN_CHECK(layer.splits_by_rows() || (call.begin == 0 && end == batch),
             "{}: it needs the whole batch, not rows [{}, {})", call.where, call.begin, end);
    bounds.emplace_back(call.begin, end);
  }
  if (cut && layer.batch_sums(call.phase, backward).stages > 0)
    return run_staged(call, backward, split, probe);
  std::vector<std::unique_ptr<SyncedMemory>> scratch;  // probes' input gradients
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    Driver& on = cut ? driver(split.shares()[i].device) : home_;
    if (cut && bounds[i].first == bounds[i].second) continue;
    SliceRun run;
    run.on = &on;
    run.begin = bounds[i].first;
    run.end = bounds[i].second;
    if (backward && !runs.empty() && !call.params.empty()) {
      // Every slice but the first adds its parameter gradients into a partial of its own,
      // summed into the parameters' gradients in device order once all are done.
      std::size_t bytes = 0;
      for (const CallTensor& param : call.params)
        if (param.diff != nullptr)
          bytes += static_cast<std::size_t>(param.shape.count()) * sizeof(float);
      SyncedMemory& partial = grad_partials_[&on];
      if (partial.bytes() < bytes) partial.resize(bytes);
      run.partial = &partial;
    }
    if (backward && probe)
      scratch.push_back(std::make_unique<SyncedMemory>(probe_scratch_bytes(call)));
    resolve_deferred(run, [&] {
      return prepare(call, on, run.begin, run.end, backward, run.partial,
                     backward && probe ? scratch.back().get() : nullptr);
    });
    runs.push_back(std::move(run));
  }
  // 2. The slices, each on its driver's thread at the same time.
  if (runs.size() == 1 && runs[0].on == &home_ && !probe) {
    // The unsplit path: no hand-off, and no synchronisation the caller did not ask for.
    if (!runs[0].copies.empty()) runs[0].copy_seconds += runs[0].copies.make();
    const auto start = Clock::now();
    try {
      if (backward) {
        layer.backward(runs[0].slice);
      } else {
        layer.forward(runs[0].slice);
      }
    } catch (const Error& failure) {
      // A driver's error (a label out of range) names the call; this names the layer too.
      const std::string named = "layer '" + layer.name() + "'";
      if (std::string_view(failure.what()).find(named) != std::string_view::npos) throw;
      fail("{}: {}: {}", call.where, backward ? "backward" : "forward", failure.what());
    }
    runs[0].busy = seconds_since(start);
    return runs;
  }
  execute(runs, std::vector<Layer*>(runs.size(), &layer), backward, call.where);
  return runs;
}

std::vector<SliceRun> Scheduler::run_staged(const LayerCall& call, bool backward,
                                            const Split& split, bool probe) {
  Layer& layer = *call.layer;
  const Layer::BatchSums sums = layer.batch_sums(call.phase, backward);
  const index_t batch = call.rows();
  const auto bounds = split.partition(batch);
  const std::size_t vector_bytes = static_cast<std::size_t>(sums.width) * sizeof(float);
  const std::size_t quantity_bytes = static_cast<std::size_t>(batch) * vector_bytes;
  const auto quantities = static_cast<std::size_t>(sums.quantities);
  if (row_sums_.bytes() < quantities * quantity_bytes)
    row_sums_.resize(quantities * quantity_bytes);
  const std::size_t totals_bytes =
      static_cast<std::size_t>(sums.stages) * quantities * vector_bytes;
  if (batch_totals_.bytes() < totals_bytes) batch_totals_.resize(totals_bytes);
  std::vector<std::unique_ptr<SyncedMemory>> scratch(bounds.size());  // probes' input gradients
  TransferTally& tally = transfer_tally();
  std::vector<SliceRun> runs;  // per device with rows: its time and copies over every stage
  for (int stage = 0; stage < sums.stages; ++stage) {
    const bool last = stage + 1 == sums.stages;
    std::vector<SliceRun> stage_runs;
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      const index_t begin = bounds[i].first, end = bounds[i].second;
      if (begin == end) continue;
      Driver& on = driver(split.shares()[i].device);
      if (backward && probe && !scratch[i])
        scratch[i] = std::make_unique<SyncedMemory>(probe_scratch_bytes(call));
      SliceRun run;
      run.on = &on;
      run.begin = begin;
      run.end = end;
      resolve_deferred(run, [&] {
        LayerSlice slice = prepare(call, on, begin, end, backward, nullptr, scratch[i].get(), true);
        slice.stage = stage;
        const std::size_t rows_bytes = static_cast<std::size_t>(end - begin) * vector_bytes;
        for (std::size_t q = 0; q < quantities && !last; ++q) {
          const std::size_t offset =
              q * quantity_bytes + static_cast<std::size_t>(begin) * vector_bytes;
          slice.row_sums.push_back(
              Pointer{on.device(), row_sums_.overwrite_range(on, offset, rows_bytes), rows_bytes});
        }
        if (stage > 0) {
          const std::size_t bytes = static_cast<std::size_t>(stage) * quantities * vector_bytes;
          slice.batch_sums = Pointer{
              on.device(), const_cast<void*>(batch_totals_.read_range(on, 0, bytes)), bytes};
        }
        return slice;
      });
      stage_runs.push_back(std::move(run));
    }
    execute(stage_runs, std::vector<Layer*>(stage_runs.size(), &layer), backward, call.where);
    if (!last) {
      // The totals, on the home driver in row order whatever the cut: the copies of the
      // slices' sums are charged to the first device.
      const TransferTally before = tally;
      for (std::size_t q = 0; q < quantities; ++q) {
        const auto* rows_sums = static_cast<const float*>(
            row_sums_.read_range(home_, q * quantity_bytes, quantity_bytes));
        auto* total = static_cast<float*>(batch_totals_.write_range(
            home_, (static_cast<std::size_t>(stage) * quantities + q) * vector_bytes,
            vector_bytes));
        sum_rows(home_, batch, sums.width, rows_sums, total);
      }
      home_.synchronize();
      stage_runs.front().copy_bytes += tally.bytes - before.bytes;
      stage_runs.front().copy_seconds += tally.seconds - before.seconds;
    }
    if (runs.empty()) {
      runs = std::move(stage_runs);
      continue;
    }
    for (std::size_t r = 0; r < runs.size(); ++r) {
      runs[r].busy += stage_runs[r].busy;
      runs[r].copy_bytes += stage_runs[r].copy_bytes;
      runs[r].copy_seconds += stage_runs[r].copy_seconds;
    }
  }
  if (!backward && layer.updates_params_in_forward()) {
    // Once, on the home driver, from the totals: the parameters the layer keeps up to date.
    LayerSlice finish = prepare(call, home_, 0, 0, false, nullptr, nullptr);
    finish.stage = sums.stages;
    finish.batch_sums =
        Pointer{home_.device(), const_cast<void*>(batch_totals_.read_range(home_, 0, totals_bytes)),
                totals_bytes};
    try {
      layer.finish_batch_sums(finish);
      home_.synchronize();
    } catch (const Error& failure) {
      fail("{}: forward on {}: {}", call.where, home_.name(), failure.what());
    }
  }
  return runs;
}

void Scheduler::on_devices(const std::vector<Driver*>& on,
                           const std::function<void(std::size_t)>& task,
                           const std::function<std::string_view(std::size_t)>& where,
                           bool backward) {
  for (std::size_t t = 0; t < on.size(); ++t) {
    if (on[t] != &home_) RuntimeThreads::of(*runtime_, *on[t]).submit([&task, t] { task(t); });
  }
  std::exception_ptr error;
  std::size_t failed = 0;
  for (std::size_t t = 0; t < on.size(); ++t) {
    if (on[t] != &home_) continue;
    try {
      task(t);
    } catch (...) {
      error = std::current_exception();
      failed = t;
    }
  }
  // Every thread is waited for before anything is rethrown: the tasks use the caller's state.
  for (std::size_t t = 0; t < on.size(); ++t) {
    if (on[t] == &home_) continue;
    std::exception_ptr thrown = RuntimeThreads::of(*runtime_, *on[t]).wait();
    if (thrown && !error) {
      error = thrown;
      failed = t;
    }
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const Error& failure) {
    fail("{}: {} on {}: {}", where(failed), backward ? "backward" : "forward", on[failed]->name(),
         failure.what());
  } catch (const std::bad_alloc&) {
    fail("{}: {} on {}: out of memory (std::bad_alloc)", where(failed),
         backward ? "backward" : "forward", on[failed]->name());
  }
}

void Scheduler::execute(std::vector<SliceRun>& runs, const std::vector<Layer*>& layers,
                        bool backward, std::string_view where) {
  std::vector<Driver*> on;
  for (const SliceRun& run : runs)
    on.push_back(run.on);
  on_devices(
      on, [&](std::size_t r) { compute(*layers[r], runs[r], backward); },
      [where](std::size_t) { return where; }, backward);
}

void Scheduler::run_rows(const std::vector<LayerCall>& calls, bool backward,
                         const std::vector<LayerProfile*>& profiles) {
  if (calls.empty()) return;
  const auto start = Clock::now();
  const Split& split = calls[0].split;
  const index_t batch = calls[0].rows();
  const auto bounds = split.partition(batch);
  // Every device but the first with rows keeps each call's parameter gradients apart, in
  // one partial sized for all of them before any is handed out.
  std::vector<std::size_t> offsets(calls.size(), 0), call_bytes(calls.size(), 0);
  std::size_t param_bytes = 0;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    HN_CHECK(calls[c].rows() == batch && calls[c].split.partition(batch) == bounds,
             "{}: cannot run with the rows of the calls before it ({} of {})", calls[c].where,
             split.to_string(), batch);
    offsets[c] = param_bytes;
    for (const CallTensor& param : calls[c].params) {
      if (backward && param.diff != nullptr)
        call_bytes[c] += static_cast<std::size_t>(param.shape.count()) * sizeof(float);
    }
    param_bytes += call_bytes[c];
  }
  std::vector<Driver*> devices;  // with rows, in the split's order
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i].first == bounds[i].second) continue;
    devices.push_back(&driver(split.shares()[i].device));
    SyncedMemory& partial = grad_partials_[devices.back()];
    if (devices.size() > 1 && param_bytes > 0 && partial.bytes() < param_bytes)
      partial.resize(param_bytes);
  }
  // Each device's workspace grown once, to the most any call needs, before the first is
  // handed out: grown by a later call's prepare, it would free the one an earlier call's
  // slice was given and is about to write (a heap corruption when the split changed).
  for (std::size_t i = 0, d = 0; i < bounds.size(); ++i) {
    if (bounds[i].first == bounds[i].second) continue;
    std::size_t most = 0;
    for (const LayerCall& call : calls)
      most = std::max(most,
                      call.layer->workspace_bytes(*devices[d], bounds[i].second - bounds[i].first));
    static_cast<void>(workspace(*devices[d++], most));
  }
  // 1. Every call's operands, in order, while every driver is idle (the copies a device can
  // make alone wait for its thread, before the call's compute).
  std::vector<std::vector<SliceRun>> runs(calls.size());
  for (std::size_t c = 0; c < calls.size(); ++c) {
    std::size_t d = 0;
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      if (bounds[i].first == bounds[i].second) continue;
      SliceRun run;
      run.on = devices[d];
      run.begin = bounds[i].first;
      run.end = bounds[i].second;
      if (d > 0 && call_bytes[c] > 0) {
        run.partial = &grad_partials_[run.on];
        run.partial_offset = offsets[c];
      }
      resolve_deferred(run, [&] {
        return prepare(calls[c], *run.on, run.begin, run.end, backward, run.partial, nullptr, false,
                       run.partial_offset);
      });
      runs[c].push_back(std::move(run));
      ++d;
    }
  }
  // 2. Each device its rows of every call in turn, on its thread (home's on this one).
  std::vector<std::size_t> at(devices.size(), 0);  // the call each device is on
  const auto chain = [&](std::size_t d) {
    for (at[d] = 0; at[d] < calls.size(); ++at[d])
      compute(*calls[at[d]].layer, runs[at[d]][d], backward);
  };
  on_devices(
      devices, chain, [&](std::size_t d) { return calls[std::min(at[d], calls.size() - 1)].where; },
      backward);
  // 3. Parameter gradients call by call, then what each device did: a call's wall time is
  // its slowest slice's, and the time no slice accounts for goes to the last call. No device
  // waits between the calls of a run, only at its end: its waiting is the run's wall time
  // less all it did. That idle time is shared among the calls in proportion to how far the
  // device was from each call's wall time, so a call's busy and waiting never exceed its
  // wall time, and jitter where neither device waited counts as no waiting at all (the
  // shares add up to the run's idle time, however small).
  for (std::size_t c = 0; c < calls.size(); ++c)
    reduce_partials(calls[c], runs[c]);
  const double wall = seconds_since(start);
  double accounted = 0.0;
  std::vector<double> walls(calls.size(), 0.0);
  std::vector<double> idle(devices.size(), wall);
  for (std::size_t c = 0; c < calls.size(); ++c) {
    for (std::size_t d = 0; d < runs[c].size(); ++d) {
      const double occupied = runs[c][d].busy + runs[c][d].copy_seconds;
      walls[c] = std::max(walls[c], occupied);
      idle[d] -= occupied;
    }
    accounted += walls[c];
  }
  walls.back() += std::max(0.0, wall - accounted);
  // The idle time each device has in each call, and their sum over the calls.
  std::vector<std::vector<double>> slack(calls.size());
  std::vector<double> total_slack(devices.size(), 0.0);
  for (std::size_t c = 0; c < calls.size(); ++c) {
    for (std::size_t d = 0; d < runs[c].size(); ++d) {
      slack[c].push_back(std::max(0.0, walls[c] - runs[c][d].busy - runs[c][d].copy_seconds));
      total_slack[d] += slack[c][d];
    }
  }
  for (std::size_t c = 0; c < calls.size(); ++c) {
    std::vector<double> waiting(runs[c].size(), 0.0);
    for (std::size_t d = 0; d < runs[c].size(); ++d) {
      if (total_slack[d] > 0.0)
        waiting[d] = slack[c][d] * std::clamp(idle[d] / total_slack[d], 0.0, 1.0);
    }
    if (c < profiles.size() && profiles[c] != nullptr)
      record(*profiles[c], runs[c], backward, walls[c], &split, waiting);
  }
}

void Scheduler::run_parts(const std::vector<LayerCall>& calls, bool backward,
                          LayerProfile* profile) {
  const auto start = Clock::now();
  std::vector<SliceRun> runs;
  std::vector<Layer*> layers;
  for (const LayerCall& call : calls) {
    HN_CHECK(call.split.shares().size() <= 1, "{}: a part runs on one device, not on {}",
             call.where, call.split.to_string());
    Driver& on = call.split.empty() ? home_ : driver(call.split.shares()[0].device);
    SliceRun run;
    run.on = &on;
    run.end = call.rows();
    resolve_deferred(run,
                     [&] { return prepare(call, on, 0, run.end, backward, nullptr, nullptr); });
    runs.push_back(std::move(run));
    layers.push_back(call.layer);
  }
  if (!calls.empty()) execute(runs, layers, backward, calls[0].where);
  if (profile != nullptr) record(*profile, runs, backward, seconds_since(start), nullptr);
}

void Scheduler::record(LayerProfile& profile, const std::vector<SliceRun>& runs, bool backward,
                       double wall, const Split* cut, const std::vector<double>& waiting) {
  (backward ? profile.backward_calls : profile.forward_calls) += 1;
  (backward ? profile.backward_seconds : profile.forward_seconds) += wall;
  if (cut != nullptr) {
    for (const SplitShare& share : cut->shares())
      profile_of(profile, share.device).rows = 0;
  }
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const SliceRun& run = runs[r];
    SliceProfile& slice = profile_of(profile, run.on->device());
    slice.rows = run.end - run.begin;
    (backward ? slice.backward_busy : slice.forward_busy) += run.busy;
    slice.copy_seconds += run.copy_seconds;
    slice.copy_bytes += run.copy_bytes;
    slice.waiting +=
        r < waiting.size() ? waiting[r] : std::max(0.0, wall - run.busy - run.copy_seconds);
  }
  if (cut != nullptr) {
    for (const SplitShare& share : cut->shares()) {
      SliceProfile& slice = profile_of(profile, share.device);
      if (slice.rows == 0) slice.waiting += wall;
    }
  }
}

void Scheduler::run(const LayerCall& call, bool backward, LayerProfile* profile) {
  const auto layer_start = Clock::now();
  const bool cut = !call.split.empty() && call.splittable();
  std::vector<SliceRun> runs = run_slices(call, backward, cut ? call.split : Split(), false);
  // 3. Parameter gradients: the partials added in device order.
  reduce_partials(call, runs);
  // 4. What each device did.
  if (profile != nullptr)
    record(*profile, runs, backward, seconds_since(layer_start), cut ? &call.split : nullptr);
}

void Scheduler::reduce_partials(const LayerCall& call, std::vector<SliceRun>& runs) {
  std::vector<SliceRun*> partials;
  for (SliceRun& run : runs)
    if (run.partial != nullptr) partials.push_back(&run);
  if (partials.empty()) return;
  // Every operand on the home driver, resolved here (copies charged to the partial's
  // device): diffs[p] += part[k][p] for k in device order.
  TransferTally& tally = transfer_tally();
  std::vector<float*> diffs;
  for (const CallTensor& param : call.params)
    diffs.push_back(param.diff != nullptr ? static_cast<float*>(param.diff->write(home_))
                                          : nullptr);
  std::vector<std::vector<const float*>> parts;
  for (SliceRun* run : partials) {
    const TransferTally before = tally;
    std::size_t offset = run->partial_offset;
    parts.emplace_back();
    for (const CallTensor& param : call.params) {
      if (param.diff == nullptr) {  // no gradient, no room in the partial (prepare)
        parts.back().push_back(nullptr);
        continue;
      }
      const std::size_t bytes = static_cast<std::size_t>(param.shape.count()) * sizeof(float);
      parts.back().push_back(
          static_cast<const float*>(run->partial->read_range(home_, offset, bytes)));
      offset += bytes;
    }
    run->copy_bytes += tally.bytes - before.bytes;
    run->copy_seconds += tally.seconds - before.seconds;
  }
  // In host memory, the devices that can address it share the work by element ranges
  // (each element still sums its partials in device order, so the result does not depend
  // on the sharing): fc6's 151 MB partial took 20 ms on one thread.
  std::vector<Driver*> helpers{&home_};
  if (home_.memory_space() == host_space()) {
    for (const SliceRun& run : runs) {
      if (run.on != &home_ && run.on->memory_space() == host_space()) helpers.push_back(run.on);
    }
  }
  const auto share = [&](std::size_t helper) {
    Driver& on = *helpers[helper];
    for (std::size_t p = 0; p < call.params.size(); ++p) {
      const index_t count = call.params[p].shape.count();
      const index_t per =
          (count + static_cast<index_t>(helpers.size()) - 1) / static_cast<index_t>(helpers.size());
      const index_t begin = std::min(count, per * static_cast<index_t>(helper));
      const index_t end = std::min(count, begin + per);
      if (begin == end || diffs[p] == nullptr) continue;
      for (const std::vector<const float*>& part : parts)
        on.axpy(end - begin, 1.0f, part[p] + begin, diffs[p] + begin);
    }
    on.synchronize();
  };
  for (std::size_t h = 1; h < helpers.size(); ++h)
    RuntimeThreads::of(*runtime_, *helpers[h]).submit([&share, h] { share(h); });
  std::exception_ptr error;
  try {
    share(0);
  } catch (...) {
    error = std::current_exception();
  }
  for (std::size_t h = 1; h < helpers.size(); ++h) {
    std::exception_ptr failed = RuntimeThreads::of(*runtime_, *helpers[h]).wait();
    if (failed && !error) error = failed;
  }
  if (error) std::rethrow_exception(error);
}

// ---- calibration -------------------------------------------------------------------------

double Scheduler::probe(const LayerCall& call, bool with_backward, Driver& on, index_t rows) {
  Layer& layer = *call.layer;
  // Twice, the second timed: the first run of a shape sets it up (a GPU driver makes its
  // cuDNN plans and workspace per shape, which took tens of ms on an H200 and made the
  // GPU look slower than the CPU).
  double seconds = 0.0;
  for (int pass = 0; pass < 2; ++pass) {
    seconds = 0.0;
    SliceRun run;
    run.on = &on;
    run.end = rows;
    run.slice = prepare(call, on, 0, rows, false, nullptr, nullptr);
    run_on(on, [&] { compute(layer, run, false); });
    seconds += run.busy;
    if (with_backward) {
      SyncedMemory scratch(probe_scratch_bytes(call));
      run.slice = prepare(call, on, 0, rows, true, nullptr, &scratch);
      run_on(on, [&] { compute(layer, run, true); });
      seconds += run.busy;
    }
  }
  return seconds;
}

double Scheduler::time_whole(const LayerCall& call, bool with_backward, const Device& device) {
  return probe(call, with_backward, driver(device), call.rows());
}

Scheduler::SplitTiming Scheduler::time_split(const LayerCall& call, bool with_backward,
                                             const Split& split) {
  // As it will run: slices side by side, then the parameter gradients merged. Twice, the
  // second timed (the first sets up the slices' shapes).
  SplitTiming timing;
  for (int pass = 0; pass < 2; ++pass) {
    timing = SplitTiming{};
    timing.busy.assign(split.shares().size(), 0.0);
    timing.rows.assign(split.shares().size(), 0);
    const auto start = Clock::now();
    for (const bool backward : {false, true}) {
      if (backward && !with_backward) break;
      std::vector<SliceRun> runs = run_slices(call, backward, split, true);
      if (backward) reduce_partials(call, runs);
      for (const SliceRun& run : runs) {
        for (std::size_t d = 0; d < split.shares().size(); ++d) {
          if (split.shares()[d].device != run.on->device()) continue;
          timing.busy[d] += run.busy;
          timing.rows[d] = run.end - run.begin;
        }
      }
    }
    timing.wall = seconds_since(start);
  }
  return timing;
}

Split Scheduler::calibrate(const LayerCall& call, bool with_backward,
                           const std::vector<Device>& devices) {
  // Probes add into the parameters' gradients, and change the parameters of a layer that
  // updates them in forward (BatchNorm's moving averages): keep them.
  const bool keep_data = call.layer->updates_params_in_forward();
  std::vector<std::vector<float>> kept, kept_data;
  for (const CallTensor& param : call.params) {
    if (keep_data) {
      const float* data = static_cast<const float*>(param.data->host_read());
      kept_data.emplace_back(data, data + param.shape.count());
    }
    if (param.diff == nullptr) {
      kept.emplace_back();
      continue;
    }
    const float* diff = static_cast<const float*>(param.diff->host_read());
    kept.emplace_back(diff, diff + param.shape.count());
  }
  const index_t batch = call.rows();
  // Rows per second of each device, first alone: slices double until one takes a few
  // milliseconds (or is the whole batch), since small slices underuse a GPU and the
  // CPU's batched lowering.
  std::vector<double> speed;
  for (const Device& device : devices) {
    if (devices.size() == 1) {
      speed.push_back(1.0);  // one device alone needs no measuring
      break;
    }
    Driver& on = driver(device);
    index_t rows = 1;
    double seconds = probe(call, with_backward, on, rows);
    while (seconds < 0.005 && rows < batch) {
      rows = std::min(batch, rows * 2);
      seconds = probe(call, with_backward, on, rows);
    }
    speed.push_back(static_cast<double>(rows) / std::max(seconds, 1e-9));
  }
  auto split_for = [&] { return Split::proportional(devices, speed); };
  Split measured = split_for();
  Split best = measured;
  double best_wall = std::numeric_limits<double>::infinity();
  if (speed.size() > 1) {
    // Then side by side, as they will run: devices sharing cores or memory bandwidth, or a
    // thread waiting for a GPU, slow each other down. Each device's speed is re-measured
    // with its slice of the split until the rows stop changing (at most a few rounds).
    for (int round = 0; round < 3; ++round) {
      const SplitTiming timing = time_split(call, with_backward, measured);
      if (timing.wall < best_wall) {
        best = measured;
        best_wall = timing.wall;
      }
      for (std::size_t d = 0; d < speed.size(); ++d) {
        if (timing.rows[d] > 0)
          speed[d] = static_cast<double>(timing.rows[d]) / std::max(timing.busy[d], 1e-9);
      }
      const Split next = split_for();
      if (next.partition(batch) == measured.partition(batch)) break;
      measured = next;
    }
    // A split pays for what proportional shares do not show: copies of the slices, the
    // parameter gradients merged across devices, a device slower at few rows. The fastest
    // device with the whole batch is a candidate too, timed the same way; it wins ties.
    const auto fastest =
        static_cast<std::size_t>(std::max_element(speed.begin(), speed.end()) - speed.begin());
    const Split single = Split::only(devices, devices[fastest]);
    if (single.partition(batch) != best.partition(batch)) {
      const SplitTiming timing = time_split(call, with_backward, single);
      if (timing.wall <= best_wall) best = single;
    }
  }
  for (std::size_t p = 0; p < kept_data.size(); ++p) {
    float* data = static_cast<float*>(call.params[p].data->host_overwrite());
    std::copy(kept_data[p].begin(), kept_data[p].end(), data);
  }
  for (std::size_t p = 0; p < call.params.size(); ++p) {
    if (call.params[p].diff == nullptr) continue;
    float* diff = static_cast<float*>(call.params[p].diff->host_overwrite());
    std::copy(kept[p].begin(), kept[p].end(), diff);
  }
  return best;
}

}  // namespace hn::detail
