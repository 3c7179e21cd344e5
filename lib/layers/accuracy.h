// Accuracy (Caffe): the fraction of positions whose label is among the top_k scores.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/layers/layer.h"

namespace hn {

struct AccuracyParams {
  int top_k = 1;
  int axis = 1;  // the class axis; negative counts from the end
  std::optional<int> ignore_label;
};

// Inputs: scores (outer x C x inner around `axis`) and labels (outer * inner). A position
// counts as correct when fewer than top_k classes score >= the true class (Caffe's rule:
// ties count against the label). Output 0: correct / counted (0 when every label is
// ignored). num_outputs (Caffe: the number of tops) 2 adds output 1 (shape C): per class,
// correct / positions with that label (0 for none). No gradient flows through it.
std::unique_ptr<Layer> make_accuracy_layer(std::string name, AccuracyParams params = {},
                                           int num_outputs = 1);

}  // namespace hn
