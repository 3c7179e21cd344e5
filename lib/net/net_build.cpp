// Building the Net's graph: phase rules, legacy inputs, Split insertion, layers and their
// blobs (versions), which layers need backward, and parameters shared by name.
#include "lib/layers/shape.h"
#include "lib/net/net_impl.h"

#include <new>

#include "lib/onnx/onnx_import.h"

namespace hn {

namespace {

bool state_meets_rule(const NetState& state, const pb::NetStateRule& rule) {
  if (rule.has_phase()) {
    const Phase phase = rule.phase() == pb::TRAIN ? Phase::train : Phase::test;
    if (phase != state.phase) return false;
  }
  if (rule.has_min_level() && state.level < rule.min_level()) return false;
  if (rule.has_max_level() && state.level > rule.max_level()) return false;
  auto has = [&](const std::string& stage) {
    return std::find(state.stages.begin(), state.stages.end(), stage) != state.stages.end();
  };
  for (const std::string& stage : rule.stage())
    if (!has(stage)) return false;
  for (const std::string& stage : rule.not_stage())
    if (has(stage)) return false;
  return true;
}

bool layer_included(const NetState& state, const pb::LayerParameter& layer,
                    const std::string& origin) {
  HN_CHECK(layer.include_size() == 0 || layer.exclude_size() == 0,
           "{}: layer '{}' has both include and exclude rules; Caffe allows only one kind", origin,
           layer.name());
  if (layer.include_size() > 0) {
    for (const auto& rule : layer.include())
      if (state_meets_rule(state, rule)) return true;
    return false;
  }
  for (const auto& rule : layer.exclude())
    if (state_meets_rule(state, rule)) return false;
  return true;
}

// Caffe's net upgrade of legacy `input` fields into an Input layer.
void upgrade_legacy_inputs(pb::NetParameter& net, const std::string& origin) {
  if (net.input_size() == 0) return;
  pb::LayerParameter input;
  input.set_name("input");
  input.set_type("Input");
  // input_shape first, as Caffe's UpgradeNetInput reads it.
  const bool dims = net.input_shape_size() == 0 && net.input_dim_size() > 0;
  HN_CHECK(dims ? net.input_dim_size() == 4 * net.input_size()
                : net.input_shape_size() == net.input_size(),
           "{}: {} legacy net inputs need {} input_shape entries or 4 input_dim each", origin,
           net.input_size(), net.input_size());
  for (int i = 0; i < net.input_size(); ++i) {
    input.add_top(net.input(i));
    pb::BlobShape* shape = input.mutable_input_param()->add_shape();
    if (dims) {
      for (int d = 0; d < 4; ++d)
        shape->add_dim(net.input_dim(4 * i + d));
    } else {
      *shape = net.input_shape(i);
    }
  }
  pb::NetParameter upgraded = net;
  upgraded.clear_input();
  upgraded.clear_input_dim();
  upgraded.clear_input_shape();
  upgraded.clear_layer();
  *upgraded.add_layer() = input;
  for (const auto& layer : net.layer())
    *upgraded.add_layer() = layer;
  net = std::move(upgraded);
}

// Caffe's InsertSplits: every top consumed by more than one layer feeds a Split whose tops
// ("BLOB_LAYER_TOP_split_K") replace it in the consumers. A consumer that worked in place
// on the shared blob then writes a new blob of the old name instead (Caffe refuses this).
pb::NetParameter insert_splits(const pb::NetParameter& net) {
  using TopId = std::pair<int, int>;  // (layer, top index)
  std::map<std::string, TopId> last_top;
  std::map<TopId, int> consumers;
  for (int i = 0; i < net.layer_size(); ++i) {
    const pb::LayerParameter& layer = net.layer(i);
    for (const std::string& bottom : layer.bottom()) {
      auto it = last_top.find(bottom);
      if (it != last_top.end()) ++consumers[it->second];  // unknown bottoms fail later
    }
    for (int j = 0; j < layer.top_size(); ++j) {
      last_top[layer.top(j)] = TopId{i, j};
      // A loss weight counts as one more consumer: the split carries it (as in Caffe).
      if (j < layer.loss_weight_size() && layer.loss_weight(j) != 0.0f) ++consumers[TopId{i, j}];
    }
  }
  auto split_name = [&](const TopId& id, int k) {
    return fmt::format("{}_{}_{}_split_{}", net.layer(id.first).top(id.second),
                       net.layer(id.first).name(), id.second, k);
  };
  pb::NetParameter result = net;
  result.clear_layer();
  last_top.clear();
  std::map<TopId, int> next_split;
  for (int i = 0; i < net.layer_size(); ++i) {
    pb::LayerParameter* layer = result.add_layer();
    *layer = net.layer(i);
    for (int j = 0; j < layer->bottom_size(); ++j) {
      auto it = last_top.find(layer->bottom(j));
      if (it == last_top.end() || consumers[it->second] < 2) continue;
      layer->set_bottom(j, split_name(it->second, next_split[it->second]++));
    }
    for (int j = 0; j < layer->top_size(); ++j) {
      const TopId id{i, j};
      last_top[layer->top(j)] = id;
      const int count = consumers[id];
      if (count < 2) continue;
      pb::LayerParameter split;
      split.set_name(fmt::format("{}_{}_{}_split", layer->top(j), layer->name(), j));
      split.set_type(kSplitLayerType);
      split.add_bottom(layer->top(j));
      for (int k = 0; k < count; ++k)
        split.add_top(split_name(id, k));
      if (j < layer->loss_weight_size() && layer->loss_weight(j) != 0.0f) {
        for (int k = 0; k + 1 < count; ++k)
          split.add_loss_weight(0.0f);
        split.add_loss_weight(layer->loss_weight(j));
        layer->set_loss_weight(j, 0.0f);
      }
      *result.add_layer() = split;
    }
  }
  return result;
}

// A prototxt's `split { device: "cuda:0" fraction: 0.6 }` entries as a Split.
Split split_of(const google::protobuf::RepeatedPtrField<pb::SplitEntry>& entries) {
  std::vector<SplitShare> shares;
  for (const pb::SplitEntry& entry : entries)
    shares.push_back(SplitShare{Device::parse(entry.device()), entry.fraction()});
  return shares.empty() ? Split() : Split(std::move(shares));
}

}  // namespace

// ---- construction ----------------------------------------------------------------------

std::vector<Device> detail::devices_named(const Device& own, const Split& split,
                                          const LayerSplits& layer_splits,
                                          const pb::NetParameter& net) {
  std::vector<Device> devices{own};
  const auto add = [&devices](const Split& named) {
    for (const Device& each : named.devices())
      devices.push_back(each);
  };
  add(split);
  for (const auto& [layer, layer_split] : layer_splits)
    add(layer_split);
  for (const Device& each : detail::split_devices(net))
    devices.push_back(each);
  return devices;
}

void Net::Impl::provide_devices(const pb::NetParameter& net) {
  try {
    runtime->provide(detail::devices_named(driver != nullptr ? driver->device() : device,
                                           options.split, options.layer_splits, net));
  } catch (const Error& error) {
    // The layers whose split names such a device say so (Split::check_devices), with this.
    unmade = error.what();
  }
  if (driver == nullptr) {
    HN_CHECK(runtime->find(device) != nullptr, "{}: the net's device {}: {}", origin, device.name(),
             unmade);
    driver = &runtime->driver(device);
  }
  device = driver->device();
}

void Net::Impl::build(pb::NetParameter net) {
  provide_devices(net);
  scheduler = std::make_unique<detail::Scheduler>(runtime, *driver);
  if (options.communicator != nullptr && options.communicator->size() > 1) {
    comm = options.communicator;
    ranks = comm->size();
    rank = comm->rank();
  }
  name = net.name();
  upgrade_legacy_inputs(net, origin);
  detail::expand_onnx_layers(net, origin);
  // Weights written into the net (an ONNX model's, Caffe's inline blobs) are loaded once
  // the layers exist, as a caffemodel's are; those of layers this phase leaves out are not.
  pb::NetParameter written_weights;
  for (pb::LayerParameter& layer : *net.mutable_layer()) {
    if (layer.blobs_size() == 0) continue;
    pb::LayerParameter& with_weights = *written_weights.add_layer();
    with_weights.set_name(layer.name());
    with_weights.mutable_blobs()->Swap(layer.mutable_blobs());
  }
  HN_CHECK(net.layers_size() == 0,
           "{}: uses the legacy V1 'layers' format; upgrade it with Caffe's upgrade_net_proto_text "
           "(or rename 'layers' to 'layer' with string types)",
           origin);
  if (net.force_backward()) options.force_backward = true;
  if (options.math) {
    math = *options.math;
  } else {
    switch (net.math()) {
      case pb::NetParameter::TF32:
        math = MathMode::tf32;
        break;
      case pb::NetParameter::BF16:
        math = MathMode::bf16;
        break;
      default:
        math = MathMode::fp32;
    }
  }
  math_drivers = runtime->drivers();
  // The file's own state supplies level and stages the caller left unset (as in Caffe, the
  // phase is always the caller's).
  if (net.has_state()) {
    if (options.state.level == 0) options.state.level = net.state().level();
    if (options.state.stages.empty()) {
      options.state.stages.assign(net.state().stage().begin(), net.state().stage().end());
    }
  }
  pb::NetParameter filtered = net;
  filtered.clear_layer();
  for (const pb::LayerParameter& param : net.layer()) {
    if (layer_included(options.state, param, origin)) *filtered.add_layer() = param;
  }
  const pb::NetParameter with_splits = insert_splits(filtered);
  for (const pb::LayerParameter& param : with_splits.layer())
    add_layer(param);
  // Splits: the caller's per-layer ones, else the layer's own entries, else the caller's
  // net-wide one, else the file's.
  std::map<std::string, Split> named;
  for (const auto& [layer_name, layer_split] : options.layer_splits) {
    const bool known = std::any_of(
        net.layer().begin(), net.layer().end(),
        [&name = layer_name](const pb::LayerParameter& param) { return param.name() == name; });
    HN_CHECK(known, "{}: a split is given for layer '{}', which the net does not have", origin,
             layer_name);
    named[layer_name] = layer_split;
  }
  std::set<std::string> model_parallel;
  for (const std::string& layer_name : options.model_parallel) {
    const bool known = std::any_of(
        net.layer().begin(), net.layer().end(),
        [&name = layer_name](const pb::LayerParameter& param) { return param.name() == name; });
    HN_CHECK(known, "{}: model parallelism is asked for layer '{}', which the net does not have",
             origin, layer_name);
    model_parallel.insert(layer_name);
  }
  Split net_split = options.split;
  if (net_split.empty()) {
    try {
      net_split = split_of(net.split());
    } catch (const Error& error) {
      detail::fail("{}: the net's split: {}", origin, error.what());
    }
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (nl.kind != Kind::compute) continue;
    try {
      if (const auto found = named.find(nl.param.name()); found != named.end()) {
        nl.split = found->second;
      } else {
        nl.split = nl.param.split_size() > 0 ? split_of(nl.param.split()) : net_split;
      }
      try {
        nl.split.check_devices(*runtime);  // an automatic split's devices too
      } catch (const Error& error) {
        if (unmade.empty()) throw;
        detail::fail("{} ({})", error.what(), unmade);
      }
      const bool cut_across_ranks =
          nl.param.model_parallel() || model_parallel.count(nl.param.name()) > 0;
      // Checked with one rank too, so that a net that fails under mpirun fails alone.
      HN_CHECK(!cut_across_ranks || (nl.type->cut && nl.type->cut->across_ranks),
               "model_parallel cuts a layer's outputs across ranks; a {} layer cannot be cut so "
               "(types that can: {})",
               nl.param.type(), fmt::join(detail::cuttable_layer_types(true), ", "));
      if (ranks > 1 && cut_across_ranks) {
        // Cut across ranks: the rows of every rank, whole; the rank's outputs cut among its
        // devices by an OUTPUT split of the layer's own, and the net-wide batch split left
        // to the other layers.
        nl.across_ranks = true;
        const bool own = nl.param.split_size() > 0 || named.count(nl.param.name()) > 0;
        HN_CHECK(!own || nl.param.split_axis() == pb::LayerParameter::OUTPUT,
                 "a layer cut across ranks (model_parallel) runs every rank's rows whole; its "
                 "own split can cut its outputs (split_axis: OUTPUT), not its batch");
        HN_CHECK(!own || !nl.split.is_automatic(),
                 "split_axis: OUTPUT needs the fractions given, not measured (auto)");
        nl.output_cut = own ? nl.split : Split();
        nl.split = Split();
        continue;
      }
      // Unset split_axis: an InnerProduct's outputs are cut where that moves less memory.
      const bool by_default = !nl.split.empty() && cuts_by_default(static_cast<int>(l));
      if (by_default && options.cuts_like != nullptr) {
        nl.output_cut = options.cuts_like->output_cut(nl.param.name());
        nl.split = Split();
        continue;
      }
      if (nl.split.is_automatic()) {
        nl.auto_devices = nl.split.measured_devices();
        nl.split = Split();  // the fractions are measured at the first forward
        HN_CHECK(nl.param.split_axis() != pb::LayerParameter::OUTPUT,
                 "split_axis: OUTPUT needs the fractions given, not measured (auto)");
        if (!by_default) {
          nl.automatic = true;
          continue;
        }
        // Measured now: a cut's fractions size its parts' parameters.
        nl.split = measure_output_cut(static_cast<int>(l), nl.auto_devices);
        nl.measured_at_build = true;
        const auto& shares = nl.split.shares();
        const auto home = std::find_if(shares.begin(), shares.end(), [&](const SplitShare& s) {
          return s.device == driver->device();
        });
        if (home != shares.end() && home->fraction == 1.0) nl.split = Split();  // unsplit
      }
      const auto devices_with_rows =
          std::count_if(nl.split.shares().begin(), nl.split.shares().end(),
                        [](const SplitShare& share) { return share.fraction > 0.0; });
      if (nl.param.split_axis() == pb::LayerParameter::OUTPUT ||
          (by_default && devices_with_rows > 1)) {
        HN_CHECK(!nl.split.empty(), "split_axis: OUTPUT without a split to cut the outputs by");
        nl.output_cut = nl.split;  // the parts run whole batches (net_output_cut.cpp)
        nl.split = Split();
        continue;
      }
    } catch (const Error& error) {
      detail::fail("{}: split: {}", where(static_cast<int>(l)), error.what());
    }
    // The whole batch on the Net's own driver is the unsplit path.
    const auto& shares = nl.split.shares();
    if (shares.size() == 1 && shares[0].device == driver->device()) nl.split = Split();
  }
  HN_CHECK(!layers.empty(), "{}: no layer is included in phase {}", origin,
           options.state.phase == Phase::train ? "TRAIN" : "TEST");
  for (const auto& [blob_name, version] : latest) {
    static_cast<void>(blob_name);
    if (blobs[version].consumers.empty()) blobs[version].keep = true;
  }
  for (const std::string& kept : options.keep_blobs) {
    auto it = latest.find(kept);
    HN_CHECK(it != latest.end(), "{}: keep_blobs names '{}', which the net does not have", origin,
             kept);
    blobs[it->second].keep = true;
  }
  set_up_output_cuts();
  decide_backward();
  set_up_params();
  plan_layouts();
  plan_fusion();
  plan_column_chains();
  plan_memory();
  profiles.resize(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    layers[l].where = where(static_cast<int>(l));
    profiles[l].name = layers[l].param.name();
    profiles[l].type = layers[l].param.type();
  }
  pb::NetParameter included;
  for (pb::LayerParameter& layer : *written_weights.mutable_layer()) {
    for (const NetLayer& nl : layers) {
      if (nl.param.name() == layer.name()) {
        included.add_layer()->Swap(&layer);
        break;
      }
    }
  }
  if (included.layer_size() > 0) copy_weights(included, origin);
}

int Net::Impl::add_top(int layer_index, const std::string& top, const Shape& shape,
                       int in_place_bottom) {
  BlobVersion version;
  version.name = top;
  version.shape = shape;
  version.producer = layer_index;
  const int index = static_cast<int>(blobs.size());
  if (in_place_bottom >= 0) {
    version.data_group = blobs[in_place_bottom].data_group;
    version.diff_group = blobs[in_place_bottom].diff_group;
  } else {
    const std::size_t bytes = static_cast<std::size_t>(shape.count()) * sizeof(float);
    version.data_group = static_cast<int>(groups.size());
    groups.push_back(Group{bytes});
    version.diff_group = static_cast<int>(groups.size());
    groups.push_back(Group{bytes});
  }
  blobs.push_back(std::move(version));
  latest[top] = index;
  return index;
}

void Net::Impl::add_layer(const pb::LayerParameter& source) {
  const int index = static_cast<int>(layers.size());
  layers.emplace_back();
  NetLayer& nl = layers.back();
  nl.param = source;
  nl.param.set_phase(options.state.phase == Phase::train ? pb::TRAIN : pb::TEST);
  const pb::LayerParameter& param = nl.param;
  const std::string& type = param.type();
  HN_CHECK(!param.name().empty(), "{}: layer {} (type '{}') has no name", origin, index + 1, type);
  for (int i = 0; i < index; ++i) {
    HN_CHECK(layers[i].param.name() != param.name(), "{}: two layers are named '{}'", origin,
             param.name());
  }
  HN_CHECK(param.propagate_down_size() == 0 || param.propagate_down_size() == param.bottom_size(),
           "{}: propagate_down must be given 0 or {} times (once per bottom), got {}", where(index),
           param.bottom_size(), param.propagate_down_size());
  if (type == "Input" || type == "DummyData") {
    HN_CHECK(param.bottom_size() == 0 && param.top_size() > 0,
             "{}: a {} layer takes no bottom and at least one top, got {} and {}", where(index),
             type, param.bottom_size(), param.top_size());
  }

  // Bottoms: the latest version of each name.
  std::vector<Shape> bottom_shapes;
  for (const std::string& bottom : param.bottom()) {
    auto it = latest.find(bottom);
    if (it == latest.end()) {
      std::vector<std::string> known;
      for (const auto& entry : latest)
        known.push_back(entry.first);
      detail::fail("{}: bottom '{}' is not produced by any earlier layer (blobs so far: {})",
                   where(index), bottom,
                   known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", ")));
    }
    nl.bottoms.push_back(it->second);
    blobs[it->second].consumers.push_back(index);
    bottom_shapes.push_back(blobs[it->second].shape);
  }

  std::vector<Shape> top_shapes;
  if (type == kSplitLayerType) {
    nl.kind = Kind::split;
    HN_CHECK(param.bottom_size() == 1 && param.top_size() >= 1,
             "{}: a Split takes one bottom and at least one top", where(index));
    top_shapes.assign(param.top_size(), bottom_shapes[0]);
  } else if (type == "Data") {
    nl.kind = Kind::feed;
    HN_CHECK(param.bottom_size() == 0 && (param.top_size() == 1 || param.top_size() == 2),
             "{}: a Data layer takes no bottoms and has 1 or 2 tops", where(index));
    detail::FeedOptions feed;
    feed.phase = options.state.phase;
    feed.source = options.data_source;
    feed.mean_file = options.mean_file;
    feed.batch_size = options.batch_size;
    feed.shard = options.data_shard;
    feed.shards = options.data_shards;
    feed.seed = detail::mix_seeds(options.seed, static_cast<std::uint64_t>(index) + 0x1000);
    try {
      nl.feed = detail::open_data_feed(param, feed);
    } catch (const Error& error) {
      detail::fail("{}: {}", origin, error.what());
    }
    top_shapes = nl.feed->top_shapes();
  } else if (type == "Input") {
    nl.kind = Kind::input;
    const auto& shapes = param.input_param().shape();
    HN_CHECK(shapes.size() == 1 || shapes.size() == param.top_size(),
             "{}: {} tops need one input_param shape or one per top, got {}", where(index),
             param.top_size(), shapes.size());
    for (int i = 0; i < param.top_size(); ++i) {
      top_shapes.push_back(
          with_batch(detail::shape_of(shapes.size() == 1 ? shapes[0] : shapes[i])));
    }
  } else if (type == "DummyData") {
    nl.kind = Kind::dummy;
    const pb::DummyDataParameter& dummy = param.dummy_data_param();
    const int tops = param.top_size();
    // Caffe's DummyDataLayer: the legacy form when any of num/channels/height/width is
    // given, each of them once or once per top.
    const bool legacy = dummy.num_size() > 0 || dummy.channels_size() > 0 ||
                        dummy.height_size() > 0 || dummy.width_size() > 0;
    HN_CHECK(dummy.shape_size() == 0 || !legacy,
             "{}: give DummyData shapes either as shape or as num/channels/height/width",
             where(index));
    const auto legacy_field = [&](const char* field, int count) {
      HN_CHECK(count == 1 || count == tops, "{}: {} tops need 1 or {} values of {}, got {}",
               where(index), tops, tops, field, count);
    };
    if (legacy) {
      legacy_field("num", dummy.num_size());
      legacy_field("channels", dummy.channels_size());
      legacy_field("height", dummy.height_size());
      legacy_field("width", dummy.width_size());
    } else {
      HN_CHECK(dummy.shape_size() == 1 || dummy.shape_size() == tops,
               "{}: {} tops need 1 or {} shapes, got {}", where(index), tops, tops,
               dummy.shape_size());
    }
    HN_CHECK(dummy.data_filler_size() <= 1 || dummy.data_filler_size() == tops,
             "{}: {} tops need 0, 1 or {} data_fillers, got {}", where(index), tops, tops,
             dummy.data_filler_size());
    for (int i = 0; i < tops; ++i) {
      const auto at = [i](int count) { return count == 1 ? 0 : i; };
      Shape shape;
      if (!legacy) {
        shape = detail::shape_of(dummy.shape(at(dummy.shape_size())));
      } else {
        shape = Shape({dummy.num(at(dummy.num_size())), dummy.channels(at(dummy.channels_size())),
                       dummy.height(at(dummy.height_size())), dummy.width(at(dummy.width_size()))});
      }
      top_shapes.push_back(with_batch(shape));
      pb::FillerParameter filler;  // Caffe's default: constant 0
      if (dummy.data_filler_size() == 1) filler = dummy.data_filler(0);
      if (dummy.data_filler_size() > 1) filler = dummy.data_filler(i);
      nl.dummy_fillers.push_back(filler);
    }
  } else if (detail::is_data_layer_type(type)) {
    detail::fail(
        "{}: data layer type '{}' is not supported (it needs an image decoder or HDF5); convert "
        "the data to LMDB, IDX or CIFAR-10 binary and use a Data layer",
        where(index), type);
  } else {
    nl.kind = Kind::compute;
    nl.type = find_layer_type(type);
    HN_CHECK(nl.type != nullptr, "{}: layer '{}': unknown layer type '{}'; known types: {}", origin,
             param.name(), type, fmt::join(known_layer_types(), ", "));
    try {
      nl.layer = detail::make_layer(param);
    } catch (const Error& error) {
      detail::fail("{}: {}", origin, error.what());
    }
    // A loss layer with no top gets one (Caffe's AutoTopBlobs: an anonymous top holding the
    // loss, with loss weight 1), so that its loss counts; no later layer can name it.
    if (nl.layer->is_loss() && param.top_size() == 0)
      nl.param.add_top(fmt::format("{} (automatic)", param.name()));
    std::vector<bool> in_place;
    for (int i = 0; i < param.top_size(); ++i)
      in_place.push_back(i < param.bottom_size() && param.top(i) == param.bottom(i));
    nl.layer->set_in_place(std::move(in_place));
    try {
      top_shapes = nl.layer->setup(bottom_shapes);
    } catch (const Error& error) {
      detail::fail("{}: {}", origin, error.what());
    }
    HN_CHECK(static_cast<int>(top_shapes.size()) == param.top_size(),
             "{}: produces {} outputs but the prototxt names {} tops", where(index),
             top_shapes.size(), param.top_size());
  }

  // Tops: in place when the name equals the bottom at the same position.
  for (int i = 0; i < param.top_size(); ++i) {
    const std::string& top = param.top(i);
    int in_place = -1;
    for (int b = 0; b < param.bottom_size(); ++b) {
      if (param.bottom(b) == top) {
        HN_CHECK(b == i && nl.layer && nl.layer->allows_in_place(),
                 "{}: top '{}' is computed in place over bottom {}, which this layer does not "
                 "allow",
                 where(index), top, b);
        in_place = nl.bottoms[b];
      }
    }
    auto it = latest.find(top);
    if (in_place < 0 && it != latest.end()) {
      // Allowed only for a layer that was in place over a blob now reached through a Split.
      const bool was_in_place = i < param.bottom_size() &&
                                param.bottom(i).rfind(top + "_", 0) == 0 &&
                                layers[blobs[nl.bottoms[i]].producer].kind == Kind::split;
      HN_CHECK(was_in_place, "{}: top '{}' is already produced by layer '{}'", where(index), top,
               layers[blobs[it->second].producer].param.name());
    }
    const int version = add_top(index, top, top_shapes[i], in_place);
    if (nl.kind == Kind::split) blobs[version].data_group = blobs[nl.bottoms[0]].data_group;
    nl.tops.push_back(version);
  }

  // Loss weights: explicit, or 1 on a loss layer's first top.
  const bool loss_layer = nl.layer && nl.layer->is_loss();
  HN_CHECK(param.loss_weight_size() == 0 || param.loss_weight_size() == param.top_size(),
           "{}: {} loss_weight values for {} tops", where(index), param.loss_weight_size(),
           param.top_size());
  for (int i = 0; i < param.top_size(); ++i) {
    float weight = loss_layer && i == 0 ? 1.0f : 0.0f;
    if (param.loss_weight_size() > 0) weight = param.loss_weight(i);
    nl.loss_weights.push_back(weight);
  }
  if (batch == 0 && (nl.kind == Kind::feed || nl.kind == Kind::input || nl.kind == Kind::dummy) &&
      !top_shapes.empty() && top_shapes[0].axes() > 0) {
    batch = top_shapes[0][0];
  }
}

void Net::Impl::decide_backward() {
  // Forward: a layer needs backward when a bottom needs it or it has a learnable parameter
  // (lr_mult != 0); its tops then need it too.
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    bool needs = false;
    for (int b : nl.bottoms)
      needs = needs || blobs[b].needs_backward;
    if (nl.layer) {
      for (std::size_t p = 0; p < nl.layer->params().size(); ++p) {
        float lr_mult = 1.0f;
        if (static_cast<int>(p) < nl.param.param_size()) lr_mult = nl.param.param(p).lr_mult();
        if (nl.type != nullptr && nl.type->statistics) lr_mult = 0.0f;
        needs = needs || lr_mult != 0.0f;
      }
    }
    nl.needs_backward = needs;
    for (int t : nl.tops)
      blobs[t].needs_backward = needs;
  }
  // Backward: only layers whose outputs reach a loss do backward (Caffe's pruning).
  for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
    NetLayer& nl = layers[l];
    bool contributes = false;
    for (std::size_t t = 0; t < nl.tops.size(); ++t) {
      if (nl.loss_weights[t] != 0.0f || blobs[nl.tops[t]].under_loss) contributes = true;
    }
    if (!contributes) nl.needs_backward = false;
    if (contributes)
      for (int b : nl.bottoms)
        blobs[b].under_loss = true;
  }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (options.force_backward && (nl.kind == Kind::compute || nl.kind == Kind::split)) {
      nl.needs_backward = true;
    }
    nl.propagate_down.assign(nl.bottoms.size(), false);
    for (std::size_t b = 0; b < nl.bottoms.size(); ++b) {
      const BlobVersion& blob = blobs[nl.bottoms[b]];
      bool down = nl.needs_backward && (blob.needs_backward || options.force_backward);
      if (nl.layer && !nl.layer->can_propagate_down(static_cast<int>(b))) down = false;
      if (b < static_cast<std::size_t>(nl.param.propagate_down_size()) &&
          !nl.param.propagate_down(static_cast<int>(b))) {
        down = false;
      }
      nl.propagate_down[b] = down;
    }
  }
}

void Net::Impl::set_up_params() {
  struct Owner {
    int layer;
    int index;
    std::size_t learnable;   // its entry in `learnable`
    bool has_lr, has_decay;  // whether a spec set the multiplier yet (Caffe's rule)
  };
  std::map<std::string, Owner> shared;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (!nl.layer) continue;
    if (!nl.parts.empty()) {
      set_up_cut_params(static_cast<int>(l));
      continue;
    }
    std::vector<Tensor>& own = nl.layer->params();
    const bool statistics = nl.type != nullptr && nl.type->statistics;
    HN_CHECK(nl.param.param_size() <= static_cast<int>(own.size()),
             "{}: {} param specs for {} parameters", where(static_cast<int>(l)),
             nl.param.param_size(), own.size());
    for (std::size_t p = 0; p < own.size(); ++p) {
      pb::ParamSpec spec;
      if (static_cast<int>(p) < nl.param.param_size()) spec = nl.param.param(p);
      if (statistics) {
        // Caffe keeps BatchNorm's statistics out of the solver: old nets' three specs are
        // upgraded to 0 (UpgradeNetBatchNorm); otherwise a non-zero lr_mult is an error.
        HN_CHECK(static_cast<int>(p) >= nl.param.param_size() || nl.param.param_size() == 3 ||
                     spec.lr_mult() == 0.0f,
                 "{}: a {}'s statistics are not learnable parameters: param {} has lr_mult {} "
                 "(give 0, or no param)",
                 where(static_cast<int>(l)), nl.param.type(), p, spec.lr_mult());
        spec.set_lr_mult(0.0f);
        spec.set_decay_mult(0.0f);
      }
      Tensor* tensor = &own[p];
      bool owner = true;
      if (!spec.name().empty()) {
        auto it = shared.find(spec.name());
        if (it != shared.end()) {
          Tensor* source = layers[it->second.layer].params[it->second.index];
          const bool permissive = spec.share_mode() == pb::ParamSpec::PERMISSIVE;
          HN_CHECK(
              permissive ? source->count() == tensor->count() : source->shape() == tensor->shape(),
              "{}: shared parameter '{}' has shape {} here but {} in layer '{}'",
              where(static_cast<int>(l)), spec.name(), tensor->shape().to_string(),
              source->shape().to_string(), layers[it->second.layer].param.name());
          tensor = source;
          owner = false;
          // Multipliers: a spec that sets one must agree with the one set before, and sets
          // it when none was (Caffe's Net::AppendParam).
          Owner& first = it->second;
          NetParam& shared_param = learnable[first.learnable];
          if (spec.has_lr_mult()) {
            HN_CHECK(!first.has_lr || spec.lr_mult() == shared_param.lr_mult,
                     "{}: shared parameter '{}' has lr_mult {} here but {} in layer '{}'",
                     where(static_cast<int>(l)), spec.name(), spec.lr_mult(), shared_param.lr_mult,
                     layers[first.layer].param.name());
            shared_param.lr_mult = spec.lr_mult();
            first.has_lr = true;
          }
          if (spec.has_decay_mult()) {
            HN_CHECK(!first.has_decay || spec.decay_mult() == shared_param.decay_mult,
                     "{}: shared parameter '{}' has decay_mult {} here but {} in layer '{}'",
                     where(static_cast<int>(l)), spec.name(), spec.decay_mult(),
                     shared_param.decay_mult, layers[first.layer].param.name());
            shared_param.decay_mult = spec.decay_mult();
            first.has_decay = true;
          }
        } else {
          shared[spec.name()] = Owner{static_cast<int>(l), static_cast<int>(p), learnable.size(),
                                      spec.has_lr_mult(), spec.has_decay_mult()};
        }
      }
      nl.params.push_back(tensor);
      nl.owns_param.push_back(owner);
      if (!owner) continue;
      // Before the filler touches it: data and gradient.
      check_host_bytes(2 * sizeof(float) * static_cast<std::size_t>(tensor->count()), [&] {
        return fmt::format("{}: parameter {} ({}, data and gradient)", where(static_cast<int>(l)),
                           p, tensor->shape().to_string());
      });
      // Fillers, per Caffe's layers: weights then bias.
      const pb::FillerParameter* filler = nl.type != nullptr && nl.type->filler
                                              ? nl.type->filler(nl.param, static_cast<int>(p))
                                              : nullptr;
      // Allocated here (by the filler, or zeros): running out of memory names the parameter.
      const auto describe = [&] {
        return fmt::format("{}: parameter {} ({}, {})", where(static_cast<int>(l)), p,
                           tensor->shape().to_string(),
                           format_bytes(sizeof(float) * static_cast<std::size_t>(tensor->count())));
      };
      float* values = nullptr;
      try {
        values = tensor->host_data_mut();
      } catch (const std::bad_alloc&) {
        throw Error(fmt::format("{}: out of memory", describe()));
      } catch (const Error& error) {
        throw Error(fmt::format("{}: {}", describe(), error.what()));
      }
      if (filler != nullptr) {
        detail::fill(*filler, tensor->shape(), values,
                     detail::mix_seeds(options.seed, (static_cast<std::uint64_t>(l) << 8) | p),
                     fmt::format("{} parameter {}", where(static_cast<int>(l)), p));
      }
      NetParam np;
      np.name = spec.name().empty() ? fmt::format("{}.{}", nl.param.name(), p) : spec.name();
      np.layer = nl.param.name();
      np.index = static_cast<int>(p);
      np.tensor = tensor;
      np.lr_mult = spec.lr_mult();
      np.decay_mult = spec.decay_mult();
      learnable.push_back(np);
    }
  }
}

}  // namespace hn
