// ONNX models in (issue 37), on models built with ONNX's own classes (libonnx-dev): a small
// net read from ONNX computes, bitwise, what the same net written by hand as a prototxt
// computes with the same weights; and hostile files (truncated, sizes that lie, shapes too
// large for memory, external data outside the model's folder) are errors naming the file,
// never a crash or a read out of bounds (this suite also runs under AddressSanitizer). The
// comparison with PyTorch and torchvision's models is bindings/python/tests/test_onnx.py.
#include <onnx/onnx_pb.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "tests/support.h"

namespace hn {
namespace {

using Catch::Matchers::Contains;

void add_float_tensor(onnx::TensorProto& t, const std::string& name,
                      const std::vector<std::int64_t>& dims, const std::vector<float>& values) {
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : dims)
    t.add_dims(d);
  t.set_raw_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

void add_value(onnx::ValueInfoProto& info, const std::string& name,
               const std::vector<std::int64_t>& dims) {
  info.set_name(name);
  onnx::TypeProto_Tensor& tensor = *info.mutable_type()->mutable_tensor_type();
  tensor.set_elem_type(onnx::TensorProto::FLOAT);
  for (std::int64_t d : dims) {
    onnx::TensorShapeProto_Dimension& dim = *tensor.mutable_shape()->add_dim();
    if (d < 0) {
      dim.set_dim_param("batch");
    } else {
      dim.set_dim_value(d);
    }
  }
}

onnx::NodeProto& add_node(onnx::GraphProto& graph, const std::string& op,
                          const std::vector<std::string>& inputs, const std::string& output) {
  onnx::NodeProto& node = *graph.add_node();
  node.set_op_type(op);
  node.set_name(op + "_node");
  for (const std::string& in : inputs)
    node.add_input(in);
  node.add_output(output);
  return node;
}

void set_ints(onnx::NodeProto& node, const std::string& name, const std::vector<std::int64_t>& v) {
  onnx::AttributeProto& a = *node.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (std::int64_t x : v)
    a.add_ints(x);
}

void set_int(onnx::NodeProto& node, const std::string& name, std::int64_t v) {
  onnx::AttributeProto& a = *node.add_attribute();
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
}

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * static_cast<float>((i * 7919) % 23) - scale * 11.0f;
  return v;
}

// x [N, 3, 6, 6] -> Conv 4x3x3x3 pad 1 (+bias) -> Relu -> MaxPool 2x2/2 -> Flatten
// -> Gemm transB (5 outputs) -> y; N symbolic.
struct SmallModel {
  onnx::ModelProto model;
  std::vector<float> conv_w = ramp(4 * 3 * 3 * 3, 0.05f), conv_b = ramp(4, 0.1f);
  std::vector<float> fc_w = ramp(5 * 36, 0.02f), fc_b = ramp(5, 0.3f);

  SmallModel() {
    model.set_ir_version(8);
    onnx::OperatorSetIdProto& opset = *model.add_opset_import();
    opset.set_domain("");
    opset.set_version(13);
    onnx::GraphProto& g = *model.mutable_graph();
    g.set_name("small");
    add_value(*g.add_input(), "x", {-1, 3, 6, 6});
    add_value(*g.add_output(), "y", {-1, 5});
    add_float_tensor(*g.add_initializer(), "conv_w", {4, 3, 3, 3}, conv_w);
    add_float_tensor(*g.add_initializer(), "conv_b", {4}, conv_b);
    add_float_tensor(*g.add_initializer(), "fc_w", {5, 36}, fc_w);
    add_float_tensor(*g.add_initializer(), "fc_b", {5}, fc_b);
    set_ints(add_node(g, "Conv", {"x", "conv_w", "conv_b"}, "c"), "pads", {1, 1, 1, 1});
    add_node(g, "Relu", {"c"}, "r");
    onnx::NodeProto& pool = add_node(g, "MaxPool", {"r"}, "p");
    set_ints(pool, "kernel_shape", {2, 2});
    set_ints(pool, "strides", {2, 2});
    add_node(g, "Flatten", {"p"}, "f");
    set_int(add_node(g, "Gemm", {"f", "fc_w", "fc_b"}, "y"), "transB", 1);
  }
  onnx::TensorProto& initializer(int index) {
    return *model.mutable_graph()->mutable_initializer(index);
  }
  std::string save(const test::TempDir& dir, const std::string& name = "small.onnx") const {
    const std::string path = dir.file(name);
    std::ofstream out(path, std::ios::binary);
    REQUIRE(model.SerializeToOstream(&out));
    return path;
  }
};

constexpr const char* kSamePrototxt = R"(
name: "small"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 } }
layer { name: "relu" type: "ReLU" bottom: "c" top: "r" }
layer { name: "pool" type: "Pooling" bottom: "r" top: "p"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 round_mode: FLOOR } }
layer { name: "flatten" type: "Flatten" bottom: "p" top: "f" }
layer { name: "fc" type: "InnerProduct" bottom: "f" top: "y" inner_product_param { num_output: 5 } }
)";

// y for x = ramp on `net`, whose parameters (conv w, b, fc w, b) are set when given.
std::vector<float> output(Net& net, const std::vector<std::vector<float>>* params = nullptr) {
  if (params != nullptr) {
    const std::vector<NetParam>& learnable = net.learnable_params();
    REQUIRE(learnable.size() == params->size());
    for (std::size_t i = 0; i < learnable.size(); ++i) {
      REQUIRE(learnable[i].tensor->count() == static_cast<index_t>((*params)[i].size()));
      std::copy((*params)[i].begin(), (*params)[i].end(), learnable[i].tensor->host_data_mut());
    }
  }
  const std::vector<float> x = ramp(2 * 3 * 6 * 6, 0.25f);
  std::copy(x.begin(), x.end(), net.blob("x").host_data_mut());
  net.forward();
  const BlobRef y = net.blob("y");
  return std::vector<float>(y.host_data(), y.host_data() + y.count());
}

NetOptions test_options() {
  NetOptions options;
  options.state.phase = Phase::test;
  options.batch_size = 2;
  return options;
}

TEST_CASE("an ONNX model computes, bitwise, what the same net written as a prototxt computes",
          "[onnx]") {
  test::TempDir dir("hybridnn-onnx");
  SmallModel small;
  const std::string path = small.save(dir);
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  Net imported(path, runtime, cpu, test_options());
  CHECK(imported.blob("x").shape->dims() == std::vector<index_t>{2, 3, 6, 6});
  const std::unique_ptr<Net> written =
      Net::from_text(kSamePrototxt, "same.prototxt", runtime, cpu, test_options());
  const std::vector<std::vector<float>> params{small.conv_w, small.conv_b, small.fc_w, small.fc_b};
  const std::vector<float> want = output(*written, &params);
  const std::vector<float> got = output(imported);
  CHECK(got == want);
  // Not all zeros or all equal: the comparison sees the weights.
  CHECK(std::count(want.begin(), want.end(), want.front()) == 1);
}

TEST_CASE("hostile ONNX files are errors naming the file, not crashes", "[onnx]") {
  test::TempDir dir("hybridnn-onnx-hostile");
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  const auto refused = [&](const std::string& path) {
    try {
      Net net(path, runtime, cpu, test_options());
    } catch (const Error& failure) {
      return std::string(failure.what());
    }
    FAIL("no error for " << path);
    return std::string();
  };
  SECTION("truncated") {
    const std::string whole = SmallModel().save(dir);
    std::ifstream in(whole, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string path = dir.file("truncated.onnx");
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    CHECK_THAT(refused(path), Contains(path));
  }
  SECTION("raw data shorter than the shape") {
    SmallModel small;
    small.initializer(0).mutable_raw_data()->resize(40);
    const std::string path = small.save(dir);
    CHECK_THAT(refused(path), Contains(path) && Contains("conv_w"));
  }
  SECTION("a shape too large for any memory") {
    SmallModel small;
    onnx::TensorProto& w = small.initializer(2);
    w.set_dims(0, std::int64_t{1} << 40);
    w.set_dims(1, std::int64_t{1} << 20);
    const std::string path = small.save(dir);
    CHECK_THAT(refused(path), Contains(path));
  }
  // The convolution's weights moved to an external file at `location`.
  const auto external = [&](const std::string& location) {
    SmallModel small;
    onnx::TensorProto& w = small.initializer(0);
    w.clear_raw_data();
    w.set_data_location(onnx::TensorProto::EXTERNAL);
    onnx::StringStringEntryProto& entry = *w.add_external_data();
    entry.set_key("location");
    entry.set_value(location);
    return small.save(dir);
  };
  SECTION("external data outside the model's folder") {
    const std::string path = external("../../etc/passwd");
    CHECK_THAT(refused(path), Contains(path));
  }
  SECTION("external data past the end of its file") {
    std::ofstream(dir.file("weights.bin"), std::ios::binary) << std::string(100, '\0');
    const std::string path = external("weights.bin");
    CHECK_THAT(refused(path), Contains(path) && Contains("weights.bin"));
  }
  SECTION("weights of 86 dimensions (a fuzz finding: libonnx's shape inference crashed)") {
    const std::string path = std::string(HYBRIDNN_SOURCE_DIR) +
                             "/fuzz/corpus/onnx_model/regression_shape_inference_crash.onnx";
    CHECK_THAT(refused(path), Contains(path) && Contains("2-D convolutions"));
  }
  SECTION("a node reading a value no node computes") {
    SmallModel small;
    small.model.mutable_graph()->mutable_node(1)->set_input(0, "nowhere");
    const std::string path = small.save(dir);
    CHECK_THAT(refused(path), Contains(path));
  }
}

}  // namespace
}  // namespace hn
