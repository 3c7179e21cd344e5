// The C ABI and the header-only C++ API over it, as a downstream program sees them: this
// executable includes only include/hybridnn/ and links only libhybridnn.so. Results are
// checked against plain loops, finite differences and hand-computed values.
#include <hybridnn/hybridnn_c.h>
#include <hybridnn/hybridnn.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace {

using Catch::Matchers::Contains;

std::vector<float> pattern(std::size_t count, int period, float scale, int shift = 0) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i)
    values[i] = scale * static_cast<float>((static_cast<int>(i) + shift) % period - period / 2);
  return values;
}

void check_close(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(std::abs(got[i] - want[i]) <= tolerance * std::max(1.0, std::abs(want[i])));
  }
}

std::string error_of(hn_status status) {
  REQUIRE(status != HN_OK);
  return hn_last_error();
}

// A directory of its own under the system's temporary directory, removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("hybridnn-capi-" + std::to_string(std::rand()) + "-" +
            std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::string file(const std::string& name, const std::string& text = "") const {
    const std::string at = (path / name).string();
    if (!text.empty()) std::ofstream(at) << text;
    return at;
  }
};

// y = W x + b per image, then ReLU, then a second InnerProduct: a two-layer perceptron.
const char* const kMlp = R"(
name: "mlp"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 3 dim: 4 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                        bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
)";

// The MLP's output computed here from its parameters.
std::vector<double> mlp_output(hn::Net& net, const std::vector<float>& x) {
  const std::vector<float> w1 = net.param(0).values(), b1 = net.param(1).values();
  const std::vector<float> w2 = net.param(2).values(), b2 = net.param(3).values();
  std::vector<double> out;
  for (int n = 0; n < 3; ++n) {
    std::vector<double> hidden(5);
    for (int o = 0; o < 5; ++o) {
      double sum = b1[o];
      for (int i = 0; i < 4; ++i)
        sum += static_cast<double>(w1[o * 4 + i]) * x[n * 4 + i];
      hidden[o] = std::max(0.0, sum);
    }
    for (int o = 0; o < 2; ++o) {
      double sum = b2[o];
      for (int i = 0; i < 5; ++i)
        sum += w2[o * 5 + i] * hidden[i];
      out.push_back(sum);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("C ABI: version, ABI version and status names", "[capi]") {
  CHECK(std::string(hn_version()) == HYBRIDNN_EXPECTED_VERSION);
  CHECK(hn::version() == HYBRIDNN_EXPECTED_VERSION);
  CHECK(hn_abi_version() == HN_ABI_VERSION);
  CHECK(std::string(hn_status_name(HN_OK)) == "ok");
  CHECK(std::string(hn_status_name(HN_ERROR_NOT_FOUND)) == "not found");
  CHECK(std::string(hn_status_name(12345)) == "unknown status");
}

TEST_CASE("C ABI: errors are statuses with a message per thread, NULL handles included", "[capi]") {
  CHECK_THAT(error_of(hn_net_forward(nullptr, nullptr)), Contains("hn_net_forward: NULL handle"));
  CHECK(hn_net_forward(nullptr, nullptr) == HN_ERROR_INVALID_ARGUMENT);
  // Another thread has its own last error.
  std::string other = "unset";
  std::thread([&] { other = hn_last_error(); }).join();
  CHECK(other.empty());
  CHECK_THAT(std::string(hn_last_error()), Contains("NULL handle"));

  hn_runtime* runtime = nullptr;
  REQUIRE(hn_runtime_create(&runtime) == HN_OK);
  hn_driver* driver = nullptr;
  CHECK(hn_runtime_add_driver(runtime, "cuda:7", nullptr, &driver) == HN_ERROR_NOT_FOUND);
  CHECK_THAT(std::string(hn_last_error()), Contains("cuda:7") && Contains("cpu"));
  CHECK(hn_runtime_add_driver(runtime, "teapot", nullptr, &driver) != HN_OK);
  CHECK_THAT(std::string(hn_last_error()), Contains("teapot"));
  REQUIRE(hn_runtime_add_driver(runtime, "cpu", "threads=1", &driver) == HN_OK);
  CHECK(std::string(hn_driver_name(driver)) == "cpu");

  hn_net_options* options = nullptr;
  REQUIRE(hn_net_options_create(&options) == HN_OK);
  CHECK(hn_net_options_set(options, "bach", "3") == HN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(hn_last_error()), Contains("'bach'") && Contains("batch"));
  CHECK(hn_net_options_set(options, "batch", "three") == HN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(hn_last_error()), Contains("batch") && Contains("three"));
  CHECK(hn_net_options_set(options, "phase", "tset") == HN_ERROR_INVALID_ARGUMENT);
  CHECK(hn_net_options_set(options, "math", "fp16") != HN_OK);
  CHECK_THAT(std::string(hn_last_error()), Contains("'fp16'") && Contains("TF32"));
  CHECK(hn_net_options_set(options, "math", "tf32") == HN_OK);
  CHECK(hn_net_options_set(options, "split", "cpu:0.5,cpu:0.5") != HN_OK);
  CHECK_THAT(std::string(hn_last_error()), Contains("twice"));

  hn_net* net = nullptr;
  CHECK(hn_net_create(runtime, driver, "/nonexistent/net.prototxt", options, &net) ==
        HN_ERROR_NOT_FOUND);
  CHECK_THAT(std::string(hn_last_error()), Contains("/nonexistent/net.prototxt"));
  // A syntax error names the origin and its line.
  CHECK(hn_net_create_from_text(runtime, driver, "name: \"x\"\nlayer { nme: 1 }\n", "mine.prototxt",
                                options, &net) == HN_ERROR);
  CHECK_THAT(std::string(hn_last_error()), Contains("mine.prototxt") && Contains("2"));
  CHECK(net == nullptr);
  hn_net_options_destroy(options);
  hn_driver_destroy(driver);
  hn_runtime_destroy(runtime);
  // destroy(NULL) is a no-op.
  hn_tensor_destroy(nullptr);
  hn_net_destroy(nullptr);

  // The C++ API throws hn::Error with the message.
  CHECK_THROWS_WITH(hn::Runtime().add("cuda:9"), Contains("cuda:9") && Contains("not found"));
}

TEST_CASE("C ABI: the host memory limit refuses a net too large, naming its blob", "[capi]") {
  const std::uint64_t default_limit = hn_host_memory_limit();
  CHECK(default_limit > (std::uint64_t{1} << 26));  // physical memory and swap: far more
  CHECK(hn_peak_resident_bytes() > (std::uint64_t{1} << 20));
  hn_runtime* runtime = nullptr;
  REQUIRE(hn_runtime_create(&runtime) == HN_OK);
  hn_driver* driver = nullptr;
  REQUIRE(hn_runtime_add_driver(runtime, "cpu", nullptr, &driver) == HN_OK);
  // One 4 MiB blob (1x1x1024x1024 floats) against a 1 MiB limit.
  const char* text =
      "name: 'big'\nlayer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 1 "
      "dim: 1 dim: 1024 dim: 1024 } } }\n";
  hn_set_host_memory_limit(std::uint64_t{1} << 20);
  CHECK(hn_host_memory_limit() == std::uint64_t{1} << 20);
  CHECK(hn::memory_limit() == std::uint64_t{1} << 20);
  hn_net* net = nullptr;
  CHECK(hn_net_create_from_text(runtime, driver, text, "big.prototxt", nullptr, &net) != HN_OK);
  CHECK_THAT(std::string(hn_last_error()), Contains("big.prototxt") && Contains("'x'") &&
                                               Contains("host memory limit of 1.0 MiB"));
  // 0: the default again, and the net builds.
  hn::set_memory_limit(0);
  CHECK(hn_host_memory_limit() == default_limit);
  REQUIRE(hn_net_create_from_text(runtime, driver, text, "big.prototxt", nullptr, &net) == HN_OK);
  CHECK(hn::peak_resident_memory() >= hn_peak_resident_bytes());
  hn_net_destroy(net);
  hn_driver_destroy(driver);
  hn_runtime_destroy(runtime);
}

TEST_CASE("C ABI: tensors over library memory and over the caller's arrays", "[capi]") {
  hn::Tensor own({2, 3});
  CHECK(own.dims() == std::vector<int64_t>{2, 3});
  CHECK(own.count() == 6);
  CHECK(own.values() == std::vector<float>(6, 0.0f));
  own.set_values({1, 2, 3, 4, 5, 6});
  CHECK(own.values() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK_THROWS_WITH(own.set_values({1}), Contains("1 values") && Contains("6"));

  std::vector<float> data = pattern(12, 5, 1.0f), diff(12, 0.0f);
  hn::Tensor wrapped = hn::Tensor::wrap({3, 4}, data.data(), diff.data());
  CHECK(wrapped.data() == data.data());  // no copy
  CHECK(wrapped.diff() == diff.data());
  CHECK(wrapped.values() == data);
  CHECK(hn_tensor_is_blocked(wrapped.get()) == 0);

  int64_t dims[2] = {2, -1};
  hn_tensor* bad = nullptr;
  CHECK(hn_tensor_create(2, dims, &bad) == HN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(hn_last_error()), Contains("axis 1 is -1"));
  CHECK(hn_tensor_create(HN_MAX_AXES + 1, dims, &bad) == HN_ERROR_INVALID_ARGUMENT);
  CHECK(hn_tensor_wrap(2, dims, nullptr, nullptr, nullptr, &bad) == HN_ERROR_INVALID_ARGUMENT);
  float* address = nullptr;
  CHECK(hn_tensor_data(own.get(), 7, &address) == HN_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("C ABI: a grouped convolution as a kernel on the caller's arrays equals the loops",
          "[capi]") {
  const int n = 2, c = 4, h = 6, w = 5, m = 6, k = 3, groups = 2, cg = c / groups, mg = m / groups;
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  hn::Layer conv(R"(name: "conv" type: "Convolution"
      convolution_param { num_output: 6 kernel_size: 3 pad: 1 group: 2 })");
  CHECK(conv.type() == "Convolution");

  std::vector<float> x = pattern(n * c * h * w, 7, 0.25f), dx(x.size(), -99.0f);
  hn::Tensor input = hn::Tensor::wrap({n, c, h, w}, x.data(), dx.data());
  const auto out_dims = conv.setup({&input});
  REQUIRE(out_dims.size() == 1);
  CHECK(out_dims[0] == std::vector<int64_t>{n, m, h, w});
  REQUIRE(conv.num_params() == 2);
  CHECK(conv.param(0).dims() == std::vector<int64_t>{m, cg, k, k});

  // The caller's weights and gradients, used in place.
  std::vector<float> weights = pattern(m * cg * k * k, 5, 0.1f), bias = pattern(m, 3, 0.05f);
  std::vector<float> dweights(weights.size(), 0.5f), dbias(m, 0.5f);
  hn::Tensor wt = hn::Tensor::wrap({m, cg, k, k}, weights.data(), dweights.data());
  hn::Tensor bt = hn::Tensor::wrap({m}, bias.data(), dbias.data());
  conv.set_param(0, wt);
  conv.set_param(1, bt);
  CHECK(conv.param(0).data() == weights.data());

  std::vector<float> y(n * m * h * w, -99.0f), dy = pattern(y.size(), 3, 0.5f);
  hn::Tensor output = hn::Tensor::wrap({n, m, h, w}, y.data(), dy.data());
  conv.forward(cpu, {&input}, {&output});
  conv.backward(cpu, {&input}, {&output});

  std::vector<double> y_ref(y.size()), dx_ref(x.size()), dw_ref(weights.size(), 0.5),
      db_ref(m, 0.5);
  for (int in = 0; in < n; ++in)
    for (int co = 0; co < m; ++co)
      for (int r = 0; r < h; ++r)
        for (int s = 0; s < w; ++s) {
          const int yi = ((in * m + co) * h + r) * w + s;
          double sum = bias[co];
          db_ref[co] += dy[yi];
          for (int ci = 0; ci < cg; ++ci)
            for (int kh = 0; kh < k; ++kh)
              for (int kw = 0; kw < k; ++kw) {
                const int ih = r - 1 + kh, iw = s - 1 + kw;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                const int xi = ((in * c + co / mg * cg + ci) * h + ih) * w + iw;
                const int wi = ((co * cg + ci) * k + kh) * k + kw;
                sum += static_cast<double>(x[xi]) * weights[wi];
                dx_ref[xi] += static_cast<double>(dy[yi]) * weights[wi];
                dw_ref[wi] += static_cast<double>(dy[yi]) * x[xi];
              }
          y_ref[yi] = sum;
        }
  check_close(y, y_ref, 1e-5);
  check_close(dx, dx_ref, 1e-5);        // overwritten
  check_close(dweights, dw_ref, 1e-5);  // added to
  check_close(std::vector<float>(dbias), db_ref, 1e-5);

  SECTION("the same cut between two drivers, merged") {
    hn::Driver reference = runtime.add("reference");
    (void)reference;
    conv.set_split(runtime, "cpu:0.5,reference:0.5");
    std::fill(y.begin(), y.end(), -99.0f);
    conv.forward(cpu, {&input}, {&output});
    check_close(y, y_ref, 1e-5);
    CHECK_THROWS_WITH(conv.set_split(runtime, "cpu:0.5,cuda:3:0.5"), Contains("cuda:3"));
  }
  SECTION("tensors of other shapes are refused, naming both") {
    hn::Tensor small({1, c, h, w});
    CHECK_THROWS_WITH(
        conv.forward(cpu, {&small}, {&output}),
        Contains("layer 'conv' (Convolution)") && Contains("1x4x6x5") && Contains("2x4x6x5"));
  }
}

TEST_CASE("C ABI: in-place ReLU and test-phase Dropout as kernels", "[capi]") {
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  std::vector<float> x = pattern(24, 7, 1.0f), dx = pattern(24, 3, 1.0f);
  const std::vector<float> x0 = x, dy0 = dx;
  hn::Tensor t = hn::Tensor::wrap({2, 3, 4}, x.data(), dx.data());
  hn::Layer relu(R"(name: "relu" type: "ReLU")");
  relu.setup({&t});
  relu.forward(cpu, {&t}, {&t});
  relu.backward(cpu, {&t}, {&t});
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(x[i] == std::max(0.0f, x0[i]));
    CHECK(dx[i] == (x0[i] > 0.0f ? dy0[i] : 0.0f));
  }

  hn::Layer dropout(R"(name: "drop" type: "Dropout" dropout_param { dropout_ratio: 0.5 })");
  hn::Tensor in({4, 8}), out({4, 8});
  in.set_values(pattern(32, 9, 1.0f));
  dropout.setup({&in});
  dropout.set_phase(HN_PHASE_TEST);
  dropout.forward(cpu, {&in}, {&out});
  CHECK(out.values() == in.values());
  dropout.set_phase(HN_PHASE_TRAIN);
  dropout.forward(cpu, {&in}, {&out});
  int kept = 0;
  const std::vector<float> ins = in.values(), outs = out.values();
  for (std::size_t i = 0; i < ins.size(); ++i) {
    if (outs[i] != 0.0f) {
      ++kept;
      CHECK(outs[i] == 2.0f * ins[i]);
    }
  }
  CHECK(kept > 0);
  CHECK(kept < 32);

  hn::Layer pool(R"(name: "pool" type: "Pooling" pooling_param { pool: MAX kernel_size: 2 })");
  hn::Tensor img({1, 1, 4, 4});
  CHECK_THROWS_WITH(pool.forward(cpu, {&img}, {&img}), Contains("hn_layer_setup first"));
  CHECK_THROWS_WITH(hn::Layer("name: \"p\" type: \"NoSuchLayer\""), Contains("NoSuchLayer"));
}

TEST_CASE(
    "C ABI: a net from text: inputs, forward against the loops, gradients against "
    "finite differences, weights saved and loaded",
    "[capi]") {
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  hn::Net net = hn::Net::from_text(runtime, cpu, kMlp, hn::NetOptions().set("seed", "7"), "mlp");
  CHECK(net.name() == "mlp");
  CHECK(net.input_names() == std::vector<std::string>{"data"});
  CHECK(net.output_names() == std::vector<std::string>{"ip2"});
  CHECK(net.num_layers() == 4);
  CHECK(net.layer_name(1) == "ip1");
  CHECK(net.layer_type(2) == "ReLU");
  CHECK(net.layer_split(1).empty());
  CHECK(net.num_params() == 4);
  CHECK(net.param_name(0) == "ip1.0");
  CHECK(net.param(0).dims() == std::vector<int64_t>{5, 4});
  CHECK_THROWS_WITH(net.blob("nope"), Contains("'nope'") && Contains("ip1"));
  CHECK_THROWS_WITH(net.layer_name(9), Contains("4 layers"));

  const std::vector<float> x = pattern(12, 7, 0.3f);
  net.blob("data").set_values(x);
  net.forward();
  const std::vector<double> want = mlp_output(net, x);
  check_close(net.blob("ip2").values(), want, 1e-5);

  // Loss = sum of ip2 * g: d loss / d param against central differences.
  const std::vector<float> g = pattern(6, 5, 0.5f, 1);
  net.clear_param_diffs();
  net.forward();
  net.blob("ip2").set_gradient(g);
  net.backward();
  const std::vector<float> dw1 = net.param(0).gradient(), dx = net.blob("data").gradient();
  const auto loss_with = [&](int param, int index, float delta) {
    hn::Tensor p = net.param(param);
    std::vector<float> v = p.values();
    const float kept = v[index];
    v[index] = kept + delta;
    p.set_values(v);
    const std::vector<double> out = mlp_output(net, x);
    v[index] = kept;
    p.set_values(v);
    double loss = 0.0;
    for (int i = 0; i < 6; ++i)
      loss += out[i] * g[i];
    return loss;
  };
  for (int index : {0, 7, 19}) {
    const double numeric = (loss_with(0, index, 1e-2f) - loss_with(0, index, -1e-2f)) / 2e-2;
    CHECK(dw1[index] == Approx(numeric).margin(2e-3));
  }
  CHECK(std::any_of(dx.begin(), dx.end(), [](float v) { return v != 0.0f; }));

  TempDir dir;
  const std::string model = dir.file("mlp.caffemodel");
  net.save(model);
  hn::Net again = hn::Net::from_text(runtime, cpu, kMlp,
                                     hn::NetOptions().set("seed", "99").set("weights", model));
  CHECK(again.param(2).values() == net.param(2).values());
  again.blob("data").set_values(x);
  again.forward();
  CHECK(again.blob("ip2").values() == net.blob("ip2").values());
}

TEST_CASE("C ABI: a net written as ONNX and read back computes what it computed", "[capi]") {
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  hn::Net net = hn::Net::from_text(runtime, cpu, kMlp, hn::NetOptions().set("seed", "7"), "mlp");
  const std::vector<float> x = pattern(12, 7, 0.3f);
  net.blob("data").set_values(x);
  net.forward();
  TempDir dir;
  const std::string path = dir.file("mlp.onnx");
  const hn_status status = hn_net_save_onnx(net.get(), path.c_str());
  if (status != HN_OK && std::string(hn_last_error()).find("libonnx-dev") != std::string::npos) {
    WARN("SKIPPED: this build writes no ONNX files: " << hn_last_error());
    return;
  }
  REQUIRE(status == HN_OK);
  hn::Net back(runtime, cpu, path, hn::NetOptions().set("batch", "3"));
  CHECK(back.input_names() == std::vector<std::string>{"data"});
  back.blob("data").set_values(x);
  back.forward();
  REQUIRE(back.output_names().size() == 1);
  CHECK(back.blob(back.output_names()[0]).values() == net.blob("ip2").values());
  CHECK_THAT(error_of(hn_net_save_onnx(nullptr, path.c_str())), Contains("hn_net_save_onnx"));
  CHECK_THAT(error_of(hn_net_save_onnx(net.get(), nullptr)), Contains("hn_net_save_onnx"));
}

// As the tool's --split auto: a bare "auto" measures every available device but the
// reference driver, whichever drivers the runtime held before.
TEST_CASE("C ABI: a net's split auto measures every device but the reference driver", "[capi]") {
  hn::Runtime runtime;
  hn::Driver reference = runtime.add("reference");
  hn::Net net =
      hn::Net::from_text(runtime, reference, kMlp, hn::NetOptions().set("split", "auto"), "mlp");
  net.calibrate_splits();
  int named = 0;
  for (int32_t l = 0; l < net.num_layers(); ++l) {
    const std::string split = net.layer_split(l);
    INFO(net.layer_name(l) << ": " << split);
    CHECK(split.find("reference") == std::string::npos);
    named += split.find("cpu") != std::string::npos ? 1 : 0;
  }
  CHECK(named > 0);
}

// The tool's commands through the C ABI (python3 -m hybridnn calls the same entry point):
// the executable's exit statuses, and malformed arguments refused, not dereferenced.
TEST_CASE("C ABI: hn_tool_main runs the tool's commands with their exit statuses", "[capi]") {
  CHECK(hn::tool_main({"hybridnn", "--version"}) == 0);
  CHECK(hn::tool_main({"hybridnn", "help", "time"}) == 0);
  CHECK(hn::tool_main({"hybridnn", "no_such_command"}) == 2);
  CHECK(hn::tool_main({"hybridnn", "time", "--model"}) == 2);  // a flag without its value
  CHECK(hn::tool_main({"hybridnn", "time", "--model", "/nonexistent/net.prototxt"}) == 1);
  CHECK(hn_tool_main(0, nullptr) == 2);
  const char* with_null[] = {"hybridnn", nullptr};
  CHECK(hn_tool_main(2, with_null) == 2);
}

TEST_CASE("C ABI: handles keep what they need alive, whatever the order of destruction", "[capi]") {
  std::vector<float> got;
  {
    hn::Tensor blob({1});
    {
      hn::Runtime runtime;
      hn::Driver cpu = runtime.add("cpu");
      hn::Net net = hn::Net::from_text(runtime, cpu, kMlp);
      net.blob("data").set_values(std::vector<float>(12, 1.0f));
      net.forward();
      blob = net.blob("ip2");
    }  // the runtime, driver and net handles are gone; the blob's tensor keeps the net
    got = blob.values();
  }
  CHECK(got.size() == 6);
}

TEST_CASE("C ABI: a solver trains, reports events, snapshots and restores", "[capi]") {
  TempDir dir;
  const std::string net = dir.file("net.prototxt", R"(
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 6 } shape { dim: 8 }
                     data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
)");
  const std::string solver_file = dir.file("solver.prototxt", "net: \"" + net + R"("
base_lr: 0.1
momentum: 0.9
lr_policy: "fixed"
display: 5
max_iter: 40
snapshot_prefix: ")" + (dir.path / "tiny").string() + "\"\n");
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  hn::Solver solver(runtime, cpu, solver_file, hn::SolverOptions().set("max_iter", "30"));
  std::vector<hn::SolverEvent> events;
  solver.on_event([&](const hn::SolverEvent& event) { events.push_back(event); });
  solver.step(1);
  const float first = solver.loss();
  CHECK(first == Approx(std::log(3.0f)).margin(0.3));
  solver.step(19);
  CHECK(solver.iter() == 20);
  CHECK(solver.loss() < 0.5f * first);
  CHECK(solver.learning_rate() == Approx(0.1f));
  REQUIRE(events.size() >= 3);
  CHECK(events[0].kind == HN_EVENT_TRAIN);
  CHECK(events[1].iter == 5);
  CHECK(events.back().iter == 15);
  CHECK(events.back().outputs.at(0).first == "loss");

  const std::string model = solver.snapshot();
  CHECK(model == (dir.path / "tiny_iter_20.caffemodel").string());
  CHECK(std::filesystem::exists(dir.path / "tiny_iter_20.solverstate"));
  const std::vector<float> trained = solver.net().param(0).values();

  hn::Solver resumed(runtime, cpu, solver_file);
  resumed.restore((dir.path / "tiny_iter_20.solverstate").string());
  CHECK(resumed.iter() == 20);
  CHECK(resumed.net().param(0).values() == trained);

  // An exception in the callback stops training and comes out of step().
  resumed.on_event([](const hn::SolverEvent&) { throw std::runtime_error("enough"); });
  CHECK_THROWS_WITH(resumed.step(10), "enough");
  CHECK(resumed.iter() <= 26);
  CHECK_THROWS_WITH(resumed.restore((dir.path / "nothing.solverstate").string()),
                    Contains("nothing.solverstate") && Contains("not found"));
}

TEST_CASE("C ABI: the local communicator", "[capi]") {
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu");
  hn::Communicator comm("local");
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.backend() == "local");
  std::vector<float> values{1.0f, 2.0f, 3.0f};
  comm.allreduce(cpu, values.data(), values.size(), true);
  CHECK(values == std::vector<float>{1.0f, 2.0f, 3.0f});
  comm.broadcast(cpu, values.data(), values.size(), 0);
  CHECK_THROWS_WITH(comm.broadcast(cpu, values.data(), values.size(), 1), Contains("root 1"));
  comm.barrier();
  CHECK_THROWS_WITH(hn::Communicator("carrier-pigeon"), Contains("carrier-pigeon"));
}

// Hostile use (issue 33): every call that fills a caller's array takes its capacity and fails
// when it is too small; no call returns OK without a usable result; a blob whose memory the
// net reused reads as an error, never another blob's values.
TEST_CASE("C ABI: arrays of the caller are filled only when their capacity holds the shape",
          "[capi]") {
  // A Reshape to 20 axes: more than HN_MAX_AXES (this wrote past dims[8] before).
  std::string dims_text;
  for (int i = 0; i < 20; ++i)
    dims_text += i == 0 ? "dim: 0 " : "dim: 1 ";
  hn_layer* layer = nullptr;
  REQUIRE(
      hn_layer_create(
          ("name: \"r\" type: \"Reshape\" reshape_param { shape { " + dims_text + "} }").c_str(),
          &layer) == HN_OK);
  hn::Tensor input({6});
  hn_tensor* inputs[] = {input.get()};
  int32_t outputs = 0;
  REQUIRE(hn_layer_setup(layer, 1, inputs, &outputs) == HN_OK);
  int64_t guard[HN_MAX_AXES + 4];
  std::fill(std::begin(guard), std::end(guard), -7);
  int32_t axes = 0;
  CHECK(hn_layer_output_dims(layer, 0, &axes, guard) == HN_ERROR_CAPACITY);
  CHECK(axes == 20);
  CHECK_THAT(std::string(hn_last_error()), Contains("20 axes") && Contains("holds 8"));
  CHECK(std::all_of(std::begin(guard), std::end(guard), [](int64_t v) { return v == -7; }));
  CHECK(hn_layer_output_shape(layer, 0, &axes, nullptr, 0) == HN_OK);
  CHECK(axes == 20);
  std::vector<int64_t> all(20);
  CHECK(hn_layer_output_shape(layer, 0, &axes, all.data(), 19) == HN_ERROR_CAPACITY);
  REQUIRE(hn_layer_output_shape(layer, 0, &axes, all.data(), 20) == HN_OK);
  CHECK(all[0] == 6);
  CHECK(std::count(all.begin(), all.end(), 1) == 19);
  hn_layer_destroy(layer);
  // The C++ API asks for the count first.
  hn::Layer reshape("name: \"r\" type: \"Reshape\" reshape_param { shape { " + dims_text + "} }");
  const auto shapes = reshape.setup({&input});
  REQUIRE(shapes.size() == 1);
  CHECK(shapes[0].size() == 20);

  // hn_tensor_dims: a shorter array is an error, not a truncated shape.
  hn::Tensor three({2, 3, 4});
  int64_t two[2] = {-7, -7};
  CHECK(hn_tensor_dims(three.get(), two, 2) == HN_ERROR_CAPACITY);
  CHECK(two[0] == -7);
  CHECK(std::string(hn_status_name(HN_ERROR_CAPACITY)) == "capacity too small");
  // NULL dims are blamed as such, not the axis count.
  hn_tensor* none = nullptr;
  CHECK(hn_tensor_create(2, nullptr, &none) == HN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(hn_last_error()), Contains("NULL dims"));
}

TEST_CASE("C ABI: a label's gradient, a reused blob and a re-added driver are errors, not results",
          "[capi]") {
  hn::Runtime runtime;
  hn::Driver cpu = runtime.add("cpu", "threads=1");
  // Adding the same device with other options would drop them silently.
  hn_driver* again = nullptr;
  CHECK(hn_runtime_add_driver(runtime.get(), "cpu", "threads=2", &again) ==
        HN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(hn_last_error()), Contains("already") && Contains("threads=1"));
  CHECK(hn_runtime_add_driver(runtime.get(), "cpu", "threads=1", &again) == HN_OK);
  hn_driver_destroy(again);
  CHECK(hn_runtime_add_driver(runtime.get(), "cpu", "", &again) == HN_OK);
  hn_driver_destroy(again);

  // The label blob's gradient: nothing computes it, so it has no memory (OK with NULL before).
  const char* classifier = R"(
name: "c"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
)";
  hn::Net net = hn::Net::from_text(runtime, cpu, classifier, hn::NetOptions(), "c.prototxt");
  net.forward();
  net.backward();
  hn::Tensor label = net.blob("label");
  float* address = nullptr;
  CHECK(hn_tensor_diff(label.get(), HN_READ, &address) == HN_ERROR);
  CHECK_THAT(std::string(hn_last_error()), Contains("no gradient"));
  CHECK_THROWS_WITH(label.gradient(), Contains("no gradient"));

  // Input -> Convolution -> ReLU -> InnerProduct -> Sigmoid -> InnerProduct: 'conv' shares its
  // memory with a later blob. After forward its values are another blob's: an error naming
  // keep_blobs; with keep_blobs they are the convolution's.
  const char* chain = R"(
name: "chain"
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip1" type: "InnerProduct" bottom: "conv" top: "ip1"
        inner_product_param { num_output: 32 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip1" top: "sig" }
layer { name: "ip2" type: "InnerProduct" bottom: "sig" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 1 } } }
)";
  const std::vector<float> images = pattern(72, 7, 0.5f);
  const auto run = [&](const std::string& options) {
    hn::NetOptions net_options;
    net_options.set("phase", "test");
    if (!options.empty()) net_options.set("keep_blobs", options);
    hn::Net n = hn::Net::from_text(runtime, cpu, chain, net_options, "chain.prototxt");
    n.blob("data").set_values(images);
    n.forward();
    return n;
  };
  hn::Net reused = run("");
  CHECK_THROWS_WITH(reused.blob("conv").values(),
                    Contains("'conv'") && Contains("keep_blobs") && Contains("reused"));
  hn::Net kept = run("conv");
  const std::vector<float> conv = kept.blob("conv").values();
  // ReLU(conv) at output (image 0, channel 0, 0, 0) from the weights: a hand loop.
  const std::vector<float> w = kept.param(0).values(), b = kept.param(1).values();
  double sum = b[0];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      sum += static_cast<double>(w[i * 3 + j]) * images[i * 6 + j];
  CHECK(conv[0] == Approx(std::max(0.0, sum)).margin(1e-5));
  CHECK(reused.blob("ip2").values() == kept.blob("ip2").values());
}

// Every layer type the library knows (read from the error of an unknown one, so that a new
// type is swept too), with its default parameters (and those it requires), on
// inputs of 0 to 4 axes, one or two of them, whole and split: each call returns a status, none
// crashes or reads outside a buffer (a rank-0 input crashed Permute; CI's fuzzer found it). A
// scalar through Permute is itself.
TEST_CASE("C ABI: every layer type on inputs of any rank fails or runs, scalars included",
          "[capi]") {
  hn_layer* unknown = nullptr;
  REQUIRE(hn_layer_create("name: \"u\" type: \"NoSuchType\"", &unknown) != HN_OK);
  const std::string message = hn_last_error();
  const std::string marker = "known types: ";
  const std::size_t at = message.find(marker);
  REQUIRE(at != std::string::npos);
  std::vector<std::string> types;
  std::string rest = message.substr(at + marker.size());
  while (!rest.empty()) {
    const std::size_t comma = rest.find(", ");
    types.push_back(rest.substr(0, comma));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 2);
  }
  REQUIRE(types.size() > 20);
  CHECK(std::find(types.begin(), types.end(), "Permute") != types.end());

  // The parameters a type requires (Pad's reach axis 1 of a batch of none too).
  const std::map<std::string, std::string> required{
      {"Clip", "clip_param { min: -1 max: 1 }"},
      {"Pooling", "pooling_param { kernel_size: 1 }"},
      {"InnerProduct", "inner_product_param { num_output: 2 }"},
      {"Convolution", "convolution_param { num_output: 2 kernel_size: 1 }"},
      {"Deconvolution", "convolution_param { num_output: 2 kernel_size: 1 }"},
      {"Pad", "pad_param { axis: 1 pad_before: 1 mode: \"edge\" }"}};
  hn::Runtime runtime;
  hn::Driver reference = runtime.add("reference");
  hn::Driver second = runtime.add("reference:1");
  const std::vector<std::vector<std::vector<int64_t>>> input_sets{
      {{}},          {{3}},    {{2, 3}},    {{2, 3, 2}},    {{2, 3, 2, 2}}, {{}, {}},
      {{2, 3}, {2}}, {{0, 3}}, {{0, 3, 2}}, {{2, 0, 2, 2}}, {{2, 3, 0, 2}}};
  for (const std::string& type : types) {
    for (const auto& dims_set : input_sets) {
      for (const char* split : {"", "reference:0.5,reference:1:0.5"}) {
        INFO(type << " on " << dims_set.size() << " inputs, the first of " << dims_set[0].size()
                  << " axes, split '" << split << "'");
        hn_layer* layer = nullptr;
        const auto known = required.find(type);
        const std::string params = known == required.end() ? "" : " " + known->second;
        const hn_status created =
            hn_layer_create(("name: \"l\" type: \"" + type + "\"" + params).c_str(), &layer);
        INFO(hn_last_error());
        REQUIRE(created == HN_OK);
        std::vector<hn::Tensor> inputs;
        std::vector<hn_tensor*> input_handles;
        for (const auto& dims : dims_set) {
          inputs.emplace_back(dims);
          input_handles.push_back(inputs.back().get());
          float* values = nullptr;
          REQUIRE(hn_tensor_data(inputs.back().get(), HN_OVERWRITE, &values) == HN_OK);
          for (int64_t i = 0; i < hn_tensor_count(inputs.back().get()); ++i)
            values[i] = static_cast<float>(i % 3);
        }
        int32_t outputs = 0;
        std::vector<hn::Tensor> made;
        std::vector<hn_tensor*> output_handles;
        if (hn_layer_setup(layer, static_cast<int32_t>(input_handles.size()), input_handles.data(),
                           &outputs) == HN_OK) {
          for (int32_t o = 0; o < outputs; ++o) {
            int32_t axes = 0;
            REQUIRE(hn_layer_output_shape(layer, o, &axes, nullptr, 0) == HN_OK);
            std::vector<int64_t> dims(static_cast<std::size_t>(axes));
            REQUIRE(hn_layer_output_shape(layer, o, &axes, dims.data(), axes) == HN_OK);
            made.emplace_back(dims);
            output_handles.push_back(made.back().get());
          }
          if (*split != '\0') hn_layer_set_split(layer, runtime.get(), split);
          if (hn_layer_forward(layer, reference.get(), input_handles.data(),
                               output_handles.data()) == HN_OK) {
            if (type == "Permute" && dims_set[0].empty()) {
              float* in = nullptr;
              float* out = nullptr;
              REQUIRE(hn_tensor_data(input_handles[0], HN_READ, &in) == HN_OK);
              REQUIRE(hn_tensor_data(output_handles[0], HN_READ, &out) == HN_OK);
              CHECK(out[0] == in[0]);
            }
            for (hn::Tensor& tensor : made) {
              float* diff = nullptr;
              if (hn_tensor_diff(tensor.get(), HN_OVERWRITE, &diff) == HN_OK)
                std::fill(diff, diff + hn_tensor_count(tensor.get()), 0.5f);
            }
            hn_layer_backward(layer, reference.get(), input_handles.data(), output_handles.data(),
                              nullptr);
          }
        }
        hn_layer_destroy(layer);
      }
    }
  }
}
