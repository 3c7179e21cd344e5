// The layer factory: Caffe's example nets build layer by layer, shapes infer through the real
// deploy nets as Caffe reports them, and each family of Caffe fields reaches its layer.
#include <google/protobuf/text_format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/layers/layer.h"
#include "lib/net/layer_factory.h"
#include "lib/proto/prototxt.h"
#include "tests/layer_support.h"

using Catch::Matchers::Contains;
using hn::Shape;
namespace fs = std::filesystem;
namespace pb = hybridnn::proto;

namespace {

const fs::path kModels = HYBRIDNN_MODELS_DIR;

pb::NetParameter read_model(const std::string& name) {
  const fs::path path = kModels / name;
  INFO("Caffe's example nets are expected in " << kModels.string());
  REQUIRE(fs::is_regular_file(path));
  return hn::detail::read_net_prototxt(path.string());
}

pb::LayerParameter parse_layer(const std::string& text) {
  pb::LayerParameter param;
  INFO(text);
  REQUIRE(google::protobuf::TextFormat::ParseFromString(text, &param));
  return param;
}

Shape to_shape(const pb::BlobShape& shape) {
  return Shape(std::vector<hn::index_t>(shape.dim().begin(), shape.dim().end()));
}

// Walks a deploy net in order as Caffe's Net::Init does: blob name -> shape, starting from
// the Input layer; an in-place top overwrites its bottom's entry.
std::map<std::string, Shape> infer_shapes(const pb::NetParameter& net) {
  std::map<std::string, Shape> blobs;
  for (const pb::LayerParameter& param : net.layer()) {
    INFO("layer " << param.name() << " (" << param.type() << ")");
    if (param.type() == "Input") {
      for (int i = 0; i < param.top_size(); ++i) {
        const int which = param.input_param().shape_size() == 1 ? 0 : i;
        blobs[param.top(i)] = to_shape(param.input_param().shape(which));
      }
      continue;
    }
    const auto layer = hn::detail::make_layer(param);
    std::vector<Shape> bottoms;
    for (const std::string& bottom : param.bottom()) {
      REQUIRE(blobs.count(bottom) == 1);
      bottoms.push_back(blobs.at(bottom));
    }
    const std::vector<Shape> tops = layer->setup(bottoms);
    REQUIRE(static_cast<int>(tops.size()) == param.top_size());
    for (int i = 0; i < param.top_size(); ++i)
      blobs[param.top(i)] = tops[static_cast<size_t>(i)];
  }
  return blobs;
}

// Runs forward on the reference driver; returns the outputs' values.
std::vector<std::vector<float>> forward(hn::Layer& layer, const std::vector<Shape>& input_shapes,
                                        const std::vector<std::vector<float>>& input_values,
                                        hn::Phase phase = hn::Phase::test) {
  const auto driver = hn::make_driver(hn::Device{"reference", 0});
  const std::vector<Shape> output_shapes = layer.setup(input_shapes);
  std::vector<hn::Tensor> inputs, outputs;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    inputs.emplace_back(input_shapes[i]);
    hn::test::set_values(inputs.back(), input_values[i]);
  }
  for (const Shape& shape : output_shapes)
    outputs.emplace_back(shape);
  std::vector<hn::Tensor*> in_ptrs, out_ptrs;
  for (auto& t : inputs)
    in_ptrs.push_back(&t);
  for (auto& t : outputs)
    out_ptrs.push_back(&t);
  hn::RunOptions options;
  options.phase = phase;
  options.seed = 7;
  hn::run_forward(layer, *driver, in_ptrs, out_ptrs, options);
  std::vector<std::vector<float>> result;
  for (auto& t : outputs)
    result.push_back(hn::test::values(t));
  return result;
}

std::vector<Shape> setup(const std::string& text, const std::vector<Shape>& inputs) {
  const auto layer = hn::detail::make_layer(parse_layer(text));
  return layer->setup(inputs);
}

}  // namespace

TEST_CASE("Every non-data layer of Caffe's example nets is built by the factory", "[factory]") {
  std::vector<fs::path> nets;
  for (const auto& entry : fs::directory_iterator(kModels)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".prototxt" && name.find("solver") == std::string::npos) {
      nets.push_back(entry.path());
    }
  }
  std::sort(nets.begin(), nets.end());
  REQUIRE(nets.size() >= 6);
  int built = 0;
  for (const fs::path& path : nets) {
    const pb::NetParameter net = hn::detail::read_net_prototxt(path.string());
    for (const pb::LayerParameter& param : net.layer()) {
      INFO(path.filename().string() << ": layer " << param.name() << " (" << param.type() << ")");
      if (hn::detail::is_data_layer_type(param.type())) continue;
      std::unique_ptr<hn::Layer> layer;
      REQUIRE_NOTHROW(layer = hn::detail::make_layer(param));
      REQUIRE(layer != nullptr);
      CHECK(layer->name() == param.name());
      CHECK(std::string(layer->type()) == param.type());
      ++built;
    }
  }
  CHECK(built > 50);
}

TEST_CASE("CaffeNet deploy infers Caffe's shapes through the built layers", "[factory]") {
  const auto blobs = infer_shapes(read_model("bvlc_reference_caffenet_deploy.prototxt"));
  // The file's Input layer is 10 x 3 x 227 x 227.
  CHECK(blobs.at("data") == Shape{10, 3, 227, 227});
  CHECK(blobs.at("conv1") == Shape{10, 96, 55, 55});  // (227 - 11) / 4 + 1
  CHECK(blobs.at("pool1") == Shape{10, 96, 27, 27});  // ceil((55 - 3) / 2) + 1
  CHECK(blobs.at("conv2") == Shape{10, 256, 27, 27});
  CHECK(blobs.at("conv5") == Shape{10, 256, 13, 13});
  CHECK(blobs.at("pool5") == Shape{10, 256, 6, 6});
  CHECK(blobs.at("fc6") == Shape{10, 4096});
  CHECK(blobs.at("fc8") == Shape{10, 1000});
  CHECK(blobs.at("prob") == Shape{10, 1000});
}

TEST_CASE("AlexNet deploy infers Caffe's shapes through the built layers", "[factory]") {
  const auto blobs = infer_shapes(read_model("bvlc_alexnet_deploy.prototxt"));
  CHECK(blobs.at("data") == Shape{10, 3, 227, 227});
  CHECK(blobs.at("conv1") == Shape{10, 96, 55, 55});
  CHECK(blobs.at("norm1") == Shape{10, 96, 55, 55});
  CHECK(blobs.at("pool1") == Shape{10, 96, 27, 27});
  CHECK(blobs.at("pool5") == Shape{10, 256, 6, 6});
  CHECK(blobs.at("fc6") == Shape{10, 4096});
  CHECK(blobs.at("prob") == Shape{10, 1000});
}

TEST_CASE("LeNet deploy infers Caffe's shapes through the built layers", "[factory]") {
  const auto blobs = infer_shapes(read_model("mnist_lenet.prototxt"));
  // The file's Input layer is 64 x 1 x 28 x 28.
  CHECK(blobs.at("conv1") == Shape{64, 20, 24, 24});
  CHECK(blobs.at("pool1") == Shape{64, 20, 12, 12});
  CHECK(blobs.at("conv2") == Shape{64, 50, 8, 8});
  CHECK(blobs.at("pool2") == Shape{64, 50, 4, 4});
  CHECK(blobs.at("ip1") == Shape{64, 500});
  CHECK(blobs.at("prob") == Shape{64, 10});
}

TEST_CASE("Unknown and data layer types are rejected with a helpful message", "[factory]") {
  const std::vector<std::string> expected{"Accuracy",      "BatchNorm",
                                          "Clip",          "Concat",
                                          "Convolution",   "Deconvolution",
                                          "Dropout",       "Eltwise",
                                          "EuclideanLoss", "Flatten",
                                          "InnerProduct",  "LRN",
                                          "LogSoftmax",    "Pad",
                                          "Permute",       "Pooling",
                                          "ReLU",          "Reshape",
                                          "Scale",         "ShuffleChannel",
                                          "Sigmoid",       "SigmoidCrossEntropyLoss",
                                          "Silence",       "Slice",
                                          "Softmax",       "SoftmaxWithLoss",
                                          "Split",         "Swish",
                                          "TanH"};
  CHECK(hn::detail::known_layer_types() == expected);
  CHECK_THROWS_WITH(
      hn::detail::make_layer(parse_layer(R"(name: "f" type: "Foo")")),
      Contains(
          "layer 'f': unknown layer type 'Foo'; known types: Accuracy, "
          "BatchNorm, Clip, Concat, Convolution, Deconvolution, Dropout, Eltwise, EuclideanLoss, "
          "Flatten, InnerProduct, LRN, LogSoftmax, Pad, Permute, Pooling, ReLU, Reshape, "
          "Scale, ShuffleChannel, Sigmoid, "
          "SigmoidCrossEntropyLoss, Silence, Slice, Softmax, SoftmaxWithLoss, Split, Swish, "
          "TanH"));
  for (const char* type : {"Data", "Input", "ImageData", "HDF5Data", "MemoryData", "DummyData"}) {
    INFO(type);
    CHECK_THROWS_WITH(
        hn::detail::make_layer(parse_layer(std::string("name: \"d\" type: \"") + type + "\"")),
        Contains(std::string("layer 'd': type '") + type +
                 "' is a data layer, handled by the Net"));
  }
}

TEST_CASE("Convolution fields map: _h/_w forms, repeated values, dilation, group, bias_term",
          "[factory]") {
  // Caffe: an _h/_w pair is chosen when either is set; pad_w then takes its default 0.
  CHECK(setup(R"(name: "c" type: "Convolution" convolution_param {
                   num_output: 4 kernel_h: 3 kernel_w: 5 pad_h: 1 stride_h: 1 stride_w: 2 })",
              {Shape{1, 2, 7, 9}}) == std::vector<Shape>{Shape{1, 4, 7, 3}});
  // stride_w alone leaves stride_h 0, which Caffe rejects.
  CHECK_THROWS_AS(setup(R"(name: "c" type: "Convolution" convolution_param {
                           num_output: 4 kernel_size: 3 stride_w: 2 })",
                        {Shape{1, 2, 7, 9}}),
                  hn::Error);
  const auto layer = hn::detail::make_layer(parse_layer(R"(name: "c" type: "Convolution"
      convolution_param { num_output: 4 kernel_size: 3 kernel_size: 5 stride: 2 pad: 1
                          dilation: 2 group: 2 bias_term: false })"));
  // Dilated extent 5 x 9: (11 + 2 - 5) / 2 + 1 = 5, (13 + 2 - 9) / 2 + 1 = 4.
  CHECK(layer->setup({Shape{1, 2, 11, 13}}) == std::vector<Shape>{Shape{1, 4, 5, 4}});
  REQUIRE(layer->params().size() == 1);
  CHECK(layer->params()[0].shape() == Shape{4, 1, 3, 5});
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(R"(name: "c" type: "Convolution"
      convolution_param { num_output: 4 kernel_size: 3 axis: 2 })")),
                    Contains("axis 2 is not supported"));
}

TEST_CASE("Pooling fields map: methods, global_pooling, _h/_w forms and Caffe's rules",
          "[factory]") {
  // AVE over the whole 2 x 3 plane of 1..6 is 3.5; MAX would give 6.
  const auto ave = hn::detail::make_layer(
      parse_layer(R"(name: "p" type: "Pooling" pooling_param { pool: AVE global_pooling: true })"));
  const auto y = forward(*ave, {Shape{1, 1, 2, 3}}, {{1, 2, 3, 4, 5, 6}});
  REQUIRE(y[0].size() == 1);
  CHECK(y[0][0] == Approx(3.5f));
  // Output ceil((8 + 2 - 3) / 2) + 1 = 5 rows; (9 + 4 - 4) / 1 + 1 = 10 columns.
  CHECK(setup(R"(name: "p" type: "Pooling" pooling_param {
                   kernel_h: 3 kernel_w: 4 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 2 })",
              {Shape{2, 3, 8, 9}}) == std::vector<Shape>{Shape{2, 3, 5, 10}});
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(R"(name: "p" type: "Pooling"
      pooling_param { kernel_size: 2 pad: 1 pad_h: 1 pad_w: 1 })")),
                    Contains("pad is pad OR pad_h and pad_w"));
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(R"(name: "p" type: "Pooling"
      pooling_param { kernel_size: 2 kernel_h: 2 kernel_w: 2 })")),
                    Contains("not both"));
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(R"(name: "p" type: "Pooling"
      pooling_param { pool: STOCHASTIC kernel_size: 2 })")),
                    Contains("STOCHASTIC is not supported"));
  // 0 is a value in the _h/_w form (Caffe accepts pad_h: 2 pad_w: 0), and a padded axis
  // drops the other axis's last window too: Caffe and PyTorch give 4 x 7.
  CHECK(setup(R"(name: "p" type: "Pooling" pooling_param {
                   kernel_h: 4 kernel_w: 1 stride: 2 pad_h: 2 pad_w: 0 })",
              {Shape{1, 1, 6, 14}}) == std::vector<Shape>{Shape{1, 1, 4, 7}});
  // round_mode FLOOR: floor((6 - 3) / 2) + 1 = 2, CEIL's 3.
  CHECK(setup(R"(name: "p" type: "Pooling" pooling_param {
                   kernel_size: 3 stride: 2 round_mode: FLOOR })",
              {Shape{1, 1, 6, 6}}) == std::vector<Shape>{Shape{1, 1, 2, 2}});
}

TEST_CASE("LRN refuses a negative alpha and k <= 0, which make its scale 0 or negative",
          "[factory]") {
  for (const char* bad : {"alpha: -1", "k: 0", "k: -2"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(setup(std::string(R"(name: "n" type: "LRN" lrn_param { )") + bad + " }",
                            {Shape{1, 3, 2, 2}}),
                      Contains("'n'") && (Contains("alpha") || Contains("k must be > 0")));
  }
  CHECK(setup(R"(name: "n" type: "LRN" lrn_param { norm_region: WITHIN_CHANNEL k: 0 })",
              {Shape{1, 3, 2, 2}}) == std::vector<Shape>{Shape{1, 3, 2, 2}});
}

TEST_CASE("LRN fields map: WITHIN_CHANNEL, local_size, alpha, beta", "[factory]") {
  // One pixel, local_size 3: Caffe's within-channel AVE pooling divides by the padded 3 x 3
  // window, so scale = 1 + 0.9 * 4 / 9 = 1.4 (across channels it would be 1 + 0.9 / 3 * 4).
  const auto within = hn::detail::make_layer(parse_layer(R"(name: "n" type: "LRN"
      lrn_param { norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.9 beta: 0.75 })"));
  const auto y = forward(*within, {Shape{1, 1, 1, 1}}, {{2.0f}});
  CHECK(y[0][0] == Approx(2.0 * std::pow(1.4, -0.75)).epsilon(1e-5));
  const auto across = hn::detail::make_layer(parse_layer(R"(name: "n" type: "LRN"
      lrn_param { local_size: 3 alpha: 0.9 beta: 0.5 k: 2 })"));
  const auto z = forward(*across, {Shape{1, 1, 1, 1}}, {{2.0f}});
  CHECK(z[0][0] == Approx(2.0 / std::sqrt(2.0 + 0.3 * 4)).epsilon(1e-5));
}

TEST_CASE("Slice, Concat, Split, Flatten and Reshape fields map", "[factory]") {
  const auto slice = hn::detail::make_layer(parse_layer(R"(name: "s" type: "Slice"
      bottom: "x" top: "a" top: "b" top: "c" slice_param { axis: -1 slice_point: 1 slice_point: 3 })"));
  CHECK(slice->setup({Shape{2, 3, 5}}) ==
        std::vector<Shape>{Shape{2, 3, 1}, Shape{2, 3, 2}, Shape{2, 3, 2}});
  CHECK(setup(R"(name: "s" type: "Slice" top: "a" top: "b" slice_param { slice_dim: 0 })",
              {Shape{4, 3}}) == std::vector<Shape>{Shape{2, 3}, Shape{2, 3}});
  CHECK(setup(R"(name: "c" type: "Concat" concat_param { concat_dim: 2 })",
              {Shape{2, 3, 4}, Shape{2, 3, 1}}) == std::vector<Shape>{Shape{2, 3, 5}});
  CHECK(setup(R"(name: "c" type: "Concat" concat_param { axis: 0 })", {Shape{2, 3}, Shape{1, 3}}) ==
        std::vector<Shape>{Shape{3, 3}});
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(
                        R"(name: "c" type: "Concat" concat_param { axis: 1 concat_dim: 1 })")),
                    Contains("either axis or concat_dim"));
  CHECK(setup(R"(name: "s" type: "Split" top: "a" top: "b" top: "c")", {Shape{2, 3}}) ==
        std::vector<Shape>(3, Shape{2, 3}));
  CHECK(setup(R"(name: "f" type: "Flatten" flatten_param { axis: 2 })", {Shape{2, 3, 4, 5}}) ==
        std::vector<Shape>{Shape{2, 3, 20}});
  CHECK(setup(R"(name: "f" type: "Flatten" flatten_param { axis: 0 end_axis: 1 })",
              {Shape{2, 3, 4}}) == std::vector<Shape>{Shape{6, 4}});
  CHECK(setup(R"(name: "r" type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } })",
              {Shape{2, 3, 4}}) == std::vector<Shape>{Shape{2, 12}});
  CHECK(setup(R"(name: "r" type: "Reshape"
                 reshape_param { shape { dim: 2 dim: 2 } axis: 1 num_axes: 1 })",
              {Shape{3, 4, 5}}) == std::vector<Shape>{Shape{3, 2, 2, 5}});
  // As Caffe: no shape is no dimensions (here: the input unchanged), and Flatten with
  // end_axis = axis - 1 inserts an axis of 1 (count(1, 1)).
  CHECK(setup(R"(name: "r" type: "Reshape" reshape_param { axis: 1 num_axes: 0 })",
              {Shape{2, 3}}) == std::vector<Shape>{Shape{2, 3}});
  CHECK(setup(R"(name: "f" type: "Flatten" flatten_param { axis: 1 end_axis: 0 })",
              {Shape{2, 3}}) == std::vector<Shape>{Shape{2, 1, 3}});
}

TEST_CASE("InnerProduct, BatchNorm and Scale fields map", "[factory]") {
  const auto ip = hn::detail::make_layer(parse_layer(R"(name: "ip" type: "InnerProduct"
      inner_product_param { num_output: 7 axis: 2 transpose: true bias_term: false })"));
  CHECK(ip->setup({Shape{2, 3, 4}}) == std::vector<Shape>{Shape{2, 3, 7}});
  REQUIRE(ip->params().size() == 1);
  CHECK(ip->params()[0].shape() == Shape{4, 7});  // transpose: K x N

  const auto global = hn::detail::make_layer(
      parse_layer(R"(name: "bn" type: "BatchNorm" batch_norm_param { use_global_stats: true })"));
  CHECK(global->splits_by_rows());
  CHECK_FALSE(global->updates_params_in_forward());
  const auto batch = hn::detail::make_layer(parse_layer(R"(name: "bn" type: "BatchNorm")"));
  CHECK_FALSE(batch->splits_by_rows());
  // A negative eps gave NaN for every channel whose variance is below it.
  CHECK_THROWS_WITH(
      setup(R"(name: "bn" type: "BatchNorm" batch_norm_param { eps: -1 })", {Shape{2, 3}}),
      Contains("'bn'") && Contains("eps must be >= 0"));

  const auto scale = hn::detail::make_layer(parse_layer(R"(name: "sc" type: "Scale"
      scale_param { bias_term: true filler { value: 3 } bias_filler { type: "constant" value: 2 } })"));
  const auto y = forward(*scale, {Shape{1, 2, 1}}, {{1.0f, -1.0f}});
  REQUIRE(scale->params().size() == 2);
  CHECK(y[0] == std::vector<float>{5.0f, -1.0f});  // 3 * x + 2
  CHECK_THROWS_WITH(hn::detail::make_layer(parse_layer(
                        R"(name: "sc" type: "Scale" scale_param { filler { type: "gaussian" } })")),
                    Contains("constant fillers only"));
}

TEST_CASE("Activation, Dropout and Eltwise fields map", "[factory]") {
  const auto relu = hn::detail::make_layer(
      parse_layer(R"(name: "r" type: "ReLU" relu_param { negative_slope: 0.25 })"));
  CHECK(forward(*relu, {Shape{2}}, {{-2.0f, 3.0f}})[0] == std::vector<float>{-0.5f, 3.0f});
  const auto sigmoid = hn::detail::make_layer(parse_layer(R"(name: "s" type: "Sigmoid")"));
  CHECK(forward(*sigmoid, {Shape{1}}, {{0.0f}})[0][0] == Approx(0.5f));
  const auto tanh = hn::detail::make_layer(parse_layer(R"(name: "t" type: "TanH")"));
  CHECK(forward(*tanh, {Shape{1}}, {{0.5f}})[0][0] == Approx(std::tanh(0.5f)));

  // Training with ratio 0.75: every kept value is scaled by exactly 1 / (1 - 0.75) = 4.
  const auto dropout = hn::detail::make_layer(
      parse_layer(R"(name: "d" type: "Dropout" dropout_param { dropout_ratio: 0.75 })"));
  const std::vector<float> ones(400, 1.0f);
  const auto dropped = forward(*dropout, {Shape{4, 100}}, {ones}, hn::Phase::train)[0];
  const auto kept = std::count(dropped.begin(), dropped.end(), 4.0f);
  CHECK(kept + std::count(dropped.begin(), dropped.end(), 0.0f) == 400);
  CHECK(kept > 50);
  CHECK(kept < 150);

  const auto sum = hn::detail::make_layer(parse_layer(
      R"(name: "e" type: "Eltwise" eltwise_param { operation: SUM coeff: 2 coeff: -1 })"));
  CHECK(forward(*sum, {Shape{2}, Shape{2}}, {{1, 2}, {5, 7}})[0] ==
        std::vector<float>{-3.0f, -3.0f});
  const auto prod = hn::detail::make_layer(
      parse_layer(R"(name: "e" type: "Eltwise" eltwise_param { operation: PROD })"));
  CHECK(forward(*prod, {Shape{2}, Shape{2}}, {{1, 2}, {5, 7}})[0] ==
        std::vector<float>{5.0f, 14.0f});
  const auto max = hn::detail::make_layer(
      parse_layer(R"(name: "e" type: "Eltwise" eltwise_param { operation: MAX })"));
  CHECK(forward(*max, {Shape{2}, Shape{2}}, {{1, 9}, {5, 7}})[0] == std::vector<float>{5.0f, 9.0f});
  // Caffe ignores MAX's coefficients (and refuses PROD's).
  const auto max_coeff = hn::detail::make_layer(parse_layer(
      R"(name: "e" type: "Eltwise" eltwise_param { operation: MAX coeff: 3 coeff: 3 })"));
  CHECK(forward(*max_coeff, {Shape{2}, Shape{2}}, {{1, 9}, {5, 7}})[0] ==
        std::vector<float>{5.0f, 9.0f});
  CHECK_THROWS_WITH(setup(R"(name: "e" type: "Eltwise" eltwise_param { operation: PROD coeff: 1
                                                                      coeff: 1 })",
                          {Shape{2}, Shape{2}}),
                    Contains("not PROD"));
}

TEST_CASE("Softmax, loss and Accuracy fields map", "[factory]") {
  // axis 2 on 2 x 3 x 4 scores takes 2 x 3 labels (axis 1 would need 2 x 4).
  CHECK(setup(R"(name: "l" type: "SoftmaxWithLoss" top: "loss" top: "prob"
                 softmax_param { axis: 2 })",
              {Shape{2, 3, 4}, Shape{2, 3}}) == std::vector<Shape>{Shape{}, Shape{2, 3, 4}});
  const auto softmax =
      hn::detail::make_layer(parse_layer(R"(name: "s" type: "Softmax" softmax_param { axis: 0 })"));
  const auto p = forward(*softmax, {Shape{2, 1}}, {{0.0f, 0.0f}})[0];
  CHECK(p == std::vector<float>{0.5f, 0.5f});  // axis 1 (one class) would give 1, 1

  // Zero scores over 3 classes: each valid position costs log 3; label 5 is ignored.
  const double log3 = std::log(3.0);
  const std::vector<float> zeros(6, 0.0f);
  struct Mode {
    const char* loss_param;
    double loss;
  };
  for (const Mode& mode : {Mode{"ignore_label: 5", log3},  // VALID: one valid position
                           Mode{"ignore_label: 5 normalization: FULL", log3 / 2},
                           Mode{"ignore_label: 5 normalization: NONE", log3},
                           Mode{"ignore_label: 5 normalize: false", log3 / 2}}) {
    INFO(mode.loss_param);
    const auto loss = hn::detail::make_layer(
        parse_layer(std::string(R"(name: "l" type: "SoftmaxWithLoss" top: "loss" loss_param { )") +
                    mode.loss_param + " }"));
    const auto out = forward(*loss, {Shape{2, 3}, Shape{2}}, {zeros, {0.0f, 5.0f}});
    CHECK(out[0][0] == Approx(mode.loss).epsilon(1e-5));
  }

  // x = 0 and label 1: each position costs log 2; BATCH_SIZE (the default) divides by 2.
  const auto sce = hn::detail::make_layer(parse_layer(
      R"(name: "l" type: "SigmoidCrossEntropyLoss" loss_param { normalization: NONE })"));
  CHECK(forward(*sce, {Shape{2, 2}, Shape{2, 2}}, {{0, 0, 0, 0}, {1, 1, 1, 1}})[0][0] ==
        Approx(4 * std::log(2.0)).epsilon(1e-5));
  const auto euclid = hn::detail::make_layer(parse_layer(R"(name: "l" type: "EuclideanLoss")"));
  CHECK(forward(*euclid, {Shape{1, 2}, Shape{1, 2}}, {{1, 2}, {3, 2}})[0][0] == Approx(2.0f));

  // Scores 0.1, 0.5, 0.4 with label 2: wrong at top 1, right at top 2; label 0 ignored.
  const auto top2 = hn::detail::make_layer(parse_layer(R"(name: "a" type: "Accuracy"
      top: "acc" top: "per_class" accuracy_param { top_k: 2 ignore_label: 0 })"));
  const auto acc =
      forward(*top2, {Shape{2, 3}, Shape{2}}, {{0.1f, 0.5f, 0.4f, 0.9f, 0.0f, 0.1f}, {2.0f, 0.0f}});
  REQUIRE(acc.size() == 2);
  CHECK(acc[0][0] == Approx(1.0f));
  CHECK(acc[1].size() == 3);
  const auto top1 = hn::detail::make_layer(parse_layer(R"(name: "a" type: "Accuracy" top: "acc")"));
  CHECK(forward(*top1, {Shape{1, 3}, Shape{1}}, {{0.1f, 0.5f, 0.4f}, {2.0f}})[0][0] ==
        Approx(0.0f));
}
