// hybridnn's header-only C++ API: RAII classes over the C ABI (hybridnn_c.h). A program
// includes this header and links libhybridnn only (no C++ symbols of the library are
// used), so it may be built with another compiler, standard library or C++ standard
// (C++17 or later). Failures throw hn::Error with the library's message.
//
//   hn::Runtime runtime;
//   hn::Driver cpu = runtime.add("cpu");
//   hn::Net net(runtime, cpu, "deploy.prototxt", hn::NetOptions().set("phase", "test"));
//   net.copy_from("weights.caffemodel");
//   hn::Tensor data = net.blob("data");
//   std::copy(image.begin(), image.end(), data.data(HN_OVERWRITE));
//   net.forward();
//   const float* prob = net.blob("prob").data(HN_READ);
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hybridnn/error.h"
#include "hybridnn/hybridnn_c.h"

namespace hn {

namespace c_api {

// Throws hn::Error with the calling thread's last error when `status` is not HN_OK.
inline void check(hn_status status) {
  if (status != HN_OK) {
    throw Error(std::string(hn_last_error()) + " [" + hn_status_name(status) + "]");
  }
}

// A string a call returns (NULL: it failed).
inline std::string text(const char* returned) {
  if (returned == nullptr) throw Error(hn_last_error());
  return returned;
}

inline std::vector<std::string> names(const char* comma_separated) {
  std::vector<std::string> list;
  const std::string all = text(comma_separated);
  std::size_t start = 0;
  while (start < all.size()) {
    std::size_t comma = all.find(',', start);
    if (comma == std::string::npos) comma = all.size();
    list.push_back(all.substr(start, comma - start));
    start = comma + 1;
  }
  return list;
}

// Owns one handle of the C ABI.
template <class T, void (*Destroy)(T*)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T* handle) : handle_(handle) {}
  Handle(Handle&& other) noexcept : handle_(other.release()) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(nullptr); }
  T* get() const { return handle_; }
  T* release() noexcept {
    T* handle = handle_;
    handle_ = nullptr;
    return handle;
  }
  void reset(T* handle) noexcept {
    if (handle_ != nullptr) Destroy(handle_);
    handle_ = handle;
  }

 private:
  T* handle_ = nullptr;
};

}  // namespace c_api

// "MAJOR.MINOR.PATCH" of the library loaded at run time.
inline std::string version() {
  return hn_version();
}

// The most host memory one allocation of the library may ask for (hn_host_memory_limit),
// setting it (0: the default again), and the process's peak resident memory in bytes.
inline std::uint64_t memory_limit() {
  return hn_host_memory_limit();
}
inline void set_memory_limit(std::uint64_t bytes) {
  hn_set_host_memory_limit(bytes);
}
inline std::uint64_t peak_resident_memory() {
  return hn_peak_resident_bytes();
}

// The devices usable on this machine and build ("reference", "cpu", "cuda:0", ...).
inline std::vector<std::string> available_devices() {
  const char* devices = nullptr;
  c_api::check(hn_available_devices(&devices));
  return c_api::names(devices);
}

// The hybridnn tool's command line (hn_tool_main): args[0] is the program's name, args[1]
// the command ("train", "test", "time", "device_query", "convert", "help"), then its flags.
// Prints as the hybridnn executable does and returns its exit status (0; 1 an error; 2 a
// usage error).
inline int tool_main(const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  for (const std::string& arg : args)
    argv.push_back(arg.c_str());
  return hn_tool_main(static_cast<int>(argv.size()), argv.data());
}

class Runtime;

// A driver of a Runtime ("cpu", "reference", "cuda:N"); keeps its runtime alive.
class Driver {
 public:
  std::string name() const { return hn_driver_name(handle_.get()); }
  std::string description() const { return hn_driver_description(handle_.get()); }
  hn_driver* get() const { return handle_.get(); }

 private:
  friend class Runtime;
  explicit Driver(hn_driver* handle) : handle_(handle) {}
  c_api::Handle<hn_driver, hn_driver_destroy> handle_;
};

// The drivers a program computes with.
class Runtime {
 public:
  Runtime() {
    hn_runtime* runtime = nullptr;
    c_api::check(hn_runtime_create(&runtime));
    handle_.reset(runtime);
  }
  // Adds (or finds) the driver of `device`; options "threads=2,blas=openblas" for cpu.
  Driver add(const std::string& device, const std::string& options = "") {
    hn_driver* driver = nullptr;
    c_api::check(hn_runtime_add_driver(handle_.get(), device.c_str(),
                                       options.empty() ? nullptr : options.c_str(), &driver));
    return Driver(driver);
  }
  hn_runtime* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_runtime, hn_runtime_destroy> handle_;
};

// A float32 tensor in C order: the library's memory, the caller's (wrap), or a net's blob.
class Tensor {
 public:
  // Library memory of these dimensions, zero-filled.
  explicit Tensor(const std::vector<int64_t>& dims) {
    hn_tensor* tensor = nullptr;
    c_api::check(hn_tensor_create(static_cast<int32_t>(dims.size()), dims.data(), &tensor));
    handle_.reset(tensor);
  }
  // The caller's arrays (count() floats each; diff may be null), used in place; `driver`
  // says whose memory they are (null: host memory).
  static Tensor wrap(const std::vector<int64_t>& dims, float* data, float* diff = nullptr,
                     const Driver* driver = nullptr) {
    hn_tensor* tensor = nullptr;
    c_api::check(hn_tensor_wrap(static_cast<int32_t>(dims.size()), dims.data(), data, diff,
                                driver != nullptr ? driver->get() : nullptr, &tensor));
    return Tensor(tensor);
  }
  // Takes ownership of a handle the C ABI returned.
  explicit Tensor(hn_tensor* handle) : handle_(handle) {}

  std::vector<int64_t> dims() const {
    std::vector<int64_t> dims(static_cast<std::size_t>(hn_tensor_axes(handle_.get())));
    c_api::check(hn_tensor_dims(handle_.get(), dims.data(), static_cast<int32_t>(dims.size())));
    return dims;
  }
  int64_t count() const { return hn_tensor_count(handle_.get()); }
  // Host pointers to the values and the gradient for HN_READ, HN_WRITE or HN_OVERWRITE,
  // valid until the library next uses the tensor.
  float* data(int32_t access = HN_WRITE) {
    float* address = nullptr;
    c_api::check(hn_tensor_data(handle_.get(), access, &address));
    return address;
  }
  float* diff(int32_t access = HN_WRITE) {
    float* address = nullptr;
    c_api::check(hn_tensor_diff(handle_.get(), access, &address));
    return address;
  }
  std::vector<float> values() {
    const float* at = data(HN_READ);
    return std::vector<float>(at, at + count());
  }
  std::vector<float> gradient() {
    const float* at = diff(HN_READ);
    return std::vector<float>(at, at + count());
  }
  void set_values(const std::vector<float>& values) { assign(values, data(HN_OVERWRITE)); }
  void set_gradient(const std::vector<float>& values) { assign(values, diff(HN_OVERWRITE)); }
  hn_tensor* get() const { return handle_.get(); }

 private:
  void assign(const std::vector<float>& values, float* to) const {
    if (static_cast<int64_t>(values.size()) != hn_tensor_count(handle_.get())) {
      throw Error("Tensor: " + std::to_string(values.size()) + " values for a tensor of " +
                  std::to_string(hn_tensor_count(handle_.get())));
    }
    for (std::size_t i = 0; i < values.size(); ++i)
      to[i] = values[i];
  }
  c_api::Handle<hn_tensor, hn_tensor_destroy> handle_;
};

namespace c_api {

inline std::vector<hn_tensor*> handles(const std::vector<Tensor*>& tensors) {
  std::vector<hn_tensor*> list;
  for (Tensor* tensor : tensors)
    list.push_back(tensor != nullptr ? tensor->get() : nullptr);
  return list;
}

}  // namespace c_api

// One Caffe layer run as a kernel on tensors (the caller's arrays through Tensor::wrap).
class Layer {
 public:
  // From one LayerParameter in prototxt text:
  //   name: "conv" type: "Convolution" convolution_param { num_output: 8 kernel_size: 3 }
  explicit Layer(const std::string& layer_prototxt) {
    hn_layer* layer = nullptr;
    c_api::check(hn_layer_create(layer_prototxt.c_str(), &layer));
    handle_.reset(layer);
  }
  std::string type() const { return hn_layer_type(handle_.get()); }
  void set_phase(int32_t phase) { c_api::check(hn_layer_set_phase(handle_.get(), phase)); }
  // Cuts the batch among `runtime`'s drivers ("cpu:0.5,reference:0.5"; "" for none).
  void set_split(Runtime& runtime, const std::string& split) {
    c_api::check(hn_layer_set_split(handle_.get(), runtime.get(), split.c_str()));
  }
  // Shapes the layer for these inputs; returns the outputs' dimensions.
  std::vector<std::vector<int64_t>> setup(const std::vector<Tensor*>& inputs) {
    const std::vector<hn_tensor*> in = c_api::handles(inputs);
    int32_t outputs = 0;
    c_api::check(
        hn_layer_setup(handle_.get(), static_cast<int32_t>(in.size()), in.data(), &outputs));
    std::vector<std::vector<int64_t>> dims;
    for (int32_t i = 0; i < outputs; ++i) {
      int32_t axes = 0;
      c_api::check(hn_layer_output_shape(handle_.get(), i, &axes, nullptr, 0));
      std::vector<int64_t> at(static_cast<std::size_t>(axes));
      c_api::check(hn_layer_output_shape(handle_.get(), i, &axes, at.data(), axes));
      dims.push_back(std::move(at));
    }
    return dims;
  }
  int32_t num_params() const { return hn_layer_num_params(handle_.get()); }
  // Parameter `index` (weights 0, bias 1): the layer's own or the one set.
  Tensor param(int32_t index) {
    hn_tensor* tensor = nullptr;
    c_api::check(hn_layer_param(handle_.get(), index, &tensor));
    return Tensor(tensor);
  }
  // Computes with `param` (e.g. the caller's weights, wrapped) as parameter `index`.
  void set_param(int32_t index, const Tensor& param) {
    c_api::check(hn_layer_set_param(handle_.get(), index, param.get()));
  }
  void forward(const Driver& driver, const std::vector<Tensor*>& inputs,
               const std::vector<Tensor*>& outputs) {
    const std::vector<hn_tensor*> in = c_api::handles(inputs), out = c_api::handles(outputs);
    c_api::check(hn_layer_forward(handle_.get(), driver.get(), in.data(), out.data()));
  }
  // propagate_down: per input (empty: every input that takes a gradient).
  void backward(const Driver& driver, const std::vector<Tensor*>& inputs,
                const std::vector<Tensor*>& outputs, const std::vector<bool>& propagate_down = {}) {
    const std::vector<hn_tensor*> in = c_api::handles(inputs), out = c_api::handles(outputs);
    std::vector<int32_t> flags(propagate_down.begin(), propagate_down.end());
    c_api::check(hn_layer_backward(handle_.get(), driver.get(), in.data(), out.data(),
                                   propagate_down.empty() ? nullptr : flags.data()));
  }
  hn_layer* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_layer, hn_layer_destroy> handle_;
};

// Options of a Net (keys in hybridnn_c.h: phase, batch, split, weights, ...).
class NetOptions {
 public:
  NetOptions() {
    hn_net_options* options = nullptr;
    c_api::check(hn_net_options_create(&options));
    handle_.reset(options);
  }
  NetOptions& set(const std::string& key, const std::string& value) {
    c_api::check(hn_net_options_set(handle_.get(), key.c_str(), value.c_str()));
    return *this;
  }
  const hn_net_options* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_net_options, hn_net_options_destroy> handle_;
};

// A Caffe net (prototxt) on a driver.
class Net {
 public:
  Net(Runtime& runtime, const Driver& driver, const std::string& prototxt_path,
      const NetOptions& options = NetOptions()) {
    hn_net* net = nullptr;
    c_api::check(
        hn_net_create(runtime.get(), driver.get(), prototxt_path.c_str(), options.get(), &net));
    handle_.reset(net);
  }
  static Net from_text(Runtime& runtime, const Driver& driver, const std::string& prototxt,
                       const NetOptions& options = NetOptions(),
                       const std::string& origin = "<text>") {
    hn_net* net = nullptr;
    c_api::check(hn_net_create_from_text(runtime.get(), driver.get(), prototxt.c_str(),
                                         origin.c_str(), options.get(), &net));
    return Net(net);
  }
  // Takes ownership of a handle the C ABI returned.
  explicit Net(hn_net* handle) : handle_(handle) {}

  std::string name() const { return hn_net_name(handle_.get()); }
  // Returns the weighted sum of the loss outputs.
  float forward() {
    float loss = 0.0f;
    c_api::check(hn_net_forward(handle_.get(), &loss));
    return loss;
  }
  void backward() { c_api::check(hn_net_backward(handle_.get())); }
  float forward_backward() {
    const float loss = forward();
    backward();
    return loss;
  }
  void clear_param_diffs() { c_api::check(hn_net_clear_param_diffs(handle_.get())); }
  void copy_from(const std::string& caffemodel_paths) {
    c_api::check(hn_net_copy_from(handle_.get(), caffemodel_paths.c_str()));
  }
  void save(const std::string& caffemodel_path) {
    c_api::check(hn_net_save(handle_.get(), caffemodel_path.c_str()));
  }
  // The net and its weights as an ONNX model (hn_net_save_onnx).
  void save_onnx(const std::string& onnx_path) {
    c_api::check(hn_net_save_onnx(handle_.get(), onnx_path.c_str()));
  }
  int32_t num_layers() const { return hn_net_num_layers(handle_.get()); }
  std::string layer_name(int32_t index) const {
    return c_api::text(hn_net_layer_name(handle_.get(), index));
  }
  std::string layer_type(int32_t index) const {
    return c_api::text(hn_net_layer_type(handle_.get(), index));
  }
  std::string layer_split(int32_t index) {
    return c_api::text(hn_net_layer_split(handle_.get(), index));
  }
  std::vector<std::string> blob_names() { return c_api::names(hn_net_blob_names(handle_.get())); }
  std::vector<std::string> input_names() { return c_api::names(hn_net_input_names(handle_.get())); }
  std::vector<std::string> output_names() {
    return c_api::names(hn_net_output_names(handle_.get()));
  }
  Tensor blob(const std::string& name) {
    hn_tensor* tensor = nullptr;
    c_api::check(hn_net_blob(handle_.get(), name.c_str(), &tensor));
    return Tensor(tensor);
  }
  int32_t num_params() const { return hn_net_num_params(handle_.get()); }
  std::string param_name(int32_t index) const {
    return c_api::text(hn_net_param_name(handle_.get(), index));
  }
  Tensor param(int32_t index) {
    hn_tensor* tensor = nullptr;
    c_api::check(hn_net_param(handle_.get(), index, &tensor));
    return Tensor(tensor);
  }
  void calibrate_splits() { c_api::check(hn_net_calibrate_splits(handle_.get())); }
  hn_net* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_net, hn_net_destroy> handle_;
};

// The ranks of a data-parallel run (started by mpirun), or this process alone.
class Communicator {
 public:
  // backend: "auto", "ring", "hier", "mpi", "local", or "" for the default (auto under
  // mpirun, else local); timeout_seconds <= 0: 300.
  explicit Communicator(const std::string& backend = "", double timeout_seconds = 0.0) {
    hn_comm* comm = nullptr;
    c_api::check(
        hn_comm_create(backend.empty() ? nullptr : backend.c_str(), timeout_seconds, &comm));
    handle_.reset(comm);
  }
  int32_t rank() const { return hn_comm_rank(handle_.get()); }
  int32_t size() const { return hn_comm_size(handle_.get()); }
  std::string backend() const { return hn_comm_backend(handle_.get()); }
  void allreduce(const Driver& driver, float* data, std::size_t count, bool average = false) {
    c_api::check(hn_comm_allreduce(handle_.get(), driver.get(), data, count, average ? 1 : 0));
  }
  void broadcast(const Driver& driver, float* data, std::size_t count, int32_t root) {
    c_api::check(hn_comm_broadcast(handle_.get(), driver.get(), data, count, root));
  }
  void barrier() { c_api::check(hn_comm_barrier(handle_.get())); }
  hn_comm* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_comm, hn_comm_destroy> handle_;
};

// Options of a Solver (keys in hybridnn_c.h: train_data, max_iter, split, ...).
class SolverOptions {
 public:
  SolverOptions() {
    hn_solver_options* options = nullptr;
    c_api::check(hn_solver_options_create(&options));
    handle_.reset(options);
  }
  SolverOptions& set(const std::string& key, const std::string& value) {
    c_api::check(hn_solver_options_set(handle_.get(), key.c_str(), value.c_str()));
    return *this;
  }
  SolverOptions& set_communicator(Communicator& comm) {
    c_api::check(hn_solver_options_set_communicator(handle_.get(), comm.get()));
    return *this;
  }
  const hn_solver_options* get() const { return handle_.get(); }

 private:
  c_api::Handle<hn_solver_options, hn_solver_options_destroy> handle_;
};

// What a Solver reports: display (kind HN_EVENT_TRAIN), test and snapshot events.
struct SolverEvent {
  int32_t kind = HN_EVENT_TRAIN;
  int32_t iter = 0;
  int32_t test_net = 0;
  float loss = 0.0f;
  float learning_rate = 0.0f;
  double images_per_second = 0.0;
  std::vector<std::pair<std::string, float>> outputs;
  std::string snapshot;
};

// Caffe's training loop from a SolverParameter prototxt.
class Solver {
 public:
  Solver(Runtime& runtime, const Driver& driver, const std::string& solver_prototxt_path,
         const SolverOptions& options = SolverOptions())
      : listener_(std::make_unique<Listener>()) {
    hn_solver* solver = nullptr;
    c_api::check(hn_solver_create(runtime.get(), driver.get(), solver_prototxt_path.c_str(),
                                  options.get(), &solver));
    handle_.reset(solver);
    listener_->solver = solver;
  }
  // Display, test and snapshot events, on the training thread. An exception the callback
  // throws stops training after the current iteration and is rethrown by solve / step.
  void on_event(std::function<void(const SolverEvent&)> callback) {
    listener_->callback = std::move(callback);
    c_api::check(hn_solver_on_event(handle_.get(), listener_->callback ? &Listener::call : nullptr,
                                    listener_.get()));
  }
  void solve() { run(hn_solver_solve(handle_.get())); }
  void step(int32_t iterations) { run(hn_solver_step(handle_.get(), iterations)); }
  void request_stop() { hn_solver_request_stop(handle_.get()); }
  // Writes a snapshot; returns the .caffemodel's path.
  std::string snapshot() {
    const char* path = nullptr;
    c_api::check(hn_solver_snapshot(handle_.get(), &path));
    return path;
  }
  void restore(const std::string& solverstate_path) {
    c_api::check(hn_solver_restore(handle_.get(), solverstate_path.c_str()));
  }
  void copy_weights(const std::string& caffemodel_paths) {
    c_api::check(hn_solver_copy_weights(handle_.get(), caffemodel_paths.c_str()));
  }
  int32_t iter() const { return hn_solver_iter(handle_.get()); }
  float loss() const { return hn_solver_loss(handle_.get()); }
  float learning_rate() const { return hn_solver_learning_rate(handle_.get()); }
  Net net() {
    hn_net* net = nullptr;
    c_api::check(hn_solver_net(handle_.get(), &net));
    return Net(net);
  }
  int32_t num_test_nets() const { return hn_solver_num_test_nets(handle_.get()); }
  Net test_net(int32_t index) {
    hn_net* net = nullptr;
    c_api::check(hn_solver_test_net(handle_.get(), index, &net));
    return Net(net);
  }
  // Runs test net `index` and returns the mean of each output.
  std::vector<std::pair<std::string, float>> test(int32_t index) {
    int32_t count = 0;
    c_api::check(hn_solver_test(handle_.get(), index, &count));
    std::vector<std::pair<std::string, float>> results;
    for (int32_t i = 0; i < count; ++i) {
      const char* name = nullptr;
      float value = 0.0f;
      c_api::check(hn_solver_result(handle_.get(), i, &name, &value));
      results.emplace_back(name, value);
    }
    return results;
  }
  hn_solver* get() const { return handle_.get(); }

 private:
  struct Listener {
    std::function<void(const SolverEvent&)> callback;
    std::exception_ptr error;
    hn_solver* solver = nullptr;

    static void call(const hn_solver_event* event, void* user_data) {
      auto* self = static_cast<Listener*>(user_data);
      if (self->error) return;
      try {
        SolverEvent e;
        e.kind = hn_event_kind(event);
        e.iter = hn_event_iter(event);
        e.test_net = hn_event_test_net(event);
        e.loss = hn_event_loss(event);
        e.learning_rate = hn_event_learning_rate(event);
        e.images_per_second = hn_event_images_per_second(event);
        for (int32_t i = 0; i < hn_event_num_outputs(event); ++i) {
          float value = 0.0f;
          const char* name = hn_event_output(event, i, &value);
          e.outputs.emplace_back(name != nullptr ? name : "", value);
        }
        e.snapshot = hn_event_snapshot(event);
        self->callback(e);
      } catch (...) {
        self->error = std::current_exception();
        hn_solver_request_stop(self->solver);
      }
    }
  };

  void run(hn_status status) {
    if (listener_->error) {
      std::exception_ptr error = listener_->error;
      listener_->error = nullptr;
      std::rethrow_exception(error);
    }
    c_api::check(status);
  }

  c_api::Handle<hn_solver, hn_solver_destroy> handle_;
  std::unique_ptr<Listener> listener_;
};

}  // namespace hn
