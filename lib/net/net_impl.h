// The Net's insides, shared by its files: net_build.cpp builds the graph from a Caffe
// NetParameter for one phase, net_memory.cpp plans the blobs' memory, net_weights.cpp
// reads and writes .caffemodel weights, net_layout.cpp chooses the activations' layouts,
// net_fusion.cpp the layers run as one, net.cpp runs it through the scheduler.
//
// Blobs are versions: an in-place layer produces a new version of its bottom's name that
// shares the bottom's memory, so the graph stays acyclic and `blob(name)` is the latest
// version. A blob consumed by several layers gets a Split, as in Caffe; the split's tops
// alias the bottom's values and own their gradients, which the split sums in backward.
// Memory: every blob version belongs to a data group and a gradient group (in-place chains
// and split aliases share groups); each group is live over an interval of the
// forward-then-backward schedule, and groups whose intervals do not overlap share memory.
#pragma once

#include "lib/net/net.h"

#include "lib/comm/comm.h"

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
#include "lib/layers/norm_fold.h"
#include "lib/layers/registry.h"
#include "lib/net/filler.h"
#include "lib/net/layer_factory.h"
#include "lib/proto/prototxt.h"
#include "lib/scheduler/scheduler.h"

namespace hn {

namespace pb = hybridnn::proto;

namespace detail {

enum class Kind { compute, feed, input, dummy, split };

struct BlobVersion {
  std::string name;
  Shape shape;
  int producer = -1;
  std::vector<int> consumers;
  int data_group = -1, diff_group = -1;
  bool needs_backward = false;
  bool under_loss = false;
  bool keep = false;             // net output or asked for: its memory is never reused
  Layout layout = Layout::nchw;  // of data and diff (net_layout.cpp)
  // The ReLU whose gradient a fused Eltwise + ReLU writes straight into the Eltwise's
  // inputs (net_fusion.cpp): this blob's gradient memory holds the unrectified gradient, so
  // reading it is an error.
  std::string gradient_fused_by;
  // The first of consecutive layers cut by outputs that pass this blob as each part's
  // columns (plan_column_chains): neither its values nor its gradient are ever gathered.
  std::string columns_of;
  // The Convolution that computes this blob into the Eltwise SUM it alone feeds
  // (net_fusion.cpp): the sum's output holds the values, this blob none.
  std::string summed_by;
};

// The registered layer types whose outputs can be cut (OutputCut; across ranks too), sorted:
// for errors.
std::vector<std::string> cuttable_layer_types(bool across_ranks = false);

struct NetLayer {
  pb::LayerParameter param;
  Kind kind = Kind::compute;
  std::unique_ptr<Layer> layer;     // compute layers
  std::unique_ptr<Layer> sum;       // split layers: a SplitLayer for backward by rows
  const LayerType* type = nullptr;  // compute layers: the registry's entry, with the traits
  std::unique_ptr<detail::DataFeed> feed;
  std::vector<int> bottoms, tops;   // blob versions
  std::vector<float> loss_weights;  // per top
  std::vector<Tensor*> params;      // resolved: own or shared
  std::vector<bool> owns_param;     // false when shared from another layer
  std::vector<pb::FillerParameter> dummy_fillers;
  // A DummyData layer whose fillers are all constant fills its tops once (Caffe's rule);
  // this says it has (the memory plan's zero-filled slots are current but not filled).
  bool dummy_filled = false;
  std::vector<bool> propagate_down;
  bool needs_backward = false;
  Split split;  // resolved: empty = the whole batch on the Net's driver
  // An automatic split: measured among auto_devices at the first forward (calibrated).
  bool automatic = false, calibrated = false;
  // An automatic split settled as the net was built (measure_output_cut): a cut by outputs
  // or one device; calibrate_splits reports it in its place.
  bool measured_at_build = false;
  bool tuned = false;  // Layer::tune has run on the layer's devices (NetOptions::tune)
  std::vector<Device> auto_devices;
  std::string where;  // "FILE: layer 'NAME' (TYPE)", for the scheduler's errors
  // Fusion (net_fusion.cpp): a layer whose work another runs has fused_into = that layer
  // and does nothing itself; a Scale that runs its BatchNorm has fused_norm = its index.
  int fused_into = -1, fused_norm = -1;
  // A Convolution that runs the Eltwise SUM reading its output has fused_residual = the
  // sum's index (its call takes the sum's other input second and writes the sum's output).
  int fused_residual = -1;
  // A Convolution with a BatchNorm (stored statistics) and a Scale folded into its weights
  // (net_fusion.cpp, lib/layers/norm_fold.h): their indices, and what its calls take as
  // parameters instead of its own: the weights and bias derived from its own, the Scale's
  // and the statistics (again whenever one of their versions changed), with the
  // convolution's gradients of them, turned into the sources' after each backward.
  int folded_norm = -1, folded_scale = -1;
  struct Folded {
    Tensor weights, bias;
    Tensor channels;  // norm_fold_channel_floats: kept from the forward for the backward
    float eps = 0.0f;
    std::vector<std::uint64_t> versions;  // the sources' when derived; empty: never
    StoredFactor factor;
  };
  std::unique_ptr<Folded> folded;
  // A layer cut by outputs (split_axis: OUTPUT, net_output_cut.cpp): one part per device
  // with outputs, each the layer computing its columns with its own parameters; `layer` is
  // the whole one, for shapes only. `output_cut` is the split as given.
  struct Part {
    Device device;
    index_t begin = 0, end = 0;  // outputs
    std::unique_ptr<Layer> layer;
    std::vector<Tensor*> params;  // resolved: its own, or shared from another net's part
    Tensor output;                // data and gradient of its columns, [rows x width]
    Tensor input_diff;            // its share of the input's gradient, summed in device order
    // Consecutive cut layers: the chain's element-wise layers on this part's columns; and,
    // in the layer reading the columns, its whole input assembled on its device, and a
    // block of columns of the input's gradient.
    std::vector<std::unique_ptr<Layer>> chain_layers;
    Tensor input, scratch;
  };
  std::vector<Part> parts;
  Split output_cut;
  // Consecutive layers cut by outputs (fc6 -> relu6 -> drop6 -> fc7, net_output_cut.cpp):
  // `chain` lists the in-place element-wise layers that run on this layer's parts, each on
  // its part's columns on its device (fused_into this layer), and `columns_to` the next cut
  // layer, which reads the parts' columns itself (its `columns_from`), so the columns are
  // never gathered into the blob on the Net's driver.
  std::vector<int> chain;
  int columns_to = -1, columns_from = -1;
  // Where the outputs of a layer cut by outputs lie in its top (OutputCut::output_axis, made
  // non-negative) and how many values go with each output (the axes after it): the top is
  // [rows][outputs * cut_inner] with rows = the product of the axes before cut_axis.
  int cut_axis = 0;
  index_t cut_inner = 1;
  // A layer cut across ranks (NetOptions::model_parallel, net_model_parallel.cpp): the parts
  // hold this rank's outputs [rank_begin, rank_end) and run on every rank's input rows,
  // gathered rank by rank into `gathered` (its diff: the parts' input gradients summed, to
  // be scattered back). `exchange` holds every rank's outputs forward (block by block) and
  // every rank's output gradient backward; `rank_output` this rank's outputs of every row
  // when several parts hold them.
  bool across_ranks = false;
  index_t rank_begin = 0, rank_end = 0;
  Tensor gathered, exchange, rank_output;
};

struct Group {
  std::size_t bytes = 0;
  int first = std::numeric_limits<int>::max(), last = -1;  // schedule steps
  bool pinned = false;  // never shared (outputs, gradients that must start at zero)
  int slot = -1;
};

// Which group's values a shared slot holds: groups that start (are first written) at a
// layer's forward or backward, so that a blob read after its memory was reused fails
// instead of returning the later blob's numbers (Net::check_blob_holds).
struct GroupStarts {
  std::vector<int> forward, backward;
};

}  // namespace detail

using detail::BlobVersion;
using detail::Group;
using detail::Kind;
using detail::NetLayer;

struct Net::Impl {
  Runtime* runtime = nullptr;
  Driver* driver = nullptr;
  Device device;       // the net's own device (its driver's, or made by provide_devices)
  std::string unmade;  // why provide_devices could not make some devices' drivers
  MathMode math = MathMode::fp32;     // NetOptions::math, else the prototxt's
  std::vector<Driver*> math_drivers;  // the Runtime's drivers when the net was built
  NetOptions options;
  std::string origin;  // the prototxt path or the caller's name for the text
  std::string name;
  std::vector<NetLayer> layers;
  std::vector<BlobVersion> blobs;
  std::map<std::string, int> latest;  // blob name -> latest version
  std::vector<Group> groups;
  std::vector<std::unique_ptr<SyncedMemory>> slots;
  std::vector<int> slot_holder;             // per slot: the group last written there; -1: none
  std::vector<detail::GroupStarts> starts;  // per layer
  std::vector<NetParam> learnable;
  index_t batch = 0;
  std::uint64_t iteration_seed = 0;
  std::uint64_t data_batch = 0;
  float last_loss = 0.0f;
  std::size_t bytes_with_reuse = 0, bytes_without_reuse = 0;

  void build(pb::NetParameter net);
  // Net::copy_trained_layers_from's work on weights already read.
  std::vector<std::string> copy_weights(const pb::NetParameter& model, const std::string& origin);
  // Gives every device the net names a driver (Runtime::provide), and the net its own.
  void provide_devices(const pb::NetParameter& net);
  // Sets the net's math mode on its drivers (before each layer: drivers may serve several
  // nets).
  void apply_math() const {
    for (Driver* d : math_drivers)
      d->set_math_mode(math);
  }
  void add_layer(const pb::LayerParameter& param);
  int add_top(int layer_index, const std::string& top, const Shape& shape, int in_place_bottom);
  void decide_backward();
  void set_up_params();
  void set_up_output_cuts();                      // net_output_cut.cpp
  void set_up_cut_params(int index);              // net_output_cut.cpp
  void run_output_cut(int index, bool backward);  // net_output_cut.cpp
  void plan_column_chains();                      // net_output_cut.cpp
  void run_chain(int index, bool backward);       // net_output_cut.cpp
  // Runs the parts of a cut layer on `input` (its gradient shares into each part's
  // input_diff).
  // A call of `layer` on `part`'s device, as layer `index` (its where, seed and phase);
  // operands left to the caller.
  detail::LayerCall part_call(const NetLayer::Part& part, Layer& layer, int index);
  // (`input` null: each part's own `input`.)
  void run_cut_parts(int index, bool backward, SyncedMemory* input, const Shape& input_shape);
  // Writes the sum of the parts' input_diff, in device order, to `dx`.
  void add_input_diffs(int index, float* dx);
  void run_rank_cut(int index, bool backward);  // net_model_parallel.cpp
  Communicator* comm = nullptr;  // options.communicator with more than one rank, else null
  int ranks = 1, rank = 0;
  std::size_t comm_bytes = 0;
  void plan_layouts();
  void plan_fusion();
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

  void mark_written(const std::vector<int>& started) {
    for (int g : started)
      slot_holder[static_cast<std::size_t>(groups[g].slot)] = g;
  }
  SyncedMemory& data_of(int blob) { return *slots[groups[blobs[blob].data_group].slot]; }
  SyncedMemory& diff_of(int blob) { return *slots[groups[blobs[blob].diff_group].slot]; }

  // The layer whose calls do layer `index`'s work: itself, or the one it is fused into.
  int computed_by(int index) const {
    const int host = layers[static_cast<std::size_t>(index)].fused_into;
    return host >= 0 ? host : index;
  }
  // The blob version layer `index`'s calls write: its top, or for a convolution with a norm
  // chain folded in the Scale's (the same memory).
  int output_of(int index) const {
    const NetLayer& nl = layers[static_cast<std::size_t>(index)];
    return nl.folded_scale >= 0 ? layers[static_cast<std::size_t>(nl.folded_scale)].tops[0]
                                : nl.tops[0];
  }
  // Layer `index`'s call forward or backward, for the scheduler.
  detail::LayerCall call_of(int index, bool backward);
  // A convolution with a norm chain folded in (NetLayer::folded, net_fusion.cpp): its
  // sources on the Net's driver; its derived weights and bias made current (call_of does it
  // for every call; always while recording, which must hold the work); before its backward
  // their gradients zeroed, and after it the sources' gradients added.
  NormFoldSources fold_sources(int index);
  void derive_folded(int index);
  void before_backward(int index);
  void after_backward(int index);
  bool recording = false;
  Tensor fold_scratch;  // norm_fold_backward's, for the widest folded convolution
  // Backward of split layer `index` as a call summing its tops' gradients on `rows`.
  detail::LayerCall split_sum_call(int index, const Split& rows);
  // Runs (NetOptions::barrier_per_layer): the layers from `first` on (down in backward)
  // that run cut alike with it, as one run; the next layer to run after them.
  int forward_from(int first);
  int backward_from(int last);
  // Recordings (Net::record_iteration): the data layers, their tops then on the driver; what
  // a replay wrote marked as the driver's.
  void run_data_layers_for_recording();
  void mark_replayed();
  // The run starting at `first`: the layer after it (before it in backward) and the calls
  // in it, in order (fewer than two: no run).
  int cut_alike_run(int first, bool backward, std::vector<int>& members,
                    std::vector<detail::LayerCall>& calls);
  void run_together(int first, int next, bool backward, const std::vector<int>& members,
                    std::vector<detail::LayerCall>& calls);
  // Runs compute layer `index` forward or backward, cut per its split.
  void run_compute(int index, bool backward);
  // Whether a split of layer `index` cuts its outputs rather than its batch while its
  // split_axis is unset (NetOptions::cuts_like, net_output_cut.cpp).
  bool cuts_by_default(int index) const;
  // An automatic split of such a layer: the layer timed whole on each of `devices` on
  // random values, then a cut of its outputs in proportion to their speeds, or the fastest
  // device alone.
  Split measure_output_cut(int index, const std::vector<Device>& devices);
  // The split every consumer of split layer `index`'s tops runs with, by rows, when they
  // all run with the same one (its backward then sums each device's rows there); else null.
  const Split* consumers_rows(int index);
  // The automatic layers fused into layer `index` (plan_fusion) take its split: they run
  // as its calls, on its rows.
  void follow_fused(int index);
  // Measures layer `index`'s automatic split on its current inputs.
  void calibrate_layer(int index);
  // Layer::tune on the layer's devices, once, when options.tune asks for it.
  void tune_layer(int index);
  // LayerProfile::algorithm of layer `index`.
  std::string algorithm_of(int index) const;
  const Split& upstream_split(int blob) const;
  std::function<void(const std::string&, const Split&)> on_calibrated;
  Net::SplitCheck split_check;

  std::unique_ptr<detail::Scheduler> scheduler;
  std::unique_ptr<Tuner> tuner;        // made at the first layer that tunes
  std::vector<LayerProfile> profiles;  // per layer
  void forward_layer(int index);
  void backward_layer(int index);
  void fill_dummy(NetLayer& layer);
};

}  // namespace hn
