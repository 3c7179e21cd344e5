// Accuracy on every driver against a naive ranking written here: top_k 1 and 3,
// ignore_label, spatial positions, per-class output, Caffe's tie rule, and the errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/accuracy_layer.h"
#include "tests/layer_runs.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::Shape;
using hn::test::DriverConfig;
using hn::test::random_floats;

struct AccuracyReference {
  float accuracy = 0.0f;
  std::vector<float> per_class;
};

// Ranks the classes of each position by score, a tie placing the true class last (so ties
// count against it, as Caffe's >= comparison does); correct when its rank is below top_k.
AccuracyReference naive_accuracy(const std::vector<float>& scores, const std::vector<float>& labels,
                                 index_t outer, index_t classes, index_t inner, int top_k,
                                 std::optional<int> ignore) {
  std::vector<double> hits(static_cast<std::size_t>(classes), 0.0);
  std::vector<double> seen(static_cast<std::size_t>(classes), 0.0);
  double correct = 0.0, counted = 0.0;
  for (index_t o = 0; o < outer; ++o) {
    for (index_t i = 0; i < inner; ++i) {
      const int label = static_cast<int>(labels[static_cast<std::size_t>(o * inner + i)]);
      if (ignore && label == *ignore) continue;
      std::vector<index_t> order(static_cast<std::size_t>(classes));
      for (index_t c = 0; c < classes; ++c)
        order[static_cast<std::size_t>(c)] = c;
      auto score = [&](index_t c) {
        return scores[static_cast<std::size_t>((o * classes + c) * inner + i)];
      };
      std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
        if (score(a) != score(b)) return score(a) > score(b);
        return a != label && b == label;
      });
      const auto rank = std::find(order.begin(), order.end(), label) - order.begin();
      seen[static_cast<std::size_t>(label)] += 1.0;
      counted += 1.0;
      if (rank < top_k) {
        correct += 1.0;
        hits[static_cast<std::size_t>(label)] += 1.0;
      }
    }
  }
  AccuracyReference ref;
  ref.accuracy = counted == 0.0 ? 0.0f : static_cast<float>(correct / counted);
  for (std::size_t c = 0; c < hits.size(); ++c)
    ref.per_class.push_back(seen[c] == 0.0 ? 0.0f : static_cast<float>(hits[c] / seen[c]));
  return ref;
}

TEST_CASE("Accuracy matches a naive top-k ranking with ignore_label", "[layer][accuracy]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    struct Case {
      std::string label;
      Shape scores, labels;
      int axis;
      index_t outer, classes, inner;
    };
    const std::vector<Case> cases = {
        {"40x6 scores", Shape{40, 6}, Shape{40}, 1, 40, 6, 1},
        {"6x5x2x2 spatial labels", Shape{6, 5, 2, 2}, Shape{6, 1, 2, 2}, 1, 6, 5, 4},
        {"4x3x7 classes on axis -1", Shape{4, 3, 7}, Shape{4, 3}, -1, 12, 7, 1},
    };
    std::uint32_t seed = 60;
    for (const Case& c : cases) {
      for (const int top_k : {1, 3}) {
        for (const std::optional<int> ignore : {std::optional<int>{}, std::optional<int>{2}}) {
          INFO(c.label << ", top_k " << top_k << ", ignore_label " << (ignore ? "2" : "none"));
          const std::vector<float> scores =
              random_floats(static_cast<std::size_t>(c.scores.count()), ++seed);
          std::vector<float> labels =
              random_floats(static_cast<std::size_t>(c.labels.count()), ++seed, 0.0f, 1.0f);
          for (float& l : labels)
            l = std::min(std::floor(l * static_cast<float>(c.classes)),
                         static_cast<float>(c.classes - 1));
          const AccuracyReference ref =
              naive_accuracy(scores, labels, c.outer, c.classes, c.inner, top_k, ignore);
          hn::AccuracyParams params;
          params.top_k = top_k;
          params.axis = c.axis;
          params.ignore_label = ignore;
          hn::AccuracyLayer layer("acc", params, 2);
          const hn::test::LayerRun run =
              hn::test::run_layer(layer, *driver, {c.scores, c.labels}, {scores, labels});
          REQUIRE(run.outputs.size() == 2);
          CHECK(run.outputs[0] == std::vector<float>{ref.accuracy});
          CHECK(run.outputs[1] == ref.per_class);
          if (ignore) CHECK(run.outputs[1][2] == 0.0f);  // class 2 never counted
          hn::AccuracyLayer single("acc", params);
          CHECK(hn::test::run_layer(single, *driver, {c.scores, c.labels}, {scores, labels})
                    .outputs == std::vector<std::vector<float>>{{ref.accuracy}});
        }
      }
    }
  }
}

TEST_CASE("Accuracy counts a tie with the true class against it (Caffe's >= rule)",
          "[layer][accuracy]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    // Four items, three classes. Item 0: label 0 ties class 1 for the top score. Item 1:
    // label 1, the same tie. Item 2: label 2, clearly second. Item 3: label 0, clearly first.
    const std::vector<float> scores = {1, 1, 0, 1, 1, 0, 0, 3, 2, 5, 1, 1};
    const std::vector<float> labels = {0, 1, 2, 0};
    auto run = [&](int top_k) {
      hn::AccuracyParams params;
      params.top_k = top_k;
      hn::AccuracyLayer layer("acc", params, 2);
      return hn::test::run_layer(layer, *driver, {Shape{4, 3}, Shape{4}}, {scores, labels}).outputs;
    };
    // top 1: only item 3; per class: class 0 1/2, class 1 0/1, class 2 0/1.
    CHECK(run(1) == std::vector<std::vector<float>>{{0.25f}, {0.5f, 0.0f, 0.0f}});
    // top 2: every item.
    CHECK(run(2) == std::vector<std::vector<float>>{{1.0f}, {1.0f, 1.0f, 1.0f}});
  }
}

TEST_CASE("Accuracy counts NaN scores against the label, never as correct", "[layer][accuracy]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    auto driver = hn::make_driver(config.device, config.options);
    const float nan = std::nanf("");
    // Item 0: the true score is NaN. Item 1: another class's score is NaN, the label's is
    // highest of the rest. Item 2: every score NaN. Item 3: no NaN, label first.
    const std::vector<float> scores = {nan, 1, 0, 2, nan, 0, nan, nan, nan, 5, 1, 1};
    const std::vector<float> labels = {0, 0, 1, 0};
    auto run = [&](int top_k) {
      hn::AccuracyParams params;
      params.top_k = top_k;
      hn::AccuracyLayer layer("acc", params, 1);
      return hn::test::run_layer(layer, *driver, {Shape{4, 3}, Shape{4}}, {scores, labels})
          .outputs.at(0)
          .at(0);
    };
    CHECK(run(1) == 0.25f);  // item 3 only
    CHECK(run(2) == 0.5f);   // and item 1 (second behind the NaN)
    CHECK(run(3) == 0.5f);   // a NaN true score is never correct
  }
}

TEST_CASE("Accuracy with every label ignored is 0", "[layer][accuracy]") {
  auto driver = hn::make_driver(hn::Device{"reference", 0});
  hn::AccuracyParams params;
  params.ignore_label = -1;
  hn::AccuracyLayer layer("acc", params, 2);
  const auto outputs =
      hn::test::run_layer(layer, *driver, {Shape{2, 3}, Shape{2}}, {random_floats(6, 1), {-1, -1}})
          .outputs;
  CHECK(outputs == std::vector<std::vector<float>>{{0.0f}, {0.0f, 0.0f, 0.0f}});
}

TEST_CASE("Accuracy rejects impossible shapes, bad labels and gradients", "[layer][accuracy]") {
  hn::AccuracyLayer layer("acc");
  CHECK_THROWS_WITH(layer.setup({Shape{2, 4, 3}, Shape{2, 2}}),
                    Contains("layer 'acc' (Accuracy)") && Contains("2x4x3") && Contains("2x2"));
  hn::AccuracyParams big_k;
  big_k.top_k = 5;
  hn::AccuracyLayer k_layer("acc", big_k);
  CHECK_THROWS_WITH(k_layer.setup({Shape{2, 4}, Shape{2}}),
                    Contains("layer 'acc' (Accuracy)") && Contains("top_k 5") && Contains("2x4"));
  CHECK_FALSE(layer.can_propagate_down(0));
  CHECK_FALSE(layer.can_propagate_down(1));

  auto driver = hn::make_driver(hn::Device{"reference", 0});
  hn::Tensor x(Shape{2, 3}), labels(Shape{2}), out(Shape{});
  layer.setup({x.shape(), labels.shape()});
  hn::test::set_values(labels, {0, 3});
  CHECK_THROWS_WITH(hn::run_forward(layer, *driver, {&x, &labels}, {&out}),
                    Contains("layer 'acc' (Accuracy)") && Contains("label 3"));
  hn::test::set_values(labels, {0, 2});
  hn::run_forward(layer, *driver, {&x, &labels}, {&out});
  hn::run_backward(layer, *driver, {&x, &labels}, {&out});  // nothing asked: nothing done
  CHECK_THROWS_WITH(hn::run_backward(layer, *driver, {&x, &labels}, {&out}, {true, false}),
                    Contains("layer 'acc' (Accuracy)") && Contains("no gradient"));
}

}  // namespace
