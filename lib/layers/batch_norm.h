// BatchNorm (Caffe): normalises each channel to zero mean and unit variance, with batch
// statistics in training and stored (moving-average) statistics otherwise. As in Caffe it
// has no scale or shift of its own (a Scale layer with bias_term follows it).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct BatchNormParams {
  // Unset: Caffe's default, the stored statistics in the test phase and batch statistics in
  // training (decided per call from LayerSlice::phase).
  std::optional<bool> use_global_stats;
  float moving_average_fraction = 0.999f;
  float eps = 1e-5f;
};

// Input N x C x ... (channels = axis 1; 1 for a 1-axis input). Parameters, as Caffe's blobs
// (never trained: Caffe fixes their lr_mult at 0):
//   0: mean sum (C), 1: variance sum (C), 2: moving-average factor (1).
// Training forward updates them: factor = factor * f + 1, mean = mean * f + batch mean,
// variance = variance * f + m / (m - 1) * batch variance (m = count / C; 1 when m == 1).
// With global statistics the mean and variance are the blobs times 1 / factor (0 when the
// factor is 0). y = (x - mean) / sqrt(variance + eps). In place allowed.
std::unique_ptr<Layer> make_batch_norm_layer(std::string name, BatchNormParams params = {});

}  // namespace hn
