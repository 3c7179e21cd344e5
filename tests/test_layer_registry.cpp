// The layer registry: a layer type defined here, outside the library, registered as a
// program would, named in a prototxt and run in a net split across two drivers; the traits
// the Net plans with; and the registry's own errors.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/layer.h"
#include "lib/layers/registry.h"
#include "lib/net/net.h"
#include "tests/net_runs.h"
#include "tests/support.h"

using Catch::Matchers::Contains;

namespace {

// y = alpha x, alpha from python_param's param_str (Caffe's way of parameterising a layer
// of the program's own), through driver calls only, so it runs on any driver and on any
// rows of the batch.
class ScaledCopyLayer final : public hn::Layer {
 public:
  ScaledCopyLayer(std::string name, float alpha) : Layer(std::move(name)), alpha_(alpha) {}
  const char* type() const override { return "TestScaledCopy"; }
  std::vector<hn::Shape> setup(const std::vector<hn::Shape>& inputs) override {
    check_input_count(inputs, 1, 1);
    return {inputs[0]};
  }
  void forward(const hn::LayerSlice& slice) override {
    const hn::index_t n =
        slice.inputs[0].shape.count(1, slice.inputs[0].shape.axes()) * slice.rows();
    slice.driver->axpby(n, alpha_, slice.inputs[0].x(), 0.0f, slice.outputs[0].mutable_x());
  }
  void backward(const hn::LayerSlice& slice) override {
    if (!slice.propagate_down[0]) return;
    const hn::index_t n =
        slice.inputs[0].shape.count(1, slice.inputs[0].shape.axes()) * slice.rows();
    slice.driver->axpby(n, alpha_, slice.outputs[0].dx(), 0.0f, slice.inputs[0].mutable_dx());
  }

 private:
  float alpha_;
};

// Registered once per process (the tests may run in any order, several in one process).
void register_scaled_copy() {
  static const bool registered = [] {
    hn::LayerType type;
    type.name = "TestScaledCopy";
    type.make = [](const hybridnn::proto::LayerParameter& param) -> std::unique_ptr<hn::Layer> {
      const std::string& text = param.python_param().param_str();
      return std::make_unique<ScaledCopyLayer>(param.name(), text.empty() ? 1.0f : std::stof(text));
    };
    type.element_wise = true;
    hn::register_layer_type(std::move(type));
    return true;
  }();
  static_cast<void>(registered);
}

constexpr const char* kNet = R"(
name: "own_layer"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 3 dim: 6 dim: 6 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "own" type: "TestScaledCopy" bottom: "conv" top: "own"
  python_param { param_str: "3" } }
layer { name: "ip" type: "InnerProduct" bottom: "own" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
)";

}  // namespace

TEST_CASE(
    "a layer type registered from outside the library runs in a net split across two "
    "drivers, as it does unsplit",
    "[registry]") {
  register_scaled_copy();
  hn::test::TwoDrivers d;
  const auto run = [&](const std::string& split) {
    hn::NetOptions options;
    options.force_backward = true;
    options.keep_blobs = {"conv", "own"};
    if (!split.empty()) options.split = hn::Split::parse(split);
    std::unique_ptr<hn::Net> net =
        hn::Net::from_text(kNet, "own_layer.prototxt", d.runtime, *d.host, options);
    net->clear_param_diffs();
    hn::test::NetGradients result;
    result.loss = net->forward_backward();
    // The layer computed what it says, on every row: 3 x its input, exactly.
    const hn::BlobRef conv = net->blob("conv");
    const hn::BlobRef own = net->blob("own");
    REQUIRE(own.count() == conv.count());
    const float* x = conv.host_data();
    const float* y = own.host_data();
    hn::index_t wrong = 0;
    for (hn::index_t i = 0; i < own.count(); ++i)
      wrong += y[i] != 3.0f * x[i] ? 1 : 0;
    CHECK(wrong == 0);
    result.gradients = hn::test::param_gradients(*net);
    return result;
  };
  const hn::test::NetGradients whole = run("");
  REQUIRE(whole.gradients.size() == 4);  // conv and ip, weights and bias
  for (const char* split : {"reference:0.5,reference:1:0.5", "reference:0.25,reference:1:0.75"}) {
    INFO("split " << split);
    const hn::test::NetGradients cut = run(split);
    CHECK(cut.loss == Approx(whole.loss).epsilon(1e-6));
    for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
      INFO("parameter " << g);
      CHECK(hn::test::max_scaled_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
    }
  }
}

TEST_CASE(
    "the layer registry lists the built-in types once, refuses a second entry of a name, "
    "and says which types can be cut by outputs",
    "[registry]") {
  register_scaled_copy();
  const std::vector<std::string> names = hn::layer_type_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  for (const char* name : {"Convolution", "InnerProduct", "ReLU", "TestScaledCopy"}) {
    INFO(name);
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
  CHECK(hn::find_layer_type("NoSuchType") == nullptr);

  hn::LayerType again;
  again.name = "ReLU";
  again.make = [](const hybridnn::proto::LayerParameter&) -> std::unique_ptr<hn::Layer> {
    return nullptr;
  };
  CHECK_THROWS_WITH(hn::register_layer_type(again), Contains("'ReLU' is already registered"));
  hn::LayerType nameless;
  CHECK_THROWS_WITH(hn::register_layer_type(nameless), Contains("needs a name"));

  // The traits the Net reads instead of type names.
  CHECK(hn::find_layer_type("BatchNorm")->statistics);
  CHECK(hn::find_layer_type("BatchNorm")->fusion == hn::FusionRole::norm);
  CHECK(hn::find_layer_type("Scale")->fusion == hn::FusionRole::affine);
  CHECK(hn::find_layer_type("ReLU")->fusion == hn::FusionRole::rectifier);
  CHECK(hn::find_layer_type("Eltwise")->fusion == hn::FusionRole::sum);
  CHECK(hn::find_layer_type("InnerProduct")->cut.has_value());
  CHECK(static_cast<bool>(hn::find_layer_type("Convolution")->filler));

  // A cut asked of a type that cannot be cut names the types that can.
  hn::test::TwoDrivers d;
  std::string text = kNet;
  const std::string at = "python_param { param_str: \"3\" }";
  text.replace(text.find(at), at.size(),
               at + " split_axis: OUTPUT split { device: \"reference\" "
                    "fraction: 0.5 } split { device: \"reference:1\" "
                    "fraction: 0.5 }");
  CHECK_THROWS_WITH(
      hn::Net::from_text(text, "own_layer.prototxt", d.runtime, *d.host, {}),
      Contains("a TestScaledCopy layer cannot be cut so (types that can: Convolution, "
               "InnerProduct)"));
}
