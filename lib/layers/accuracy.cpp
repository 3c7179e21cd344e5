// Accuracy (Caffe): top-k classification accuracy, computed on the host (it reads every
// score once and writes a few floats, so moving the scores is the whole cost anyway).
#include "hybridnn.pb.h"
#include "lib/layers/accuracy_layer.h"
#include "lib/layers/caffe_params.h"
#include "lib/layers/registry.h"

#include <cmath>
#include <vector>

#include "lib/core/check.h"
#include "lib/layers/common.h"
#include "lib/layers/loss_support.h"

namespace hn {

AccuracyLayer::AccuracyLayer(std::string name, AccuracyParams params, int num_outputs)
    : Layer(std::move(name)), param_(params), num_outputs_(num_outputs) {}

std::vector<Shape> AccuracyLayer::setup(const std::vector<Shape>& inputs) {
  check_input_count(inputs, 2, 2);
  HN_CHECK(num_outputs_ == 1 || num_outputs_ == 2,
           "{}: num_outputs must be 1 (accuracy) or 2 (and per-class accuracy), got {}", describe(),
           num_outputs_);
  const Shape& scores = inputs[0];
  const Shape& labels = inputs[1];
  axis_ = detail::canonical_axis(describe(), "axis", param_.axis, scores);
  const index_t classes = scores[axis_];
  HN_CHECK(param_.top_k >= 1 && param_.top_k <= classes,
           "{}: top_k {} must lie in [1, {}], the number of classes of scores {}", describe(),
           param_.top_k, classes, scores.to_string());
  const index_t positions = scores.count(0, axis_) * scores.count(axis_ + 1, scores.axes());
  HN_CHECK(labels.count() == positions,
           "{}: {} labels ({}) for scores {} with class axis {}: needs one label per position, "
           "{}",
           describe(), labels.count(), labels.to_string(), scores.to_string(), axis_, positions);
  input_shape_ = scores;
  std::vector<Shape> outputs{Shape{}};
  if (num_outputs_ == 2) outputs.push_back(Shape{classes});
  return outputs;
}

void AccuracyLayer::forward(const LayerSlice& slice) {
  Driver& driver = *slice.driver;
  const index_t outer = input_shape_.count(0, axis_);
  const index_t classes = input_shape_[axis_];
  const index_t inner = input_shape_.count(axis_ + 1, input_shape_.axes());
  std::vector<float> scores(static_cast<std::size_t>(input_shape_.count()));
  std::vector<float> labels(static_cast<std::size_t>(outer * inner));
  driver.copy_to_host(scores.data(), slice.inputs[0].x(), scores.size() * sizeof(float));
  driver.copy_to_host(labels.data(), slice.inputs[1].x(), labels.size() * sizeof(float));

  std::vector<float> correct_per_class(static_cast<std::size_t>(classes), 0.0f);
  std::vector<float> seen_per_class(static_cast<std::size_t>(classes), 0.0f);
  index_t correct = 0, counted = 0;
  for (index_t o = 0; o < outer; ++o) {
    for (index_t i = 0; i < inner; ++i) {
      const float raw = labels[static_cast<std::size_t>(o * inner + i)];
      HN_CHECK(std::isfinite(raw) && std::abs(raw) < 2.0e9f,
               "{}: label {} at position (outer {}, inner {}) is not a class index", describe(),
               raw, o, i);
      const int label = static_cast<int>(raw);  // Caffe truncates float labels
      if (param_.ignore_label && label == *param_.ignore_label) continue;
      HN_CHECK(label >= 0 && label < classes,
               "{}: label {} at position (outer {}, inner {}) is outside [0, {}) (scores {})",
               describe(), raw, o, i, classes, input_shape_.to_string());
      const float* column = scores.data() + o * classes * inner + i;
      const float true_score = column[label * inner];
      // The true class counts itself, hence -1; a tie counts against the label, and so does
      // a NaN score (!(a < b) is a >= b, or true when either is NaN). A NaN true score is
      // never correct: a net that outputs NaN has not classified anything.
      int better = std::isnan(true_score) ? param_.top_k : -1;
      for (index_t c = 0; c < classes && better < param_.top_k; ++c) {
        better += !(column[c * inner] < true_score) ? 1 : 0;
      }
      seen_per_class[static_cast<std::size_t>(label)] += 1.0f;
      if (better < param_.top_k) {
        ++correct;
        correct_per_class[static_cast<std::size_t>(label)] += 1.0f;
      }
      ++counted;
    }
  }
  const float accuracy =
      counted == 0 ? 0.0f : static_cast<float>(correct) / static_cast<float>(counted);
  detail::write_scalar(driver, accuracy, slice.outputs[0].mutable_x());
  if (num_outputs_ == 2) {
    for (std::size_t c = 0; c < correct_per_class.size(); ++c) {
      correct_per_class[c] =
          seen_per_class[c] == 0.0f ? 0.0f : correct_per_class[c] / seen_per_class[c];
    }
    driver.copy_from_host(slice.outputs[1].mutable_x(), correct_per_class.data(),
                          correct_per_class.size() * sizeof(float));
  }
}

void AccuracyLayer::backward(const LayerSlice& slice) {
  for (std::size_t i = 0; i < slice.propagate_down.size(); ++i) {
    HN_CHECK(!slice.propagate_down[i], "{}: has no gradient (asked to propagate to input {})",
             describe(), i);
  }
}

// ---- the registry entry: Caffe's LayerParameter and the type's traits ------------------

namespace {

using namespace detail;

std::unique_ptr<Layer> make_accuracy(const pb::LayerParameter& p) {
  const pb::AccuracyParameter& a = p.accuracy_param();
  AccuracyParams params;
  params.top_k = to_int(p, "top_k", a.top_k());
  params.axis = a.axis();
  if (a.has_ignore_label()) params.ignore_label = a.ignore_label();
  return std::make_unique<AccuracyLayer>(p.name(), params, outputs_or(p, 1));
}

}  // namespace

LayerType accuracy_layer_type() {
  LayerType type;
  type.name = "Accuracy";
  type.make = make_accuracy;
  return type;
}

}  // namespace hn
