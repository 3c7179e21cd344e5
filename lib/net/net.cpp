// The Net: builds a Caffe NetParameter into a DAG of layers for one phase and runs it.
//
// Blobs are versions: an in-place layer produces a new version of its bottom's name that
// shares the bottom's memory, so the graph stays acyclic and `blob(name)` is the latest
// version. A blob consumed by several layers gets a Split, as in Caffe; the split's tops
// alias the bottom's values and own their gradients, which the split sums in backward.
// Memory: every blob version belongs to a data group and a gradient group (in-place chains
// and split aliases share groups); each group is live over an interval of the
// forward-then-backward schedule, and groups whose intervals do not overlap share memory.
#include "lib/net/net_impl.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "lib/onnx/onnx_import.h"

namespace hn {

// ---- running ---------------------------------------------------------------------------

void Net::Impl::fill_dummy(NetLayer& nl) {
  for (std::size_t t = 0; t < nl.tops.size(); ++t) {
    const BlobVersion& blob = blobs[nl.tops[t]];
    float* host = static_cast<float*>(data_of(nl.tops[t]).host_overwrite());
    detail::fill(nl.dummy_fillers[t], blob.shape, host,
                 detail::mix_seeds(options.seed ^ iteration_seed,
                                   (static_cast<std::uint64_t>(t) << 32) |
                                       static_cast<std::uint64_t>(nl.tops[t])),
                 nl.param.name());
  }
}

void Net::Impl::forward_layer(int index) {
  apply_math();
  NetLayer& nl = layers[index];
  mark_written(starts[static_cast<std::size_t>(index)].forward);
  if (nl.fused_into >= 0) return;  // the layer it is fused into does its work
  switch (nl.kind) {
    case Kind::feed: {
      std::vector<float*> tops;
      for (int t : nl.tops)
        tops.push_back(static_cast<float*>(data_of(t).host_overwrite()));
      try {
        nl.feed->next(tops);
      } catch (const Error& error) {
        detail::fail("{}: {}", where(index), error.what());
      }
      return;
    }
    case Kind::input:
      return;  // the caller wrote the values
    case Kind::dummy: {
      // Caffe refills non-constant fillers every forward; constants once.
      bool constant = true;
      for (const auto& filler : nl.dummy_fillers)
        constant = constant && filler.type() == "constant";
      if (!constant || !nl.dummy_filled) fill_dummy(nl);
      nl.dummy_filled = true;
      return;
    }
    case Kind::split:
      return;  // its tops alias the bottom
    case Kind::compute:
      break;
  }
  run_compute(index, false);
}

detail::LayerCall Net::Impl::call_of(int index, bool backward) {
  NetLayer& nl = layers[index];
  detail::LayerCall call;
  call.layer = nl.layer.get();
  call.where = nl.where;
  std::vector<bool> propagate_down = nl.propagate_down;
  if (nl.fused_norm >= 0) {
    // The fused BatchNorm's input is the Scale's (in place): its gradient is the BatchNorm's.
    const NetLayer& bn = layers[static_cast<std::size_t>(nl.fused_norm)];
    propagate_down[0] = bn.needs_backward && bn.propagate_down[0];
  }
  for (std::size_t i = 0; i < nl.bottoms.size(); ++i) {
    const int b = nl.bottoms[i];
    const bool gradient = backward && propagate_down[i];
    call.inputs.push_back(detail::CallTensor{blobs[b].shape, &data_of(b),
                                             gradient ? &diff_of(b) : nullptr, blobs[b].layout});
  }
  for (int t : nl.tops)
    call.outputs.push_back(detail::CallTensor{blobs[t].shape, &data_of(t),
                                              backward ? &diff_of(t) : nullptr, blobs[t].layout});
  if (nl.fused_residual >= 0) {
    // The sum's other input second, its output in place of this layer's own.
    const NetLayer& sum = layers[static_cast<std::size_t>(nl.fused_residual)];
    const std::size_t other = sum.bottoms[0] == output_of(index) ? 1 : 0;
    const int r = sum.bottoms[other], z = sum.tops[0];
    const bool gradient = backward && sum.propagate_down[other];
    call.inputs.push_back(detail::CallTensor{blobs[r].shape, &data_of(r),
                                             gradient ? &diff_of(r) : nullptr, blobs[r].layout});
    propagate_down.push_back(sum.propagate_down[other]);
    call.outputs[0] = detail::CallTensor{blobs[z].shape, &data_of(z),
                                         backward ? &diff_of(z) : nullptr, blobs[z].layout};
  }
  if (nl.folded) {
    derive_folded(index);
    for (Tensor* param : {&nl.folded->weights, &nl.folded->bias})
      call.params.push_back(detail::CallTensor{param->shape(), &param->data(), &param->diff()});
  } else {
    for (Tensor* param : nl.params)
      call.params.push_back(detail::CallTensor{param->shape(), &param->data(), &param->diff()});
  }
  if (nl.fused_norm >= 0) {
    // The BatchNorm's statistics, read only.
    for (Tensor* param : layers[static_cast<std::size_t>(nl.fused_norm)].params)
      call.params.push_back(detail::CallTensor{param->shape(), &param->data(), nullptr});
  }
  if (backward) call.propagate_down = propagate_down;
  call.phase = options.state.phase;
  call.seed = detail::mix_seeds(iteration_seed, static_cast<std::uint64_t>(index));
  call.split = nl.split;
  return call;
}

// ---- a norm chain folded into a convolution (lib/layers/norm_fold.h) --------------------

NormFoldSources Net::Impl::fold_sources(int index) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  const NetLayer& scale = layers[static_cast<std::size_t>(nl.folded_scale)];
  const NetLayer& norm = layers[static_cast<std::size_t>(nl.folded_norm)];
  const auto read = [&](Tensor* t) { return t->data_read(*driver); };
  const auto statistic = [&](Tensor* t) {
    Operand operand;
    operand.shape = t->shape();
    operand.data = Pointer{driver->device(), const_cast<float*>(read(t)),
                           static_cast<std::size_t>(t->count()) * sizeof(float)};
    operand.version = t->data().version();
    return operand;
  };
  NormFoldSources s;
  s.outputs = nl.params[0]->shape()[0];
  s.per_output = nl.params[0]->count() / s.outputs;
  s.eps = nl.folded->eps;
  s.weights = read(nl.params[0]);
  s.bias = nl.params.size() > 1 ? read(nl.params[1]) : nullptr;
  s.gamma = read(scale.params[0]);
  s.beta = scale.params.size() > 1 ? read(scale.params[1]) : nullptr;
  s.mean_sum = statistic(norm.params[0]);
  s.variance_sum = statistic(norm.params[1]);
  s.factor = statistic(norm.params[2]);
  return s;
}

void Net::Impl::derive_folded(int index) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  std::vector<std::uint64_t> versions;
  for (const NetLayer* source : {&nl, &layers[static_cast<std::size_t>(nl.folded_scale)],
                                 &layers[static_cast<std::size_t>(nl.folded_norm)]}) {
    for (Tensor* param : source->params)
      versions.push_back(param->data().version());
  }
  // An unknown version (0: memory a caller may write) is never taken as unchanged.
  const bool known = std::find(versions.begin(), versions.end(), 0) == versions.end();
  if (!recording && known && versions == nl.folded->versions) return;
  NetLayer::Folded& f = *nl.folded;
  apply_math();
  const NormFoldSources sources = fold_sources(index);
  norm_fold_forward(*driver, sources, f.factor,
                    static_cast<float*>(f.channels.data().overwrite(*driver)),
                    static_cast<float*>(f.weights.data().overwrite(*driver)),
                    static_cast<float*>(f.bias.data().overwrite(*driver)));
  f.versions = std::move(versions);
}

void Net::Impl::before_backward(int index) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  if (!nl.folded) return;
  for (Tensor* t : {&nl.folded->weights, &nl.folded->bias})
    driver->fill(t->count(), 0.0f, static_cast<float*>(t->diff().overwrite(*driver)));
}

void Net::Impl::after_backward(int index) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  if (!nl.folded) return;
  NetLayer& scale = layers[static_cast<std::size_t>(nl.folded_scale)];
  NetLayer::Folded& f = *nl.folded;
  const NormFoldSources sources = fold_sources(index);
  const auto diff = [&](const std::vector<Tensor*>& params, std::size_t i) -> float* {
    return i < params.size() ? params[i]->diff_write(*driver) : nullptr;
  };
  norm_fold_backward(
      *driver, sources, f.channels.data_read(*driver), f.weights.diff_write(*driver),
      f.bias.diff_read(*driver), static_cast<float*>(fold_scratch.data().overwrite(*driver)),
      diff(nl.params, 0), diff(nl.params, 1), diff(scale.params, 0), diff(scale.params, 1));
}

void Net::Impl::run_compute(int index, bool backward) {
  NetLayer& nl = layers[index];
  if (!nl.parts.empty()) {
    run_output_cut(index, backward);
    return;
  }
  if (nl.automatic && !nl.calibrated && !backward) calibrate_layer(index);
  if (!nl.tuned && !backward) tune_layer(index);
  scheduler->run(call_of(index, backward), backward, &profiles[index]);
}

const Split& Net::Impl::upstream_split(int blob) const {
  static const Split none;
  int producer = blobs[blob].producer;
  // Through split layers, and layers fused into another (in place: their work is the
  // other's, their split its split).
  while (producer >= 0 && (layers[producer].kind == Kind::split ||
                           (layers[producer].fused_into >= 0 && layers[producer].parts.empty() &&
                            !layers[producer].bottoms.empty()))) {
    const int host = layers[producer].fused_into;
    if (host >= 0 && layers[host].fused_residual == producer) {
      producer = host;  // a sum computed by the convolution that feeds it
      break;
    }
    producer = blobs[layers[producer].bottoms[0]].producer;
  }
  if (producer < 0 || layers[producer].kind != Kind::compute) return none;
  return layers[producer].split;
}

void Net::Impl::tune_layer(int index) {
  NetLayer& nl = layers[index];
  nl.tuned = true;
  if (options.tune.mode == TuneMode::off) return;
  if (!tuner) tuner = std::make_unique<Tuner>(options.tune);
  scheduler->tune(call_of(index, false), *tuner);
  try {
    tuner->save();
  } catch (const Error& e) {
    // The cache only saves time: a run goes on without it.
    TuneReport report;
    report.layer = nl.param.name();
    report.warning = e.what();
    tuner->report(report);
  }
}

std::string Net::Impl::algorithm_of(int index) const {
  const NetLayer& nl = layers[index];
  if (nl.fused_into >= 0)
    return fmt::format("fused into '{}'",
                       layers[static_cast<std::size_t>(nl.fused_into)].param.name());
  if (nl.split.empty()) return nl.layer->algorithm(*driver);
  std::string text;
  for (const SplitShare& share : nl.split.shares()) {
    const std::string algorithm = nl.layer->algorithm(scheduler->driver(share.device));
    if (algorithm.empty()) continue;
    text += fmt::format("{}{}: {}", text.empty() ? "" : "; ", share.device.name(), algorithm);
  }
  return text;
}

void Net::Impl::calibrate_layer(int index) {
  NetLayer& nl = layers[index];
  nl.calibrated = true;
  // Calibration runs backward too, so the call carries the gradients it would.
  detail::LayerCall call = call_of(index, nl.needs_backward);
  if (!call.splittable()) {
    nl.split = Split();  // needs the whole batch: the Net's driver
    follow_fused(index);
    return;
  }
  const Split upstream = nl.bottoms.empty() ? Split() : upstream_split(nl.bottoms[0]);
  bool in_place = false;
  for (int t : nl.tops)
    for (int b : nl.bottoms)
      in_place = in_place || blobs[t].data_group == blobs[b].data_group;
  if (in_place) {
    // Probing would change the input it computes on; an in-place layer is cheap and best
    // left where its input is.
    nl.split = upstream;
  } else {
    const Split measured = scheduler->calibrate(call, nl.needs_backward, nl.auto_devices);
    // Where the rows come out as the layer before's, keep its split: the data stays put.
    const index_t rows = call.rows();
    nl.split = !upstream.empty() && upstream.partition(rows) == measured.partition(rows) ? upstream
                                                                                         : measured;
  }
  follow_fused(index);
  if (on_calibrated) on_calibrated(nl.param.name(), nl.split);
}

const Split* Net::Impl::consumers_rows(int index) {
  const Split* common = nullptr;
  for (int t : layers[static_cast<std::size_t>(index)].tops) {
    for (int c : blobs[static_cast<std::size_t>(t)].consumers) {
      NetLayer& consumer = layers[static_cast<std::size_t>(c)];
      if (consumer.kind != Kind::compute || !consumer.parts.empty() || consumer.split.empty() ||
          consumer.across_ranks || !call_of(c, false).splittable())
        return nullptr;
      if (common != nullptr && common->to_string() != consumer.split.to_string()) return nullptr;
      common = &consumer.split;
    }
  }
  return common;
}

void Net::Impl::follow_fused(int index) {
  for (NetLayer& fused : layers) {
    if (fused.fused_into != index || !fused.automatic || !fused.parts.empty()) continue;
    fused.split = layers[static_cast<std::size_t>(index)].split;
    fused.calibrated = true;
  }
}

void Net::Impl::backward_layer(int index) {
  apply_math();
  NetLayer& nl = layers[index];
  mark_written(starts[static_cast<std::size_t>(index)].backward);
  if (!nl.needs_backward || nl.fused_into >= 0) return;
  // Gradients of loss outputs start at the loss weight (Caffe's convention).
  for (std::size_t t = 0; t < nl.tops.size(); ++t) {
    if (nl.loss_weights[t] == 0.0f) continue;
    const BlobVersion& blob = blobs[nl.tops[t]];
    driver->fill(blob.shape.count(), nl.loss_weights[t],
                 static_cast<float*>(diff_of(nl.tops[t]).overwrite(*driver)));
  }
  if (nl.kind == Kind::split) {
    if (!nl.propagate_down[0]) return;
    const int bottom = nl.bottoms[0];
    const index_t count = blobs[bottom].shape.count();
    if (const Split* rows = consumers_rows(index)) {
      // Every consumer cut its rows alike: each device sums its own rows, all at once.
      scheduler->run(split_sum_call(index, *rows), true);
      return;
    }
    // The sum runs where the gradients are: when the consumers all ran on a GPU, copying
    // each gradient to the Net's driver and the sum back cost ResNet-50 31 ms per fan-out
    // under --split auto on an H200. Each element is a + b rounded once on any driver, so
    // the result does not depend on where.
    const auto all_on = [&](const Driver& d) {
      return std::all_of(nl.tops.begin(), nl.tops.end(),
                         [&](int t) { return diff_of(t).current_on(d.memory_space()); });
    };
    Driver* on = driver;
    if (runtime != nullptr && !all_on(*driver)) {
      for (Driver* candidate : runtime->drivers()) {
        if (all_on(*candidate)) {
          on = candidate;
          break;
        }
      }
    }
    float* dx = static_cast<float*>(diff_of(bottom).overwrite(*on));
    const auto dy = [&](std::size_t t) {
      return static_cast<const float*>(diff_of(nl.tops[t]).read(*on));
    };
    // The first two gradients in one pass, any others added to that.
    if (nl.tops.size() == 1) {
      on->copy(dx, dy(0), static_cast<std::size_t>(count) * sizeof(float));
    } else {
      on->lincomb(count, 1.0f, dy(0), 1.0f, dy(1), dx);
    }
    for (std::size_t t = 2; t < nl.tops.size(); ++t)
      on->axpy(count, 1.0f, dy(t), dx);
    return;
  }
  if (nl.kind != Kind::compute) return;
  before_backward(index);
  run_compute(index, true);
  after_backward(index);
}

detail::LayerCall Net::Impl::split_sum_call(int index, const Split& rows) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  const int bottom = nl.bottoms[0];
  if (!nl.sum) {
    nl.sum = detail::make_layer(nl.param);
    nl.sum->setup({blobs[bottom].shape});
  }
  detail::LayerCall call;
  call.layer = nl.sum.get();
  call.where = nl.where;
  call.phase = options.state.phase;
  call.inputs.push_back(detail::CallTensor{blobs[bottom].shape, &data_of(bottom), &diff_of(bottom),
                                           blobs[bottom].layout});
  for (int t : nl.tops)
    call.outputs.push_back(
        detail::CallTensor{blobs[t].shape, &data_of(t), &diff_of(t), blobs[t].layout});
  call.propagate_down = {true};
  call.split = rows;
  return call;
}

// ---- runs of layers cut alike ----------------------------------------------------------

int Net::Impl::cut_alike_run(int first, bool backward, std::vector<int>& members,
                             std::vector<detail::LayerCall>& calls) {
  const int step = backward ? -1 : 1;
  const int n = static_cast<int>(layers.size());
  std::string split;  // the run's, as text
  index_t rows = 0;
  // Every tensor's memory with the bytes of one of its rows (0: read whole): a memory that
  // two layers of the run cut differently (blobs sharing memory by the memory plan) would
  // let one device's rows overlap another's.
  std::map<const SyncedMemory*, std::size_t> row_bytes;
  constexpr std::size_t kParameter = ~std::size_t{0};  // a parameter's memory, in one layer
  int next = first;
  for (int l = first; l >= 0 && l < n; l += step) {
    NetLayer& nl = layers[static_cast<std::size_t>(l)];
    // Layers that do nothing here: fused into another (which runs in its place, in order),
    // without backward, and the split layers' aliases in forward.
    const bool idle = nl.fused_into >= 0 || (backward && !nl.needs_backward) ||
                      (!backward && nl.kind == Kind::split) ||
                      (backward && nl.kind == Kind::split && !nl.propagate_down[0]);
    if (idle) {
      if (calls.empty()) break;  // a run starts with a call
      continue;
    }
    detail::LayerCall call;
    if (nl.kind == Kind::split) {
      const Split* sum_rows = consumers_rows(l);
      if (sum_rows == nullptr) break;
      call = split_sum_call(l, *sum_rows);
    } else {
      if (nl.kind != Kind::compute || !nl.parts.empty() || nl.across_ranks || nl.split.empty() ||
          (nl.automatic && !nl.calibrated) || !nl.tuned)
        break;
      if (std::any_of(nl.loss_weights.begin(), nl.loss_weights.end(),
                      [](float w) { return w != 0.0f; }))
        break;  // backward sets its gradients first
      if (nl.layer->batch_sums(options.state.phase, backward).stages > 0) break;
      call = call_of(l, backward);
      if (!call.splittable()) break;
    }
    if (calls.empty()) {
      split = call.split.to_string();
      rows = call.rows();
    } else if (call.split.to_string() != split || call.rows() != rows) {
      break;
    }
    bool clash = false;
    const auto note = [&](const detail::CallTensor& tensor) {
      const bool by_rows = tensor.shape.axes() > 0 && tensor.shape[0] == rows;
      const std::size_t bytes =
          by_rows ? static_cast<std::size_t>(tensor.shape.count() / rows) * sizeof(float) : 0;
      for (const SyncedMemory* memory : {tensor.data, tensor.diff}) {
        if (memory == nullptr) continue;
        const auto [it, added] = row_bytes.emplace(memory, bytes);
        clash = clash || (!added && (it->second != bytes || bytes == 0));
      }
    };
    for (const detail::CallTensor& tensor : call.inputs)
      note(tensor);
    for (const detail::CallTensor& tensor : call.outputs)
      note(tensor);
    // A parameter shared with an earlier layer of the run would sum its gradients in
    // another order than a barrier per layer does.
    for (const detail::CallTensor& param : call.params) {
      for (const SyncedMemory* memory : {param.data, param.diff}) {
        if (memory == nullptr) continue;
        clash = clash || !row_bytes.emplace(memory, kParameter).second;
      }
    }
    if (clash) break;
    members.push_back(l);
    calls.push_back(std::move(call));
    next = l + step;
  }
  return next;
}

void Net::Impl::run_together(int first, int next, bool backward, const std::vector<int>& members,
                             std::vector<detail::LayerCall>& calls) {
  apply_math();
  const int step = backward ? -1 : 1;
  for (int l = first; l != next; l += step) {
    const detail::GroupStarts& started = starts[static_cast<std::size_t>(l)];
    mark_written(backward ? started.backward : started.forward);
  }
  std::vector<LayerProfile*> layer_profiles;
  for (int l : members) {
    const bool sum = layers[static_cast<std::size_t>(l)].kind == Kind::split;
    layer_profiles.push_back(sum ? nullptr : &profiles[static_cast<std::size_t>(l)]);
  }
  if (backward) {
    for (int l : members)
      before_backward(l);
  }
  scheduler->run_rows(calls, backward, layer_profiles);
  if (backward) {
    for (int l : members)
      after_backward(l);
  }
}

int Net::Impl::forward_from(int first) {
  std::vector<int> members;
  std::vector<detail::LayerCall> calls;
  const int next =
      options.barrier_per_layer ? first + 1 : cut_alike_run(first, false, members, calls);
  if (calls.size() < 2) {
    forward_layer(first);
    return first + 1;
  }
  run_together(first, next, false, members, calls);
  return next;
}

int Net::Impl::backward_from(int last) {
  std::vector<int> members;
  std::vector<detail::LayerCall> calls;
  const int next = options.barrier_per_layer ? last - 1 : cut_alike_run(last, true, members, calls);
  if (calls.size() < 2) {
    backward_layer(last);
    return last - 1;
  }
  run_together(last, next, true, members, calls);
  return next;
}

// ---- Net -------------------------------------------------------------------------------

namespace {

// The net of a prototxt, or of an ONNX model: its layers carry their weights, which the
// build loads (Net::Impl::build). An ONNX graph's outputs are kept (`options.keep_blobs`),
// as ONNX Runtime returns each: one that a later node reads too is then no Net output, and
// its memory would otherwise be reused.
pb::NetParameter read_model(const std::string& path, NetOptions& options) {
  if (!detail::is_onnx_path(path)) return detail::read_net_prototxt(path);
  detail::OnnxModel model = detail::read_onnx_model(path);
  for (const std::string& output : model.outputs)
    if (std::find(options.keep_blobs.begin(), options.keep_blobs.end(), output) ==
        options.keep_blobs.end())
      options.keep_blobs.push_back(output);
  return std::move(model.net);
}

}  // namespace

Net::Net(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Net::Net(const std::string& prototxt_path, Runtime& runtime, Driver& driver,
         const NetOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->runtime = &runtime;
  impl_->driver = &driver;
  impl_->options = options;
  impl_->origin = prototxt_path;
  impl_->build(read_model(prototxt_path, impl_->options));
}

Net::Net(const std::string& prototxt_path, Runtime& runtime, const Device& device,
         const NetOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->runtime = &runtime;
  impl_->device = device;
  impl_->options = options;
  impl_->origin = prototxt_path;
  impl_->build(read_model(prototxt_path, impl_->options));
}

std::unique_ptr<Net> Net::from_text(const std::string& prototxt_text, const std::string& origin,
                                    Runtime& runtime, Driver& driver, const NetOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->runtime = &runtime;
  impl->driver = &driver;
  impl->options = options;
  impl->origin = origin;
  impl->build(detail::parse_net_prototxt(prototxt_text, origin));
  return std::unique_ptr<Net>(new Net(std::move(impl)));
}

std::unique_ptr<Net> Net::from_param(const pb::NetParameter& param, const std::string& origin,
                                     Runtime& runtime, Driver& driver, const NetOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->runtime = &runtime;
  impl->driver = &driver;
  impl->options = options;
  impl->origin = origin;
  impl->build(param);
  return std::unique_ptr<Net>(new Net(std::move(impl)));
}

Net::~Net() = default;

const std::string& Net::name() const {
  return impl_->name;
}
Phase Net::phase() const {
  return impl_->options.state.phase;
}
Driver& Net::driver() const {
  return *impl_->driver;
}
MathMode Net::math_mode() const {
  return impl_->math;
}
std::vector<std::string> Net::math_notes() const {
  std::vector<std::string> notes;
  for (const Driver* d : impl_->math_drivers) {
    std::string note = d->math_note(impl_->math);
    if (!note.empty()) notes.push_back(std::move(note));
  }
  return notes;
}
index_t Net::batch_size() const {
  return impl_->batch;
}

float Net::forward() {
  for (int l = 0; l < num_layers();)
    l = impl_->forward_from(l);
  impl_->data_batch++;
  return read_loss();
}

void Net::sum_losses_on_driver(float* total, float* scratch) {
  Driver& d = *impl_->driver;
  d.fill(1, 0.0f, total);
  for (const NetLayer& nl : impl_->layers) {
    for (std::size_t t = 0; t < nl.tops.size(); ++t) {
      if (nl.loss_weights[t] == 0.0f) continue;
      const BlobVersion& blob = impl_->blobs[nl.tops[t]];
      const float* y = static_cast<const float*>(impl_->data_of(nl.tops[t]).read(d));
      d.bias_backward(AxisShape{1, 1, blob.shape.count()}, y, 0.0f, scratch);
      d.axpy(1, nl.loss_weights[t], scratch, total);
    }
  }
}

float Net::read_loss() {
  impl_->last_loss = 0.0f;
  for (const NetLayer& nl : impl_->layers) {
    for (std::size_t t = 0; t < nl.tops.size(); ++t) {
      if (nl.loss_weights[t] == 0.0f) continue;
      const BlobVersion& blob = impl_->blobs[nl.tops[t]];
      const float* y = static_cast<const float*>(impl_->data_of(nl.tops[t]).read(*impl_->driver));
      impl_->last_loss += nl.loss_weights[t] * impl_->driver->sum(blob.shape.count(), y);
    }
  }
  return impl_->last_loss;
}

std::vector<std::vector<std::string>> Net::layer_runs(bool backward) const {
  std::vector<std::vector<std::string>> runs;
  if (impl_->options.barrier_per_layer) return runs;
  const int n = num_layers();
  for (int l = backward ? n - 1 : 0; l >= 0 && l < n;) {
    std::vector<int> members;
    std::vector<detail::LayerCall> calls;
    const int next = impl_->cut_alike_run(l, backward, members, calls);
    if (calls.size() < 2) {
      l += backward ? -1 : 1;
      continue;
    }
    runs.emplace_back();
    for (int m : members)
      runs.back().push_back(impl_->layers[static_cast<std::size_t>(m)].param.name());
    l = next;
  }
  return runs;
}

void Net::backward() {
  for (int l = num_layers() - 1; l >= 0;)
    l = impl_->backward_from(l);
}

namespace {
// Layers that bring values in from the host: they run outside a recording.
bool brings_data(const NetLayer& nl) {
  return nl.kind == Kind::feed || nl.kind == Kind::input || nl.kind == Kind::dummy;
}
}  // namespace

void Net::Impl::run_data_layers_for_recording() {
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (!brings_data(layers[l])) continue;
    forward_layer(static_cast<int>(l));
    for (int t : layers[l].tops)
      data_of(t).read(*driver);  // the copy in, before the recorded layers read it
  }
}

void Net::Impl::mark_replayed() {
  const MemorySpace space = driver->memory_space();
  const auto mark = [&](SyncedMemory& memory) {
    if (memory.bytes() > 0 && memory.current_on(space)) memory.write(*driver);
  };
  for (const std::unique_ptr<SyncedMemory>& slot : slots)
    if (slot) mark(*slot);
  for (const NetParam& param : learnable) {
    mark(param.tensor->data());
    mark(param.tensor->diff());
  }
  for (NetLayer& nl : layers) {
    if (!nl.folded) continue;
    for (Tensor* t : {&nl.folded->weights, &nl.folded->bias, &nl.folded->channels}) {
      mark(t->data());
      mark(t->diff());
    }
  }
}

std::unique_ptr<Driver::Recording> Net::record_iteration(std::string& why,
                                                         const std::function<void()>& before,
                                                         const std::function<void()>& after) {
  why.clear();
  Impl& m = *impl_;
  for (const NetLayer& nl : m.layers) {
    if (!nl.split.empty() || !nl.output_cut.empty() || (nl.automatic && !nl.calibrated)) {
      why = fmt::format(
          "layer '{}' is split or cut between devices, or not yet placed: a recording holds the "
          "calls of the Net's driver alone",
          nl.param.name());
      return nullptr;
    }
  }
  if (model_parallel_ranks() > 1) {
    why = "layers cut across ranks communicate inside the iteration";
    return nullptr;
  }
  m.run_data_layers_for_recording();
  m.data_batch++;  // the data layers fetched this iteration's batch
  if (!m.driver->begin_recording(why)) return nullptr;
  // The folded weights are derived inside the recording, so that each replay derives them
  // from the weights the last update left.
  m.recording = true;
  try {
    if (before) before();
    for (int l = 0; l < num_layers();)
      l = brings_data(m.layers[static_cast<std::size_t>(l)]) ? l + 1 : m.forward_from(l);
    for (int l = num_layers() - 1; l >= 0;)
      l = m.backward_from(l);
    if (after) after();
  } catch (const std::exception& e) {
    m.recording = false;
    std::string ended;
    m.driver->end_recording(ended);  // ends the capture; what it holds is dropped
    why = e.what();
    return nullptr;
  }
  m.recording = false;
  return m.driver->end_recording(why);
}

void Net::replay_iteration(Driver::Recording& recording, bool fetch_data) {
  // Weights written elsewhere since (a restore, copy_weights) reach the driver first: the
  // recorded calls read them there.
  for (const NetParam& param : impl_->learnable)
    param.tensor->data().read(*impl_->driver);
  if (fetch_data) impl_->run_data_layers_for_recording();
  recording.replay();
  if (fetch_data) impl_->data_batch++;
  impl_->mark_replayed();
}

void Net::forward_layer(int index) {
  HN_CHECK(index >= 0 && index < num_layers(), "forward_layer({}): the net has {} layers", index,
           num_layers());
  impl_->forward_layer(index);
  if (index == num_layers() - 1) impl_->data_batch++;
}

void Net::backward_layer(int index) {
  HN_CHECK(index >= 0 && index < num_layers(), "backward_layer({}): the net has {} layers", index,
           num_layers());
  impl_->backward_layer(index);
}

float Net::loss() const {
  return impl_->last_loss;
}

void Net::clear_param_diffs() {
  for (const NetParam& param : impl_->learnable) {
    Driver& on = param.driver != nullptr ? *param.driver : *impl_->driver;
    on.fill(param.tensor->count(), 0.0f, static_cast<float*>(param.tensor->diff().overwrite(on)));
  }
}

int Net::num_layers() const {
  return static_cast<int>(impl_->layers.size());
}

Layer& Net::layer(int index) const {
  HN_CHECK(index >= 0 && index < num_layers() && impl_->layers[index].layer,
           "layer({}): not a computing layer of net '{}'", index, impl_->name);
  return *impl_->layers[index].layer;
}

const std::string& Net::layer_name(int index) const {
  return impl_->layers.at(index).param.name();
}
const char* Net::layer_type(int index) const {
  return impl_->layers.at(index).param.type().c_str();
}
std::string Net::layer_algorithm(int index) const {
  return impl_->layers.at(index).kind == Kind::compute ? impl_->algorithm_of(index) : "";
}
double Net::layer_forward_flops(int index) const {
  const NetLayer& nl = impl_->layers.at(index);
  if (nl.kind != Kind::compute || nl.bottoms.empty()) return 0.0;
  return nl.layer->forward_flops(impl_->blobs[nl.bottoms[0]].shape[0]);
}
bool Net::layer_needs_backward(int index) const {
  return impl_->layers.at(index).needs_backward;
}

int Net::layer_computed_by(int index) const {
  static_cast<void>(impl_->layers.at(index));  // range-checked
  return impl_->computed_by(index);
}

std::vector<std::string> Net::blob_names() const {
  std::vector<std::string> names;
  for (const BlobVersion& blob : impl_->blobs) {
    if (impl_->latest.at(blob.name) == static_cast<int>(&blob - impl_->blobs.data()))
      names.push_back(blob.name);
  }
  return names;
}

bool Net::has_blob(const std::string& name) const {
  return impl_->latest.count(name) > 0;
}

BlobRef Net::blob(const std::string& name) const {
  auto it = impl_->latest.find(name);
  if (it == impl_->latest.end()) {
    detail::fail("net '{}' ({}) has no blob '{}'; its blobs: {}", impl_->name, impl_->origin, name,
                 fmt::join(blob_names(), ", "));
  }
  BlobVersion& blob = impl_->blobs[it->second];
  return BlobRef{&blob.name,  &blob.shape, &impl_->data_of(it->second), &impl_->diff_of(it->second),
                 blob.layout, this};
}

const float* BlobRef::host_data() const {
  if (net != nullptr) net->check_blob_holds(*name, false);
  return static_cast<const float*>(data->host_read());
}
float* BlobRef::host_data_mut() const {
  if (net != nullptr) net->check_blob_holds(*name, false);
  return static_cast<float*>(data->host_write());
}
const float* BlobRef::host_diff() const {
  if (net != nullptr) net->check_blob_holds(*name, true);
  return static_cast<const float*>(diff->host_read());
}
float* BlobRef::host_diff_mut() const {
  if (net != nullptr) net->check_blob_holds(*name, true);
  return static_cast<float*>(diff->host_write());
}

void Net::check_blob_holds(const std::string& name, bool diff) const {
  const BlobVersion& blob = impl_->blobs[static_cast<std::size_t>(impl_->latest.at(name))];
  if (diff && !blob.gradient_fused_by.empty()) {
    detail::fail(
        "net '{}' ({}): the gradient of blob '{}' is not stored: its Eltwise and ReLU '{}' run "
        "fused (fuse_layers), the ReLU's gradient going straight into the Eltwise's inputs; name "
        "'{}' in keep_blobs (or turn fuse_layers off) to read it",
        impl_->name, impl_->origin, name, blob.gradient_fused_by, name);
  }
  if (!blob.summed_by.empty()) {
    detail::fail(
        "net '{}' ({}): blob '{}' is never written: Convolution '{}' adds the Eltwise's other "
        "input in its call and writes the sum instead (fuse_layers); name '{}' in keep_blobs "
        "(or turn fuse_layers off) to read it",
        impl_->name, impl_->origin, name, blob.summed_by, name);
  }
  if (!blob.columns_of.empty()) {
    detail::fail(
        "net '{}' ({}): blob '{}' is never gathered: the layers cut by outputs from '{}' on "
        "pass it as each part's columns; name '{}' in keep_blobs (or make it a net output) to "
        "read it",
        impl_->name, impl_->origin, name, blob.columns_of, name);
  }
  const int group = diff ? blob.diff_group : blob.data_group;
  const int holder = impl_->slot_holder[static_cast<std::size_t>(impl_->groups[group].slot)];
  if (holder < 0 || holder == group) return;
  // Name a blob whose values the memory holds now.
  std::string other = "another blob";
  for (const BlobVersion& b : impl_->blobs) {
    if (b.data_group == holder || b.diff_group == holder) {
      other = fmt::format("the {} of '{}'", b.diff_group == holder ? "gradient" : "values", b.name);
      break;
    }
  }
  detail::fail(
      "net '{}' ({}): the {} of blob '{}' are gone: the memory plan reused their memory for {} "
      "(blobs share memory where their lifetimes allow); name '{}' in keep_blobs (or turn "
      "reuse_memory off) to read them after forward and backward",
      impl_->name, impl_->origin, diff ? "gradient" : "values", name, other, name);
}

std::vector<std::string> Net::output_blob_names() const {
  std::vector<std::string> names;
  for (const auto& [name, pair] : outputs())
    names.push_back(name);
  return names;
}

std::vector<std::string> Net::input_blob_names() const {
  std::vector<std::string> names;
  for (const NetLayer& nl : impl_->layers) {
    if (nl.kind != Kind::input) continue;
    for (int t : nl.tops)
      names.push_back(impl_->blobs[t].name);
  }
  return names;
}

std::vector<std::pair<std::string, float>> Net::outputs() const {
  std::vector<std::pair<std::string, float>> result;
  for (const NetLayer& nl : impl_->layers) {
    for (std::size_t t = 0; t < nl.tops.size(); ++t) {
      const BlobVersion& blob = impl_->blobs[nl.tops[t]];
      if (!blob.consumers.empty() || impl_->latest.at(blob.name) != nl.tops[t]) continue;
      result.emplace_back(blob.name, nl.loss_weights[t]);
    }
  }
  return result;
}

const std::vector<NetParam>& Net::learnable_params() const {
  return impl_->learnable;
}

void Net::seek_data(std::uint64_t batch) {
  for (NetLayer& nl : impl_->layers) {
    if (nl.feed) nl.feed->seek(batch);
  }
  impl_->data_batch = batch;
}

std::uint64_t Net::data_position() const {
  return impl_->data_batch;
}

void Net::set_iteration_seed(std::uint64_t seed) {
  impl_->iteration_seed = seed;
}

LayerSplits Net::layer_splits() const {
  LayerSplits splits;
  for (const NetLayer& nl : impl_->layers) {
    if (nl.kind != Kind::compute) continue;
    if (!nl.split.empty()) splits.emplace_back(nl.param.name(), nl.split);
    if (!nl.output_cut.empty()) splits.emplace_back(nl.param.name(), nl.output_cut);
  }
  return splits;
}

Split Net::output_cut(const std::string& name) const {
  for (const NetLayer& nl : impl_->layers) {
    if (nl.param.name() == name) return nl.output_cut;
  }
  return Split();
}

bool Net::needs_split_calibration() const {
  return std::any_of(impl_->layers.begin(), impl_->layers.end(),
                     [](const NetLayer& nl) { return nl.automatic && !nl.calibrated; });
}

void Net::calibrate_splits(
    const std::function<void(const std::string& layer, const Split& split)>& on_layer) {
  if (!needs_split_calibration()) return;
  // A forward pass measures each layer on its inputs as it reaches it; the data it fetched
  // is fetched again by the next forward.
  const std::uint64_t position = impl_->data_batch;
  impl_->on_calibrated = on_layer;
  try {
    for (int l = 0; l < num_layers(); ++l) {
      const NetLayer& nl = impl_->layers[static_cast<std::size_t>(l)];
      if (nl.measured_at_build && on_layer)
        on_layer(nl.param.name(), nl.output_cut.empty() ? nl.split : nl.output_cut);
      impl_->forward_layer(l);
    }
  } catch (...) {
    impl_->on_calibrated = nullptr;
    seek_data(position);
    throw;
  }
  impl_->on_calibrated = nullptr;
  seek_data(position);
  check_splits_whole(position);
}

void Net::check_splits_whole(std::uint64_t position) {
  Impl& net = *impl_;
  net.split_check = SplitCheck{};
  // The device with most of the automatic layers' work (forward flops by fraction).
  std::vector<std::pair<Device, double>> work;
  std::vector<int> automatic;
  for (std::size_t l = 0; l < net.layers.size(); ++l) {
    const NetLayer& nl = net.layers[l];
    if (!nl.automatic || nl.split.empty()) continue;
    automatic.push_back(static_cast<int>(l));
    const double flops = std::max(1.0, layer_forward_flops(static_cast<int>(l)));
    for (const SplitShare& share : nl.split.shares()) {
      auto found = std::find_if(work.begin(), work.end(),
                                [&](const auto& entry) { return entry.first == share.device; });
      if (found == work.end()) found = work.insert(work.end(), {share.device, 0.0});
      found->second += flops * share.fraction;
    }
  }
  if (work.empty()) return;
  const Device alone = std::max_element(work.begin(), work.end(), [](const auto& a, const auto& b) {
                         return a.second < b.second;
                       })->first;
  // One split for every automatic layer: each device's share of their work.
  std::vector<Device> workers;
  std::vector<double> flops;
  for (const auto& [device, done] : work) {
    workers.push_back(device);
    flops.push_back(done);
  }
  const Split uniform = Split::proportional(workers, flops);
  std::vector<Split> measured, single, same;
  bool differs = false, varies = false;
  for (int l : automatic) {
    const Split& split = net.layers[l].split;
    const Split only = Split::only(split.devices(), alone);
    measured.push_back(split);
    differs = differs || only.partition(net.batch) != split.partition(net.batch);
    varies = varies || uniform.partition(net.batch) != split.partition(net.batch);
    // The Net's own driver alone is the unsplit path.
    single.push_back(alone == net.driver->device() ? Split() : only);
    same.push_back(uniform);
  }
  if (!differs) return;
  // Timing runs change the parameters' gradients and running statistics: keep them.
  std::vector<std::vector<float>> kept;
  for (const NetParam& param : net.learnable) {
    const float* data = param.tensor->host_data();
    const float* diff = param.tensor->host_diff();
    kept.emplace_back(data, data + param.tensor->count());
    kept.emplace_back(diff, diff + param.tensor->count());
  }
  auto restore = [&] {
    std::size_t k = 0;
    for (const NetParam& param : net.learnable) {
      std::copy(kept[k].begin(), kept[k].end(), param.tensor->host_data_mut());
      std::copy(kept[k + 1].begin(), kept[k + 1].end(), param.tensor->host_diff_mut());
      k += 2;
    }
  };
  auto use = [&](const std::vector<Split>& splits) {
    for (std::size_t a = 0; a < automatic.size(); ++a)
      net.layers[automatic[a]].split = splits[a];
  };
  // Each device's busy seconds in the automatic layers (their profiles' slices), so far.
  const auto busy_so_far = [&] {
    std::map<std::string, double> busy;
    for (int l : automatic)
      for (const SliceProfile& slice : net.profiles[static_cast<std::size_t>(l)].devices)
        busy[slice.device.name()] += slice.forward_busy + slice.backward_busy;
    return busy;
  };
  // The wall time of a forward and a backward, and each device's busy seconds in it (by name).
  std::map<std::string, double> busy;
  auto iteration_seconds = [&] {
    // Twice, the second timed: the first sets up the slices' shapes.
    double seconds = 0.0;
    for (int pass = 0; pass < 2; ++pass) {
      seek_data(position);
      const std::map<std::string, double> before = busy_so_far();
      const auto start = std::chrono::steady_clock::now();
      forward();
      backward();
      net.driver->synchronize();
      for (const auto& entry : work)
        net.scheduler->driver(entry.first).synchronize();
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      busy = busy_so_far();
      for (auto& [device, total] : busy) {
        const auto earlier = before.find(device);
        if (earlier != before.end()) total -= earlier->second;
      }
    }
    return seconds;
  };
  SplitCheck check;
  check.checked = true;
  check.alone = alone;
  check.uniform = uniform;
  // Each share's busy seconds in the latest timing.
  const auto busy_by_share = [&](const Split& split) {
    std::vector<double> seconds;
    for (const SplitShare& share : split.shares()) {
      const auto found = busy.find(share.device.name());
      seconds.push_back(found == busy.end() ? 0.0 : found->second);
    }
    return seconds;
  };
  const auto tried_before = [&](const Split& candidate) {
    for (const SplitCheck::Tried& tried : check.uniform_tried)
      if (tried.split.partition(net.batch) == candidate.partition(net.batch)) return true;
    return false;
  };
  const auto time_uniform = [&](const Split& candidate, bool balanced) {
    use(std::vector<Split>(automatic.size(), candidate));
    const double seconds = iteration_seconds();
    check.uniform_tried.push_back({candidate, seconds, balanced, busy_by_share(candidate)});
  };
  try {
    check.measured_seconds = iteration_seconds();
    check.uniform_seconds = check.measured_seconds;
    if (varies) {
      time_uniform(uniform, false);
      check.uniform_seconds = check.uniform_tried.back().seconds;
    } else {
      check.uniform_tried.push_back(
          {uniform, check.measured_seconds, false, busy_by_share(uniform)});
    }
    // The search: the devices other than `alone` with their shares scaled by k (alone takes
    // the rest); k = 1 is `uniform`.
    std::vector<double> scales{1.0};
    const auto try_scale = [&](double k) {
      std::vector<double> shares;
      double others = 0.0;
      for (const SplitShare& share : uniform.shares()) {
        shares.push_back(share.device == alone ? 0.0 : k * share.fraction);
        others += shares.back();
      }
      if (others <= 0.0 || others >= 1.0) return;
      for (std::size_t s = 0; s < shares.size(); ++s)
        if (uniform.shares()[s].device == alone) shares[s] = 1.0 - others;
      const Split candidate = Split::proportional(uniform.devices(), shares);
      if (tried_before(candidate)) return;
      time_uniform(candidate, false);
      scales.push_back(k);
    };
    const auto rows_on = [&](const Split& split) {
      const auto rows = split.partition(net.batch);
      return std::count_if(rows.begin(), rows.end(),
                           [](const auto& r) { return r.second > r.first; });
    };
    const auto fastest_tried = [&] {
      std::size_t best = 0;
      for (std::size_t t = 1; t < check.uniform_tried.size(); ++t)
        if (check.uniform_tried[t].seconds < check.uniform_tried[best].seconds) best = t;
      return best;
    };
    if (rows_on(uniform) > 1) {
      try_scale(0.5);
      try_scale(1.5);
      const double k = scales[fastest_tried()];
      try_scale(k == 1.0 ? 0.75 : k < 1.0 ? 0.25 : 2.0);
      if (k == 1.0) try_scale(1.25);
      // Balanced: the fastest so far with each device's rows in proportion to its speed in
      // that timing (rows over busy seconds, the devices measured in the same moments,
      // where timings of different iterations differ by a machine's drift), twice at most.
      std::size_t from = fastest_tried();
      for (int step = 0; step < 2; ++step) {
        const SplitCheck::Tried& base = check.uniform_tried[from];
        const Split candidate = base.split.balanced(net.batch, base.busy_seconds);
        if (candidate.empty()) break;
        if (tried_before(candidate)) break;
        time_uniform(candidate, true);
        from = check.uniform_tried.size() - 1;
      }
    }
    // The fastest, or the best balanced cut where it is within 3 % of it, or within 10 %
    // giving no device more than a row more or less: its rows came from one timing, both
    // devices measured in the same moments, where the fastest may only have met a faster
    // moment of the machine (a row of 16 is 6 %, less than two timings of the same cut
    // differ here). Where that leaves the fastest and the balanced cut is within 10 % of it,
    // both are timed once more, in turn, each keeping its faster timing.
    const auto best_balanced = [&] {
      std::optional<std::size_t> best;
      for (std::size_t t = 0; t < check.uniform_tried.size(); ++t)
        if (check.uniform_tried[t].balanced &&
            (!best || check.uniform_tried[t].seconds < check.uniform_tried[*best].seconds))
          best = t;
      return best;
    };
    const auto a_row_apart = [&](std::size_t a, std::size_t b) {
      const auto rows_a = check.uniform_tried[a].split.partition(net.batch);
      const auto rows_b = check.uniform_tried[b].split.partition(net.batch);
      for (std::size_t s = 0; s < rows_a.size(); ++s) {
        const index_t held_a = rows_a[s].second - rows_a[s].first;
        const index_t held_b = rows_b[s].second - rows_b[s].first;
        if (std::abs(held_a - held_b) > 1) return false;
      }
      return true;
    };
    const auto balanced_wins = [&](std::size_t balanced, std::size_t fastest) {
      const double ratio =
          check.uniform_tried[balanced].seconds / check.uniform_tried[fastest].seconds;
      return check.uniform_tried[fastest].balanced || ratio <= 1.03 ||
             (ratio <= 1.1 && a_row_apart(balanced, fastest));
    };
    if (const std::optional<std::size_t> balanced = best_balanced(); balanced) {
      const std::size_t fastest = fastest_tried();
      if (!balanced_wins(*balanced, fastest) &&
          check.uniform_tried[*balanced].seconds <= 1.1 * check.uniform_tried[fastest].seconds) {
        for (const std::size_t t : {fastest, *balanced}) {
          SplitCheck::Tried& again = check.uniform_tried[t];
          use(std::vector<Split>(automatic.size(), again.split));
          again.seconds = std::min(again.seconds, iteration_seconds());
        }
      }
    }
    std::size_t chosen = fastest_tried();
    if (const std::optional<std::size_t> balanced = best_balanced();
        balanced && balanced_wins(*balanced, chosen))
      chosen = *balanced;
    if (chosen > 0) {
      check.uniform = check.uniform_tried[chosen].split;
      check.uniform_seconds = check.uniform_tried[chosen].seconds;
      same.assign(automatic.size(), check.uniform);
      varies = true;
    }
    use(single);
    check.alone_seconds = iteration_seconds();
  } catch (...) {
    use(measured);
    seek_data(position);
    restore();
    throw;
  }
  // A split must win by more than noise to be worth its copies: the measured splits (rows
  // moving between layers) over one split for every layer, any split over a device alone.
  const bool uniform_wins = varies && check.measured_seconds >= 0.97 * check.uniform_seconds;
  const double split_seconds = uniform_wins ? check.uniform_seconds : check.measured_seconds;
  check.kept = split_seconds >= 0.97 * check.alone_seconds ? SplitCheck::Kept::alone
               : uniform_wins                              ? SplitCheck::Kept::uniform
                                                           : SplitCheck::Kept::measured;
  use(check.kept == SplitCheck::Kept::alone     ? single
      : check.kept == SplitCheck::Kept::uniform ? same
                                                : measured);
  // A layer was tuned for the slices of its measured split; cut otherwise now, it is tuned
  // again for its new slices at the next forward (a choice made for 17 rows held for 16:
  // oneDNN's Winograd weight gradient, for one, pays only above about 16 images a thread).
  for (std::size_t a = 0; a < automatic.size(); ++a) {
    NetLayer& nl = net.layers[static_cast<std::size_t>(automatic[a])];
    if (nl.split.partition(net.batch) != measured[a].partition(net.batch)) nl.tuned = false;
  }
  seek_data(position);
  restore();
  net.split_check = check;
}

Net::SplitCheck Net::split_check() const {
  return impl_->split_check;
}

std::vector<LayerProfile> Net::profile() const {
  std::vector<LayerProfile> result;
  for (std::size_t l = 0; l < impl_->layers.size(); ++l) {
    if (impl_->layers[l].kind != Kind::compute) continue;
    result.push_back(impl_->profiles[l]);
    result.back().algorithm = impl_->algorithm_of(static_cast<int>(l));
  }
  return result;
}

void Net::reset_profile() {
  for (LayerProfile& profile : impl_->profiles) {
    profile.forward_calls = profile.backward_calls = 0;
    profile.forward_seconds = profile.backward_seconds = 0.0;
    profile.devices.clear();
  }
}

std::size_t Net::activation_bytes() const {
  return impl_->bytes_with_reuse;
}
std::size_t Net::activation_bytes_without_reuse() const {
  return impl_->bytes_without_reuse;
}

std::vector<std::string> known_layer_types() {
  std::vector<std::string> types = detail::known_layer_types();
  for (const char* type : {"Data", "DummyData", "Input"})
    types.emplace_back(type);
  std::sort(types.begin(), types.end());
  return types;
}

}  // namespace hn
