// Layers cut by outputs (split_axis: OUTPUT, model parallelism inside a process): an
// InnerProduct's num_output outputs are partitioned among the split's devices as its batch
// would be (Split::partition), and each device runs an InnerProduct of its columns with its
// own rows of the weights and bias, which never leave its memory. Forward gathers the
// columns into the top on the Net's driver; backward hands each part its columns of the
// top's gradient and sums the parts' input gradients in device order (deterministic). The
// parts run at the same time, each on its device's thread (Scheduler::run_parts).
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

void Net::Impl::set_up_output_cuts() {
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (nl.output_cut.empty()) continue;
    const std::string at = where(static_cast<int>(l));
    HN_CHECK(nl.param.type() == "InnerProduct",
             "{}: split_axis: OUTPUT cuts an InnerProduct's outputs; a {} layer cannot be cut so",
             at, nl.param.type());
    for (const pb::ParamSpec& spec : nl.param.param()) {
      HN_CHECK(spec.name().empty(),
               "{}: parameter '{}' is shared by name, and a layer cut by outputs cannot share "
               "its parameters",
               at, spec.name());
    }
    const BlobVersion& input = blobs[nl.bottoms[0]];
    const index_t outputs = static_cast<index_t>(nl.param.inner_product_param().num_output());
    const auto columns = nl.output_cut.partition(outputs);
    for (std::size_t d = 0; d < columns.size(); ++d) {
      const auto [begin, end] = columns[d];
      if (end == begin) continue;
      NetLayer::Part part;
      part.device = nl.output_cut.shares()[d].device;
      part.begin = begin;
      part.end = end;
      pb::LayerParameter param = nl.param;
      param.mutable_inner_product_param()->set_num_output(static_cast<std::uint32_t>(end - begin));
      try {
        part.layer = detail::make_layer(param);
        part.output = Tensor(part.layer->setup({input.shape}).at(0));
      } catch (const Error& error) {
        detail::fail("{}: the part on {}: {}", at, part.device.name(), error.what());
      }
      part.input_diff = Tensor(input.shape);
      nl.parts.push_back(std::move(part));
    }
  }
}

void Net::Impl::set_up_cut_params(int index) {
  NetLayer& nl = layers[index];
  const pb::InnerProductParameter& config = nl.param.inner_product_param();
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
    detail::fill(p == 0 ? config.weight_filler() : config.bias_filler(), shape, values.data(),
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
      np.shard.axis = p == 0 && config.transpose() ? 1 : 0;
      np.shard.begin = part.begin;
      np.shard.end = part.end;
      np.shard.whole = shape;
      whole_to_shard(np, values.data(), np.tensor->host_data_mut());
      learnable.push_back(np);
    }
    nl.owns_param.push_back(true);
  }
}

void Net::Impl::run_output_cut(int index, bool backward) {
  NetLayer& nl = layers[index];
  const int bottom = nl.bottoms[0], top = nl.tops[0];
  const Shape& out = blobs[top].shape;
  const index_t columns = out[out.axes() - 1];
  const index_t rows = out.count() / std::max<index_t>(columns, 1);
  Driver& home = *driver;
  const bool input_gradient = backward && nl.propagate_down[0];
  auto call_for = [&](NetLayer::Part& part) {
    detail::LayerCall call;
    call.layer = part.layer.get();
    call.where = nl.where;
    call.inputs.push_back(detail::CallTensor{blobs[bottom].shape, &data_of(bottom),
                                             input_gradient ? &part.input_diff.data() : nullptr,
                                             blobs[bottom].layout});
    call.outputs.push_back(detail::CallTensor{part.output.shape(), &part.output.data(),
                                              backward ? &part.output.diff() : nullptr});
    for (Tensor* param : part.params)
      call.params.push_back(detail::CallTensor{param->shape(), &param->data(), &param->diff()});
    if (backward) call.propagate_down = nl.propagate_down;
    call.phase = options.state.phase;
    call.seed = detail::mix_seeds(iteration_seed, static_cast<std::uint64_t>(index));
    if (part.device != home.device()) call.split = Split({SplitShare{part.device, 1.0}});
    return call;
  };
  std::vector<detail::LayerCall> calls;
  auto run_parts = [&] {
    calls.clear();
    for (NetLayer::Part& part : nl.parts)
      calls.push_back(call_for(part));
    scheduler->run_parts(calls, backward, &profiles[index]);
  };
  if (!backward) {
    run_parts();
    // The gather: disjoint columns, copied.
    float* y = static_cast<float*>(data_of(top).overwrite(home));
    for (NetLayer::Part& part : nl.parts) {
      const index_t width = part.end - part.begin;
      home.copy_strided(rows, width, part.output.data_read(home), width, y + part.begin, columns);
    }
    return;
  }
  const float* dy = static_cast<const float*>(diff_of(top).read(home));
  for (NetLayer::Part& part : nl.parts) {
    const index_t width = part.end - part.begin;
    home.copy_strided(rows, width, dy + part.begin, columns,
                      static_cast<float*>(part.output.diff().overwrite(home)), width);
  }
  run_parts();
  if (!input_gradient) return;
  // The input's gradient: the parts' shares added in device order.
  const index_t count = blobs[bottom].shape.count();
  float* dx = static_cast<float*>(diff_of(bottom).overwrite(home));
  for (std::size_t p = 0; p < nl.parts.size(); ++p) {
    const float* share = static_cast<const float*>(nl.parts[p].input_diff.data().read(home));
    if (p == 0)
      home.copy(dx, share, static_cast<std::size_t>(count) * sizeof(float));
    else
      home.axpy(count, 1.0f, share, dx);
  }
}

}  // namespace hn
