// The Net: builds a Caffe NetParameter into a DAG of layers for one phase and runs it.
//
// Blobs are versions: an in-place layer produces a new version of its bottom's name that
// shares the bottom's memory, so the graph stays acyclic and `blob(name)` is the latest
// version. A blob consumed by several layers gets a Split, as in Caffe; the split's tops
// alias the bottom's values and own their gradients, which the split sums in backward.
// Memory: every blob version belongs to a data group and a gradient group (in-place chains
// and split aliases share groups); each group is live over an interval of the
// forward-then-backward schedule, and groups whose intervals do not overlap share memory.
#include "hybridnn/net.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "lib/core/check.h"
#include "lib/core/philox.h"
#include "lib/core/transfer.h"
#include "lib/core/worker.h"
#include "lib/data/data.h"
#include "lib/net/filler.h"
#include "lib/net/layer_factory.h"
#include "lib/proto/prototxt.h"
#include "lib/scheduler/scheduler.h"

namespace hn {

namespace pb = hybridnn::proto;

namespace {

enum class Kind { compute, feed, input, dummy, split };

struct BlobVersion {
  std::string name;
  Shape shape;
  int producer = -1;
  std::vector<int> consumers;
  int data_group = -1, diff_group = -1;
  bool needs_backward = false;
  bool under_loss = false;
  bool keep = false;  // net output or asked for: its memory is never reused
};

struct NetLayer {
  pb::LayerParameter param;
  Kind kind = Kind::compute;
  std::unique_ptr<Layer> layer;  // compute layers
  std::unique_ptr<detail::DataFeed> feed;
  std::vector<int> bottoms, tops;   // blob versions
  std::vector<float> loss_weights;  // per top
  std::vector<Tensor*> params;      // resolved: own or shared
  std::vector<bool> owns_param;     // false when shared from another layer
  std::vector<pb::FillerParameter> dummy_fillers;
  std::vector<bool> propagate_down;
  bool needs_backward = false;
  Split split;  // resolved: empty = the whole batch on the Net's driver
  // An automatic split: measured among auto_devices at the first forward (calibrated).
  bool automatic = false, calibrated = false;
  std::vector<Device> auto_devices;
};

struct Group {
  std::size_t bytes = 0;
  int first = std::numeric_limits<int>::max(), last = -1;  // schedule steps
  bool pinned = false;  // never shared (outputs, gradients that must start at zero)
  int slot = -1;
};

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
  const bool dims = net.input_dim_size() > 0;
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
      split.set_type("Split");
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

struct Net::Impl {
  Runtime* runtime = nullptr;
  Driver* driver = nullptr;
  NetOptions options;
  std::string origin;  // the prototxt path or the caller's name for the text
  std::string name;
  std::vector<NetLayer> layers;
  std::vector<BlobVersion> blobs;
  std::map<std::string, int> latest;  // blob name -> latest version
  std::vector<Group> groups;
  std::vector<std::unique_ptr<SyncedMemory>> slots;
  std::vector<NetParam> learnable;
  index_t batch = 0;
  std::uint64_t iteration_seed = 0;
  std::uint64_t data_batch = 0;
  float last_loss = 0.0f;
  std::size_t bytes_with_reuse = 0, bytes_without_reuse = 0;

  void build(pb::NetParameter net);
  void add_layer(const pb::LayerParameter& param);
  int add_top(int layer_index, const std::string& top, const Shape& shape, int in_place_bottom);
  void decide_backward();
  void set_up_params();
  void plan_memory();
  // `shape` with axis 0 replaced by options.batch_size when that is set.
  Shape with_batch(const Shape& shape) const {
    if (options.batch_size <= 0 || shape.axes() == 0) return shape;
    std::vector<index_t> dims = shape.dims();
    dims[0] = options.batch_size;
    return Shape(std::move(dims));
  }
  std::string where(int layer) const {
    return fmt::format("{}: layer '{}' ({})", origin, layers[layer].param.name(),
                       layers[layer].param.type());
  }

  SyncedMemory& data_of(int blob) { return *slots[groups[blobs[blob].data_group].slot]; }
  SyncedMemory& diff_of(int blob) { return *slots[groups[blobs[blob].diff_group].slot]; }

  // Layer `index`'s call forward or backward, for the scheduler.
  detail::LayerCall call_of(int index, bool backward);
  // Runs compute layer `index` forward or backward, cut per its split.
  void run_compute(int index, bool backward);
  // Measures layer `index`'s automatic split on its current inputs.
  void calibrate_layer(int index);
  const Split& upstream_split(int blob) const;
  std::function<void(const std::string&, const Split&)> on_calibrated;

  std::unique_ptr<detail::Scheduler> scheduler;
  std::vector<LayerProfile> profiles;  // per layer
  void forward_layer(int index);
  void backward_layer(int index);
  void fill_dummy(NetLayer& layer);
};

// ---- construction ----------------------------------------------------------------------

void Net::Impl::build(pb::NetParameter net) {
  scheduler = std::make_unique<detail::Scheduler>(runtime, *driver);
  name = net.name();
  upgrade_legacy_inputs(net, origin);
  HN_CHECK(net.layers_size() == 0,
           "{}: uses the legacy V1 'layers' format; upgrade it with Caffe's upgrade_net_proto_text "
           "(or rename 'layers' to 'layer' with string types)",
           origin);
  if (net.force_backward()) options.force_backward = true;
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
    const bool known =
        std::any_of(net.layer().begin(), net.layer().end(),
                    [&](const pb::LayerParameter& param) { return param.name() == layer_name; });
    HN_CHECK(known, "{}: a split is given for layer '{}', which the net does not have", origin,
             layer_name);
    named[layer_name] = layer_split;
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
      nl.split.check_devices(*runtime);  // an automatic split's devices too
      if (nl.split.is_automatic()) {
        nl.automatic = true;
        nl.auto_devices = nl.split.automatic_devices();
        if (nl.auto_devices.empty()) {
          for (const Driver* present : runtime->drivers())
            nl.auto_devices.push_back(present->device());
        }
        nl.split = Split();  // the fractions are measured at the first forward
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
  decide_backward();
  set_up_params();
  plan_memory();
  profiles.resize(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    profiles[l].name = layers[l].param.name();
    profiles[l].type = layers[l].param.type();
  }
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
  if (type == "Split") {
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
    const int legacy = dummy.num_size();
    HN_CHECK(dummy.shape_size() == 0 || legacy == 0,
             "{}: give DummyData shapes either as shape or as num/channels/height/width",
             where(index));
    const int shapes = dummy.shape_size() > 0 ? dummy.shape_size() : legacy;
    HN_CHECK(shapes == 1 || shapes == tops, "{}: {} tops need 1 or {} shapes, got {}", where(index),
             tops, tops, shapes);
    HN_CHECK(dummy.data_filler_size() <= 1 || dummy.data_filler_size() == tops,
             "{}: {} tops need 0, 1 or {} data_fillers, got {}", where(index), tops, tops,
             dummy.data_filler_size());
    for (int i = 0; i < tops; ++i) {
      const int s = shapes == 1 ? 0 : i;
      Shape shape;
      if (dummy.shape_size() > 0) {
        shape = detail::shape_of(dummy.shape(s));
      } else {
        HN_CHECK(dummy.channels_size() == legacy && dummy.height_size() == legacy &&
                     dummy.width_size() == legacy,
                 "{}: num, channels, height and width need the same count", where(index));
        shape = Shape({dummy.num(s), dummy.channels(s), dummy.height(s), dummy.width(s)});
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
    const std::vector<std::string> known = known_layer_types();
    HN_CHECK(std::find(known.begin(), known.end(), type) != known.end(),
             "{}: layer '{}': unknown layer type '{}'; known types: {}", origin, param.name(), type,
             fmt::join(known, ", "));
    try {
      nl.layer = detail::make_layer(param);
    } catch (const Error& error) {
      detail::fail("{}: {}", origin, error.what());
    }
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
        if (std::string(nl.layer->type()) == "BatchNorm") lr_mult = 0.0f;
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
  };
  std::map<std::string, Owner> shared;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    NetLayer& nl = layers[l];
    if (!nl.layer) continue;
    std::vector<Tensor>& own = nl.layer->params();
    const bool batch_norm = std::string(nl.layer->type()) == "BatchNorm";
    HN_CHECK(nl.param.param_size() <= static_cast<int>(own.size()),
             "{}: {} param specs for {} parameters", where(static_cast<int>(l)),
             nl.param.param_size(), own.size());
    for (std::size_t p = 0; p < own.size(); ++p) {
      pb::ParamSpec spec;
      if (static_cast<int>(p) < nl.param.param_size()) spec = nl.param.param(p);
      if (batch_norm) {  // Caffe keeps BatchNorm's statistics out of the solver.
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
        } else {
          shared[spec.name()] = Owner{static_cast<int>(l), static_cast<int>(p)};
        }
      }
      nl.params.push_back(tensor);
      nl.owns_param.push_back(owner);
      if (!owner) continue;
      // Fillers, per Caffe's layers: weights then bias.
      const std::string& type = nl.param.type();
      const pb::FillerParameter* filler = nullptr;
      if (type == "Convolution") {
        filler = p == 0 ? &nl.param.convolution_param().weight_filler()
                        : &nl.param.convolution_param().bias_filler();
      } else if (type == "InnerProduct") {
        filler = p == 0 ? &nl.param.inner_product_param().weight_filler()
                        : &nl.param.inner_product_param().bias_filler();
      }
      if (filler != nullptr) {
        detail::fill(*filler, tensor->shape(), tensor->host_data_mut(),
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
  for (std::size_t b = 0; b < blobs.size(); ++b) {
    const BlobVersion& blob = blobs[b];
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
  // Groups never touched (no backward) need no memory; the rest are placed first-fit.
  std::vector<int> order;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    bytes_without_reuse += groups[g].last >= 0 ? groups[g].bytes : 0;
    if (groups[g].last >= 0) order.push_back(static_cast<int>(g));
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return groups[a].first != groups[b].first ? groups[a].first < groups[b].first : a < b;
  });
  struct Slot {
    std::size_t bytes = 0;
    int free_after = -1;
    bool pinned = false;
  };
  std::vector<Slot> plan;
  for (int g : order) {
    Group& group = groups[g];
    int chosen = -1;
    if (!group.pinned) {
      for (std::size_t s = 0; s < plan.size(); ++s) {
        if (plan[s].pinned || plan[s].free_after >= group.first) continue;
        // Prefer the slot that needs the least growth.
        if (chosen < 0 || (plan[s].bytes >= group.bytes) > (plan[chosen].bytes >= group.bytes) ||
            ((plan[s].bytes >= group.bytes) == (plan[chosen].bytes >= group.bytes) &&
             plan[s].bytes < plan[chosen].bytes)) {
          chosen = static_cast<int>(s);
        }
      }
    }
    if (chosen < 0) {
      chosen = static_cast<int>(plan.size());
      plan.push_back(Slot{});
      plan.back().pinned = group.pinned;
    }
    plan[chosen].bytes = std::max(plan[chosen].bytes, group.bytes);
    plan[chosen].free_after = group.pinned ? std::numeric_limits<int>::max() : group.last;
    group.slot = chosen;
  }
  // Groups nothing touches (gradients in a net without backward) share an empty memory.
  const int unused = static_cast<int>(plan.size());
  plan.push_back(Slot{0, std::numeric_limits<int>::max(), true});
  for (Group& group : groups) {
    if (group.slot < 0) group.slot = unused;
  }
  for (const Slot& slot : plan) {
    slots.push_back(std::make_unique<SyncedMemory>(slot.bytes));
    bytes_with_reuse += slot.bytes;
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
  NetLayer& nl = layers[index];
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
      if (!constant || !data_of(nl.tops[0]).current_on(driver->memory_space())) fill_dummy(nl);
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
  call.where = where(index);
  for (std::size_t i = 0; i < nl.bottoms.size(); ++i) {
    const int b = nl.bottoms[i];
    const bool gradient = backward && nl.propagate_down[i];
    call.inputs.push_back(
        detail::CallTensor{blobs[b].shape, &data_of(b), gradient ? &diff_of(b) : nullptr});
  }
  for (int t : nl.tops)
    call.outputs.push_back(
        detail::CallTensor{blobs[t].shape, &data_of(t), backward ? &diff_of(t) : nullptr});
  for (Tensor* param : nl.params)
    call.params.push_back(detail::CallTensor{param->shape(), &param->data(), &param->diff()});
  if (backward) call.propagate_down = nl.propagate_down;
  call.phase = options.state.phase;
  call.seed = detail::mix_seeds(iteration_seed, static_cast<std::uint64_t>(index));
  call.split = nl.split;
  return call;
}

void Net::Impl::run_compute(int index, bool backward) {
  NetLayer& nl = layers[index];
  if (nl.automatic && !nl.calibrated && !backward) calibrate_layer(index);
  scheduler->run(call_of(index, backward), backward, &profiles[index]);
}

const Split& Net::Impl::upstream_split(int blob) const {
  static const Split none;
  int producer = blobs[blob].producer;
  while (producer >= 0 && layers[producer].kind == Kind::split)
    producer = blobs[layers[producer].bottoms[0]].producer;
  if (producer < 0 || layers[producer].kind != Kind::compute) return none;
  return layers[producer].split;
}

void Net::Impl::calibrate_layer(int index) {
  NetLayer& nl = layers[index];
  nl.calibrated = true;
  // Calibration runs backward too, so the call carries the gradients it would.
  detail::LayerCall call = call_of(index, nl.needs_backward);
  if (!call.splittable()) {
    nl.split = Split();  // needs the whole batch: the Net's driver
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
  if (on_calibrated) on_calibrated(nl.param.name(), nl.split);
}

void Net::Impl::backward_layer(int index) {
  NetLayer& nl = layers[index];
  if (!nl.needs_backward) return;
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
    float* dx = static_cast<float*>(diff_of(bottom).overwrite(*driver));
    bool first = true;
    for (int t : nl.tops) {
      const float* dy = static_cast<const float*>(diff_of(t).read(*driver));
      if (first) {
        driver->copy(dx, dy, static_cast<std::size_t>(count) * sizeof(float));
      } else {
        driver->axpy(count, 1.0f, dy, dx);
      }
      first = false;
    }
    return;
  }
  if (nl.kind != Kind::compute) return;
  run_compute(index, true);
}

// ---- Net -------------------------------------------------------------------------------

Net::Net(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Net::Net(const std::string& prototxt_path, Runtime& runtime, Driver& driver,
         const NetOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->runtime = &runtime;
  impl_->driver = &driver;
  impl_->options = options;
  impl_->origin = prototxt_path;
  impl_->build(detail::read_net_prototxt(prototxt_path));
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
index_t Net::batch_size() const {
  return impl_->batch;
}

float Net::forward() {
  for (int l = 0; l < num_layers(); ++l)
    impl_->forward_layer(l);
  impl_->data_batch++;
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

void Net::backward() {
  for (int l = num_layers() - 1; l >= 0; --l)
    impl_->backward_layer(l);
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
    impl_->driver->fill(param.tensor->count(), 0.0f,
                        static_cast<float*>(param.tensor->diff().overwrite(*impl_->driver)));
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
bool Net::layer_needs_backward(int index) const {
  return impl_->layers.at(index).needs_backward;
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
  return BlobRef{&blob.name, &blob.shape, &impl_->data_of(it->second), &impl_->diff_of(it->second)};
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

void Net::share_trained_layers_with(const Net& other) {
  for (NetLayer& nl : impl_->layers) {
    if (!nl.layer) continue;
    for (const NetLayer& source : other.impl_->layers) {
      if (source.param.name() != nl.param.name() || !source.layer) continue;
      HN_CHECK(source.params.size() == nl.params.size(),
               "sharing weights of layer '{}': {} parameters here, {} in net '{}'", nl.param.name(),
               nl.params.size(), source.params.size(), other.name());
      for (std::size_t p = 0; p < nl.params.size(); ++p) {
        HN_CHECK(source.params[p]->shape() == nl.params[p]->shape(),
                 "sharing weights of layer '{}': parameter {} is {} here but {} in net '{}'",
                 nl.param.name(), p, nl.params[p]->shape().to_string(),
                 source.params[p]->shape().to_string(), other.name());
        Tensor* old = nl.params[p];
        nl.params[p] = source.params[p];
        for (NetParam& np : impl_->learnable)
          if (np.tensor == old) np.tensor = source.params[p];
      }
    }
  }
}

void Net::copy_trained_layers_from(const std::string& caffemodel_path) {
  pb::NetParameter model;
  detail::read_binary_proto(caffemodel_path, model);
  auto copy_layer = [&](const std::string& layer_name,
                        const google::protobuf::RepeatedPtrField<pb::BlobProto>& blobs) {
    for (NetLayer& nl : impl_->layers) {
      if (nl.param.name() != layer_name || !nl.layer) continue;
      if (blobs.empty()) continue;
      HN_CHECK(blobs.size() == static_cast<int>(nl.params.size()),
               "{}: layer '{}' has {} parameter blobs in the file but {} in the net",
               caffemodel_path, layer_name, blobs.size(), nl.params.size());
      for (int p = 0; p < blobs.size(); ++p) {
        const pb::BlobProto& blob = blobs[p];
        Tensor& tensor = *nl.params[p];
        HN_CHECK(detail::blob_shape_matches(blob, tensor.shape()),
                 "{}: layer '{}' parameter {} is {} in the file but {} in the net", caffemodel_path,
                 layer_name, p, detail::blob_shape(blob).to_string(), tensor.shape().to_string());
        const index_t count = tensor.count();
        float* data = tensor.host_data_mut();
        if (blob.double_data_size() > 0) {
          HN_CHECK(blob.double_data_size() == count,
                   "{}: layer '{}' parameter {} holds {} values, its shape needs {}",
                   caffemodel_path, layer_name, p, blob.double_data_size(), count);
          for (index_t i = 0; i < count; ++i)
            data[i] = static_cast<float>(blob.double_data(static_cast<int>(i)));
        } else {
          HN_CHECK(blob.data_size() == count,
                   "{}: layer '{}' parameter {} holds {} values, its shape needs {}",
                   caffemodel_path, layer_name, p, blob.data_size(), count);
          std::copy(blob.data().begin(), blob.data().end(), data);
        }
      }
    }
  };
  for (const pb::LayerParameter& layer : model.layer())
    copy_layer(layer.name(), layer.blobs());
  for (const pb::V1LayerParameter& layer : model.layers())
    copy_layer(layer.name(), layer.blobs());
}

void Net::save(const std::string& caffemodel_path, bool write_diff) const {
  pb::NetParameter model;
  model.set_name(impl_->name);
  for (const NetLayer& nl : impl_->layers) {
    if (nl.kind == Kind::split) continue;
    pb::LayerParameter* layer = model.add_layer();
    *layer = nl.param;
    layer->clear_blobs();
    for (Tensor* param : nl.params) {
      pb::BlobProto* blob = layer->add_blobs();
      for (index_t d : param->shape().dims())
        blob->mutable_shape()->add_dim(d);
      const float* data = param->host_data();
      blob->mutable_data()->Add(data, data + param->count());
      if (write_diff) {
        const float* diff = param->host_diff();
        blob->mutable_diff()->Add(diff, diff + param->count());
      }
    }
  }
  detail::write_binary_proto(caffemodel_path, model);
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
    if (nl.kind == Kind::compute && !nl.split.empty())
      splits.emplace_back(nl.param.name(), nl.split);
  }
  return splits;
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
    for (int l = 0; l < num_layers(); ++l)
      impl_->forward_layer(l);
  } catch (...) {
    impl_->on_calibrated = nullptr;
    seek_data(position);
    throw;
  }
  impl_->on_calibrated = nullptr;
  seek_data(position);
}

std::vector<LayerProfile> Net::profile() const {
  std::vector<LayerProfile> result;
  for (std::size_t l = 0; l < impl_->layers.size(); ++l) {
    if (impl_->layers[l].kind == Kind::compute) result.push_back(impl_->profiles[l]);
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
