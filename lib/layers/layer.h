// The Layer contract: written once, device-independent. A layer checks and infers shapes
// in setup(), then computes forward and backward on a slice [begin, end) of the batch on
// whatever driver it is given, through Pointers; it never includes device code and never
// branches on the device. Parameters (weights, bias) and per-row state kept from forward
// to backward (pooling masks, dropout masks, LRN scales) are Tensors the layer owns; the
// caller (a Net, the scheduler, or a program using the layer as a kernel) resolves them on
// the driver and passes Pointers in a LayerSlice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/core/driver.h"
#include "lib/core/memory.h"
#include "lib/core/phase.h"
#include "lib/core/tensor.h"
#include "lib/core/tune.h"

namespace hn {

// One tensor operand of a layer call. `shape` is the whole tensor's shape (axis 0 is the
// batch for inputs, outputs and state); `data` and `diff` point at the slice's rows on the
// slice's driver (the whole tensor for parameters). `diff` may be null where no gradient
// is wanted. `layout` is how data and diff lie in memory (shapes.h): blocked only for
// inputs and outputs of layers whose blocked_layout() is not `none`, on drivers with
// Capabilities::blocked_layout.
struct Operand {
  Shape shape;
  Pointer data;
  Pointer diff;
  Layout layout = Layout::nchw;
  // A parameter's: its data's SyncedMemory::version() (0: unknown, and for the others).
  std::uint64_t version = 0;

  const float* x() const { return data.as<const float>(); }
  float* mutable_x() const { return data.as<float>(); }
  const float* dx() const { return diff.as<const float>(); }
  float* mutable_dx() const { return diff.as<float>(); }
};

// Everything one forward or backward call of a layer sees.
struct LayerSlice {
  Driver* driver = nullptr;
  index_t begin = 0, end = 0;  // rows of the batch computed by this call
  Phase phase = Phase::train;
  std::uint64_t seed = 0;        // random stream of this iteration (dropout)
  std::vector<Operand> inputs;   // bottoms
  std::vector<Operand> outputs;  // tops
  // Parameters: data = current values; diff = the gradient this call ADDS to (Caffe
  // accumulates parameter gradients; the caller clears them between iterations).
  std::vector<Operand> params;
  std::vector<Operand> state;        // the layer's state tensors, same rows as inputs
  std::vector<bool> propagate_down;  // backward: compute inputs[i].diff (overwritten)
  Pointer workspace;                 // scratch of at least workspace_bytes(rows()) bytes
  // A column block of a blob whose columns (its last axis) are cut among devices (a layer
  // cut by outputs, then element-wise layers on each device's block): when columns > 0,
  // the operands hold columns [column_begin, column_begin + width) of the `columns` of each
  // row, compact. Element-wise layers compute as on whole rows; Dropout draws the mask of
  // those elements of the whole blob.
  index_t column_begin = 0, columns = 0;
  // A stage of a pass that needs sums over the batch (Layer::batch_sums): -1, the whole pass
  // at once. row_sums: the stage's per-row vectors (one per quantity, rows() x width, only
  // before the last stage); batch_sums: the totals of the earlier stages.
  int stage = -1;
  std::vector<Pointer> row_sums;
  Pointer batch_sums;

  index_t rows() const { return end - begin; }
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;
  virtual ~Layer() = default;

  const std::string& name() const { return name_; }
  // The Caffe type string ("Convolution", "ReLU", ...).
  virtual const char* type() const = 0;

  // Checks the input shapes and returns the output shapes; shapes the parameters (keeping
  // their values when the shape is unchanged) and the state. Called again when the input
  // shapes change. Throws hn::Error naming the layer, its type and the shapes at fault.
  virtual std::vector<Shape> setup(const std::vector<Shape>& inputs) = 0;

  virtual void forward(const LayerSlice& slice) = 0;
  virtual void backward(const LayerSlice& slice) = 0;

  // Scratch a slice of `rows` images needs on `driver` (lowered columns, ...).
  virtual std::size_t workspace_bytes(const Driver& driver, index_t rows) const {
    static_cast<void>(driver);
    static_cast<void>(rows);
    return 0;
  }
  // Layers with several algorithms measure them on `driver` for slices of `rows` rows and
  // keep the fastest for that driver (tune.h); the others do nothing. Called before the
  // first forward on that driver (by a Net when its TuneOptions say so); parameter values
  // and gradients are left as they were.
  virtual void tune(Driver& driver, index_t rows, Tuner& tuner) {
    static_cast<void>(driver);
    static_cast<void>(rows);
    static_cast<void>(tuner);
  }
  // Floating-point operations of a forward over `rows` rows (2 per multiply-add), counted for
  // the layers whose work is GEMM-like (convolution, inner product); 0 for the others. Their
  // backward does twice as many (data and parameter gradients).
  virtual double forward_flops(index_t rows) const {
    static_cast<void>(rows);
    return 0.0;
  }
  // The algorithm the layer runs with on `driver`, for reports (empty: only one).
  virtual std::string algorithm(const Driver& driver) const {
    static_cast<void>(driver);
    return "";
  }
  // False for layers whose rows depend on the whole batch (batch statistics, losses
  // normalised over the batch): they always run with begin = 0, end = batch.
  virtual bool splits_by_rows() const { return true; }

  // ---- batch sums ------------------------------------------------------------------------
  // A layer whose rows depend on the rest of the batch only through sums over the batch's
  // rows (BatchNorm's batch statistics) is cut by rows anyway, in stages: stage s of a pass
  // runs on every slice (LayerSlice::stage). Each stage but the last writes, for each of the
  // slice's rows, `quantities` vectors of `width` floats (LayerSlice::row_sums[q]); the
  // caller then adds up each quantity over the whole batch with sum_rows, on one driver, and
  // the later stages read every earlier total in LayerSlice::batch_sums (stage s's quantity q
  // at (s * quantities + q) * width). So the totals do not depend on how the rows were cut.
  // After a forward's last stage, finish_batch_sums runs once, on one driver, with the
  // parameters to write and every total (BatchNorm's moving averages). A call with stage -1
  // runs the whole pass at once on its rows as the batch, with the same arithmetic.
  struct BatchSums {
    int stages = 0;  // 0: the pass needs no sums over the batch
    int quantities = 1;
    index_t width = 0;
  };
  virtual BatchSums batch_sums(Phase phase, bool backward) const {
    static_cast<void>(phase);
    static_cast<void>(backward);
    return {};
  }
  // `slice` has no rows and `stages` as its stage; its inputs' shapes, params to write,
  // batch_sums holding every stage's totals and a workspace of workspace_bytes(driver, 0).
  virtual void finish_batch_sums(const LayerSlice& slice) { static_cast<void>(slice); }
  // Whether the layer computes on blocked inputs and outputs (nChw16c or nChw8c: 4-D,
  // channels in whole blocks; Layout in shapes.h): `none`; `uniform`, all of them in one layout
  // (the layer passes it to its driver calls); `mixed`, each in its own (convolutions). A Net keeps
  // activations blocked between layers that take it (NetOptions::blocked_layout).
  enum class BlockedLayout { none, uniform, mixed };
  virtual BlockedLayout blocked_layout() const { return BlockedLayout::none; }
  // Called by a Net after it has chosen the layouts of the layer's inputs and outputs
  // (before the first forward), so the layer can choose its algorithm for them.
  virtual void use_layouts(const std::vector<Layout>& inputs, const std::vector<Layout>& outputs) {
    (void)inputs;
    (void)outputs;
  }
  // Whether output i may share memory with input i (ReLU, Dropout, ...).
  virtual bool allows_in_place() const { return false; }
  // Which outputs will share memory with the input at the same position, told before
  // setup(): the Net does so from the prototxt's names; a program running the layer as a
  // kernel on one tensor for both does so itself. A layer whose backward needs an input
  // that running in place overwrites keeps a copy of it (Scale), as Caffe does.
  void set_in_place(std::vector<bool> outputs) { in_place_ = std::move(outputs); }
  bool in_place(int output) const {
    return output >= 0 && output < static_cast<int>(in_place_.size()) && in_place_[output];
  }
  // Whether a gradient can flow to input i (false for labels).
  virtual bool can_propagate_down(int input) const {
    static_cast<void>(input);
    return true;
  }
  // Loss layers return true; their single output is a scalar whose diff holds the loss
  // weight when backward runs (Caffe's convention).
  virtual bool is_loss() const { return false; }
  // True when forward writes the parameters' data (BatchNorm's moving averages): the caller
  // then resolves them for writing, so copies on other devices become stale.
  virtual bool updates_params_in_forward() const { return false; }

  // ---- fusion (NetOptions::fuse_layers) -----------------------------------------------
  // The Net plans it by the types' FusionRole (lib/layers/registry.h), then asks the layers
  // through these calls; by default a layer takes part in none.
  //
  // A norm chain: a norm on stored statistics, then an affine layer, then optionally a
  // rectifier, all in place on one blob, run as the affine layer's calls.
  struct FusedNorm {
    std::string batch_norm, relu;  // the fused layers' names ("" for no rectifier)
    float eps = 1e-5f;
    float relu_slope = 0.0f;
  };
  // A rectifier in place on a sum's output, run as the sum's calls.
  struct FusedRelu {
    std::string relu;  // the fused layer's name
    float slope = 0.0f;
  };
  // A rectifier in place on a convolution's output, run as the convolution's calls.
  struct FusedActivation {
    std::string layer;  // the fused layer's name
    Activation activation;
  };
  // A sum of the convolution's output and another blob (a residual block's end), run as the
  // convolution's calls: the other blob is the call's second input, the sum's output its
  // output.
  struct FusedResidual {
    std::string sum;  // the fused layer's name
  };
  // FusionRole::norm: its eps when it normalises with stored statistics in `phase`.
  virtual std::optional<float> stored_norm_eps(Phase phase) const {
    static_cast<void>(phase);
    return std::nullopt;
  }
  // FusionRole::rectifier: its negative slope (a ReLU; the norm chains and sums take only
  // those).
  virtual std::optional<float> rectifier_slope() const { return std::nullopt; }
  // FusionRole::rectifier: what it computes, when the layer before it may compute it instead
  // (its gradient then read from its output: a ReLU of slope >= 0, a Clip in place).
  virtual std::optional<Activation> fusable_activation() const { return std::nullopt; }
  // FusionRole::affine: whether it can take a norm chain in now (after setup), and taking
  // one (std::nullopt gives it back).
  virtual bool can_fuse_norm() const { return false; }
  virtual void fuse_norm(std::optional<FusedNorm> fused);
  // FusionRole::sum: the same for the rectifier after it.
  virtual bool can_fuse_relu() const { return false; }
  virtual void fuse_relu(std::optional<FusedRelu> fused);
  // FusionRole::conv: the same for the rectifier in place after it.
  virtual bool can_fuse_activation() const { return false; }
  virtual void fuse_activation(std::optional<FusedActivation> fused);
  // FusionRole::conv: a norm chain after it folded into it (a BatchNorm on stored
  // statistics, then a per-channel Scale): its calls then take the weights and the bias
  // that the Net derives from its own, the Scale's and the statistics before each forward
  // (lib/layers/norm_fold.h), with a bias whether or not it has one of its own.
  struct FoldedNorm {
    std::string batch_norm, scale;  // the folded layers' names
  };
  virtual bool can_fold_norm() const { return false; }
  virtual void fold_norm(std::optional<FoldedNorm> folded);
  // FusionRole::sum: whether it adds exactly its inputs (no coefficients other than 1), so
  // that the convolution computing one of them may add the other (fuse_residual).
  virtual bool is_plain_sum() const { return false; }
  // FusionRole::conv: whether it can take such a sum in now (after setup), and taking one.
  virtual bool can_fuse_residual() const { return false; }
  virtual void fuse_residual(std::optional<FusedResidual> fused);

  std::vector<Tensor>& params() { return params_; }
  std::vector<Tensor>& state() { return state_; }

 protected:
  // Throws unless count lies in [min_count, max_count], naming the layer.
  void check_input_count(const std::vector<Shape>& inputs, int min_count, int max_count) const;
  // "layer 'conv1' (Convolution)": the prefix of this layer's error messages.
  std::string describe() const;

  std::vector<Tensor> params_;
  std::vector<Tensor> state_;
  std::vector<bool> in_place_;

 private:
  std::string name_;
};

// Runs a layer on whole tensors on one driver, without a Net or a split: resolves every
// tensor on the driver (copying only stale data), allocates the workspace, and calls the
// layer for rows [begin, end) (end < 0: the whole batch). What a Net does for each layer.
// total[w] = sum of row_sums[r * width + w] over r < rows: how the totals of a layer's batch
// sums are taken, by the scheduler and by the layer's own whole pass alike.
void sum_rows(Driver& driver, index_t rows, index_t width, const float* row_sums, float* total);

struct RunOptions {
  Phase phase = Phase::train;
  std::uint64_t seed = 0;
  index_t begin = 0, end = -1;
};
void run_forward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, const RunOptions& options = {});
// propagate_down: per input (empty: every input the layer can propagate to).
void run_backward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                  const std::vector<Tensor*>& outputs, std::vector<bool> propagate_down = {},
                  const RunOptions& options = {});

}  // namespace hn
