// The Caffe-compatible schema: Caffe's own example nets and solvers parse unchanged, text
// errors point at file:line:column, and binary files round-trip and fail clearly.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/proto/prototxt.h"

using Catch::Matchers::Contains;
namespace fs = std::filesystem;
namespace pb = hybridnn::proto;

namespace {

const fs::path kModels = HYBRIDNN_MODELS_DIR;

fs::path model(const std::string& name) {
  const fs::path path = kModels / name;
  INFO("Caffe's example nets are expected in " << kModels.string()
                                               << " (shared/models beside the repository)");
  REQUIRE(fs::is_regular_file(path));
  return path;
}

std::vector<fs::path> model_files() {
  INFO("Caffe's example nets are expected in " << kModels.string()
                                               << " (shared/models beside the repository)");
  REQUIRE(fs::is_directory(kModels));
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kModels)) {
    if (entry.path().extension() == ".prototxt") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Counts top-level `layer {` blocks by scanning the text: a reference independent of protobuf.
int count_top_level_layers(const fs::path& path) {
  std::ifstream file(path);
  const std::regex layer_start(R"(^layer\s*\{)");
  int count = 0;
  for (std::string line; std::getline(file, line);)
    count += std::regex_search(line, layer_start);
  return count;
}

const pb::LayerParameter& layer_named(const pb::NetParameter& net, const std::string& name) {
  for (const auto& layer : net.layer()) {
    if (layer.name() == name) return layer;
  }
  FAIL("no layer named " << name << " in net " << net.name());
  throw std::logic_error("unreachable");
}

// A temporary file removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_(fs::temp_directory_path() / ("hybridnn_test_proto_" + name)) {}
  ~TempFile() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const std::string& contents) const {
    std::ofstream file(path_, std::ios::binary | std::ios::trunc);
    file << contents;
  }
  std::string read() const {
    std::ifstream file(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

}  // namespace

TEST_CASE("every Caffe example net and solver parses unchanged", "[proto]") {
  const auto files = model_files();
  REQUIRE(files.size() >= 8);
  for (const auto& path : files) {
    INFO(path.string());
    if (path.filename().string().find("solver") != std::string::npos) {
      const pb::SolverParameter solver = hn::detail::read_solver_prototxt(path.string());
      CHECK(solver.has_net());
      CHECK(solver.max_iter() > 0);
    } else {
      const pb::NetParameter net = hn::detail::read_net_prototxt(path.string());
      CHECK(!net.name().empty());
      CHECK(net.layer_size() == count_top_level_layers(path));
      CHECK(net.layers_size() == 0);
    }
  }
}

TEST_CASE("LeNet train/test net has Caffe's layer parameters", "[proto]") {
  const auto net = hn::detail::read_net_prototxt(model("mnist_lenet_train_test.prototxt").string());
  CHECK(net.name() == "LeNet");
  REQUIRE(net.layer_size() == 11);

  const auto& train_data = net.layer(0);
  CHECK(train_data.type() == "Data");
  REQUIRE(train_data.include_size() == 1);
  CHECK(train_data.include(0).phase() == pb::TRAIN);
  CHECK(train_data.transform_param().scale() == 0.00390625f);
  CHECK(train_data.data_param().batch_size() == 64);
  CHECK(train_data.data_param().backend() == pb::DataParameter::LMDB);
  CHECK(train_data.data_param().source() == "examples/mnist/mnist_train_lmdb");
  CHECK(net.layer(1).include(0).phase() == pb::TEST);

  const auto& conv1 = layer_named(net, "conv1");
  CHECK(conv1.type() == "Convolution");
  CHECK(conv1.convolution_param().num_output() == 20);
  REQUIRE(conv1.convolution_param().kernel_size_size() == 1);
  CHECK(conv1.convolution_param().kernel_size(0) == 5);
  CHECK(conv1.convolution_param().weight_filler().type() == "xavier");
  REQUIRE(conv1.param_size() == 2);
  CHECK(conv1.param(1).lr_mult() == 2.0f);
  // Unset fields read Caffe's defaults.
  CHECK(conv1.convolution_param().group() == 1);
  CHECK(conv1.convolution_param().bias_term());

  const auto& pool1 = layer_named(net, "pool1");
  CHECK(pool1.pooling_param().pool() == pb::PoolingParameter::MAX);
  CHECK(pool1.pooling_param().kernel_size() == 2);
  CHECK(pool1.pooling_param().stride() == 2);

  CHECK(layer_named(net, "ip1").inner_product_param().num_output() == 500);
  CHECK(layer_named(net, "loss").type() == "SoftmaxWithLoss");
}

TEST_CASE("deploy nets declare their input through an Input layer", "[proto]") {
  const auto lenet = hn::detail::read_net_prototxt(model("mnist_lenet.prototxt").string());
  const auto& shape = lenet.layer(0).input_param().shape(0);
  REQUIRE(shape.dim_size() == 4);
  CHECK(shape.dim(0) == 64);
  CHECK(shape.dim(1) == 1);
  CHECK(shape.dim(2) == 28);
  CHECK(shape.dim(3) == 28);

  const auto alexnet =
      hn::detail::read_net_prototxt(model("bvlc_alexnet_deploy.prototxt").string());
  CHECK(alexnet.layer(0).input_param().shape(0).dim(2) == 227);
}

TEST_CASE("CaffeNet conv2 has 2 groups and LRN its across-channel parameters", "[proto]") {
  const auto net =
      hn::detail::read_net_prototxt(model("bvlc_reference_caffenet_deploy.prototxt").string());
  const auto& conv2 = layer_named(net, "conv2").convolution_param();
  CHECK(conv2.num_output() == 256);
  CHECK(conv2.group() == 2);
  CHECK(conv2.pad(0) == 2);
  CHECK(conv2.kernel_size(0) == 5);
  CHECK(layer_named(net, "conv1").convolution_param().stride(0) == 4);

  const auto& norm1 = layer_named(net, "norm1").lrn_param();
  CHECK(norm1.local_size() == 5);
  CHECK(norm1.alpha() == 0.0001f);
  CHECK(norm1.beta() == 0.75f);
  CHECK(norm1.norm_region() == pb::LRNParameter::ACROSS_CHANNELS);

  CHECK(layer_named(net, "drop6").dropout_param().dropout_ratio() == 0.5f);
  CHECK(layer_named(net, "prob").type() == "Softmax");
}

TEST_CASE("CIFAR-10 full net uses within-channel LRN", "[proto]") {
  const auto net =
      hn::detail::read_net_prototxt(model("cifar10_cifar10_full_train_test.prototxt").string());
  const auto& norm1 = layer_named(net, "norm1").lrn_param();
  CHECK(norm1.local_size() == 3);
  CHECK(norm1.alpha() == 5e-05f);
  CHECK(norm1.norm_region() == pb::LRNParameter::WITHIN_CHANNEL);
}

TEST_CASE("solver files read Caffe's solver fields and defaults", "[proto]") {
  const auto lenet =
      hn::detail::read_solver_prototxt(model("mnist_lenet_solver.prototxt").string());
  CHECK(lenet.net() == "examples/mnist/lenet_train_test.prototxt");
  REQUIRE(lenet.test_iter_size() == 1);
  CHECK(lenet.test_iter(0) == 100);
  CHECK(lenet.base_lr() == 0.01f);
  CHECK(lenet.lr_policy() == "inv");
  CHECK(lenet.power() == 0.75f);
  CHECK(lenet.max_iter() == 10000);
  CHECK(lenet.solver_mode() == pb::SolverParameter::GPU);
  CHECK(lenet.type() == "SGD");  // default

  const auto quick =
      hn::detail::read_solver_prototxt(model("cifar10_cifar10_quick_solver.prototxt").string());
  CHECK(quick.lr_policy() == "fixed");
  CHECK(quick.weight_decay() == 0.004f);
  CHECK(quick.max_iter() == 4000);
}

TEST_CASE("a malformed prototxt reports file:line:column", "[proto]") {
  TempFile file("malformed.prototxt");
  file.write("name: \"broken\"\nlayer {\n  name: \"conv1\"\n  num_outputs: 3\n}\n");
  // Protobuf reports the column where it noticed the error: just after the unknown name.
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt(file.path()),
                      Contains(file.path() + ":4:14:") && Contains("num_outputs"));

  file.write("layer {\n  name: \"conv1\"\n");
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt(file.path()), Contains(file.path() + ":"));
}

TEST_CASE("a missing prototxt names the path", "[proto]") {
  const std::string missing = (fs::temp_directory_path() / "hybridnn_no_such.prototxt").string();
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt(missing), Contains(missing));
  REQUIRE_THROWS_WITH(hn::detail::read_solver_prototxt(missing), Contains(missing));
}

TEST_CASE("a directory, a FIFO or a file past 2 GiB is refused before it is read, naming it",
          "[proto]") {
  const fs::path dir = fs::temp_directory_path() / "hybridnn_proto_not_files";
  fs::remove_all(dir);
  fs::create_directories(dir / "model.prototxt");
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt((dir / "model.prototxt").string()),
                      Contains("model.prototxt") && Contains("is a directory"));
  const std::string fifo = (dir / "pipe.prototxt").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a FIFO with no writer would block: refused from its type alone.
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt(fifo),
                      Contains("pipe.prototxt") && Contains("not a regular file"));
  // A sparse 3 GiB file (no disk used): a text proto is streamed, so the NUL bytes after
  // the 'x' fail at line 1 without the file read whole (resident memory would rise by 3 GiB);
  // a binary one is refused from its size.
  const fs::path huge = dir / "huge.prototxt";
  std::ofstream(huge).put('x');
  fs::resize_file(huge, std::uintmax_t{3} << 30);
  const std::size_t peak_before = hn::peak_resident_bytes();
  REQUIRE_THROWS_WITH(hn::detail::read_net_prototxt(huge.string()), Contains("huge.prototxt:1:"));
  if (peak_before > 0) CHECK(hn::peak_resident_bytes() < peak_before + (std::size_t{1} << 30));
  pb::NetParameter net;
  REQUIRE_THROWS_WITH(hn::detail::read_binary_proto(huge.string(), net), Contains("2 GiB limit"));
  fs::remove_all(dir);
}

TEST_CASE("a NetParameter with blobs and splits round-trips through a binary file", "[proto]") {
  pb::NetParameter net;
  net.set_name("tiny");
  auto* layer = net.add_layer();
  layer->set_name("ip");
  layer->set_type("InnerProduct");
  layer->mutable_inner_product_param()->set_num_output(3);
  auto* blob = layer->add_blobs();
  for (const auto dim : {3, 2})
    blob->mutable_shape()->add_dim(dim);
  for (int i = 0; i < 6; ++i)
    blob->add_data(0.5f * static_cast<float>(i) - 1.0f);
  auto* split = layer->add_split();
  split->set_device("cuda:0");
  split->set_fraction(0.75f);
  auto* net_split = net.add_split();
  net_split->set_device("cpu");
  net_split->set_fraction(1.0f);

  TempFile file("roundtrip.caffemodel");
  hn::detail::write_binary_proto(file.path(), net);
  CHECK(file.read() == net.SerializeAsString());

  pb::NetParameter read_back;
  read_back.set_name("stale contents are replaced");
  hn::detail::read_binary_proto(file.path(), read_back);
  CHECK(read_back.SerializeAsString() == net.SerializeAsString());
  CHECK(read_back.name() == "tiny");
  REQUIRE(read_back.layer_size() == 1);
  const auto& blob_back = read_back.layer(0).blobs(0);
  REQUIRE(blob_back.data_size() == 6);
  CHECK(blob_back.data(5) == 1.5f);
  CHECK(blob_back.shape().dim(0) == 3);
  CHECK(read_back.layer(0).split(0).device() == "cuda:0");
  CHECK(read_back.layer(0).split(0).fraction() == 0.75f);
  CHECK(read_back.split(0).device() == "cpu");
}

TEST_CASE("BlobProto bytes match Caffe's wire format", "[proto]") {
  // Hand-encoded per the protobuf wire format with Caffe's field numbers, in field-number
  // order as protobuf (and so Caffe) writes them: packed data (5) = {1.0f, -2.0f}, then
  // shape (7) holding packed dim (1) = {2}.
  const std::string expected(
      "\x2a\x08\x00\x00\x80\x3f\x00\x00\x00\xc0"
      "\x3a\x03\x0a\x01\x02",
      15);
  pb::BlobProto blob;
  blob.mutable_shape()->add_dim(2);
  blob.add_data(1.0f);
  blob.add_data(-2.0f);
  CHECK(blob.SerializeAsString() == expected);

  pb::BlobProto parsed;
  REQUIRE(parsed.ParseFromString(expected));
  REQUIRE(parsed.data_size() == 2);
  CHECK(parsed.data(1) == -2.0f);
  CHECK(parsed.shape().dim(0) == 2);
}

TEST_CASE("a truncated binary file is a clear error", "[proto]") {
  pb::NetParameter net;
  net.set_name("truncated");
  auto* blob = net.add_layer()->add_blobs();
  for (int i = 0; i < 100; ++i)
    blob->add_data(static_cast<float>(i));
  const std::string bytes = net.SerializeAsString();

  TempFile file("truncated.caffemodel");
  file.write(bytes.substr(0, bytes.size() / 2));
  pb::NetParameter read_back;
  REQUIRE_THROWS_WITH(
      hn::detail::read_binary_proto(file.path(), read_back),
      Contains(file.path()) && Contains("truncated") && Contains("hybridnn.proto.NetParameter"));
}

TEST_CASE("a text prototxt is not mistaken for a binary NetParameter", "[proto]") {
  pb::NetParameter read_back;
  REQUIRE_THROWS_WITH(
      hn::detail::read_binary_proto(model("mnist_lenet_train_test.prototxt").string(), read_back),
      Contains("mnist_lenet_train_test.prototxt") && Contains("NetParameter"));
}
