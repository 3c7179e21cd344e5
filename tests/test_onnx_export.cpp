// ONNX models out (issue 37): Caffe's zoo nets written as ONNX (Net::save_onnx) and read
// back compute, bitwise, what they computed; the ONNX file holds what ONNX expects (checked
// by ONNX's own checker on writing, and read here with its classes: the inputs, the
// outputs, the losses left out); ONNX -> Caffe's files (onnx_to_caffe) gives the same net
// again; a parameter with no ONNX equivalent is an error naming the layer, and no file is
// left. The
// comparison with ONNX Runtime is bindings/python/tests/test_onnx.py's.
#include <fmt/format.h>
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "lib/onnx/onnx_convert.h"
#include "tests/support.h"

namespace hn {
namespace {

using Catch::Matchers::Contains;

NetOptions test_options(int batch) {
  NetOptions options;
  options.state.phase = Phase::test;
  options.batch_size = batch;
  options.data_source = "synthetic:1x28x28";
  return options;
}

// A forward, then the values of every output blob.
std::vector<std::vector<float>> forward_outputs(Net& net) {
  net.forward();
  std::vector<std::vector<float>> outputs;
  for (const std::string& name : net.output_blob_names()) {
    const BlobRef blob = net.blob(name);
    outputs.emplace_back(blob.host_data(), blob.host_data() + blob.count());
  }
  return outputs;
}

// Every parameter drawn at random (a BatchNorm's variance positive and its scale factor 1,
// so that no output is a NaN), the inputs too; returns the outputs after a forward.
std::vector<std::vector<float>> fill_and_run(Net& net, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-0.5f, 0.5f);
  for (const NetParam& param : net.learnable_params()) {
    float* data = param.tensor->host_data_mut();
    std::string type;
    for (int l = 0; l < net.num_layers(); ++l)
      if (net.layer_name(l) == param.layer) type = net.layer_type(l);
    // Weights scaled by their fan-in, so that the outputs stay spread (a softmax of large
    // values is mostly zeros).
    const Shape& shape = param.tensor->shape();
    const float scale =
        shape.axes() >= 2 ? std::sqrt(12.0f / static_cast<float>(shape.count() / shape[0])) : 1.0f;
    for (index_t i = 0; i < param.tensor->count(); ++i) {
      float value = scale * uniform(random);
      if (type == "BatchNorm" && param.index == 1) value = 1.0f + value;  // variance
      if (type == "BatchNorm" && param.index == 2) value = 1.0f;          // scale factor
      data[i] = value;
    }
  }
  std::mt19937 inputs(seed + 1);
  for (const std::string& name : net.input_blob_names()) {
    const BlobRef blob = net.blob(name);
    float* data = blob.host_data_mut();
    for (index_t i = 0; i < blob.count(); ++i)
      data[i] = uniform(inputs);
  }
  return forward_outputs(net);
}

// `to`'s inputs set to `from`'s blobs of the same names (an Input's, or what a data layer
// read), then `to`'s outputs.
std::vector<std::vector<float>> run_like(Net& to, Net& from) {
  const std::vector<std::string> names = to.input_blob_names();
  REQUIRE_FALSE(names.empty());
  for (const std::string& name : names) {
    const BlobRef source = from.blob(name), target = to.blob(name);
    REQUIRE(source.count() == target.count());
    std::copy(source.host_data(), source.host_data() + source.count(), target.host_data_mut());
  }
  return forward_outputs(to);
}

onnx::ModelProto read_model(const std::string& path) {
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(model.ParseFromIstream(&in));
  return model;
}

TEST_CASE(
    "Caffe's zoo nets written as ONNX and read back compute bitwise what they computed "
    "(LeNet, GoogLeNet, ResNet-50, MobileNet v1)",
    "[onnx]") {
  test::TempDir dir("hybridnn-onnx-export");
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  for (const char* file : {"mnist_lenet_train_test.prototxt", "bvlc_googlenet_deploy.prototxt",
                           "resnet50_deploy.prototxt", "mobilenet_v1_deploy.prototxt"}) {
    INFO(file);
    const std::string name = std::string(file).substr(0, std::string(file).find('.'));
    // Small inputs where the net allows (ResNet-50's last pooling is a fixed 7x7).
    const bool lenet = name == "mnist_lenet_train_test";
    Net caffe(fmt::format("{}/{}", HYBRIDNN_MODELS_DIR, file), runtime, cpu,
              test_options(lenet ? 3 : 1));
    const std::vector<std::vector<float>> want = fill_and_run(caffe, 7);
    const std::string path = dir.file(name + ".onnx");
    caffe.save_onnx(path);

    const onnx::ModelProto model = read_model(path);
    CHECK(model.opset_import(0).version() == 13);
    REQUIRE(model.graph().input_size() == 1);
    CHECK(model.graph().input(0).name() == "data");
    CHECK(model.graph().input(0).type().tensor_type().shape().dim(0).dim_param() == "N");
    if (lenet) {
      // The label, the loss and the accuracy are not part of the model: ip2 is its output.
      REQUIRE(model.graph().output_size() == 1);
      CHECK(model.graph().output(0).name() == "ip2");
    }

    Net back(path, runtime, cpu, test_options(lenet ? 3 : 1));
    const std::vector<std::vector<float>> got = run_like(back, caffe);
    // The deploy nets' one output is their Softmax; LeNet's TEST net outputs its loss and
    // accuracy, the ONNX model ip2: compare that blob.
    if (lenet) {
      const BlobRef ip2 = caffe.blob("ip2");
      REQUIRE(got.size() == 1);
      CHECK(got[0] == std::vector<float>(ip2.host_data(), ip2.host_data() + ip2.count()));
    } else {
      CHECK(got == want);
    }
    // Many distinct values: the comparison sees the weights.
    const std::vector<float>& first = lenet ? got[0] : want[0];
    CHECK(std::set<float>(first.begin(), first.end()).size() > first.size() / 2);
  }
}

TEST_CASE("an ONNX model converted to Caffe's prototxt and caffemodel is the same net", "[onnx]") {
  test::TempDir dir("hybridnn-onnx-to-caffe");
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  Net caffe(fmt::format("{}/bvlc_googlenet_deploy.prototxt", HYBRIDNN_MODELS_DIR), runtime, cpu,
            test_options(1));
  const std::vector<std::vector<float>> want = fill_and_run(caffe, 11);
  caffe.save_onnx(dir.file("googlenet.onnx"));
  onnx_to_caffe(dir.file("googlenet.onnx"), dir.file("googlenet.prototxt"),
                dir.file("googlenet.caffemodel"));
  Net converted(dir.file("googlenet.prototxt"), runtime, cpu, test_options(1));
  CHECK(converted.copy_trained_layers_from(dir.file("googlenet.caffemodel")).empty());
  CHECK(run_like(converted, caffe) == want);
}

TEST_CASE(
    "a layer parameter with no ONNX equivalent is an error naming it, and no file is "
    "written",
    "[onnx]") {
  test::TempDir dir("hybridnn-onnx-export-refused");
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  const auto refused = [&](const char* body, const char* name) {
    const std::string text = std::string(R"(name: "small"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 4 dim: 3 dim: 3 } } }
)") + body;
    const std::unique_ptr<Net> net =
        Net::from_text(text, "small.prototxt", runtime, cpu, test_options(2));
    const std::string path = dir.file(std::string(name) + ".onnx");
    const std::string message = test::error_of([&] { net->save_onnx(path); });
    CHECK_FALSE(std::filesystem::exists(path));
    return message;
  };
  SECTION("an InnerProduct from axis 2") {
    const std::string message = refused(
        R"(layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y"
              inner_product_param { num_output: 2 axis: 2 } })",
        "fc");
    CHECK_THAT(message, Contains("net 'small'") && Contains("layer 'fc' (InnerProduct)") &&
                            Contains("axis 2"));
  }
  SECTION("an Eltwise sum with coefficients") {
    const std::string message = refused(
        R"(layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "x" top: "y"
              eltwise_param { operation: SUM coeff: 1 coeff: 2 } })",
        "coeff");
    CHECK_THAT(message, Contains("layer 'sum' (Eltwise)") && Contains("coeff 2"));
  }
  SECTION("an LRN within channels") {
    const std::string message = refused(
        R"(layer { name: "norm" type: "LRN" bottom: "x" top: "y"
              lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL } })",
        "lrn");
    CHECK_THAT(message, Contains("layer 'norm' (LRN)") && Contains("WITHIN_CHANNEL"));
  }
}

}  // namespace
}  // namespace hn
