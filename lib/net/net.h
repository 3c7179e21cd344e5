// Net: a Caffe network (NetParameter prototxt) built for one phase as a DAG of layers, with
// its data layers, fillers, shared parameters, automatic splits of tops consumed by several
// layers, in-place layers and reuse of activation memory; forward, backward, and .caffemodel
// weights in and out. The public header hides protobuf: nets come from files or text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/runtime.h"
#include "lib/core/tensor.h"
#include "lib/core/tune.h"
#include "lib/layers/layer.h"
#include "lib/scheduler/split.h"

namespace hn {

class Communicator;
}  // namespace hn

namespace hybridnn::proto {
class NetParameter;
}  // namespace hybridnn::proto

namespace hn {

// Caffe's NetState: selects the layers whose include/exclude rules match.
struct NetState {
  Phase phase = Phase::train;
  int level = 0;
  std::vector<std::string> stages;
};

class Net;

struct NetOptions {
  NetState state;
  // Replaces the `source` of every Data layer of the net (empty: keep the prototxt's). A
  // path to an LMDB directory of Datum records, an IDX images file (the labels file beside
  // it is found by name), a CIFAR-10 binary file, or "synthetic:CxHxW[:classes]" for
  // generated images.
  std::string data_source;
  // Replaces transform_param.mean_file of every data layer ("none" drops it).
  std::string mean_file;
  // Replaces data_param.batch_size of every Data layer and the batch axis of Input shapes
  // (0: keep).
  int batch_size = 0;
  // Computes gradients for every blob, inputs included (Caffe's force_backward).
  bool force_backward = false;
  // Lets blobs whose values are no longer needed share memory (outputs of the net and
  // blobs named in keep_blobs are never reused).
  bool reuse_memory = true;
  std::vector<std::string> keep_blobs;
  // Data parallelism: the Data layers read shard `data_shard` of `data_shards` of their
  // stream, records data_shard, data_shard + data_shards, ... (the Solver sets it to the
  // rank and the number of ranks), so that the shards' batches together are the batch of
  // data_shards times the size that one net reading everything would get.
  int data_shard = 0;
  int data_shards = 1;
  // Seed of the net's random streams (dropout, random crops and mirrors, fillers).
  std::uint64_t seed = 1701;
  // How every layer's batch is cut among devices (empty: the prototxt's NetParameter
  // `split`, else the whole batch on the Net's driver). A layer's own `split` entries
  // override it. Each device needs a driver in the Runtime. Layers that need the whole
  // batch (losses) and data layers run on the Net's driver; BatchNorm's batch statistics are
  // cut in stages (Layer::batch_sums).
  //
  // Slices run at the same time, each on its driver's own long-lived thread (the Net's
  // driver runs on the calling thread). See docs/architecture.md, "Hybrid split".
  Split split;
  // Consecutive layers cut alike (the same split, tensors cut by the same rows) run as one
  // run in forward() and backward(): each device goes through its rows of all of them
  // without waiting for the other devices in between; only a change of split, a layer that
  // needs the whole batch or a stage of batch sums waits for every device. Same results,
  // bitwise. True: every layer waits, as forward_layer() always does.
  bool barrier_per_layer = false;
  // Splits of single layers by name (read_layer_splits() reads a saved file of them); they
  // override the prototxt's and `split`. Naming a layer the prototxt lacks (in every phase)
  // is an error.
  LayerSplits layer_splits;
  // A split of an InnerProduct layer (a type whose OutputCut is `by_default`) whose
  // split_axis is unset cuts its outputs, not its batch, where that moves less memory: each
  // device then holds its rows of the weights, and no device writes or merges a whole
  // weight gradient (rows x (2 inputs + outputs) < weights). With an automatic split, the
  // layer is timed whole on each device when the net is built (on random values) and cut
  // by outputs in proportion to their speeds, or kept on the fastest device alone where the
  // cut would save less than 15 %. split_axis: BATCH keeps the batch cut.
  // `cuts_like` (not owned; may be null): such layers are cut as the layer of the same name
  // in that net is, and not otherwise; the Solver's test nets, which share its training
  // net's weights, follow it.
  const Net* cuts_like = nullptr;
  // Measured choice of algorithm (tune.h): with a mode other than off, each layer that has
  // several (convolutions) measures them on its drivers at the first forward, or reads the
  // choice from the cache file, before it runs.
  TuneOptions tune;
  // Keeps activations in the driver's blocked layout (shapes.h; the CPU driver's is nChw16c
  // with AVX-512, nChw8c with AVX2) between consecutive layers that
  // compute on it (convolution, pooling, LRN, ReLU, concat, eltwise, the Net's splits), so
  // they are not reordered at every layer; only on a driver with
  // Capabilities::blocked_layout (the CPU driver), for 4-D blobs of channels in multiples
  // of the block, cut by no split or by one whose devices all have the same blocked layout
  // (CPU drivers). Inputs, outputs and keep_blobs stay NCHW;
  // BlobRef::layout says how any other blob lies. Off by default, so every blob reads as
  // NCHW; the hybridnn tool turns it on (--layout).
  bool blocked_layout = false;
  // Runs each in-place chain BatchNorm (on stored statistics: use_global_stats, or the test
  // phase) -> Scale (per channel) [-> ReLU] as one layer, one pass over the blob each way
  // instead of about eight (Driver::norm_affine_*), where the three are cut alike (unsplit,
  // the same split: each device on its rows, or all automatic); likewise each Eltwise SUM
  // -> ReLU in place on its output
  // (Driver::lincomb_relu forward, the ReLU's gradient written straight into the inputs'
  // backward). Results equal the unfused layers' up to float rounding; the fused
  // BatchNorm and ReLU report no time of their own (layer_algorithm names the fusion).
  bool fuse_layers = true;
  // How the net's GEMMs and convolutions may round inside a call (MathMode, shapes.h):
  // unset, the prototxt's NetParameter `math` (FP32 by default). The Net sets it on its
  // drivers before each layer; Net::math_notes says what a driver computes instead where it
  // lacks the hardware. FP32 is bitwise the computation of a net without the setting.
  std::optional<MathMode> math;
  // Model parallelism across ranks: InnerProduct layers, named here or marked
  // `model_parallel: true` in the prototxt, are cut by their outputs among the ranks of
  // `communicator` (not owned; null or one rank: no cut). Rank r holds outputs
  // [N*r/R, N*(r+1)/R) of the weights and bias; forward gathers every rank's input rows and
  // returns this rank's rows of every output, backward scatters the input's gradient back
  // (allgather, allgatherv and reduce_scatterv), so that the layer computes on the batch of
  // all ranks, as one process would. Every rank builds the same net and runs it in step:
  // forward and backward of such a layer are collectives. Its parameters' gradients are
  // those of the sum of every rank's loss (the Solver divides them by the ranks, as it
  // averages the others). Naming a layer the prototxt lacks is an error.
  Communicator* communicator = nullptr;
  std::vector<std::string> model_parallel;
};

// A named blob of a net: its shape and its data and gradient memory. A blob whose memory is
// reused holds its values only until a later layer overwrites them; in a net that runs no
// backward, gradients have no memory (diff is empty).
class Net;

struct BlobRef {
  const std::string* name = nullptr;
  const Shape* shape = nullptr;
  SyncedMemory* data = nullptr;
  SyncedMemory* diff = nullptr;
  Layout layout = Layout::nchw;  // of data and diff (NetOptions::blocked_layout)

  const Net* net = nullptr;  // checks that the memory still holds this blob's values

  index_t count() const { return shape->count(); }
  // These throw when the memory plan has since reused the memory for another blob.
  const float* host_data() const;
  float* host_data_mut() const;
  const float* host_diff() const;
  // The gradient to write (an output's, before backward: where the backward starts from).
  float* host_diff_mut() const;
};

// A learnable parameter of the net, listed once even when several layers share it.
struct NetParam {
  std::string name;   // the ParamSpec name, or "LAYER.INDEX" when unnamed
  std::string layer;  // the owning layer
  int index = 0;      // position among the owning layer's parameters
  Tensor* tensor = nullptr;
  float lr_mult = 1.0f;
  float decay_mult = 1.0f;
  // The driver whose memory holds it and updates it; null: the Net's.
  Driver* driver = nullptr;
  // A layer cut by outputs (split_axis: OUTPUT) has one NetParam per device for each of its
  // parameters, in device order: `tensor` holds outputs [begin, end) along `axis` of the
  // whole parameter, of shape `whole`. axis < 0: the parameter is whole.
  // With a layer cut across ranks (NetOptions::model_parallel), `ranks` > 1 and this
  // rank's shards cover its outputs only.
  struct Shard {
    int axis = -1;
    index_t begin = 0, end = 0;
    Shape whole;
    int ranks = 1;
  } shard;
};

// Caffe files (.caffemodel, .solverstate) hold every parameter whole: the shards of
// learnable_params() [first, last) form one, of shape `shape`.
struct WholeParam {
  std::size_t first = 0, last = 0;
  Shape shape;
};
std::vector<WholeParam> whole_params(const std::vector<NetParam>& params);
// Copies between a whole parameter's values and its shard's (params[i].shard).
void whole_to_shard(const NetParam& shard, const float* whole, float* values);
void shard_to_whole(const NetParam& shard, const float* values, float* whole);
// The outputs [begin, end) of `outputs` that rank `rank` of `ranks` holds in a layer cut
// across ranks.
std::pair<index_t, index_t> rank_outputs(index_t outputs, int rank, int ranks);

namespace detail {
// Every device a net on `own` names: its own, those of `split` and `layer_splits`, and those
// of the file's split entries (what Runtime::provide is given before the net is built).
std::vector<Device> devices_named(const Device& own, const Split& split,
                                  const LayerSplits& layer_splits,
                                  const hybridnn::proto::NetParameter& net);
}  // namespace detail

class Net {
 public:
  // Builds the net for options.state from a prototxt file, or from an ONNX model (a path
  // ending in ".onnx": its layers and weights; docs/onnx.md); runs on `driver`, which must
  // belong to `runtime` and outlive the Net. Errors name the file, line, layer and shapes.
  // The devices the net's splits name (the options' and the file's split entries) get
  // drivers from the registry where the runtime has none (Runtime::provide).
  Net(const std::string& prototxt_path, Runtime& runtime, Driver& driver,
      const NetOptions& options = {});
  // The same on `device`, whose driver the runtime makes with those of the splits when it
  // has none, all at once (so that CPU drivers side by side divide the cores).
  Net(const std::string& prototxt_path, Runtime& runtime, const Device& device,
      const NetOptions& options = {});
  // The same from prototxt text; `origin` names it in errors.
  static std::unique_ptr<Net> from_text(const std::string& prototxt_text, const std::string& origin,
                                        Runtime& runtime, Driver& driver,
                                        const NetOptions& options = {});
  // The same from a parsed NetParameter (the Solver's nets, read once).
  static std::unique_ptr<Net> from_param(const hybridnn::proto::NetParameter& param,
                                         const std::string& origin, Runtime& runtime,
                                         Driver& driver, const NetOptions& options = {});
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;
  ~Net();

  const std::string& name() const;
  Phase phase() const;
  Driver& driver() const;
  // NetOptions::math, else the prototxt's; and, one line per driver of the net that computes
  // something else in that mode, what and why (Driver::math_note).
  MathMode math_mode() const;
  std::vector<std::string> math_notes() const;
  index_t batch_size() const;  // axis 0 of the first data (or Input) layer's first top

  // Runs every layer forward (data layers fetch their next batch) and returns the sum of
  // the loss outputs weighted by their loss_weight.
  float forward();
  // Runs every layer that needs it backward, accumulating parameter gradients.
  void backward();
  float forward_backward() {
    const float loss = forward();
    backward();
    return loss;
  }
  // The same for one layer (for per-layer timing); layers run in index order. A layer
  // fused into another (NetOptions::fuse_layers) does nothing: the other does its work.
  void forward_layer(int index);
  void backward_layer(int index);
  // An iteration recorded on the Net's driver and replayed as one launch (a CUDA graph):
  // forward then backward of every layer but the data layers, which run before each replay
  // as in forward() (their copies from the host stay outside). nullptr, with the reason in
  // `why`, where the driver records nothing (a CPU), the net is split or cut across ranks,
  // or a layer's calls cannot be recorded (a wait for the device, a copy through the host);
  // the recorded layers have not run then, though the data layers have fetched their batch.
  // replay_iteration runs one such iteration (`fetch_data` false: on the batch the data
  // layers last fetched, as for the first replay after record_iteration); the values it
  // writes are the driver's (host reads copy them again); loss() is not updated: read_loss()
  // reads it back.
  // `before` and `after`, when given, make calls on the Net's driver recorded before the
  // forward and after the backward (the Solver's clearing of the gradients and its update).
  std::unique_ptr<Driver::Recording> record_iteration(std::string& why,
                                                      const std::function<void()>& before = {},
                                                      const std::function<void()>& after = {});
  void replay_iteration(Driver::Recording& recording, bool fetch_data = true);
  // Sums the weighted losses of the last forward.
  float loss() const;
  // Sums the weighted losses now in the loss outputs, as forward() does after its layers
  // (a wait for the driver), and returns them as loss() will.
  float read_loss();
  // The same sum into total[0] on the Net's driver, with no value read back (so that it can
  // be recorded); scratch: one float of the driver's memory.
  void sum_losses_on_driver(float* total, float* scratch);
  // Zeroes every learnable parameter's gradient.
  void clear_param_diffs();

  int num_layers() const;
  Layer& layer(int index) const;
  const std::string& layer_name(int index) const;
  const char* layer_type(int index) const;  // data layers included ("Data", "Input")
  // The algorithm layer `index` runs with (LayerProfile::algorithm); empty for layers with
  // one.
  std::string layer_algorithm(int index) const;
  // Layer::forward_flops of layer `index` for the net's batch (0 for data layers).
  double layer_forward_flops(int index) const;
  bool layer_needs_backward(int index) const;
  // The layer whose calls do layer `index`'s work, itself unless it was fused into another
  // (NetOptions::fuse_layers): its parameters' gradients are final after that layer's
  // backward_layer.
  int layer_computed_by(int index) const;

  std::vector<std::string> blob_names() const;
  bool has_blob(const std::string& name) const;
  BlobRef blob(const std::string& name) const;  // throws listing the blobs
  // Throws, naming keep_blobs, when the memory of blob `name`'s values (diff: gradient) now
  // holds another blob's, reused by the memory plan since the blob was written.
  void check_blob_holds(const std::string& name, bool diff) const;
  // Blobs no layer consumes (Caffe's net outputs) and the Input layers' tops.
  std::vector<std::string> output_blob_names() const;
  std::vector<std::string> input_blob_names() const;
  // Output blobs with their loss weights (0 for non-loss outputs), in output order.
  std::vector<std::pair<std::string, float>> outputs() const;

  // Learnable parameters in Caffe's order (layer order, then parameter index); shared
  // parameters appear once, at their owner.
  const std::vector<NetParam>& learnable_params() const;

  // Uses `other`'s parameters for every layer of the same name (Caffe's
  // ShareTrainedLayersWith: a test net sees the training net's weights without copies).
  void share_trained_layers_with(const Net& other);

  // Copies weights by layer name from a .caffemodel (binary NetParameter; V1 layers too);
  // layers absent from the file keep their values, and are returned (the net's layers
  // with weights of their own the file has none for); a blob count or shape mismatch is an
  // error naming the layer and both shapes, and so is a file none of whose layers is one
  // of this net's (the weights of another net).
  std::vector<std::string> copy_trained_layers_from(const std::string& caffemodel_path);
  // The same from weights already read (an ONNX model's); `origin` names them in errors.
  std::vector<std::string> copy_trained_layers_from(const hybridnn::proto::NetParameter& model,
                                                    const std::string& origin);
  // Writes the weights as a .caffemodel (through a temporary file and a rename). With
  // layers cut across ranks, a collective: every rank calls it, and rank 0 writes.
  void save(const std::string& caffemodel_path, bool write_diff = false) const;
  // Writes the net and its weights as an ONNX model (opset 13; docs/onnx.md lists which
  // layer becomes which operator): the inputs are the data layers' tops that exported
  // layers read, with a symbolic batch; losses and accuracies are left out; a layer with no
  // ONNX equivalent is an error naming it, and nothing is written. Across ranks, a
  // collective as save().
  void save_onnx(const std::string& onnx_path) const;
  // The whole parameter `whole` of learnable_params() from its shards' values
  // (values[i - whole.first], host memory, each the shape of its shard's tensor). For a
  // layer cut across ranks, a collective that gathers the other ranks' rows: every rank
  // calls it for the same parameters in the same order, and every rank gets the whole.
  std::vector<float> whole_values(const WholeParam& whole,
                                  const std::vector<const float*>& values) const;

  // Model parallelism across ranks: how many ranks the net's layers are cut among (1: none),
  // and whether layer `index` runs collectives in its forward and backward.
  int model_parallel_ranks() const;
  bool layer_communicates(int index) const;
  // Bytes this rank sent to the others in the collectives of its layers cut across ranks
  // since construction or the last reset, counted as the ring algorithms send them:
  // times its block for an allgather, (R-1)/R of the data for a reduce-scatter.
  std::size_t comm_bytes() const;
  void reset_comm_bytes();

  // The next forward's data layers produce batch number `batch` of their sources (each
  // source counts its own batches from 0; the net starts at 0). Deterministic: random
  // transforms depend on the record and the seed only.
  void seek_data(std::uint64_t batch);
  std::uint64_t data_position() const;  // the batch the next forward fetches
  // Sets the random stream of the next forward/backward (dropout masks). The Solver sets
  // it from the iteration, so resumed runs reproduce uninterrupted ones.
  void set_iteration_seed(std::uint64_t seed);

  // The split every layer runs with, in layer order, for the layers cut among devices
  // (measured fractions for automatic splits once measured; for a layer cut by outputs,
  // how its outputs are cut: output_cut).
  LayerSplits layer_splits() const;
  // The runs of layers cut alike that forward() (backward(), in its order) makes: each
  // run's layers by name; a layer that runs on its own is in none (NetOptions::
  // barrier_per_layer). Known once the automatic splits are measured and the layers tuned,
  // that is after the first forward.
  std::vector<std::vector<std::string>> layer_runs(bool backward) const;
  // How layer `name` is cut by its outputs among devices (split_axis: OUTPUT, or chosen:
  // NetOptions::cuts_like), or an empty Split where it is not.
  Split output_cut(const std::string& name) const;
  // Whether some layer's split is automatic and not yet measured.
  bool needs_split_calibration() const;
  // Measures automatic splits now (the first forward does it otherwise): on the current
  // inputs, each device runs each such layer alone on growing slices until a slice takes a
  // few milliseconds (or has the whole batch), then all devices run it side by side with
  // the resulting fractions, re-measured until the rows settle, so that the slices finish
  // together. Layers computed in place follow the layer before them. Parameter values and
  // gradients are left as they were and the data layers are rewound.
  // `on_layer` (may be empty) hears each layer's choice as it is made, in net order; an
  // InnerProduct's was made as the net was built (NetOptions::cuts_like): its cut by outputs
  // (output_cut) or its one device.
  // Then the whole net is timed (a forward and a backward, the second of two runs) with the
  // measured splits, with one split for every layer and with every automatic layer on the
  // one device that got most of the work, and the fastest is kept (split_check()): per-layer
  // timings do not show the copies between layers cut differently, nor a slow slice holding
  // up every layer after it.
  void calibrate_splits(
      const std::function<void(const std::string& layer, const Split& split)>& on_layer = {});
  // What calibrate_splits' whole-net check measured; `checked` is false before
  // calibrate_splits, and when every automatic layer came out on one device anyway. Three
  // candidates are timed: the per-layer splits as measured; `uniform`, one split for every
  // automatic layer (no rows move between layers: per-layer fractions near each other cost
  // a copy at every layer and gain nothing); and every automatic layer on the device with
  // most of their measured work (forward flops by fraction). The uniform split is searched
  // for: from each device's share of that work, the shares of the devices other than
  // `alone` are scaled by 0.5 and 1.5, then by a step between the fastest and its neighbour
  // (0.25, 0.75, 1.25 or 2); then the fastest is balanced, each device given rows in
  // proportion to its speed in that timing (its rows over its busy seconds in the automatic
  // layers: the devices measured in the same moments), and the result balanced again, each
  // new cut timed as the others. `uniform` is the fastest, or a balanced cut within 3 % of
  // it, or within 10 % of it moving no device's rows by more than one (the fastest may only
  // have met a faster moment of the machine); where a balanced cut is within 10 % of a
  // fastest that is not and neither holds, the two are timed once more, in turn, each
  // keeping its faster timing. The measured splits
  // are kept only where 3 % faster than `uniform`, and a split only where 3 % faster than
  // the device alone.
  struct SplitCheck {
    enum class Kept { measured, uniform, alone };
    // One split for every automatic layer, timed.
    struct Tried {
      Split split;
      double seconds = 0.0;
      bool balanced = false;  // from an earlier one's busy seconds per device
      // Each share's busy seconds in the automatic layers in that timing (its first; the
      // balanced cut goes by them).
      std::vector<double> busy_seconds;
    };
    bool checked = false;
    double measured_seconds = 0.0;  // forward + backward with the measured splits
    double uniform_seconds = 0.0;   // the same with `uniform` for every automatic layer
    double alone_seconds = 0.0;     // the same with every automatic layer on `alone`
    Split uniform;
    Device alone;
    Kept kept = Kept::measured;
    // Every split for every layer timed, in order: the first the shares of the work, then
    // the search's and the balanced ones (those cutting the batch as an earlier one does are
    // not timed again).
    std::vector<Tried> uniform_tried;
  };
  SplitCheck split_check() const;
  // Per-layer timing of the compute layers since construction or the last reset.
  std::vector<LayerProfile> profile() const;
  void reset_profile();

  // Bytes of activation memory (data and gradients) allocated, and the bytes it would take
  // without reuse.
  std::size_t activation_bytes() const;
  std::size_t activation_bytes_without_reuse() const;

 private:
  // Every layer with its parameters, and its weights as blobs (with their gradients when
  // `write_diff`): what save() writes; with `splits`, the Split layers the Net added too
  // (the other layers' bottoms name their tops). Across ranks, a collective.
  hybridnn::proto::NetParameter model_param(bool write_diff, bool splits = false) const;
  // calibrate_splits' whole-net check, the data rewound to `position` after.
  void check_splits_whole(std::uint64_t position);
  struct Impl;  // lib/net/net_impl.h
  Net(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The Caffe type strings a net accepts: layers and data layers.
std::vector<std::string> known_layer_types();

}  // namespace hn
