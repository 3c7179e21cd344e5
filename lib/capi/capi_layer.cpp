// The C ABI's layers run as kernels (hn_layer_*): one layer made from its prototxt, set up,
// its parameters read or replaced, forward and backward on the caller's tensors.
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/core/philox.h"
#include "lib/layers/registry.h"
#include "lib/net/filler.h"
#include "lib/net/layer_factory.h"
#include "lib/proto/prototxt.h"
#include "lib/scheduler/scheduler.h"
#include "lib/scheduler/split.h"

// ---- a layer as a kernel ---------------------------------------------------------------------

namespace {

struct LayerBox {
  hybridnn::proto::LayerParameter param;
  std::unique_ptr<hn::Layer> layer;
  std::string where;
  hn::Phase phase = hn::Phase::train;
  std::uint64_t calls = 0;  // seeds the random streams (dropout) of successive forwards
  bool set_up = false, filled = false;
  std::vector<hn::Shape> inputs, outputs;
  std::vector<bool> in_place;
  // Parameters the caller replaced (hn_layer_set_param), by index.
  std::map<int32_t, std::shared_ptr<hn_tensor>> params;
  std::shared_ptr<RuntimeBox> split_box;  // the runtime of a split's drivers
  hn::Split split;
};

// Fillers as a Net's (the layer type's filler trait), with a fixed seed per parameter.
void fill_params(LayerBox& box) {
  const hn::LayerType* type = hn::find_layer_type(box.param.type());
  if (type == nullptr || !type->filler) return;
  std::vector<hn::Tensor>& params = box.layer->params();
  for (std::size_t p = 0; p < params.size(); ++p) {
    const hybridnn::proto::FillerParameter* filler = type->filler(box.param, static_cast<int>(p));
    if (filler != nullptr) {
      hn::detail::fill(*filler, params[p].shape(), params[p].host_data_mut(), 1701 + p,
                       fmt::format("{} parameter {}", box.where, p));
    }
  }
}

hn::detail::CallTensor call_tensor(const hn_tensor& tensor) {
  return hn::detail::CallTensor{*tensor.shape, tensor.data, tensor.diff, tensor.layout};
}

}  // namespace

struct hn_layer {
  std::shared_ptr<LayerBox> box;
};

namespace {

// Checks the tensors of a forward or backward against the last setup and builds the call.
hn::detail::LayerCall layer_call(LayerBox& box, hn_tensor* const* inputs, hn_tensor* const* outputs,
                                 const char* what) {
  if (!box.set_up) {
    fail(HN_ERROR_INVALID_ARGUMENT,
         fmt::format("{}: {}: call hn_layer_setup first", what, box.where));
  }
  if ((!box.inputs.empty() && inputs == nullptr) || (!box.outputs.empty() && outputs == nullptr)) {
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: {}: NULL tensor array", what, box.where));
  }
  hn::detail::LayerCall call;
  call.layer = box.layer.get();
  call.where = box.where;
  const auto add = [&](hn_tensor* const* list, const std::vector<hn::Shape>& shapes,
                       std::vector<hn::detail::CallTensor>& into, const char* role) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      if (list[i] == nullptr) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("{}: {}: {} {} is NULL", what, box.where, role, i));
      }
      if (*list[i]->shape != shapes[i]) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("{}: {}: {} {} has shape {}, the layer was set up for {}", what, box.where,
                         role, i, list[i]->shape->to_string(), shapes[i].to_string()));
      }
      into.push_back(call_tensor(*list[i]));
    }
  };
  add(inputs, box.inputs, call.inputs, "input");
  add(outputs, box.outputs, call.outputs, "output");
  std::vector<hn::Tensor>& own = box.layer->params();
  for (std::size_t p = 0; p < own.size(); ++p) {
    auto it = box.params.find(static_cast<int32_t>(p));
    call.params.push_back(it != box.params.end()
                              ? call_tensor(*it->second)
                              : hn::detail::CallTensor{own[p].shape(), &own[p].data(),
                                                       &own[p].diff(), hn::Layout::nchw});
  }
  call.phase = box.phase;
  call.split = box.split;
  return call;
}

// Runs `body` between making the caller's wrapped arrays current and bringing the results
// back into them.
template <class Body>
void with_user_memory(const std::vector<const hn_tensor*>& tensors, const Body& body) {
  for (const hn_tensor* tensor : tensors)
    tensor->adopt_user();
  body();
  for (const hn_tensor* tensor : tensors)
    tensor->return_user();
}

std::vector<const hn_tensor*> tensors_of(const LayerBox& box, hn_tensor* const* inputs,
                                         hn_tensor* const* outputs) {
  std::vector<const hn_tensor*> all;
  for (std::size_t i = 0; i < box.inputs.size(); ++i)
    all.push_back(inputs[i]);
  for (std::size_t i = 0; i < box.outputs.size(); ++i)
    all.push_back(outputs[i]);
  for (const auto& [index, param] : box.params)
    all.push_back(param.get());
  return all;
}

}  // namespace

extern "C" {

hn_status hn_layer_create(const char* layer_prototxt, hn_layer** out) {
  return guarded([&] {
    auto box = std::make_shared<LayerBox>();
    hn::detail::parse_text_proto(checked_text(layer_prototxt, "hn_layer_create"), "hn_layer_create",
                                 box->param);
    if (box->param.name().empty()) box->param.set_name(box->param.type());
    box->layer = hn::detail::make_layer(box->param);
    box->where = fmt::format("layer '{}' ({})", box->param.name(), box->param.type());
    auto handle = std::make_unique<hn_layer>();
    handle->box = std::move(box);
    set_out(out, std::move(handle), "hn_layer_create");
  });
}

void hn_layer_destroy(hn_layer* layer) {
  delete layer;
}

const char* hn_layer_type(const hn_layer* layer) {
  return layer != nullptr ? layer->box->layer->type() : "";
}

hn_status hn_layer_set_phase(hn_layer* layer, int32_t phase) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_set_phase").box;
    if (phase != HN_PHASE_TRAIN && phase != HN_PHASE_TEST) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_layer_set_phase: phase {} (HN_PHASE_TRAIN or HN_PHASE_TEST)", phase));
    }
    box.phase = phase == HN_PHASE_TRAIN ? hn::Phase::train : hn::Phase::test;
  });
}

hn_status hn_layer_set_split(hn_layer* layer, hn_runtime* runtime, const char* split) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_set_split").box;
    const std::string text = split != nullptr ? split : "";
    if (text.empty()) {
      box.split = hn::Split();
      box.split_box.reset();
      return;
    }
    hn::Split parsed = hn::Split::parse(text);
    if (parsed.is_automatic()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           "hn_layer_set_split: a layer run as a kernel takes fixed fractions, not auto");
    }
    RuntimeBox& runtime_box = *checked(runtime, "hn_layer_set_split").box;
    parsed.check_devices(runtime_box.runtime);
    box.split = std::move(parsed);
    box.split_box = runtime->box;
  });
}

hn_status hn_layer_setup(hn_layer* layer, int32_t num_inputs, hn_tensor* const* inputs,
                         int32_t* num_outputs) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_setup").box;
    if (num_inputs < 0 || (num_inputs > 0 && inputs == nullptr)) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_layer_setup: {}: {} inputs", box.where, num_inputs));
    }
    std::vector<hn::Shape> shapes;
    for (int32_t i = 0; i < num_inputs; ++i) {
      if (inputs[i] == nullptr) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("hn_layer_setup: {}: input {} is NULL", box.where, i));
      }
      shapes.push_back(*inputs[i]->shape);
    }
    box.set_up = false;
    box.outputs = box.layer->setup(shapes);
    box.inputs = std::move(shapes);
    box.set_up = true;
    if (!box.filled) {
      fill_params(box);
      box.filled = true;
    }
    for (auto& [index, param] : box.params) {
      const hn::Shape& want = box.layer->params()[static_cast<std::size_t>(index)].shape();
      if (*param->shape != want) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format(
                 "hn_layer_setup: {}: parameter {} set with shape {}, the layer now needs {}",
                 box.where, index, param->shape->to_string(), want.to_string()));
      }
    }
    if (num_outputs != nullptr) *num_outputs = static_cast<int32_t>(box.outputs.size());
  });
}

hn_status hn_layer_output_shape(const hn_layer* layer, int32_t output, int32_t* axes, int64_t* dims,
                                int32_t capacity) {
  return guarded([&] {
    const char* what = "hn_layer_output_shape";
    const LayerBox& box = *checked(layer, what).box;
    if (!box.set_up || output < 0 || output >= static_cast<int32_t>(box.outputs.size())) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: {}: no output {} ({} after setup)", what,
                                                  box.where, output, box.outputs.size()));
    }
    const hn::Shape& shape = box.outputs[static_cast<std::size_t>(output)];
    set_out(axes, static_cast<int32_t>(shape.axes()), what);
    if (dims == nullptr && capacity == 0) return;
    copy_dims(shape, dims, capacity, fmt::format("{}: {} output {}", what, box.where, output));
  });
}

hn_status hn_layer_output_dims(const hn_layer* layer, int32_t output, int32_t* axes,
                               int64_t* dims) {
  return hn_layer_output_shape(layer, output, axes, dims, HN_MAX_AXES);
}

int32_t hn_layer_num_params(const hn_layer* layer) {
  return layer != nullptr ? static_cast<int32_t>(layer->box->layer->params().size()) : 0;
}

hn_status hn_layer_param(hn_layer* layer, int32_t index, hn_tensor** out) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_param").box;
    std::vector<hn::Tensor>& params = box.layer->params();
    if (index < 0 || index >= static_cast<int32_t>(params.size())) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_layer_param: {} has {} parameters (after setup), not {}", box.where,
                       params.size(), index));
    }
    auto it = box.params.find(index);
    if (it != box.params.end()) {
      set_out(out, owned(new hn_tensor(*it->second)), "hn_layer_param");
      return;
    }
    set_out(out, owned(tensor_of(layer->box, params[static_cast<std::size_t>(index)])),
            "hn_layer_param");
  });
}

hn_status hn_layer_set_param(hn_layer* layer, int32_t index, hn_tensor* param) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_set_param").box;
    std::vector<hn::Tensor>& params = box.layer->params();
    if (index < 0 || index >= static_cast<int32_t>(params.size())) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_layer_set_param: {} has {} parameters (after setup), not {}", box.where,
                       params.size(), index));
    }
    if (param == nullptr) {
      box.params.erase(index);
      return;
    }
    const hn::Shape& want = params[static_cast<std::size_t>(index)].shape();
    if (*param->shape != want) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_layer_set_param: {}: parameter {} has shape {}, got {}", box.where,
                       index, want.to_string(), param->shape->to_string()));
    }
    box.params[index] = std::make_shared<hn_tensor>(*param);
  });
}

hn_status hn_layer_forward(hn_layer* layer, hn_driver* driver, hn_tensor* const* inputs,
                           hn_tensor* const* outputs) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_forward").box;
    hn::Driver& home = *checked(driver, "hn_layer_forward").driver;
    hn::detail::LayerCall call = layer_call(box, inputs, outputs, "hn_layer_forward");
    // Outputs that are their input's tensor run in place: the layer must know at setup.
    std::vector<bool> in_place;
    for (std::size_t i = 0; i < call.outputs.size(); ++i) {
      const bool same = i < call.inputs.size() && call.outputs[i].data == call.inputs[i].data;
      if (same && !box.layer->allows_in_place()) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("hn_layer_forward: {}: output {} is input {}, and this layer does not "
                         "run in place",
                         box.where, i, i));
      }
      in_place.push_back(same);
    }
    if (in_place != box.in_place) {
      box.layer->set_in_place(in_place);
      box.layer->setup(box.inputs);
      box.in_place = in_place;
    }
    call.seed = hn::detail::mix_seeds(1701, box.calls++);
    hn::detail::Scheduler scheduler(box.split_box ? &box.split_box->runtime : nullptr, home);
    with_user_memory(tensors_of(box, inputs, outputs), [&] { scheduler.run(call, false); });
  });
}

hn_status hn_layer_backward(hn_layer* layer, hn_driver* driver, hn_tensor* const* inputs,
                            hn_tensor* const* outputs, const int32_t* propagate_down) {
  return guarded([&] {
    LayerBox& box = *checked(layer, "hn_layer_backward").box;
    hn::Driver& home = *checked(driver, "hn_layer_backward").driver;
    hn::detail::LayerCall call = layer_call(box, inputs, outputs, "hn_layer_backward");
    for (std::size_t i = 0; i < call.inputs.size(); ++i) {
      const bool can = box.layer->can_propagate_down(static_cast<int>(i));
      const bool want = propagate_down != nullptr ? propagate_down[i] != 0 : can;
      if (want && !can) {
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("hn_layer_backward: {}: input {} takes no gradient", box.where, i));
      }
      call.propagate_down.push_back(want);
    }
    call.seed = hn::detail::mix_seeds(1701, box.calls - 1);
    hn::detail::Scheduler scheduler(box.split_box ? &box.split_box->runtime : nullptr, home);
    with_user_memory(tensors_of(box, inputs, outputs), [&] { scheduler.run(call, true); });
  });
}

}  // extern "C"
