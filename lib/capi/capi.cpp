// The C ABI (include/hybridnn/hybridnn_c.h) over the C++ library: handles own shared boxes
// of the C++ objects, so a handle keeps alive what it needs (a net its runtime, a blob's
// tensor its net) and handles can be destroyed in any order; every call catches what the
// C++ side throws and turns it into a status and the thread's last error.
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/memory.h"
#include "lib/core/philox.h"
#include "lib/core/runtime.h"
#include "lib/core/text.h"
#include "lib/core/version.h"
#include "lib/net/filler.h"
#include "lib/net/layer_factory.h"
#include "lib/net/net.h"
#include "lib/proto/prototxt.h"
#include "lib/scheduler/scheduler.h"
#include "lib/scheduler/split.h"
#include "lib/solver/solver.h"

namespace {

using hn::index_t;

thread_local std::string last_error;

// An error the C layer finds itself, with its status.
struct ApiError {
  hn_status status;
  std::string message;
};

[[noreturn]] void fail(hn_status status, std::string message) {
  throw ApiError{status, std::move(message)};
}

template <class T>
T& checked(T* handle, const char* what) {
  if (handle == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL handle", what));
  return *handle;
}

const char* checked_text(const char* text, const char* what) {
  if (text == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL string", what));
  return text;
}

// Runs `body`, turning whatever it throws into a status and the thread's last error.
template <class Body>
hn_status guarded(const Body& body) noexcept {
  try {
    body();
    return HN_OK;
  } catch (const ApiError& error) {
    last_error = error.message;
    return error.status;
  } catch (const hn::CommunicatorError& error) {
    last_error = error.what();
    return last_error.find("timed out") != std::string::npos ? HN_ERROR_TIMEOUT : HN_ERROR;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return HN_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& error) {
    last_error = error.what();
    return HN_ERROR;
  } catch (...) {
    last_error = "unknown error";
    return HN_ERROR;
  }
}

// For the calls that return a value rather than a status: `fallback` on error.
template <class T, class Body>
T value_or(T fallback, const Body& body) noexcept {
  T result = fallback;
  if (guarded([&] { result = body(); }) != HN_OK) return fallback;
  return result;
}

template <class T>
void set_out(T* out, T value, const char* what) {
  if (out == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL output", what));
  *out = value;
}
// A new handle: freed, not leaked, when `out` is NULL.
template <class T>
std::unique_ptr<T> owned(T* handle) {
  return std::unique_ptr<T>(handle);
}
template <class T>
void set_out(T** out, std::unique_ptr<T> value, const char* what) {
  if (out == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL output", what));
  *out = value.release();
}

// A shape into the caller's array of `capacity` entries, or HN_ERROR_CAPACITY writing
// nothing when it does not fit.
void copy_dims(const hn::Shape& shape, int64_t* dims, int32_t capacity, const std::string& what) {
  if (capacity < shape.axes()) {
    fail(HN_ERROR_CAPACITY, fmt::format("{}: the shape {} has {} axes; the array holds {}", what,
                                        shape.to_string(), shape.axes(), capacity));
  }
  if (dims == nullptr && shape.axes() > 0)
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL dims", what));
  for (int i = 0; i < shape.axes(); ++i)
    dims[i] = shape[i];
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names)
    text += (text.empty() ? "" : ",") + name;
  return text;
}

bool on_off(const std::string& key, const std::string& value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  fail(HN_ERROR_INVALID_ARGUMENT,
       fmt::format("option {}: expected on or off, got '{}'", key, value));
}

long long integer(const std::string& key, const std::string& value, long long min, long long max) {
  std::size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || number < min || number > max) {
    fail(HN_ERROR_INVALID_ARGUMENT,
         fmt::format("option {}: expected an integer in [{}, {}], got '{}'", key, min, max, value));
  }
  return number;
}

void check_file(const std::string& path, const char* what) {
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) {
    fail(HN_ERROR_NOT_FOUND, fmt::format("{}: no such file '{}'", what, path));
  }
}

// Copies weights into `net` from each .caffemodel of a comma-separated list, a missing
// file being HN_ERROR_NOT_FOUND.
void copy_weights(hn::Net& net, const std::string& paths, const char* what) {
  for (const std::string& path : hn::detail::split_commas(paths, hn::detail::EmptyItems::drop)) {
    check_file(path, what);
    net.copy_trained_layers_from(path);
  }
}

struct RuntimeBox {
  hn::Runtime runtime;
  std::map<std::string, std::vector<std::string>> options;  // per device: what it was added with
};

}  // namespace

// ---- handles -------------------------------------------------------------------------

struct hn_runtime {
  std::shared_ptr<RuntimeBox> box;
};

struct hn_driver {
  std::shared_ptr<RuntimeBox> box;
  hn::Driver* driver = nullptr;
  std::string name, description;
};

// A tensor: a shape and data/gradient memory the library tracks (hn::SyncedMemory),
// either its own (`own`), a net's or a layer's (kept alive by `keep`), or the caller's
// arrays adopted as that memory's copy (`wrapped`).
struct hn_tensor {
  std::shared_ptr<void> keep;
  std::shared_ptr<hn::Tensor> own;
  const hn::Shape* shape = nullptr;
  hn::SyncedMemory* data = nullptr;
  hn::SyncedMemory* diff = nullptr;
  hn::Layout layout = hn::Layout::nchw;
  // Wrapped: the caller's arrays and the driver that addresses them (nullptr: host).
  float* user_data = nullptr;
  float* user_diff = nullptr;
  hn::Driver* user_driver = nullptr;
  std::shared_ptr<RuntimeBox> user_box;  // keeps user_driver alive
  // A net's blob: throws when the net's memory plan has reused its memory since it was
  // written (argument: the gradient rather than the values).
  std::function<void(bool)> check_holds;

  // The caller's arrays hold the current values (before the library uses the tensor).
  void adopt_user() const {
    if (user_data != nullptr) data->adopt(user_driver, user_data);
    if (user_diff != nullptr) diff->adopt(user_driver, user_diff);
  }
  // The library's results reach the caller's arrays (after it used the tensor).
  void return_user() const {
    const auto back = [&](hn::SyncedMemory* memory) {
      if (user_driver != nullptr) {
        memory->read(*user_driver);
      } else {
        memory->host_read();
      }
    };
    if (user_data != nullptr) back(data);
    if (user_diff != nullptr) back(diff);
  }
};

namespace {

hn_tensor* synced_tensor(std::shared_ptr<void> keep, const hn::Shape* shape, hn::SyncedMemory* data,
                         hn::SyncedMemory* diff, hn::Layout layout = hn::Layout::nchw) {
  auto* tensor = new hn_tensor;
  tensor->keep = std::move(keep);
  tensor->shape = shape;
  tensor->data = data;
  tensor->diff = diff;
  tensor->layout = layout;
  return tensor;
}

hn_tensor* tensor_of(std::shared_ptr<void> keep, hn::Tensor& tensor) {
  return synced_tensor(std::move(keep), &tensor.shape(), &tensor.data(), &tensor.diff());
}

hn::Shape shape_from(int32_t axes, const int64_t* dims, const char* what) {
  if (axes > 0 && dims == nullptr) {
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL dims for {} axes", what, axes));
  }
  if (axes < 0 || axes > HN_MAX_AXES) {
    fail(HN_ERROR_INVALID_ARGUMENT,
         fmt::format("{}: {} axes (0 to {}, with dims)", what, axes, HN_MAX_AXES));
  }
  std::vector<index_t> list;
  for (int32_t i = 0; i < axes; ++i) {
    if (dims[i] < 0) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: axis {} is {}", what, i, dims[i]));
    }
    list.push_back(static_cast<index_t>(dims[i]));
  }
  return hn::Shape(std::move(list));
}

}  // namespace

// ---- status, errors, version ------------------------------------------------------------

extern "C" {

const char* hn_last_error(void) {
  return last_error.c_str();
}

const char* hn_status_name(hn_status status) {
  switch (status) {
    case HN_OK:
      return "ok";
    case HN_ERROR:
      return "error";
    case HN_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case HN_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case HN_ERROR_NOT_FOUND:
      return "not found";
    case HN_ERROR_TIMEOUT:
      return "timeout";
    case HN_ERROR_CAPACITY:
      return "capacity too small";
    default:
      return "unknown status";
  }
}

const char* hn_version(void) {
  return hn::version();
}

int32_t hn_abi_version(void) {
  return HN_ABI_VERSION;
}

uint64_t hn_host_memory_limit(void) {
  return hn::host_memory_limit();
}

void hn_set_host_memory_limit(uint64_t bytes) {
  hn::set_host_memory_limit(
      static_cast<std::size_t>(std::min<uint64_t>(bytes, std::numeric_limits<std::size_t>::max())));
}

uint64_t hn_peak_resident_bytes(void) {
  return hn::peak_resident_bytes();
}

// ---- runtime and drivers -----------------------------------------------------------------

hn_status hn_runtime_create(hn_runtime** out) {
  return guarded([&] {
    auto runtime = std::make_unique<hn_runtime>();
    runtime->box = std::make_shared<RuntimeBox>();
    set_out(out, std::move(runtime), "hn_runtime_create");
  });
}

void hn_runtime_destroy(hn_runtime* runtime) {
  delete runtime;
}

hn_status hn_runtime_add_driver(hn_runtime* runtime, const char* device, const char* options,
                                hn_driver** out) {
  return guarded([&] {
    RuntimeBox& box = *checked(runtime, "hn_runtime_add_driver").box;
    const hn::Device parsed =
        hn::Device::parse(checked_text(device, "hn_runtime_add_driver: device"));
    hn::Driver* driver = box.runtime.find(parsed);
    std::vector<std::string> items =
        hn::detail::split_commas(options != nullptr ? options : "", hn::detail::EmptyItems::drop);
    std::sort(items.begin(), items.end());
    if (driver != nullptr && !items.empty() && items != box.options[parsed.name()]) {
      // A driver's options are fixed when it is made; dropping these silently would run
      // with others than the caller asked for.
      const std::vector<std::string>& had = box.options[parsed.name()];
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_runtime_add_driver: {} is already in this runtime with options '{}'; "
                       "add it with the same options or none to get it, or add another "
                       "instance (e.g. cpu:1) for '{}'",
                       parsed.name(), joined(had), options));
    }
    if (driver == nullptr) {
      hn::DriverOptions driver_options;
      for (const std::string& item : items) {
        const std::size_t equals = item.find('=');
        if (equals == std::string::npos || equals == 0) {
          fail(HN_ERROR_INVALID_ARGUMENT,
               fmt::format("hn_runtime_add_driver: option '{}' is not key=value", item));
        }
        driver_options.set(item.substr(0, equals), item.substr(equals + 1));
      }
      const std::vector<hn::Device> present = hn::available_devices();
      if (std::find(present.begin(), present.end(), parsed) == present.end() &&
          parsed.kind != "cpu") {
        std::vector<std::string> names;
        for (const hn::Device& d : present)
          names.push_back(d.name());
        fail(HN_ERROR_NOT_FOUND,
             fmt::format("hn_runtime_add_driver: no device {} here (devices: {})", parsed.name(),
                         joined(names)));
      }
      driver = &box.runtime.add(parsed, driver_options);
      box.options[parsed.name()] = items;
    }
    auto handle = std::make_unique<hn_driver>();
    handle->box = runtime->box;
    handle->driver = driver;
    handle->name = driver->name();
    handle->description = driver->description();
    set_out(out, std::move(handle), "hn_runtime_add_driver");
  });
}

hn_status hn_available_devices(const char** out) {
  thread_local std::string devices;
  return guarded([&] {
    std::vector<std::string> names;
    for (const hn::Device& device : hn::available_devices())
      names.push_back(device.name());
    devices = joined(names);
    set_out(out, devices.c_str(), "hn_available_devices");
  });
}

void hn_driver_destroy(hn_driver* driver) {
  delete driver;
}

const char* hn_driver_name(const hn_driver* driver) {
  return driver != nullptr ? driver->name.c_str() : "";
}

const char* hn_driver_description(const hn_driver* driver) {
  return driver != nullptr ? driver->description.c_str() : "";
}

// ---- tensors -----------------------------------------------------------------------------

hn_status hn_tensor_create(int32_t axes, const int64_t* dims, hn_tensor** out) {
  return guarded([&] {
    auto own = std::make_shared<hn::Tensor>(shape_from(axes, dims, "hn_tensor_create"));
    std::unique_ptr<hn_tensor> tensor(tensor_of(nullptr, *own));
    tensor->own = std::move(own);
    set_out(out, std::move(tensor), "hn_tensor_create");
  });
}

hn_status hn_tensor_wrap(int32_t axes, const int64_t* dims, float* data, float* diff,
                         hn_driver* driver, hn_tensor** out) {
  return guarded([&] {
    if (data == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, "hn_tensor_wrap: NULL data");
    auto own = std::make_shared<hn::Tensor>(shape_from(axes, dims, "hn_tensor_wrap"));
    std::unique_ptr<hn_tensor> tensor(tensor_of(nullptr, *own));
    tensor->own = std::move(own);
    tensor->user_data = data;
    tensor->user_diff = diff;
    if (driver != nullptr) {
      tensor->user_driver = driver->driver;
      tensor->user_box = driver->box;
    }
    tensor->adopt_user();
    set_out(out, std::move(tensor), "hn_tensor_wrap");
  });
}

void hn_tensor_destroy(hn_tensor* tensor) {
  delete tensor;
}

int32_t hn_tensor_axes(const hn_tensor* tensor) {
  return tensor != nullptr ? tensor->shape->axes() : 0;
}

hn_status hn_tensor_dims(const hn_tensor* tensor, int64_t* dims, int32_t capacity) {
  return guarded([&] {
    copy_dims(*checked(tensor, "hn_tensor_dims").shape, dims, capacity, "hn_tensor_dims");
  });
}

int64_t hn_tensor_count(const hn_tensor* tensor) {
  return tensor != nullptr ? tensor->shape->count() : 0;
}

}  // extern "C"

namespace {

hn_status host_access(hn_tensor* tensor, int32_t access, float** out, bool diff, const char* what) {
  return guarded([&] {
    hn_tensor& t = checked(tensor, what);
    hn::SyncedMemory* memory = diff ? t.diff : t.data;
    if (memory == nullptr) {
      fail(HN_ERROR,
           fmt::format("{}: this tensor has no gradient (a net that runs no backward)", what));
    }
    if (t.layout != hn::Layout::nchw) {
      fail(HN_ERROR, fmt::format("{}: this blob lies in the {} layout inside the net (net "
                                 "option layout=blocked); name it in keep_blobs to read it",
                                 what, hn::layout_name(t.layout)));
    }
    if (t.check_holds) t.check_holds(diff);
    if (memory->bytes() == 0 && t.shape->count() > 0) {
      fail(HN_ERROR, fmt::format("{}: this blob has no gradient: nothing in the net computes or "
                                 "reads it (e.g. a label or a blob no backward reaches)",
                                 what));
    }
    float* user = diff ? t.user_diff : t.user_data;
    if (user != nullptr) {
      if (t.user_driver != nullptr && t.user_driver->memory_space() != hn::host_space()) {
        fail(HN_ERROR, fmt::format("{}: the tensor wraps memory of {}, not host memory", what,
                                   t.user_driver->name()));
      }
      set_out(out, user, what);
      return;
    }
    void* address = nullptr;
    switch (access) {
      case HN_READ:
        address = const_cast<void*>(memory->host_read());
        break;
      case HN_WRITE:
        address = memory->host_write();
        break;
      case HN_OVERWRITE:
        address = memory->host_overwrite();
        break;
      default:
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("{}: access {} (HN_READ, HN_WRITE or HN_OVERWRITE)", what, access));
    }
    set_out(out, static_cast<float*>(address), what);
  });
}

}  // namespace

extern "C" {

hn_status hn_tensor_data(hn_tensor* tensor, int32_t access, float** out) {
  return host_access(tensor, access, out, false, "hn_tensor_data");
}

hn_status hn_tensor_diff(hn_tensor* tensor, int32_t access, float** out) {
  return host_access(tensor, access, out, true, "hn_tensor_diff");
}

int32_t hn_tensor_is_blocked(const hn_tensor* tensor) {
  return tensor != nullptr && tensor->layout != hn::Layout::nchw ? 1 : 0;
}

}  // extern "C"

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

void fill_params(LayerBox& box) {
  const std::string& type = box.param.type();
  std::vector<hn::Tensor>& params = box.layer->params();
  for (std::size_t p = 0; p < params.size() && p < 2; ++p) {
    const hybridnn::proto::FillerParameter* filler = nullptr;
    if (type == "Convolution") {
      filler = p == 0 ? &box.param.convolution_param().weight_filler()
                      : &box.param.convolution_param().bias_filler();
    } else if (type == "InnerProduct") {
      filler = p == 0 ? &box.param.inner_product_param().weight_filler()
                      : &box.param.inner_product_param().bias_filler();
    }
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

// ---- nets -------------------------------------------------------------------------------

struct hn_net_options {
  hn::NetOptions options;
  std::string weights;
};

namespace {

const char* const kNetKeys =
    "phase, level, stage, batch, data, mean_file, force_backward, reuse_memory, keep_blobs, "
    "seed, split, split_file, tune, tune_cache, layout, fuse, weights";

hn::Phase phase_of(const std::string& key, const std::string& value) {
  if (value == "train") return hn::Phase::train;
  if (value == "test") return hn::Phase::test;
  fail(HN_ERROR_INVALID_ARGUMENT,
       fmt::format("option {}: expected train or test, got '{}'", key, value));
}

bool layout_of(const std::string& key, const std::string& value) {
  if (value == "blocked") return true;
  if (value == "nchw") return false;
  fail(HN_ERROR_INVALID_ARGUMENT,
       fmt::format("option {}: expected nchw or blocked, got '{}'", key, value));
}

// The options a net and a solver share; false when `key` is not one of them.
bool set_common(const std::string& key, const std::string& value, hn::Split& split,
                hn::LayerSplits& layer_splits, hn::TuneOptions& tune, bool& blocked, bool& fuse) {
  if (key == "split") {
    split = value.empty() ? hn::Split() : hn::Split::parse(value);
  } else if (key == "split_file") {
    layer_splits = value.empty() ? hn::LayerSplits() : hn::read_layer_splits(value);
  } else if (key == "tune") {
    tune.mode = hn::parse_tune_mode(value);
  } else if (key == "tune_cache") {
    tune.cache_path = value;
  } else if (key == "layout") {
    blocked = layout_of(key, value);
  } else if (key == "fuse") {
    fuse = on_off(key, value);
  } else {
    return false;
  }
  return true;
}

struct NetBox {
  std::shared_ptr<void> keep;  // the runtime, or the solver that owns the net
  std::unique_ptr<hn::Net> own;
  hn::Net* net = nullptr;
  std::string name;
  std::map<int32_t, std::string> layer_splits;
  std::string blob_names, input_names, output_names;
};

}  // namespace

struct hn_net {
  std::shared_ptr<NetBox> box;
};

namespace {

hn_net* net_handle(std::shared_ptr<void> keep, hn::Net& net) {
  auto box = std::make_shared<NetBox>();
  box->keep = std::move(keep);
  box->net = &net;
  box->name = net.name();
  return new hn_net{std::move(box)};
}

hn::Net& net_of(const hn_net* net, const char* what) {
  return *checked(net, what).box->net;
}

hn_status make_net(hn_runtime* runtime, hn_driver* driver, const std::string& origin,
                   const std::string* text, const hn_net_options* options, hn_net** out,
                   const char* what) {
  return guarded([&] {
    RuntimeBox& runtime_box = *checked(runtime, what).box;
    hn_driver& home = checked(driver, what);
    if (home.box != runtime->box) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("{}: driver {} belongs to another runtime", what, home.name));
    }
    const hn_net_options defaults;
    const hn_net_options& chosen = options != nullptr ? *options : defaults;
    std::unique_ptr<hn::Net> net;
    if (text != nullptr) {
      net = hn::Net::from_text(*text, origin, runtime_box.runtime, *home.driver, chosen.options);
    } else {
      check_file(origin, what);
      net = std::make_unique<hn::Net>(origin, runtime_box.runtime, *home.driver, chosen.options);
    }
    copy_weights(*net, chosen.weights, what);
    auto box = std::make_shared<NetBox>();
    box->keep = runtime->box;
    box->net = net.get();
    box->name = net->name();
    box->own = std::move(net);
    set_out(out, owned(new hn_net{std::move(box)}), what);
  });
}

const char* layer_text(const hn_net* net, int32_t index, const char* what,
                       const char* (*get)(hn::Net&, int)) {
  return value_or<const char*>(nullptr, [&] {
    hn::Net& n = net_of(net, what);
    if (index < 0 || index >= n.num_layers()) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: net '{}' has {} layers, not {}", what,
                                                  n.name(), n.num_layers(), index));
    }
    return get(n, index);
  });
}

}  // namespace

extern "C" {

hn_status hn_net_options_create(hn_net_options** out) {
  return guarded([&] { set_out(out, owned(new hn_net_options), "hn_net_options_create"); });
}

void hn_net_options_destroy(hn_net_options* options) {
  delete options;
}

hn_status hn_net_options_set(hn_net_options* options, const char* key, const char* value) {
  return guarded([&] {
    hn_net_options& o = checked(options, "hn_net_options_set");
    const std::string k = checked_text(key, "hn_net_options_set: key");
    const std::string v = checked_text(value, "hn_net_options_set: value");
    hn::NetOptions& n = o.options;
    if (set_common(k, v, n.split, n.layer_splits, n.tune, n.blocked_layout, n.fuse_layers)) return;
    if (k == "phase") {
      n.state.phase = phase_of(k, v);
    } else if (k == "level") {
      n.state.level = static_cast<int>(integer(k, v, -(1 << 30), 1 << 30));
    } else if (k == "stage") {
      n.state.stages = hn::detail::split_commas(v, hn::detail::EmptyItems::drop);
    } else if (k == "batch") {
      n.batch_size = static_cast<int>(integer(k, v, 0, 1 << 30));
    } else if (k == "data") {
      n.data_source = v;
    } else if (k == "mean_file") {
      n.mean_file = v;
    } else if (k == "force_backward") {
      n.force_backward = on_off(k, v);
    } else if (k == "reuse_memory") {
      n.reuse_memory = on_off(k, v);
    } else if (k == "keep_blobs") {
      n.keep_blobs = hn::detail::split_commas(v, hn::detail::EmptyItems::drop);
    } else if (k == "seed") {
      n.seed = static_cast<std::uint64_t>(integer(k, v, 0, (1LL << 62)));
    } else if (k == "weights") {
      o.weights = v;
    } else {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_net_options_set: unknown option '{}' (options: {})", k, kNetKeys));
    }
  });
}

hn_status hn_net_create(hn_runtime* runtime, hn_driver* driver, const char* prototxt_path,
                        const hn_net_options* options, hn_net** out) {
  if (prototxt_path == nullptr) {
    last_error = "hn_net_create: NULL path";
    return HN_ERROR_INVALID_ARGUMENT;
  }
  return make_net(runtime, driver, prototxt_path, nullptr, options, out, "hn_net_create");
}

hn_status hn_net_create_from_text(hn_runtime* runtime, hn_driver* driver, const char* prototxt_text,
                                  const char* origin, const hn_net_options* options, hn_net** out) {
  if (prototxt_text == nullptr) {
    last_error = "hn_net_create_from_text: NULL text";
    return HN_ERROR_INVALID_ARGUMENT;
  }
  const std::string text = prototxt_text;
  return make_net(runtime, driver, origin != nullptr ? origin : "<text>", &text, options, out,
                  "hn_net_create_from_text");
}

void hn_net_destroy(hn_net* net) {
  delete net;
}

const char* hn_net_name(const hn_net* net) {
  return net != nullptr ? net->box->name.c_str() : "";
}

hn_status hn_net_forward(hn_net* net, float* loss) {
  return guarded([&] {
    const float value = net_of(net, "hn_net_forward").forward();
    if (loss != nullptr) *loss = value;
  });
}

hn_status hn_net_backward(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_backward").backward(); });
}

hn_status hn_net_clear_param_diffs(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_clear_param_diffs").clear_param_diffs(); });
}

hn_status hn_net_copy_from(hn_net* net, const char* caffemodel_paths) {
  return guarded([&] {
    hn::Net& n = net_of(net, "hn_net_copy_from");
    copy_weights(n, checked_text(caffemodel_paths, "hn_net_copy_from"), "hn_net_copy_from");
  });
}

hn_status hn_net_save(hn_net* net, const char* caffemodel_path) {
  return guarded(
      [&] { net_of(net, "hn_net_save").save(checked_text(caffemodel_path, "hn_net_save")); });
}

int32_t hn_net_num_layers(const hn_net* net) {
  return net != nullptr ? net->box->net->num_layers() : 0;
}

const char* hn_net_layer_name(const hn_net* net, int32_t index) {
  return layer_text(net, index, "hn_net_layer_name",
                    [](hn::Net& n, int i) { return n.layer_name(i).c_str(); });
}

const char* hn_net_layer_type(const hn_net* net, int32_t index) {
  return layer_text(net, index, "hn_net_layer_type",
                    [](hn::Net& n, int i) { return n.layer_type(i); });
}

const char* hn_net_layer_split(hn_net* net, int32_t index) {
  return value_or<const char*>(nullptr, [&] {
    hn::Net& n = net_of(net, "hn_net_layer_split");
    if (index < 0 || index >= n.num_layers()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_net_layer_split: net '{}' has {} layers, not {}", n.name(),
                       n.num_layers(), index));
    }
    std::string text;
    for (const auto& [layer, split] : n.layer_splits()) {
      if (layer == n.layer_name(index)) text = split.to_string();
    }
    std::string& kept = net->box->layer_splits[index];
    kept = std::move(text);
    return kept.c_str();
  });
}

const char* hn_net_blob_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->blob_names = joined(net_of(net, "hn_net_blob_names").blob_names());
    return net->box->blob_names.c_str();
  });
}

const char* hn_net_input_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->input_names = joined(net_of(net, "hn_net_input_names").input_blob_names());
    return net->box->input_names.c_str();
  });
}

const char* hn_net_output_names(hn_net* net) {
  return value_or<const char*>(nullptr, [&] {
    net->box->output_names = joined(net_of(net, "hn_net_output_names").output_blob_names());
    return net->box->output_names.c_str();
  });
}

hn_status hn_net_blob(hn_net* net, const char* name, hn_tensor** out) {
  return guarded([&] {
    hn::Net& n = net_of(net, "hn_net_blob");
    const std::string blob = checked_text(name, "hn_net_blob: name");
    if (!n.has_blob(blob)) {
      fail(HN_ERROR_NOT_FOUND, fmt::format("hn_net_blob: net '{}' has no blob '{}' (blobs: {})",
                                           n.name(), blob, joined(n.blob_names())));
    }
    const hn::BlobRef ref = n.blob(blob);
    hn_tensor* tensor = synced_tensor(net->box, ref.shape, ref.data, ref.diff, ref.layout);
    tensor->check_holds = [&n, blob](bool diff) { n.check_blob_holds(blob, diff); };
    set_out(out, owned(tensor), "hn_net_blob");
  });
}

int32_t hn_net_num_params(const hn_net* net) {
  return net != nullptr ? static_cast<int32_t>(net->box->net->learnable_params().size()) : 0;
}

}  // extern "C"

namespace {

const hn::NetParam& net_param(const hn_net* net, int32_t index, const char* what) {
  const std::vector<hn::NetParam>& params = net_of(net, what).learnable_params();
  if (index < 0 || index >= static_cast<int32_t>(params.size())) {
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: net '{}' has {} parameters, not {}", what,
                                                net->box->name, params.size(), index));
  }
  return params[static_cast<std::size_t>(index)];
}

}  // namespace

extern "C" {

const char* hn_net_param_name(const hn_net* net, int32_t index) {
  return value_or<const char*>(
      nullptr, [&] { return net_param(net, index, "hn_net_param_name").name.c_str(); });
}

hn_status hn_net_param(hn_net* net, int32_t index, hn_tensor** out) {
  return guarded([&] {
    const hn::NetParam& param = net_param(net, index, "hn_net_param");
    set_out(out, owned(tensor_of(net->box, *param.tensor)), "hn_net_param");
  });
}

hn_status hn_net_calibrate_splits(hn_net* net) {
  return guarded([&] { net_of(net, "hn_net_calibrate_splits").calibrate_splits(); });
}

}  // extern "C"

// ---- collectives --------------------------------------------------------------------------

namespace {

struct CommBox {
  std::unique_ptr<hn::Communicator> comm;
  std::string name;
};

}  // namespace

struct hn_comm {
  std::shared_ptr<CommBox> box;
};

// ---- solver -------------------------------------------------------------------------------

struct hn_solver_options {
  hn::SolverOptions options;
  std::shared_ptr<CommBox> comm;
};

struct hn_solver_event {
  const hn::SolverEvent* event = nullptr;
};

namespace {

const char* const kSolverKeys =
    "train_data, test_data, mean_file, snapshot_prefix, max_iter, seed, split, split_file, "
    "tune, tune_cache, layout, fuse, bucket_bytes";

struct SolverBox {
  std::shared_ptr<RuntimeBox> runtime;
  std::shared_ptr<CommBox> comm;
  std::unique_ptr<hn::Solver> solver;
  std::vector<std::pair<std::string, float>> results;
  std::string snapshot;
};

}  // namespace

struct hn_solver {
  std::shared_ptr<SolverBox> box;
};

namespace {

hn::Solver& solver_of(const hn_solver* solver, const char* what) {
  return *checked(solver, what).box->solver;
}

}  // namespace

extern "C" {

hn_status hn_solver_options_create(hn_solver_options** out) {
  return guarded([&] { set_out(out, owned(new hn_solver_options), "hn_solver_options_create"); });
}

void hn_solver_options_destroy(hn_solver_options* options) {
  delete options;
}

hn_status hn_solver_options_set(hn_solver_options* options, const char* key, const char* value) {
  return guarded([&] {
    hn::SolverOptions& s = checked(options, "hn_solver_options_set").options;
    const std::string k = checked_text(key, "hn_solver_options_set: key");
    const std::string v = checked_text(value, "hn_solver_options_set: value");
    if (set_common(k, v, s.split, s.layer_splits, s.tune, s.blocked_layout, s.fuse_layers)) return;
    if (k == "train_data") {
      s.train_data = v;
    } else if (k == "test_data") {
      s.test_data = v;
    } else if (k == "mean_file") {
      s.mean_file = v;
    } else if (k == "snapshot_prefix") {
      s.snapshot_prefix = v;
    } else if (k == "max_iter") {
      s.max_iter = static_cast<int>(integer(k, v, 0, 1LL << 30));
    } else if (k == "seed") {
      s.seed = static_cast<std::uint64_t>(integer(k, v, 0, 1LL << 62));
    } else if (k == "bucket_bytes") {
      s.bucket_bytes = static_cast<std::size_t>(integer(k, v, 1, 1LL << 40));
    } else {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_options_set: unknown option '{}' (options: {})", k, kSolverKeys));
    }
  });
}

hn_status hn_solver_options_set_communicator(hn_solver_options* options, hn_comm* comm) {
  return guarded([&] {
    hn_solver_options& o = checked(options, "hn_solver_options_set_communicator");
    o.comm = comm != nullptr ? comm->box : nullptr;
    o.options.communicator = comm != nullptr ? comm->box->comm.get() : nullptr;
  });
}

hn_status hn_solver_create(hn_runtime* runtime, hn_driver* driver, const char* solver_prototxt_path,
                           const hn_solver_options* options, hn_solver** out) {
  return guarded([&] {
    RuntimeBox& runtime_box = *checked(runtime, "hn_solver_create").box;
    hn_driver& home = checked(driver, "hn_solver_create");
    if (home.box != runtime->box) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_create: driver {} belongs to another runtime", home.name));
    }
    const std::string path = checked_text(solver_prototxt_path, "hn_solver_create: path");
    check_file(path, "hn_solver_create");
    const hn_solver_options defaults;
    const hn_solver_options& chosen = options != nullptr ? *options : defaults;
    auto box = std::make_shared<SolverBox>();
    box->runtime = runtime->box;
    box->comm = chosen.comm;
    box->solver =
        std::make_unique<hn::Solver>(path, runtime_box.runtime, *home.driver, chosen.options);
    set_out(out, owned(new hn_solver{std::move(box)}), "hn_solver_create");
  });
}

void hn_solver_destroy(hn_solver* solver) {
  delete solver;
}

hn_status hn_solver_solve(hn_solver* solver) {
  return guarded([&] { solver_of(solver, "hn_solver_solve").solve(); });
}

hn_status hn_solver_step(hn_solver* solver, int32_t iterations) {
  return guarded([&] {
    if (iterations < 0) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("hn_solver_step: {} iterations", iterations));
    }
    solver_of(solver, "hn_solver_step").step(iterations);
  });
}

void hn_solver_request_stop(hn_solver* solver) {
  if (solver != nullptr) solver->box->solver->request_stop();
}

hn_status hn_solver_snapshot(hn_solver* solver, const char** path) {
  return guarded([&] {
    solver->box->snapshot = solver_of(solver, "hn_solver_snapshot").snapshot();
    if (path != nullptr) *path = solver->box->snapshot.c_str();
  });
}

hn_status hn_solver_restore(hn_solver* solver, const char* solverstate_path) {
  return guarded([&] {
    const std::string path = checked_text(solverstate_path, "hn_solver_restore");
    check_file(path, "hn_solver_restore");
    solver_of(solver, "hn_solver_restore").restore(path);
  });
}

hn_status hn_solver_copy_weights(hn_solver* solver, const char* caffemodel_paths) {
  return guarded([&] {
    const std::string paths = checked_text(caffemodel_paths, "hn_solver_copy_weights");
    for (const std::string& path : hn::detail::split_commas(paths, hn::detail::EmptyItems::drop))
      check_file(path, "hn_solver_copy_weights");
    solver_of(solver, "hn_solver_copy_weights").copy_weights(paths);
  });
}

int32_t hn_solver_iter(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->iter() : 0;
}

float hn_solver_loss(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->last_loss() : 0.0f;
}

float hn_solver_learning_rate(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->learning_rate() : 0.0f;
}

hn_status hn_solver_net(hn_solver* solver, hn_net** out) {
  return guarded([&] {
    hn::Net& net = solver_of(solver, "hn_solver_net").net();
    set_out(out, owned(net_handle(solver->box, net)), "hn_solver_net");
  });
}

int32_t hn_solver_num_test_nets(const hn_solver* solver) {
  return solver != nullptr ? solver->box->solver->num_test_nets() : 0;
}

hn_status hn_solver_test_net(hn_solver* solver, int32_t index, hn_net** out) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_test_net");
    if (index < 0 || index >= s.num_test_nets()) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("hn_solver_test_net: the solver has {} test "
                                                  "nets, not {}",
                                                  s.num_test_nets(), index));
    }
    set_out(out, owned(net_handle(solver->box, s.test_net(index))), "hn_solver_test_net");
  });
}

hn_status hn_solver_test(hn_solver* solver, int32_t index, int32_t* num_results) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_test");
    if (index < 0 || index >= s.num_test_nets()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_test: the solver has {} test nets, not {}", s.num_test_nets(),
                       index));
    }
    solver->box->results = s.test(index);
    if (num_results != nullptr) *num_results = static_cast<int32_t>(solver->box->results.size());
  });
}

hn_status hn_solver_result(const hn_solver* solver, int32_t index, const char** name,
                           float* value) {
  return guarded([&] {
    const auto& results = checked(solver, "hn_solver_result").box->results;
    if (index < 0 || index >= static_cast<int32_t>(results.size())) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_solver_result: {} results from the last hn_solver_test, not {}",
                       results.size(), index));
    }
    if (name != nullptr) *name = results[static_cast<std::size_t>(index)].first.c_str();
    if (value != nullptr) *value = results[static_cast<std::size_t>(index)].second;
  });
}

hn_status hn_solver_on_event(hn_solver* solver, hn_solver_callback callback, void* user_data) {
  return guarded([&] {
    hn::Solver& s = solver_of(solver, "hn_solver_on_event");
    if (callback == nullptr) {
      s.on_event(nullptr);
      return;
    }
    s.on_event([callback, user_data](const hn::SolverEvent& event) {
      const hn_solver_event view{&event};
      callback(&view, user_data);
    });
  });
}

int32_t hn_event_kind(const hn_solver_event* event) {
  if (event == nullptr) return -1;
  if (!event->event->snapshot.empty()) return HN_EVENT_SNAPSHOT;
  return event->event->phase == hn::Phase::test ? HN_EVENT_TEST : HN_EVENT_TRAIN;
}

int32_t hn_event_iter(const hn_solver_event* event) {
  return event != nullptr ? event->event->iter : 0;
}

int32_t hn_event_test_net(const hn_solver_event* event) {
  return event != nullptr ? event->event->test_net : 0;
}

float hn_event_loss(const hn_solver_event* event) {
  return event != nullptr ? event->event->loss : 0.0f;
}

float hn_event_learning_rate(const hn_solver_event* event) {
  return event != nullptr ? event->event->lr : 0.0f;
}

double hn_event_images_per_second(const hn_solver_event* event) {
  return event != nullptr ? event->event->images_per_s : 0.0;
}

int32_t hn_event_num_outputs(const hn_solver_event* event) {
  return event != nullptr ? static_cast<int32_t>(event->event->outputs.size()) : 0;
}

const char* hn_event_output(const hn_solver_event* event, int32_t index, float* value) {
  if (event == nullptr || index < 0 ||
      index >= static_cast<int32_t>(event->event->outputs.size())) {
    return nullptr;
  }
  const auto& output = event->event->outputs[static_cast<std::size_t>(index)];
  if (value != nullptr) *value = output.second;
  return output.first.c_str();
}

const char* hn_event_snapshot(const hn_solver_event* event) {
  return event != nullptr ? event->event->snapshot.c_str() : "";
}

// ---- collectives ----------------------------------------------------------------------------

hn_status hn_comm_create(const char* backend, double timeout_seconds, hn_comm** out) {
  return guarded([&] {
    hn::CommOptions options;
    if (timeout_seconds > 0) options.timeout_seconds = timeout_seconds;
    const std::string name = backend != nullptr ? backend : hn::default_communicator();
    auto box = std::make_shared<CommBox>();
    box->comm = hn::make_communicator(name, options);
    box->name = box->comm->name();
    set_out(out, owned(new hn_comm{std::move(box)}), "hn_comm_create");
  });
}

void hn_comm_destroy(hn_comm* comm) {
  delete comm;
}

int32_t hn_comm_rank(const hn_comm* comm) {
  return comm != nullptr ? comm->box->comm->rank() : 0;
}

int32_t hn_comm_size(const hn_comm* comm) {
  return comm != nullptr ? comm->box->comm->size() : 1;
}

const char* hn_comm_backend(const hn_comm* comm) {
  return comm != nullptr ? comm->box->name.c_str() : "";
}

hn_status hn_comm_allreduce(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                            int32_t average) {
  return guarded([&] {
    hn::Communicator& c = *checked(comm, "hn_comm_allreduce").box->comm;
    hn::Driver& d = *checked(driver, "hn_comm_allreduce").driver;
    if (data == nullptr && count > 0)
      fail(HN_ERROR_INVALID_ARGUMENT, "hn_comm_allreduce: NULL data");
    c.allreduce(d, data, count, average != 0 ? hn::ReduceOp::average : hn::ReduceOp::sum);
  });
}

hn_status hn_comm_broadcast(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                            int32_t root) {
  return guarded([&] {
    hn::Communicator& c = *checked(comm, "hn_comm_broadcast").box->comm;
    hn::Driver& d = *checked(driver, "hn_comm_broadcast").driver;
    if (root < 0 || root >= c.size()) {
      fail(HN_ERROR_INVALID_ARGUMENT,
           fmt::format("hn_comm_broadcast: root {} of {} ranks", root, c.size()));
    }
    if (data == nullptr && count > 0)
      fail(HN_ERROR_INVALID_ARGUMENT, "hn_comm_broadcast: NULL data");
    c.broadcast(d, data, count, root);
  });
}

hn_status hn_comm_barrier(hn_comm* comm) {
  return guarded([&] { checked(comm, "hn_comm_barrier").box->comm->barrier(); });
}

}  // extern "C"
