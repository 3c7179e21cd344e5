// run_forward / run_backward: a layer on the caller's tensors, the scheduler's one-device
// case.
#include <fmt/format.h>

#include <string>

#include "lib/core/check.h"
#include "lib/layers/layer.h"
#include "lib/scheduler/scheduler.h"

namespace hn {

namespace {

std::string where(const Layer& layer) {
  return fmt::format("running layer '{}' ({})", layer.name(), layer.type());
}

detail::LayerCall call_of(Layer& layer, const std::string& where,
                          const std::vector<Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                          const RunOptions& options) {
  detail::LayerCall call;
  call.layer = &layer;
  call.where = where;
  for (Tensor* input : inputs)
    call.inputs.push_back(detail::CallTensor{input->shape(), &input->data(), &input->diff()});
  for (Tensor* output : outputs)
    call.outputs.push_back(detail::CallTensor{output->shape(), &output->data(), &output->diff()});
  for (Tensor& param : layer.params())
    call.params.push_back(detail::CallTensor{param.shape(), &param.data(), &param.diff()});
  call.phase = options.phase;
  call.seed = options.seed;
  call.begin = options.begin;
  call.end = options.end;
  return call;
}

}  // namespace

void run_forward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, const RunOptions& options) {
  detail::Scheduler scheduler(nullptr, driver);
  const std::string context = where(layer);
  scheduler.run(call_of(layer, context, inputs, outputs, options), false);
}

void run_backward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                  const std::vector<Tensor*>& outputs, std::vector<bool> propagate_down,
                  const RunOptions& options) {
  if (propagate_down.empty()) {
    for (std::size_t i = 0; i < inputs.size(); ++i)
      propagate_down.push_back(layer.can_propagate_down(static_cast<int>(i)));
  }
  HN_CHECK(propagate_down.size() == inputs.size(),
           "running layer '{}' ({}) backward: {} propagate_down flags for {} inputs", layer.name(),
           layer.type(), propagate_down.size(), inputs.size());
  const std::string context = where(layer);
  detail::LayerCall call = call_of(layer, context, inputs, outputs, options);
  call.propagate_down = std::move(propagate_down);
  detail::Scheduler scheduler(nullptr, driver);
  scheduler.run(call, true);
}

}  // namespace hn
