// Layers cut by outputs (split_axis: OUTPUT, model parallelism inside a process), those
// whose registry entry says how (OutputCut; InnerProduct's num_output): the outputs are
// partitioned among the split's devices as its batch would be (Split::partition), and each
// device runs the layer for its columns with its own rows of the weights and bias, which never
// leave its memory. Forward gathers the columns into the top on the Net's driver; backward hands
// each part its columns of the top's gradient and sums the parts' input gradients in device order
// (deterministic). The parts run at the same time, each on its device's thread
// (Scheduler::run_parts).
#include <numeric>

#include "lib/net/layer_factory.h"
#include "lib/net/net_impl.h"

namespace hn {

namespace {

// Rows before `axis` and values after it, for copies of a range along it.
struct AxisBlocks {
  index_t outer = 1, inner = 1, length = 0;
};

AxisBlocks blocks_of(const Shape& shape, int axis) {
  AxisBlocks blocks;
  blocks.outer = shape.count(0, axis);
  blocks.inner = shape.count(axis + 1, shape.axes());
  blocks.length = shape[axis];
  return blocks;
}

}  // namespace

std::vector<WholeParam> whole_params(const std::vector<NetParam>& params) {
  std::vector<WholeParam> wholes;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const NetParam& np = params[i];
    const bool continues = np.shard.axis >= 0 && np.shard.begin > 0 && !wholes.empty() &&
                           params[wholes.back().first].layer == np.layer &&
                           params[wholes.back().first].index == np.index;
    if (continues) {
      wholes.back().last = i + 1;
      continue;
    }
    wholes.push_back(
        WholeParam{i, i + 1, np.shard.axis >= 0 ? np.shard.whole : np.tensor->shape()});
  }
  return wholes;
}

void whole_to_shard(const NetParam& shard, const float* whole, float* values) {
  if (shard.shard.axis < 0) {
    std::copy(whole, whole + shard.tensor->count(), values);
    return;
  }
  const AxisBlocks b = blocks_of(shard.shard.whole, shard.shard.axis);
  const index_t width = (shard.shard.end - shard.shard.begin) * b.inner;
  for (index_t o = 0; o < b.outer; ++o) {
    const float* from = whole + (o * b.length + shard.shard.begin) * b.inner;
    std::copy(from, from + width, values + o * width);
  }
}

void shard_to_whole(const NetParam& shard, const float* values, float* whole) {
  if (shard.shard.axis < 0) {
    std::copy(values, values + shard.tensor->count(), whole);
    return;
  }
  const AxisBlocks b = blocks_of(shard.shard.whole, shard.shard.axis);
  const index_t width = (shard.shard.end - shard.shard.begin) * b.inner;
  for (index_t o = 0; o < b.outer; ++o)
    std::copy(values + o * width, values + (o + 1) * width,
              whole + (o * b.length + shard.shard.begin) * b.inner);
}

std::vector<std::string> detail::cuttable_layer_types(bool across_ranks) {
  std::vector<std::string> names;
  for (const std::string& name : layer_type_names()) {
    const LayerType* type = find_layer_type(name);
    if (type->cut && (!across_ranks || type->cut->across_ranks)) names.push_back(name);
  }
  return names;
}

std::pair<index_t, index_t> rank_outputs(index_t outputs, int rank, int ranks) {
  return {outputs * rank / ranks, outputs * (rank + 1) / ranks};
}

bool Net::Impl::cuts_by_default(int index) const {
  const NetLayer& nl = layers[static_cast<std::size_t>(index)];
  if (nl.param.has_split_axis() || nl.type == nullptr || !nl.type->cut ||
      !nl.type->cut->by_default || nl.bottoms.size() != 1 || nl.tops.size() != 1)
    return false;
  if (options.cuts_like != nullptr) return !options.cuts_like->output_cut(nl.param.name()).empty();
  const OutputCut& cut = *nl.type->cut;
  if (cut.refusal && !cut.refusal(nl.param).empty()) return false;
  for (const pb::ParamSpec& spec : nl.param.param()) {
    if (!spec.name().empty()) return false;  // shared parameters stay whole
  }
  // A batch cut writes and merges a whole weight gradient on every device; a cut by outputs
  // gives every device the whole input and merges input gradients instead.
  const Shape& input = blobs[static_cast<std::size_t>(nl.bottoms[0])].shape;
  const Shape& output = blobs[static_cast<std::size_t>(nl.tops[0])].shape;
  int axis = cut.input_axis(nl.param);
  if (axis < 0) axis += input.axes();
  if (axis < 1 || axis >= input.axes() || nl.layer->params().empty()) return false;
  const index_t rows = input.count(0, axis);
  if (rows <= 0) return false;
  const double moved =
      static_cast<double>(rows) * (2.0 * static_cast<double>(input.count(axis, input.axes())) +
                                   static_cast<double>(output.count()) / static_cast<double>(rows));
  return moved < static_cast<double>(nl.layer->params()[0].count());
}

Split Net::Impl::measure_output_cut(int index, const std::vector<Device>& devices) {
  NetLayer& nl = layers[static_cast<std::size_t>(index)];
  HN_CHECK(!devices.empty(), "{}: an automatic split without devices", where(index));
  if (devices.size() == 1) return Split::single(devices[0]);
  // The layer whole, on random values (the net's own memory is not planned yet).
  const std::string at = where(index);
  const Shape& input_shape = blobs[static_cast<std::size_t>(nl.bottoms[0])].shape;
  std::unique_ptr<Layer> layer = detail::make_layer(nl.param);
  const Shape output_shape = layer->setup({input_shape}).at(0);
  Tensor input(input_shape), output(output_shape);
  pb::FillerParameter random;
  random.set_type("uniform");
  random.set_min(-1.0f);
  random.set_max(1.0f);
  std::uint64_t stream = 0;
  auto fill_random = [&](const Shape& shape, float* values) {
    detail::fill(random, shape, values, detail::mix_seeds(options.seed, ++stream), at);
  };
  fill_random(input_shape, input.host_data_mut());
  fill_random(output_shape, output.host_diff_mut());
  const bool with_backward = options.state.phase == Phase::train;
  detail::LayerCall call;
  call.layer = layer.get();
  call.where = at;
  call.phase = options.state.phase;
  call.inputs.push_back(detail::CallTensor{input_shape, &input.data(), &input.diff()});
  call.outputs.push_back(detail::CallTensor{output_shape, &output.data(), &output.diff()});
  for (Tensor& param : layer->params()) {
    fill_random(param.shape(), param.host_data_mut());
    call.params.push_back(detail::CallTensor{param.shape(), &param.data(), &param.diff()});
  }
  call.propagate_down = {with_backward};
  std::vector<float> seconds;
  for (const Device& on : devices)
    seconds.push_back(
        static_cast<float>(std::max(1e-9, scheduler->time_whole(call, with_backward, on))));
  // Every rank cuts alike (the parts' parameters are reduced across ranks): rank 0's times.
  if (comm != nullptr && ranks > 1) comm->broadcast(*driver, seconds.data(), seconds.size(), 0);
  std::vector<double> speeds;
  for (float s : seconds)
    speeds.push_back(1.0 / static_cast<double>(s));
  const double rate = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  const auto fastest =
      static_cast<std::size_t>(std::max_element(speeds.begin(), speeds.end()) - speeds.begin());
  // The cut gathers the outputs and sums the input gradients: it must save more than that.
  // Else the fastest alone, the others listed with nothing (as Scheduler::calibrate says it).
  if (1.0 / rate > 0.85 * static_cast<double>(seconds[fastest]))
    return Split::only(devices, devices[fastest]);
  return Split::proportional(devices, speeds);
}

void Net::Impl::set_up_output_cuts() {
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (nl.output_cut.empty() && !nl.across_ranks) continue;
    const std::string at = where(static_cast<int>(l));
    const char* how = nl.across_ranks ? "model_parallel" : "split_axis: OUTPUT";
    HN_CHECK(nl.type != nullptr && nl.type->cut,
             "{}: {} cuts a layer's outputs; a {} layer cannot be cut so (types that can: {})", at,
             how, nl.param.type(), fmt::join(detail::cuttable_layer_types(), ", "));
    const OutputCut& how_cut = *nl.type->cut;
    HN_CHECK(!nl.across_ranks || how_cut.across_ranks,
             "{}: model_parallel does not cut a {} layer across ranks yet; split_axis: OUTPUT "
             "cuts it among this process's devices",
             at, nl.param.type());
    if (how_cut.refusal) {
      const std::string why = how_cut.refusal(nl.param);
      HN_CHECK(why.empty(), "{}: {} cannot cut this layer's outputs: {}", at, how, why);
    }
    for (const pb::ParamSpec& spec : nl.param.param()) {
      HN_CHECK(spec.name().empty(),
               "{}: parameter '{}' is shared by name, and a layer cut by outputs cannot share "
               "its parameters",
               at, spec.name());
    }
    const BlobVersion& input = blobs[nl.bottoms[0]];
    const index_t outputs = how_cut.outputs(nl.param);
    // Across ranks: this rank's outputs, computed for every rank's rows.
    Shape input_shape = input.shape;
    index_t first = 0, last = outputs;
    if (nl.across_ranks) {
      int axis = how_cut.input_axis(nl.param);
      if (axis < 0) axis += input.shape.axes();
      HN_CHECK(axis >= 1,
               "{}: model_parallel gathers the ranks' rows along axis 0, and the layer's axis "
               "is 0 (one row of {})",
               at, input.shape.to_string());
      HN_CHECK(outputs >= ranks,
               "{}: model_parallel cuts its {} outputs among {} ranks; every rank needs one", at,
               outputs, ranks);
      std::vector<index_t> dims = input.shape.dims();
      dims[0] *= ranks;
      input_shape = Shape(std::move(dims));
      std::tie(first, last) = rank_outputs(outputs, rank, ranks);
      nl.rank_begin = first;
      nl.rank_end = last;
      nl.gathered = Tensor(input_shape);
    }
    const Split cut =
        nl.output_cut.empty() ? Split({SplitShare{driver->device(), 1.0}}) : nl.output_cut;
    const auto columns = cut.partition(last - first);
    for (std::size_t d = 0; d < columns.size(); ++d) {
      const index_t begin = first + columns[d].first, end = first + columns[d].second;
      if (end == begin) continue;
      NetLayer::Part part;
      part.device = cut.shares()[d].device;
      part.begin = begin;
      part.end = end;
      pb::LayerParameter param = nl.param;
      how_cut.set_outputs(param, end - begin);
      try {
        part.layer = detail::make_layer(param);
        part.output = Tensor(part.layer->setup({input_shape}).at(0));
      } catch (const Error& error) {
        detail::fail("{}: the part on {}: {}", at, part.device.name(), error.what());
      }
      part.input_diff = Tensor(input_shape);
      nl.parts.push_back(std::move(part));
    }
    const Shape& top = blobs[static_cast<std::size_t>(nl.tops[0])].shape;
    nl.cut_axis = how_cut.output_axis < 0 ? how_cut.output_axis + top.axes() : how_cut.output_axis;
    HN_CHECK(nl.cut_axis >= 0 && nl.cut_axis < top.axes() && top[nl.cut_axis] == outputs,
             "{}: the layer's {} outputs are not axis {} of its output {}", at, outputs,
             how_cut.output_axis, top.to_string());
    nl.cut_inner = top.count(nl.cut_axis + 1, top.axes());
    if (nl.across_ranks) {
      const index_t rows =
          nl.parts.empty() ? 0 : nl.parts[0].output.count() / (nl.parts[0].end - nl.parts[0].begin);
      nl.exchange = Tensor(Shape{rows * outputs});
      if (nl.parts.size() > 1) nl.rank_output = Tensor(Shape{rows * (last - first)});
    }
  }
}

void Net::Impl::set_up_cut_params(int index) {
  NetLayer& nl = layers[index];
  const OutputCut& cut = *nl.type->cut;
  const std::vector<Tensor>& whole = nl.layer->params();  // shapes only: never allocated
  for (std::size_t p = 0; p < whole.size(); ++p) {
    pb::ParamSpec spec;
    if (static_cast<int>(p) < nl.param.param_size()) spec = nl.param.param(static_cast<int>(p));
    // The whole parameter as the uncut layer draws it (the same seed), then each part's rows.
    const Shape& shape = whole[p].shape();
    check_host_bytes(sizeof(float) * static_cast<std::size_t>(shape.count()), [&] {
      return fmt::format("{}: parameter {} ({})", where(index), p, shape.to_string());
    });
    std::vector<float> values(static_cast<std::size_t>(shape.count()), 0.0f);
    const pb::FillerParameter* filler =
        nl.type->filler ? nl.type->filler(nl.param, static_cast<int>(p)) : nullptr;
    if (filler != nullptr)
      detail::fill(*filler, shape, values.data(),
                   detail::mix_seeds(options.seed, (static_cast<std::uint64_t>(index) << 8) | p),
                   fmt::format("{} parameter {}", where(index), p));
    for (NetLayer::Part& part : nl.parts) {
      NetParam np;
      np.name = fmt::format("{}.{}", nl.param.name(), p);
      np.layer = nl.param.name();
      np.index = static_cast<int>(p);
      np.tensor = &part.layer->params()[p];
      part.params.push_back(np.tensor);
      np.lr_mult = spec.lr_mult();
      np.decay_mult = spec.decay_mult();
      np.driver = &scheduler->driver(part.device);
      np.shard.axis = cut.param_axis(nl.param, static_cast<int>(p));
      np.shard.begin = part.begin;
      np.shard.end = part.end;
      np.shard.whole = shape;
      np.shard.ranks = nl.across_ranks ? ranks : 1;
      whole_to_shard(np, values.data(), np.tensor->host_data_mut());
      learnable.push_back(np);
    }
    nl.owns_param.push_back(true);
  }
}

void Net::Impl::plan_column_chains() {
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& first = layers[l];
    if (first.parts.empty() || first.across_ranks) continue;
    // In-place element-wise layers on the top, each its blob's only consumer, then a layer
    // cut by outputs in the same process.
    std::vector<int> chain;
    int next = -1;
    for (int version = first.tops[0];;) {
      const BlobVersion& blob = blobs[static_cast<std::size_t>(version)];
      if (blob.keep || blob.consumers.size() != 1) break;
      const int consumer = blob.consumers[0];
      const NetLayer& cl = layers[static_cast<std::size_t>(consumer)];
      if (!cl.parts.empty()) {
        if (!cl.across_ranks && cl.bottoms.size() == 1) next = consumer;
        break;
      }
      bool no_loss = true;
      for (float weight : cl.loss_weights)
        no_loss = no_loss && weight == 0.0f;
      const bool element_wise = cl.kind == Kind::compute && cl.type != nullptr &&
                                cl.type->element_wise && cl.bottoms.size() == 1 &&
                                cl.tops.size() == 1 && cl.param.top(0) == cl.param.bottom(0) &&
                                !cl.automatic && cl.fused_into < 0 && no_loss;
      if (!element_wise) break;
      chain.push_back(consumer);
      version = cl.tops[0];
    }
    if (next < 0) continue;
    NetLayer& last = layers[static_cast<std::size_t>(next)];
    first.chain = chain;
    first.columns_to = next;
    blobs[static_cast<std::size_t>(first.tops[0])].columns_of = first.param.name();
    for (int e : chain)
      blobs[static_cast<std::size_t>(layers[static_cast<std::size_t>(e)].tops[0])].columns_of =
          first.param.name();
    last.columns_from = static_cast<int>(l);
    for (int e : chain)
      layers[static_cast<std::size_t>(e)].fused_into = static_cast<int>(l);
    for (NetLayer::Part& part : first.parts) {
      for (int e : chain) {
        part.chain_layers.push_back(detail::make_layer(layers[static_cast<std::size_t>(e)].param));
        part.chain_layers.back()->setup({part.output.shape()});
      }
      part.scratch = Tensor(part.output.shape());
    }
    for (NetLayer::Part& part : last.parts)
      part.input = Tensor(blobs[static_cast<std::size_t>(last.bottoms[0])].shape);
  }
}

detail::LayerCall Net::Impl::part_call(const NetLayer::Part& part, Layer& layer, int index) {
  detail::LayerCall call;
  call.layer = &layer;
  call.where = layers[static_cast<std::size_t>(index)].where;
  call.phase = options.state.phase;
  call.seed = detail::mix_seeds(iteration_seed, static_cast<std::uint64_t>(index));
  if (part.device != driver->device()) call.split = Split({SplitShare{part.device, 1.0}});
  return call;
}

void Net::Impl::run_chain(int index, bool backward) {
  NetLayer& nl = layers[index];
  const Shape& out = blobs[nl.tops[0]].shape;
  const index_t columns = out.count(nl.cut_axis, out.axes());  // values per row
  const std::size_t count = nl.chain.size();
  for (std::size_t step = 0; step < count; ++step) {
    const std::size_t k = backward ? count - 1 - step : step;
    const int element_wise = nl.chain[k];
    std::vector<detail::LayerCall> calls;
    for (NetLayer::Part& part : nl.parts) {
      detail::LayerCall call = part_call(part, *part.chain_layers[k], element_wise);
      const detail::CallTensor block{part.output.shape(), &part.output.data(),
                                     backward ? &part.output.diff() : nullptr};
      call.inputs.push_back(block);
      call.outputs.push_back(block);
      if (backward) call.propagate_down = {true};
      call.column_begin = part.begin * nl.cut_inner;
      call.columns = columns;
      calls.push_back(std::move(call));
    }
    scheduler->run_parts(calls, backward, &profiles[static_cast<std::size_t>(element_wise)]);
  }
}

void Net::Impl::run_cut_parts(int index, bool backward, SyncedMemory* input,
                              const Shape& input_shape) {
  NetLayer& nl = layers[index];
  const int bottom = nl.bottoms[0];
  const bool input_gradient = backward && nl.propagate_down[0];
  std::vector<detail::LayerCall> calls;
  for (NetLayer::Part& part : nl.parts) {
    detail::LayerCall call = part_call(part, *part.layer, index);
    call.inputs.push_back(detail::CallTensor{
        input_shape, input != nullptr ? input : &part.input.data(),
        input_gradient ? &part.input_diff.data() : nullptr, blobs[bottom].layout});
    call.outputs.push_back(detail::CallTensor{part.output.shape(), &part.output.data(),
                                              backward ? &part.output.diff() : nullptr});
    for (Tensor* param : part.params)
      call.params.push_back(detail::CallTensor{param->shape(), &param->data(), &param->diff()});
    if (backward) call.propagate_down = nl.propagate_down;
    calls.push_back(std::move(call));
  }
  scheduler->run_parts(calls, backward, &profiles[index]);
}

void Net::Impl::run_output_cut(int index, bool backward) {
  NetLayer& nl = layers[index];
  if (nl.across_ranks) {
    run_rank_cut(index, backward);
    return;
  }
  const int bottom = nl.bottoms[0], top = nl.tops[0];
  const Shape& out = blobs[top].shape;
  const index_t columns = out.count(nl.cut_axis, out.axes());  // values per row
  const index_t rows = out.count(0, nl.cut_axis);
  const index_t inner = nl.cut_inner;
  Driver& home = *driver;
  const bool input_gradient = backward && nl.propagate_down[0];
  // After another cut layer: each part's whole input, from that layer's parts' columns.
  NetLayer* before =
      nl.columns_from >= 0 ? &layers[static_cast<std::size_t>(nl.columns_from)] : nullptr;
  SyncedMemory* input = before != nullptr ? nullptr : &data_of(bottom);
  const Shape& in = blobs[bottom].shape;
  const index_t in_columns = before != nullptr ? in.count(before->cut_axis, in.axes()) : 0;
  const index_t in_rows = before != nullptr ? in.count(0, before->cut_axis) : 0;
  const index_t in_inner = before != nullptr ? before->cut_inner : 1;
  if (!backward) {
    if (before != nullptr) {
      for (NetLayer::Part& part : nl.parts) {
        Driver& on = scheduler->driver(part.device);
        float* x = static_cast<float*>(part.input.data().overwrite(on));
        for (NetLayer::Part& block : before->parts) {
          const index_t width = (block.end - block.begin) * in_inner;
          on.copy_strided(in_rows, width, block.output.data_read(on), width,
                          x + block.begin * in_inner, in_columns);
        }
      }
    }
    run_cut_parts(index, false, input, blobs[bottom].shape);
    if (nl.columns_to >= 0) {  // the columns stay with the parts
      run_chain(index, false);
      return;
    }
    // The gather: disjoint columns, copied.
    float* y = static_cast<float*>(data_of(top).overwrite(home));
    for (NetLayer::Part& part : nl.parts) {
      const index_t width = (part.end - part.begin) * inner;
      home.copy_strided(rows, width, part.output.data_read(home), width, y + part.begin * inner,
                        columns);
    }
    return;
  }
  if (nl.columns_to >= 0) {
    // The next cut layer left each part its columns of the gradient.
    run_chain(index, true);
  } else {
    const float* dy = static_cast<const float*>(diff_of(top).read(home));
    for (NetLayer::Part& part : nl.parts) {
      const index_t width = (part.end - part.begin) * inner;
      home.copy_strided(rows, width, dy + part.begin * inner, columns,
                        static_cast<float*>(part.output.diff().overwrite(home)), width);
    }
  }
  run_cut_parts(index, true, input, blobs[bottom].shape);
  if (!input_gradient) return;
  if (before == nullptr) {
    add_input_diffs(index, static_cast<float*>(diff_of(bottom).overwrite(home)));
    return;
  }
  // Each of the layer before's parts gets its columns of the input's gradient, the parts'
  // shares added in device order on its device.
  for (NetLayer::Part& block : before->parts) {
    Driver& on = scheduler->driver(block.device);
    const index_t width = (block.end - block.begin) * in_inner;
    float* dx = static_cast<float*>(block.output.diff().overwrite(on));
    for (std::size_t p = 0; p < nl.parts.size(); ++p) {
      const float* share = nl.parts[p].input_diff.data_read(on) + block.begin * in_inner;
      if (p == 0) {
        on.copy_strided(in_rows, width, share, in_columns, dx, width);
      } else {
        float* columns_of = static_cast<float*>(block.scratch.data().overwrite(on));
        on.copy_strided(in_rows, width, share, in_columns, columns_of, width);
        on.axpy(in_rows * width, 1.0f, columns_of, dx);
      }
    }
  }
}

void Net::Impl::add_input_diffs(int index, float* dx) {
  // The input's gradient: the parts' shares added in device order.
  NetLayer& nl = layers[index];
  Driver& home = *driver;
  for (std::size_t p = 0; p < nl.parts.size(); ++p) {
    Tensor& share = nl.parts[p].input_diff;
    const float* values = static_cast<const float*>(share.data().read(home));
    if (p == 0)
      home.copy(dx, values, static_cast<std::size_t>(share.count()) * sizeof(float));
    else
      home.axpy(share.count(), 1.0f, values, dx);
  }
}

}  // namespace hn
