// The batch norm layer classes (internal): their parameters and factory functions are the
// public API, lib/layers/batch_norm.h.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/batch_norm.h"

namespace hn {

// The weight of BatchNorm's stored statistics (its third blob, one value), read back from
// the driver once per version of the blob (Operand::version) instead of at every call: a
// GPU's steady-state forward then waits for nothing, which a recorded iteration (a CUDA
// graph) needs. An unknown version (0) is read every time. The slices of a split call it
// from several threads.
class StoredFactor {
 public:
  float read(Driver& driver, const Operand& weight);

 private:
  std::mutex mutex_;
  const void* at_ = nullptr;
  std::uint64_t version_ = 0;
  float value_ = 0.0f;
};

// Input N x C x ... (channels = axis 1; 1 for a 1-axis input). Parameters, as Caffe's blobs
// (never trained: Caffe fixes their lr_mult at 0):
//   0: mean sum (C), 1: variance sum (C), 2: moving-average factor (1).
// Training forward updates them: factor = factor * f + 1, mean = mean * f + batch mean,
// variance = variance * f + m / (m - 1) * batch variance (m = count / C; 1 when m == 1).
// The batch mean and variance are sums of per-row sums (batch_sums), the same however the
// rows are cut.
// With global statistics the mean and variance are the blobs times 1 / factor (0 when the
// factor is 0). y = (x - mean) / sqrt(variance + eps). In place allowed.
class BatchNormLayer final : public Layer {
 public:
  explicit BatchNormLayer(std::string name, BatchNormParams params = {});
  const char* type() const override { return "BatchNorm"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override;
  void forward(const LayerSlice& slice) override;
  void backward(const LayerSlice& slice) override;
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override;
  // Only explicit global statistics split by rows alone; batch statistics are batch sums:
  // forward in three stages (per-channel sums of x; of (x - mean)^2; the normalisation),
  // backward in two (sums of dy * y and of dy; the gradient).
  bool splits_by_rows() const override { return param_.use_global_stats.value_or(false); }
  BatchSums batch_sums(Phase phase, bool backward) const override;
  // The moving averages from the batch's mean and variance.
  void finish_batch_sums(const LayerSlice& slice) override;
  bool allows_in_place() const override { return true; }
  // Per-channel calls and element-wise ones: blocked too, input and output alike.
  BlockedLayout blocked_layout() const override { return BlockedLayout::uniform; }
  // Whether calls in `phase` normalise with the stored statistics (Caffe's
  // use_global_stats, by default the test phase): then the layer is a per-channel affine
  // map that a Net may fuse with a Scale after it (ScaleLayer::fuse_norm).
  std::optional<float> stored_norm_eps(Phase phase) const override {
    return global_stats(phase) ? std::optional<float>(param_.eps) : std::nullopt;
  }
  // Forward with batch statistics updates the statistics blobs.
  bool updates_params_in_forward() const override {
    return !param_.use_global_stats.value_or(false);
  }

 private:
  bool global_stats(Phase phase) const;
  AxisShape slice_shape(index_t rows) const;
  // The slice viewed as rows x channels planes, one plane per (row, channel): bias_backward
  // on it gives each row's per-channel sums.
  AxisShape row_planes(const LayerSlice& slice) const;
  void forward_stage(const LayerSlice& slice, int stage);
  void backward_stage(const LayerSlice& slice, int stage);
  // The whole pass: every stage on the slice's rows as the batch, totals in the workspace.
  void whole_pass(const LayerSlice& slice, bool backward);

  BatchNormParams param_;
  Shape input_shape_;
  index_t channels_ = 0;
  StoredFactor stored_factor_;
};

// From BatchNorm's three statistics blobs (sums of means and of variances, and their
// weight): neg_mean = -mean and inv_std = (variance + eps)^-1/2 per channel.
void batch_norm_stored_statistics(Driver& driver, index_t channels, float eps,
                                  const Operand& mean_sum, const Operand& variance_sum,
                                  const Operand& weight, StoredFactor& factor, float* neg_mean,
                                  float* inv_std);

}  // namespace hn
