// Layer test support: finite-difference gradient checks.
#include "tests/layer_support.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>

namespace hn::test {

void set_values(Tensor& tensor, const std::vector<float>& v) {
  REQUIRE(static_cast<index_t>(v.size()) == tensor.count());
  std::copy(v.begin(), v.end(), tensor.host_data_mut());
}

std::vector<float> values(Tensor& tensor) {
  const float* data = tensor.host_data();
  return std::vector<float>(data, data + tensor.count());
}

std::vector<float> diffs(Tensor& tensor) {
  const float* diff = tensor.host_diff();
  return std::vector<float>(diff, diff + tensor.count());
}

namespace {

struct Projection {
  std::vector<std::vector<float>> weights;  // one per output
};

Projection make_projection(const std::vector<Tensor*>& outputs, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Projection p;
  for (Tensor* output : outputs) {
    std::vector<float> w(static_cast<std::size_t>(output->count()));
    for (float& x : w)
      x = dist(rng);
    p.weights.push_back(std::move(w));
  }
  return p;
}

double projected_loss(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                      const std::vector<Tensor*>& outputs, const Projection& projection,
                      const GradientCheck& options) {
  RunOptions run;
  run.phase = options.phase;
  run.seed = options.seed;
  run_forward(layer, driver, inputs, outputs, run);
  double loss = 0.0;
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const float* y = outputs[o]->host_data();
    for (std::size_t k = 0; k < projection.weights[o].size(); ++k) {
      loss += static_cast<double>(projection.weights[o][k]) * y[k];
    }
  }
  return loss;
}

void check_tensor(const std::string& what, Tensor& tensor, const std::vector<float>& analytic,
                  const std::function<double()>& loss, const GradientCheck& options,
                  bool apply_kink) {
  for (index_t i = 0; i < tensor.count(); ++i) {
    const float original = tensor.host_data()[i];
    if (apply_kink && options.kink_range >= 0.0f &&
        std::abs(original - options.kink) <= options.kink_range) {
      continue;
    }
    tensor.host_data_mut()[i] = original + options.step;
    const double plus = loss();
    tensor.host_data_mut()[i] = original - options.step;
    const double minus = loss();
    tensor.host_data_mut()[i] = original;
    const double numeric = (plus - minus) / (2.0 * options.step);
    const double computed = analytic[static_cast<std::size_t>(i)];
    const double scale = std::max({1.0, std::abs(numeric), std::abs(computed)});
    INFO(what << " element " << i << " of " << tensor.shape().to_string() << ": backward gives "
              << computed << ", finite differences give " << numeric);
    CHECK(std::abs(computed - numeric) <= options.threshold * scale);
  }
}

}  // namespace

void check_gradients(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                     const std::vector<Tensor*>& outputs, const GradientCheck& options) {
  const Projection projection = make_projection(outputs, options.projection_seed);
  auto loss = [&] { return projected_loss(layer, driver, inputs, outputs, projection, options); };

  // Analytic gradients: forward, set dL/dy = r, clear parameter gradients, backward.
  loss();
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    std::copy(projection.weights[o].begin(), projection.weights[o].end(),
              outputs[o]->host_diff_mut());
  }
  for (Tensor& param : layer.params()) {
    std::fill(param.host_diff_mut(), param.host_diff_mut() + param.count(), 0.0f);
  }
  std::vector<bool> propagate;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    propagate.push_back(layer.can_propagate_down(static_cast<int>(i)));
  }
  RunOptions run;
  run.phase = options.phase;
  run.seed = options.seed;
  run_backward(layer, driver, inputs, outputs, propagate, run);
  std::vector<std::vector<float>> input_grads, param_grads;
  for (Tensor* input : inputs)
    input_grads.push_back(diffs(*input));
  for (Tensor& param : layer.params())
    param_grads.push_back(diffs(param));

  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!propagate[i]) continue;
    check_tensor(layer.name() + " input " + std::to_string(i), *inputs[i], input_grads[i], loss,
                 options, true);
  }
  if (options.check_params) {
    for (std::size_t p = 0; p < layer.params().size(); ++p) {
      check_tensor(layer.name() + " param " + std::to_string(p), layer.params()[p], param_grads[p],
                   loss, options, false);
    }
  }
}

}  // namespace hn::test
