// hybridnn._core: the Python bindings, over the header-only C++ API (hybridnn.hpp) and so
// over the C ABI of libhybridnn.so only. numpy arrays go in and out without copies: a
// Tensor can wrap an array's memory (keeping the array alive), and Tensor.data / .diff are
// numpy views of the tensor's host memory whose base keeps the tensor (and the net or
// layer behind it) alive.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <hybridnn/hybridnn.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using Array = py::array_t<float, py::array::c_style>;

// A Tensor and the Python objects whose memory it wraps.
struct PyTensor {
  hn::Tensor tensor;
  py::object data_owner, diff_owner;
};

std::vector<int64_t> dims_of(const py::array& array) {
  return std::vector<int64_t>(array.shape(), array.shape() + array.ndim());
}

// An array we may hand to the library: float32, C-contiguous, writeable.
py::array checked_array(const py::object& object, const char* what) {
  if (!py::isinstance<py::array>(object)) {
    throw py::type_error(std::string(what) + ": expected a numpy array");
  }
  py::array array = object.cast<py::array>();
  if (!array.dtype().is(py::dtype::of<float>())) {
    throw py::type_error(std::string(what) + ": expected float32, got " +
                         std::string(py::str(array.dtype())));
  }
  if ((array.flags() & py::array::c_style) == 0) {
    throw py::value_error(std::string(what) + ": the array must be C-contiguous");
  }
  if (!array.writeable()) throw py::value_error(std::string(what) + ": the array is read-only");
  return array;
}

// A numpy view of host memory whose base is `owner`.
py::array view(float* data, const std::vector<int64_t>& dims, py::handle owner) {
  std::vector<py::ssize_t> shape(dims.begin(), dims.end());
  return Array(shape, data, owner);
}

// Keyword options as the C ABI's key/value strings: True/False as on/off, lists joined
// with commas, anything else through str().
std::string option_text(const py::handle& value) {
  if (py::isinstance<py::bool_>(value)) return value.cast<bool>() ? "on" : "off";
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    std::string text;
    for (const py::handle item : value)
      text += (text.empty() ? "" : ",") + std::string(py::str(item));
    return text;
  }
  return py::str(value);
}

hn::NetOptions net_options(const py::kwargs& kwargs) {
  hn::NetOptions options;
  for (const auto& [key, value] : kwargs)
    options.set(py::str(key), option_text(value));
  return options;
}

std::vector<hn::Tensor*> tensors(const std::vector<PyTensor*>& list) {
  std::vector<hn::Tensor*> out;
  for (PyTensor* t : list)
    out.push_back(t != nullptr ? &t->tensor : nullptr);
  return out;
}

py::tuple tuple_of(const std::vector<int64_t>& dims) {
  py::tuple shape(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    shape[i] = dims[i];
  return shape;
}

// Host memory of a tensor's values or gradient.
float* memory(PyTensor& t, bool gradient, int32_t access) {
  return gradient ? t.tensor.diff(access) : t.tensor.data(access);
}

// Tensor.data / Tensor.diff: a numpy view whose base is the tensor.
py::array memory_view(const py::object& self, bool gradient) {
  PyTensor& t = self.cast<PyTensor&>();
  return view(memory(t, gradient, HN_WRITE), t.tensor.dims(), self);
}

// Assigning to Tensor.data / Tensor.diff: a copy in, converted to float32.
void assign(PyTensor& t, const py::array_t<float, py::array::forcecast>& values, bool gradient) {
  const py::array_t<float, py::array::c_style | py::array::forcecast> in(values);
  if (in.size() != t.tensor.count()) {
    throw py::value_error(std::string(gradient ? "Tensor.diff" : "Tensor.data") + ": " +
                          std::to_string(in.size()) + " values for a tensor of " +
                          std::to_string(t.tensor.count()));
  }
  std::copy(in.data(), in.data() + in.size(), memory(t, gradient, HN_OVERWRITE));
}

py::dict event_dict(const hn::SolverEvent& event) {
  static const char* const kinds[] = {"train", "test", "snapshot"};
  py::dict d;
  d["kind"] = event.kind >= 0 && event.kind <= 2 ? kinds[event.kind] : "unknown";
  d["iter"] = event.iter;
  d["test_net"] = event.test_net;
  d["loss"] = event.loss;
  d["lr"] = event.learning_rate;
  d["images_per_s"] = event.images_per_second;
  py::dict outputs;
  for (const auto& [name, value] : event.outputs)
    outputs[py::str(name)] = value;
  d["outputs"] = outputs;
  d["snapshot"] = event.snapshot;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "hybridnn's Python bindings over its C ABI (libhybridnn.so)";
  // Every failure of the library: a RuntimeError with its message.
  py::register_exception<hn::Error>(m, "Error", PyExc_RuntimeError);

  m.def("version", &hn::version, "The library's version, MAJOR.MINOR.PATCH.");
  m.def("abi_version", &hn_abi_version, "The C ABI's version (HN_ABI_VERSION).");
  m.def("memory_limit", &hn::memory_limit,
        "The most host memory one allocation of the library may ask for, in bytes.");
  m.def("set_memory_limit", &hn::set_memory_limit, py::arg("bytes"),
        "Sets the host memory limit (0: the default, physical memory plus swap).");
  m.def("peak_resident_memory", &hn::peak_resident_memory,
        "The process's peak resident memory so far, in bytes.");
  m.def("available_devices", &hn::available_devices,
        "The devices usable on this machine and build: reference, cpu, cuda:N ...");
  m.def(
      "tool_main",
      [](const std::vector<std::string>& args) {
        std::vector<const char*> argv;
        for (const std::string& arg : args)
          argv.push_back(arg.c_str());
        py::gil_scoped_release release;
        return hn_tool_main(static_cast<int>(argv.size()), argv.data());
      },
      py::arg("argv"),
      "Runs the hybridnn tool's command line (hn_tool_main): argv[0] the program's name, "
      "argv[1] the command; prints as the hybridnn executable and returns its exit status.");

  py::class_<hn::Driver>(m, "Driver", "A driver of a Runtime (cpu, reference, cuda:N).")
      .def_property_readonly("name", &hn::Driver::name)
      .def_property_readonly("description", &hn::Driver::description)
      .def("__repr__", [](const hn::Driver& d) { return "<hybridnn.Driver " + d.name() + ">"; });

  py::class_<hn::Runtime>(m, "Runtime", "The drivers a program computes with.")
      .def(py::init<>())
      .def("add", &hn::Runtime::add, py::arg("device"), py::arg("options") = "",
           "Adds (or finds) the driver of `device`; options 'threads=2,blas=openblas' for cpu.");

  py::class_<PyTensor>(m, "Tensor",
                       "A float32 tensor in C order: the library's memory, a numpy array's "
                       "(Tensor.wrap) or a net's blob.")
      .def(py::init([](const std::vector<int64_t>& shape) {
             return new PyTensor{hn::Tensor(shape), py::none(), py::none()};
           }),
           py::arg("shape"), "Library memory of this shape, zero-filled.")
      .def_static(
          "wrap",
          [](const py::object& data, const py::object& diff, const hn::Driver* driver) {
            py::array values = checked_array(data, "Tensor.wrap data");
            float* diff_pointer = nullptr;
            if (!diff.is_none()) {
              py::array gradient = checked_array(diff, "Tensor.wrap diff");
              if (dims_of(gradient) != dims_of(values)) {
                throw py::value_error("Tensor.wrap: data and diff have different shapes");
              }
              diff_pointer = static_cast<float*>(gradient.mutable_data());
            }
            hn::Tensor tensor = hn::Tensor::wrap(
                dims_of(values), static_cast<float*>(values.mutable_data()), diff_pointer, driver);
            return new PyTensor{std::move(tensor), values, diff};
          },
          py::arg("data"), py::arg("diff") = py::none(), py::arg("driver") = nullptr,
          "A tensor over numpy arrays' memory (float32, C-contiguous), used in place: the "
          "library reads and writes the arrays themselves.")
      .def_property_readonly("shape", [](const PyTensor& t) { return tuple_of(t.tensor.dims()); })
      .def_property_readonly("count", [](const PyTensor& t) { return t.tensor.count(); })
      .def_property(
          "data", [](const py::object& self) { return memory_view(self, false); },
          [](PyTensor& t, const py::array_t<float, py::array::forcecast>& values) {
            assign(t, values, false);
          },
          "The values as a numpy view of host memory (no copy; the view keeps the tensor "
          "alive). Assigning an array copies it in.")
      .def_property(
          "diff", [](const py::object& self) { return memory_view(self, true); },
          [](PyTensor& t, const py::array_t<float, py::array::forcecast>& values) {
            assign(t, values, true);
          },
          "The gradient as a numpy view, as data.")
      .def("__repr__", [](const PyTensor& t) {
        std::string text = "<hybridnn.Tensor ";
        for (int64_t d : t.tensor.dims())
          text += std::to_string(d) + "x";
        text.back() = '>';
        return text;
      });

  py::class_<hn::Layer>(m, "Layer", "One Caffe layer run as a kernel on tensors.")
      .def(py::init<const std::string&>(), py::arg("prototxt"),
           "From one LayerParameter in prototxt text, e.g. 'name: \"conv\" type: "
           "\"Convolution\" convolution_param { num_output: 8 kernel_size: 3 }'.")
      .def_property_readonly("type", &hn::Layer::type)
      .def(
          "set_phase",
          [](hn::Layer& layer, const std::string& phase) {
            if (phase != "train" && phase != "test") throw py::value_error("phase: train or test");
            layer.set_phase(phase == "train" ? HN_PHASE_TRAIN : HN_PHASE_TEST);
          },
          py::arg("phase"))
      .def("set_split", &hn::Layer::set_split, py::arg("runtime"), py::arg("split"),
           "Cuts the batch among the runtime's drivers ('cpu:0.5,reference:0.5'; '' for none).")
      .def(
          "setup",
          [](hn::Layer& layer, const std::vector<PyTensor*>& inputs) {
            std::vector<py::tuple> shapes;
            for (const std::vector<int64_t>& dims : layer.setup(tensors(inputs)))
              shapes.push_back(tuple_of(dims));
            return shapes;
          },
          py::arg("inputs"), "Shapes the layer for these inputs; returns the output shapes.")
      .def_property_readonly("num_params", &hn::Layer::num_params)
      .def(
          "param",
          [](hn::Layer& layer, int32_t index) {
            return new PyTensor{layer.param(index), py::none(), py::none()};
          },
          py::arg("index"))
      .def(
          "set_param",
          [](hn::Layer& layer, int32_t index, PyTensor& param) {
            layer.set_param(index, param.tensor);
          },
          py::arg("index"), py::arg("param"), py::keep_alive<1, 3>(),
          "Computes with `param` (e.g. a wrapped array) as parameter `index`.")
      .def(
          "forward",
          [](hn::Layer& layer, const hn::Driver& driver, const std::vector<PyTensor*>& inputs,
             const std::vector<PyTensor*>& outputs) {
            const std::vector<hn::Tensor*> in = tensors(inputs), out = tensors(outputs);
            py::gil_scoped_release release;
            layer.forward(driver, in, out);
          },
          py::arg("driver"), py::arg("inputs"), py::arg("outputs"))
      .def(
          "backward",
          [](hn::Layer& layer, const hn::Driver& driver, const std::vector<PyTensor*>& inputs,
             const std::vector<PyTensor*>& outputs, const std::vector<bool>& propagate_down) {
            const std::vector<hn::Tensor*> in = tensors(inputs), out = tensors(outputs);
            py::gil_scoped_release release;
            layer.backward(driver, in, out, propagate_down);
          },
          py::arg("driver"), py::arg("inputs"), py::arg("outputs"),
          py::arg("propagate_down") = std::vector<bool>{});

  py::class_<hn::Net>(m, "Net", "A Caffe net (prototxt) or an ONNX model (.onnx) on a driver.")
      .def(py::init([](hn::Runtime& runtime, const hn::Driver& driver, const std::string& path,
                       const py::kwargs& options) {
             return new hn::Net(runtime, driver, path, net_options(options));
           }),
           py::arg("runtime"), py::arg("driver"), py::arg("prototxt"),
           "Options as keywords: phase='test', batch=32, weights='x.caffemodel', "
           "split='cpu:0.5,cuda:0:0.5', force_backward=True, ... (hybridnn_c.h lists them).")
      .def_static(
          "from_text",
          [](hn::Runtime& runtime, const hn::Driver& driver, const std::string& text,
             const py::kwargs& options) {
            return hn::Net::from_text(runtime, driver, text, net_options(options));
          },
          py::arg("runtime"), py::arg("driver"), py::arg("text"))
      .def_static(
          "from_onnx",
          [](hn::Runtime& runtime, const hn::Driver& driver, const std::string& path,
             const py::kwargs& options) {
            const std::string suffix = ".onnx";
            if (path.size() < suffix.size() ||
                path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
              throw py::value_error("Net.from_onnx: '" + path + "' does not end in .onnx");
            return new hn::Net(runtime, driver, path, net_options(options));
          },
          py::arg("runtime"), py::arg("driver"), py::arg("path"),
          "An ONNX model's net with its weights (the same as Net(runtime, driver, path)); "
          "the graph inputs' symbolic batch is the `batch` option.")
      .def_property_readonly("name", &hn::Net::name)
      .def(
          "forward",
          [](hn::Net& net) {
            py::gil_scoped_release release;
            return net.forward();
          },
          "Runs every layer forward; returns the weighted loss.")
      .def("backward",
           [](hn::Net& net) {
             py::gil_scoped_release release;
             net.backward();
           })
      .def("clear_param_diffs", &hn::Net::clear_param_diffs)
      .def("copy_from", &hn::Net::copy_from, py::arg("caffemodel"))
      .def("save", &hn::Net::save, py::arg("caffemodel"))
      .def("save_onnx", &hn::Net::save_onnx, py::arg("path"),
           "Writes the net and its weights as an ONNX model (opset 13; losses and accuracies "
           "left out)")
      .def_property_readonly("layer_names",
                             [](const hn::Net& net) {
                               std::vector<std::string> names;
                               for (int32_t i = 0; i < net.num_layers(); ++i)
                                 names.push_back(net.layer_name(i));
                               return names;
                             })
      .def_property_readonly("layer_types",
                             [](const hn::Net& net) {
                               std::vector<std::string> types;
                               for (int32_t i = 0; i < net.num_layers(); ++i)
                                 types.push_back(net.layer_type(i));
                               return types;
                             })
      .def("layer_split", &hn::Net::layer_split, py::arg("index"))
      .def_property_readonly("blob_names", &hn::Net::blob_names)
      .def_property_readonly("inputs", &hn::Net::input_names)
      .def_property_readonly("outputs", &hn::Net::output_names)
      .def(
          "blob",
          [](hn::Net& net, const std::string& name) {
            return new PyTensor{net.blob(name), py::none(), py::none()};
          },
          py::arg("name"), "A blob as a Tensor (its data and diff; keeps the net alive).")
      .def_property_readonly("param_names",
                             [](const hn::Net& net) {
                               std::vector<std::string> names;
                               for (int32_t i = 0; i < net.num_params(); ++i)
                                 names.push_back(net.param_name(i));
                               return names;
                             })
      .def(
          "param",
          [](hn::Net& net, int32_t index) {
            return new PyTensor{net.param(index), py::none(), py::none()};
          },
          py::arg("index"))
      .def("calibrate_splits", &hn::Net::calibrate_splits);

  py::class_<hn::Communicator>(m, "Communicator",
                               "The ranks mpirun started, or this process alone.")
      .def(py::init<const std::string&, double>(), py::arg("backend") = "",
           py::arg("timeout") = 0.0)
      .def_property_readonly("rank", &hn::Communicator::rank)
      .def_property_readonly("size", &hn::Communicator::size)
      .def_property_readonly("backend", &hn::Communicator::backend)
      .def(
          "allreduce",
          [](hn::Communicator& comm, const hn::Driver& driver, const py::object& array,
             bool average) {
            py::array values = checked_array(array, "Communicator.allreduce");
            float* data = static_cast<float*>(values.mutable_data());
            const auto count = static_cast<std::size_t>(values.size());
            py::gil_scoped_release release;
            comm.allreduce(driver, data, count, average);
          },
          py::arg("driver"), py::arg("array"), py::arg("average") = false,
          "In place on a float32 numpy array: the sum (or mean) over the ranks.")
      .def(
          "broadcast",
          [](hn::Communicator& comm, const hn::Driver& driver, const py::object& array, int root) {
            py::array values = checked_array(array, "Communicator.broadcast");
            float* data = static_cast<float*>(values.mutable_data());
            const auto count = static_cast<std::size_t>(values.size());
            py::gil_scoped_release release;
            comm.broadcast(driver, data, count, root);
          },
          py::arg("driver"), py::arg("array"), py::arg("root") = 0)
      .def("barrier", [](hn::Communicator& comm) {
        py::gil_scoped_release release;
        comm.barrier();
      });

  py::class_<hn::Solver>(m, "Solver", "Caffe's training loop from a SolverParameter prototxt.")
      .def(py::init([](hn::Runtime& runtime, const hn::Driver& driver, const std::string& path,
                       hn::Communicator* communicator, const py::kwargs& kwargs) {
             hn::SolverOptions options;
             for (const auto& [key, value] : kwargs)
               options.set(py::str(key), option_text(value));
             if (communicator != nullptr) options.set_communicator(*communicator);
             return new hn::Solver(runtime, driver, path, options);
           }),
           py::arg("runtime"), py::arg("driver"), py::arg("solver"),
           py::arg("communicator") = nullptr,
           "Options as keywords: max_iter=1000, train_data='...', snapshot_prefix='...', "
           "split='...', ... (hybridnn_c.h lists them).")
      .def(
          "on_event",
          [](hn::Solver& solver, const py::object& callback) {
            if (callback.is_none()) {
              solver.on_event(nullptr);
              return;
            }
            auto held = std::make_shared<py::object>(callback);
            solver.on_event([held](const hn::SolverEvent& event) {
              py::gil_scoped_acquire acquire;
              (*held)(event_dict(event));
            });
          },
          py::arg("callback"),
          "Calls callback(event) on display, test and snapshot events; event is a dict "
          "(kind, iter, loss, lr, images_per_s, outputs, snapshot). An exception it raises "
          "stops training and comes out of step() / solve().")
      .def(
          "step",
          [](hn::Solver& solver, int32_t iterations) {
            py::gil_scoped_release release;
            solver.step(iterations);
          },
          py::arg("iterations"))
      .def("solve",
           [](hn::Solver& solver) {
             py::gil_scoped_release release;
             solver.solve();
           })
      .def("request_stop", &hn::Solver::request_stop)
      .def("snapshot", &hn::Solver::snapshot, "Writes a snapshot; returns the .caffemodel path.")
      .def("restore", &hn::Solver::restore, py::arg("solverstate"))
      .def("copy_weights", &hn::Solver::copy_weights, py::arg("caffemodel"))
      .def_property_readonly("iter", &hn::Solver::iter)
      .def_property_readonly("loss", &hn::Solver::loss)
      .def_property_readonly("learning_rate", &hn::Solver::learning_rate)
      .def_property_readonly("net", &hn::Solver::net)
      .def_property_readonly("num_test_nets", &hn::Solver::num_test_nets)
      .def("test_net", &hn::Solver::test_net, py::arg("index") = 0)
      .def(
          "test",
          [](hn::Solver& solver, int32_t index) {
            std::vector<std::pair<std::string, float>> results;
            {
              py::gil_scoped_release release;
              results = solver.test(index);
            }
            py::dict d;
            for (const auto& [name, value] : results)
              d[py::str(name)] = value;
            return d;
          },
          py::arg("index") = 0, "Runs test net `index`; returns each output's mean.");
}
