// Loss layers with Caffe's semantics and parameter names: SoftmaxWithLoss, EuclideanLoss and
// SigmoidCrossEntropyLoss. Each outputs a scalar loss; in backward the output's diff holds
// the loss weight (Caffe's top[0]->cpu_diff()[0]). They depend on the whole batch, so they
// never split by rows.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

// Caffe's LossParameter.NormalizationMode: what the summed loss is divided by.
enum class LossNormalization {
  full,        // every position: outer * inner
  valid,       // the positions whose label is not ignore_label
  batch_size,  // outer (the batch for SigmoidCrossEntropyLoss)
  none,        // 1
};

// Caffe's LossParameter. Unset optionals are Caffe's has_*() == false.
struct LossParams {
  std::optional<int> ignore_label;
  std::optional<LossNormalization> normalization;
  std::optional<bool> normalize;  // deprecated: true = VALID, false = BATCH_SIZE

  // The mode in effect: `normalization` when set, else the legacy `normalize`, else the
  // layer's default (VALID for SoftmaxWithLoss, BATCH_SIZE for SigmoidCrossEntropyLoss).
  LossNormalization effective_normalization(LossNormalization layer_default) const;
};

// Caffe's get_normalizer: FULL outer * inner, VALID valid_count, BATCH_SIZE outer, NONE 1;
// never below 1 (so a batch with every label ignored gives loss 0, not NaN).
float loss_normalizer(LossNormalization mode, index_t outer, index_t inner, index_t valid_count);

struct SoftmaxWithLossParams {
  int axis = 1;  // softmax_param.axis: the class axis; negative counts from the end
  LossParams loss_param;
};

// Inputs: scores (outer x C x inner around `axis`) and labels (outer * inner integer
// values in [0, C), or ignore_label). Output 0: the scalar loss
//   -sum_{p not ignored} log(max(softmax(x)[p][label_p], FLT_MIN)) / normalizer.
// num_outputs (Caffe: the number of tops) 2 adds output 1, the probabilities (shaped like
// input 0); as in Caffe, backward ignores any gradient reaching them.
std::unique_ptr<Layer> make_softmax_with_loss_layer(std::string name,
                                                    SoftmaxWithLossParams params = {},
                                                    int num_outputs = 1);

// Caffe's EuclideanLoss: loss = sum((a - b)^2) / (2 * N), N = axis 0 of the inputs. Both
// inputs receive gradients (+-(a - b) * loss_weight / N).
std::unique_ptr<Layer> make_euclidean_loss_layer(std::string name);

struct SigmoidCrossEntropyLossParams {
  LossParams loss_param;  // Caffe's default here is BATCH_SIZE (not VALID)
};

// Caffe's SigmoidCrossEntropyLoss: inputs are logits x and targets t in [0, 1] of the same
// count; loss = sum over targets != ignore_label of
//   max(x, 0) - x * t + log(1 + exp(-|x|)), divided by the normalizer
// (outer = axis 0 of x, inner = the rest).
std::unique_ptr<Layer> make_sigmoid_cross_entropy_loss_layer(
    std::string name, SigmoidCrossEntropyLossParams params = {});

}  // namespace hn
