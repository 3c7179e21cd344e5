// hybridnn-bench layers: CaffeNet's layers (bvlc_reference_caffenet_deploy.prototxt, shapes
// hard-coded until the prototxt parser exists) forward and backward on the CPU driver, each
// run as a kernel on buffers the benchmark owns (as a Net would run it: persistent
// workspace, no tensor bookkeeping in the timed region), against the sgemm peak.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/layers/convolution_layer.h"
#include "lib/layers/inner_product_layer.h"
#include "lib/layers/layer.h"

#if __has_include("lib/layers/pooling.h")
#include "lib/layers/pooling_layer.h"
#define HYBRIDNN_BENCH_POOLING 1
#endif
#if __has_include("lib/layers/lrn.h")
#include "lib/layers/lrn_layer.h"
#define HYBRIDNN_BENCH_LRN 1
#endif
#if __has_include("lib/layers/activation.h")
#include "lib/layers/activation_layer.h"
#define HYBRIDNN_BENCH_RELU 1
#endif

namespace hn::bench {

namespace {

struct LayersOptions {
  int threads = 0;
  std::string blas;               // empty: the build's default
  std::string net = "caffenet";   // or "lenet" (Caffe's mnist LeNet, batch 64), "resnet50",
                                  // "squeezenet"
  bool blocked = false;           // convolutions on the driver's blocked layout
  index_t batch = 0;              // 0: the net's usual batch (CaffeNet 32, LeNet 64)
  std::vector<std::string> only;  // empty: every layer
  // Overrides for the convolutions, for tuning: 0 / automatic = the library's choice.
  std::size_t chunk_bytes = 0;
  Lowering lowering = Lowering::automatic;
  // Several lowerings (--lowering a,b): each layer timed with each in turn, rounds of them
  // alternating, so that they are compared in the same moments of a noisy machine.
  std::vector<Lowering> lowerings;
  // Every layer computes its data gradient, the first included (Caffe's force_backward, as
  // `hybridnn time` and bench/zoo.py time nets).
  bool force_backward = false;
};

LayersOptions parse_layers(const std::vector<std::string>& args) {
  LayersOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if ((arg == "--threads" || arg == "--blas" || arg == "--batch" || arg == "--only" ||
         arg == "--chunk-bytes" || arg == "--lowering" || arg == "--net" || arg == "--layout") &&
        i + 1 == args.size()) {
      throw UsageError{"layers: " + arg + " needs a value"};
    }
    if (arg == "--force-backward") {
      options.force_backward = true;
    } else if (arg == "--threads") {
      options.threads = parse_threads("layers", args[++i]);
    } else if (arg == "--blas") {
      options.blas = args[++i];
    } else if (arg == "--batch") {
      const std::string& value = args[++i];
      char* end = nullptr;
      const long batch = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || batch < 1 || batch > 4096) {
        throw UsageError{"layers: --batch needs a number in [1, 4096], got '" + value + "'"};
      }
      options.batch = batch;
    } else if (arg == "--net") {
      options.net = args[++i];
      if (options.net != "caffenet" && options.net != "lenet" && options.net != "resnet50" &&
          options.net != "squeezenet") {
        throw UsageError{"layers: --net takes caffenet, lenet, resnet50 or squeezenet, got '" +
                         options.net + "'"};
      }
    } else if (arg == "--layout") {
      const std::string& value = args[++i];
      if (value != "blocked" && value != "nchw")
        throw UsageError{"layers: --layout takes blocked or nchw, got '" + value + "'"};
      options.blocked = value == "blocked";
    } else if (arg == "--only") {
      std::istringstream list(args[++i]);
      for (std::string name; std::getline(list, name, ',');) {
        if (!name.empty()) options.only.push_back(name);
      }
    } else if (arg == "--chunk-bytes") {
      const std::string& value = args[++i];
      char* end = nullptr;
      const unsigned long long bytes = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') {
        throw UsageError{"layers: --chunk-bytes needs a number of bytes, got '" + value + "'"};
      }
      options.chunk_bytes = static_cast<std::size_t>(bytes);
    } else if (arg == "--lowering") {
      std::istringstream list(args[++i]);
      for (std::string value; std::getline(list, value, ',');) {
        bool known = false;
        for (const Lowering l :
             {Lowering::automatic, Lowering::type1, Lowering::type3, Lowering::direct_1x1,
              Lowering::direct, Lowering::direct_plain, Lowering::winograd, Lowering::pointwise}) {
          if (value == lowering_name(l)) {
            options.lowerings.push_back(l);
            known = true;
          }
        }
        if (!known) throw UsageError{"layers: unknown --lowering '" + value + "'"};
      }
      if (options.lowerings.empty()) throw UsageError{"layers: --lowering needs a value"};
      options.lowering = options.lowerings.front();
    } else {
      throw UsageError{"layers: unknown option '" + arg + "'"};
    }
  }
  return options;
}

// One layer of the net with its input shape and its forward FLOPs (0: not a GEMM layer).
struct NetLayer {
  std::unique_ptr<Layer> layer;
  Shape input;
  double forward_flops = 0.0;
  bool data_gradient = true;  // false for a net's first layer (no gradient to the data)
};

ConvolutionParams conv(index_t num_output, index_t kernel, index_t stride, index_t pad,
                       index_t group) {
  ConvolutionParams p;
  p.num_output = num_output;
  p.kernel_size = {kernel};
  p.stride = {stride};
  p.pad = {pad};
  p.group = group;
  return p;
}

// Whether a forced lowering can run the layer of `p` (the nets here give one kernel size and
// at most one stride).
bool lowering_applies(Lowering lowering, const ConvolutionParams& p) {
  if (lowering == Lowering::type3) return p.group == 1;
  if (lowering == Lowering::winograd) {
    return p.kernel_size == std::vector<index_t>{3} &&
           (p.stride.empty() || p.stride == std::vector<index_t>{1});
  }
  if (lowering == Lowering::pointwise) {
    return p.group == 1 && p.kernel_size == std::vector<index_t>{1} &&
           (p.pad.empty() || p.pad == std::vector<index_t>{0});
  }
  return true;
}

// CaffeNet (bvlc_reference_caffenet_deploy.prototxt) at batch n, without the dropout and
// softmax layers.
std::vector<NetLayer> caffenet(const LayersOptions& options) {
  const index_t n = options.batch;
  std::vector<NetLayer> net;
  auto add_conv = [&](const char* name, Shape input, ConvolutionParams p) {
    p.chunk_bytes = options.chunk_bytes;
    // A forced lowering applies where it can (type3: group 1 only; winograd: 3x3 stride 1).
    if (lowering_applies(options.lowering, p)) p.lowering = options.lowering;
    auto layer = std::make_unique<ConvolutionLayer>(name, p);
    const Shape out = layer->setup({input}).at(0);
    // 2 * outputs * (C_in / group) * kernel_h * kernel_w: the weights of one output.
    const double flops = 2.0 * out.count() * layer->params().at(0).count() / p.num_output;
    net.push_back({std::move(layer), input, flops});
  };
  auto add_fc = [&](const char* name, Shape input, index_t num_output) {
    InnerProductParams p;
    p.num_output = num_output;
    net.push_back({std::make_unique<InnerProductLayer>(name, p), input,
                   2.0 * input[0] * input.count(1, input.axes()) * num_output});
  };
  auto add = [&](std::unique_ptr<Layer> layer, Shape input) {
    net.push_back({std::move(layer), input, 0.0});
  };
#if HYBRIDNN_BENCH_RELU
  auto relu = [&](const char* name, Shape input) { add(std::make_unique<ReluLayer>(name), input); };
#else
  auto relu = [](const char*, const Shape&) {};
#endif
#if HYBRIDNN_BENCH_POOLING
  auto pool = [&](const char* name, Shape input) {
    PoolingParams p;
    p.pool = PoolMethod::max;
    p.kernel_size = 3;
    p.stride = 2;
    add(std::make_unique<PoolingLayer>(name, p), input);
  };
#else
  auto pool = [](const char*, const Shape&) {};
#endif
#if HYBRIDNN_BENCH_LRN
  auto norm = [&](const char* name, Shape input) {
    LrnParams p;
    p.local_size = 5;
    p.alpha = 1e-4f;
    p.beta = 0.75f;
    add(std::make_unique<LrnLayer>(name, p), input);
  };
#else
  auto norm = [](const char*, const Shape&) {};
#endif
  add_conv("conv1", Shape{n, 3, 227, 227}, conv(96, 11, 4, 0, 1));
  relu("relu1", Shape{n, 96, 55, 55});
  pool("pool1", Shape{n, 96, 55, 55});
  norm("norm1", Shape{n, 96, 27, 27});
  add_conv("conv2", Shape{n, 96, 27, 27}, conv(256, 5, 1, 2, 2));
  relu("relu2", Shape{n, 256, 27, 27});
  pool("pool2", Shape{n, 256, 27, 27});
  norm("norm2", Shape{n, 256, 13, 13});
  add_conv("conv3", Shape{n, 256, 13, 13}, conv(384, 3, 1, 1, 1));
  relu("relu3", Shape{n, 384, 13, 13});
  add_conv("conv4", Shape{n, 384, 13, 13}, conv(384, 3, 1, 1, 2));
  relu("relu4", Shape{n, 384, 13, 13});
  add_conv("conv5", Shape{n, 384, 13, 13}, conv(256, 3, 1, 1, 2));
  relu("relu5", Shape{n, 256, 13, 13});
  pool("pool5", Shape{n, 256, 13, 13});
  add_fc("fc6", Shape{n, 256, 6, 6}, 4096);
  relu("relu6", Shape{n, 4096});
  add_fc("fc7", Shape{n, 4096}, 4096);
  relu("relu7", Shape{n, 4096});
  add_fc("fc8", Shape{n, 4096}, 1000);
  return net;
}

// Caffe's LeNet (examples/mnist/lenet_train_test.prototxt) at batch n, without the data and
// loss layers. conv1 computes no data gradient, as in training.
std::vector<NetLayer> lenet(const LayersOptions& options) {
  const index_t n = options.batch;
  std::vector<NetLayer> net;
  auto add_conv = [&](const char* name, Shape input, ConvolutionParams p, bool data_gradient) {
    p.chunk_bytes = options.chunk_bytes;
    if (lowering_applies(options.lowering, p)) p.lowering = options.lowering;
    auto layer = std::make_unique<ConvolutionLayer>(name, p);
    const Shape out = layer->setup({input}).at(0);
    const double flops = 2.0 * out.count() * layer->params().at(0).count() / p.num_output;
    net.push_back({std::move(layer), input, flops, data_gradient});
  };
  auto add_fc = [&](const char* name, Shape input, index_t num_output) {
    InnerProductParams p;
    p.num_output = num_output;
    net.push_back({std::make_unique<InnerProductLayer>(name, p), input,
                   2.0 * input[0] * input.count(1, input.axes()) * num_output});
  };
#if HYBRIDNN_BENCH_POOLING
  auto pool = [&](const char* name, Shape input) {
    PoolingParams p;
    p.pool = PoolMethod::max;
    p.kernel_size = 2;
    p.stride = 2;
    net.push_back({std::make_unique<PoolingLayer>(name, p), input, 0.0});
  };
#else
  auto pool = [](const char*, const Shape&) {};
#endif
  add_conv("conv1", Shape{n, 1, 28, 28}, conv(20, 5, 1, 0, 1), false);
  pool("pool1", Shape{n, 20, 24, 24});
  add_conv("conv2", Shape{n, 20, 12, 12}, conv(50, 5, 1, 0, 1), true);
  pool("pool2", Shape{n, 50, 8, 8});
  add_fc("ip1", Shape{n, 50, 4, 4}, 500);
#if HYBRIDNN_BENCH_RELU
  net.push_back({std::make_unique<ReluLayer>("relu1"), Shape{n, 500}, 0.0});
#endif
  add_fc("ip2", Shape{n, 500}, 10);
  return net;
}

// A convolution of the zoo nets' lists below, with the options' overrides, on `input`; every
// layer but the first (conv1) computes its data gradient.
void add_zoo_conv(std::vector<NetLayer>& net, const LayersOptions& options, const std::string& name,
                  Shape input, ConvolutionParams p) {
  p.chunk_bytes = options.chunk_bytes;
  if (lowering_applies(options.lowering, p)) p.lowering = options.lowering;
  auto layer = std::make_unique<ConvolutionLayer>(name, p);
  const Shape out = layer->setup({input}).at(0);
  const double flops = 2.0 * out.count() * layer->params().at(0).count() / p.num_output;
  net.push_back({std::move(layer), input, flops, name != "conv1"});
}

// ResNet-50's convolutions (resnet50_deploy.prototxt), one of each distinct shape: conv1,
// each stage's 3x3 layer and its 1x1 layers (in, out), and the strided 1x1 ones.
std::vector<NetLayer> resnet50(const LayersOptions& options) {
  const index_t n = options.batch;
  std::vector<NetLayer> net;
  auto add_conv = [&](const std::string& name, Shape input, ConvolutionParams p) {
    p.bias_term = false;
    add_zoo_conv(net, options, name, input, p);
  };
  add_conv("conv1", Shape{n, 3, 224, 224}, conv(64, 7, 2, 3, 1));
  const index_t widths[] = {64, 128, 256, 512}, sides[] = {56, 28, 14, 7};
  for (int stage = 0; stage < 4; ++stage) {
    const index_t w = widths[stage], side = sides[stage];
    const std::string prefix = "res" + std::to_string(stage + 2);
    add_conv(prefix + "_3x3", Shape{n, w, side, side}, conv(w, 3, 1, 1, 1));
    add_conv(prefix + "_1x1_in", Shape{n, 4 * w, side, side}, conv(w, 1, 1, 0, 1));
    add_conv(prefix + "_1x1_out", Shape{n, w, side, side}, conv(4 * w, 1, 1, 0, 1));
    if (stage > 0) {
      add_conv(prefix + "_1x1_stride2", Shape{n, 2 * w, 2 * side, 2 * side},
               conv(4 * w, 1, 2, 0, 1));
    }
  }
  return net;
}

// SqueezeNet v1.1's convolutions (bench/models/squeezenet_v1.1_deploy.prototxt), one of each
// distinct shape: conv1, each pair of fire modules' squeeze and expand layers (fire2-3 at
// 56x56, fire4-5 at 27x27, fire6-7 and fire8-9 at 13x13), conv10.
std::vector<NetLayer> squeezenet(const LayersOptions& options) {
  const index_t n = options.batch;
  std::vector<NetLayer> net;
  auto add_conv = [&](const std::string& name, Shape input, ConvolutionParams p) {
    add_zoo_conv(net, options, name, input, p);
  };
  add_conv("conv1", Shape{n, 3, 227, 227}, conv(64, 3, 2, 0, 1));
  struct Fire {
    const char* name;
    index_t in, squeeze, expand, side;
  };
  const Fire fires[] = {{"fire2", 64, 16, 64, 56},
                        {"fire3", 128, 16, 64, 56},
                        {"fire4", 128, 32, 128, 27},
                        {"fire6", 256, 48, 192, 13},
                        {"fire8", 384, 64, 256, 13}};
  for (const Fire& f : fires) {
    const std::string prefix = f.name;
    add_conv(prefix + "/squeeze1x1", Shape{n, f.in, f.side, f.side}, conv(f.squeeze, 1, 1, 0, 1));
    add_conv(prefix + "/expand1x1", Shape{n, f.squeeze, f.side, f.side},
             conv(f.expand, 1, 1, 0, 1));
    add_conv(prefix + "/expand3x3", Shape{n, f.squeeze, f.side, f.side},
             conv(f.expand, 3, 1, 1, 1));
  }
  add_conv("conv10", Shape{n, 512, 13, 13}, conv(1000, 1, 1, 0, 1));
  return net;
}

// A buffer of `shape`'s floats on the driver, filled with random values in [-scale, scale].
struct Array {
  Array(Driver& driver, const Shape& s, unsigned seed, float scale)
      : shape(s), buffer(driver, static_cast<std::size_t>(s.count()) * sizeof(float)) {
    std::vector<float> values = random_floats(static_cast<std::size_t>(s.count()), seed);
    for (float& v : values)
      v *= scale;
    driver.copy_from_host(buffer.address(), values.data(), buffer.bytes());
  }
  Pointer pointer() const { return buffer.pointer(); }
  Shape shape;
  Buffer buffer;
};

struct Timing {
  double forward = 0.0, backward = 0.0;  // seconds
  // A convolution's backward with the weight gradient alone (no data gradient); 0: not timed.
  double weights = 0.0;
};

// Runs the layer as a kernel: buffers for every operand, one LayerSlice per direction over
// the whole batch, the workspace allocated once.
Timing time_layer(Driver& driver, NetLayer& entry, bool blocked) {
  Layer& layer = *entry.layer;
  const Shape out_shape = layer.setup({entry.input}).at(0);
  // Blocked operands where their channels fill the driver's blocks (as a Net lays them).
  const Layout block_layout = driver.capabilities().preferred_blocked_layout;
  const auto layout_of = [&](const Shape& s) {
    return blocked && driver.capabilities().blocked_layout && s.axes() == 4 &&
                   s[1] % layout_block(block_layout) == 0
               ? block_layout
               : Layout::nchw;
  };
  const Layout in_layout = layout_of(entry.input), out_layout = layout_of(out_shape);
  layer.use_layouts({in_layout}, {out_layout});
  const index_t batch = entry.input[0];
  Array x(driver, entry.input, 1, 1.0f), dx(driver, entry.input, 2, 1.0f);
  Array y(driver, out_shape, 3, 1.0f), dy(driver, out_shape, 4, 1.0f);
  std::vector<Array> params, param_diffs, states;
  for (Tensor& p : layer.params()) {
    params.emplace_back(driver, p.shape(), 5, 0.01f);
    param_diffs.emplace_back(driver, p.shape(), 6, 0.0f);
  }
  for (Tensor& s : layer.state())
    states.emplace_back(driver, s.shape(), 7, 0.0f);
  Buffer workspace(driver, layer.workspace_bytes(driver, batch));

  LayerSlice forward;
  forward.driver = &driver;
  forward.begin = 0;
  forward.end = batch;
  forward.phase = Phase::train;
  forward.inputs = {
      Operand{entry.input, x.pointer(), Pointer{driver.device(), nullptr, 0}, in_layout}};
  forward.outputs = {
      Operand{out_shape, y.pointer(), Pointer{driver.device(), nullptr, 0}, out_layout}};
  for (std::size_t i = 0; i < params.size(); ++i) {
    forward.params.push_back(
        Operand{params[i].shape, params[i].pointer(), param_diffs[i].pointer()});
  }
  for (const Array& s : states) {
    forward.state.push_back(Operand{s.shape, s.pointer(), Pointer{driver.device(), nullptr, 0}});
  }
  forward.workspace = workspace.pointer();
  LayerSlice backward = forward;
  backward.inputs[0].diff = dx.pointer();
  backward.outputs[0].diff = dy.pointer();
  backward.propagate_down = {entry.data_gradient};
  if (!entry.data_gradient) backward.inputs[0].diff = Pointer{driver.device(), nullptr, 0};

  Timing t;
  t.forward = best_seconds([&] {
    layer.forward(forward);
    driver.synchronize();
  });
  t.backward = best_seconds([&] {
    layer.backward(backward);
    driver.synchronize();
  });
  if (entry.data_gradient && std::string(layer.type()) == "Convolution") {
    LayerSlice weights_only = backward;
    weights_only.propagate_down = {false};
    weights_only.inputs[0].diff = Pointer{driver.device(), nullptr, 0};
    t.weights = best_seconds([&] {
      layer.backward(weights_only);
      driver.synchronize();
    });
  } else if (!entry.data_gradient) {
    t.weights = t.backward;
  }
  return t;
}

bool selected(const LayersOptions& options, const std::string& name) {
  if (options.only.empty()) return true;
  for (const std::string& s : options.only) {
    if (s == name) return true;
  }
  return false;
}

}  // namespace

int run_layers(const std::vector<std::string>& args) {
  LayersOptions options = parse_layers(args);
  if (options.batch == 0) options.batch = options.net == "lenet" ? 64 : 32;
  const int threads = resolve_threads(options.threads);
  DriverOptions driver_options;
  driver_options.set("threads", threads);
  if (!options.blas.empty()) driver_options.set("blas", options.blas);
  const std::unique_ptr<Driver> driver = make_driver(Device{"cpu", 0}, driver_options);
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::fprintf(stderr, "layers: %s, %s at batch %ld, OMP_WAIT_POLICY=%s\n",
               driver->description().c_str(), options.net.c_str(), static_cast<long>(options.batch),
               wait_policy ? wait_policy : "(unset)");

  const Peak peak = measure_peak(threads);
  // OMP_WAIT_POLICY is part of the result: oneDNN's OpenMP threads spin after each GEMM and
  // slow the TBB lowering that follows unless it is "passive" (docs/layers.md).
  fmt::print(
      "{{\"bench\":\"gemm_peak\",\"blas\":\"{}\",\"threads\":{},\"gflops\":{:.1f},"
      "\"omp_wait_policy\":\"{}\"}}\n",
      peak.blas, threads, peak.gflops, wait_policy ? wait_policy : "");
  std::fflush(stdout);

  // One net per lowering compared (one: the options' own).
  const std::vector<Lowering> compared =
      options.lowerings.size() > 1 ? options.lowerings : std::vector<Lowering>{options.lowering};
  std::vector<std::vector<NetLayer>> nets;
  for (const Lowering lowering : compared) {
    LayersOptions one = options;
    one.lowering = lowering;
    nets.push_back(one.net == "lenet"        ? lenet(one)
                   : one.net == "resnet50"   ? resnet50(one)
                   : one.net == "squeezenet" ? squeezenet(one)
                                             : caffenet(one));
    if (options.force_backward) {
      for (NetLayer& layer : nets.back())
        layer.data_gradient = true;
    }
  }
  const int rounds = compared.size() > 1 ? 3 : 1;
  const std::size_t ways = compared.size();
  std::vector<double> conv_forward(ways), conv_backward(ways), total_forward(ways),
      total_backward(ways);
  double conv_flops = 0.0;
  int convs = 0;
  for (std::size_t i = 0; i < nets[0].size(); ++i) {
    const std::string name = nets[0][i].layer->name();
    if (!selected(options, name)) continue;
    // The best of `rounds` rounds, each timing every lowering in turn.
    std::vector<Timing> best(ways);
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < ways; ++k) {
        const Timing t = time_layer(*driver, nets[k][i], options.blocked);
        const auto keep = [&](double mine, double& kept) {
          if (round == 0 || (mine > 0.0 && mine < kept)) kept = mine;
        };
        keep(t.forward, best[k].forward);
        keep(t.backward, best[k].backward);
        keep(t.weights, best[k].weights);
      }
    }
    for (std::size_t k = 0; k < ways; ++k) {
      NetLayer& entry = nets[k][i];
      const Timing& t = best[k];
      const std::string type = entry.layer->type();
      std::string line = fmt::format(
          "{{\"bench\":\"layer\",\"name\":\"{}\",\"type\":\"{}\",\"batch\":{},\"threads\":{}", name,
          type, options.batch, threads);
      if (const auto* c = dynamic_cast<const ConvolutionLayer*>(entry.layer.get())) {
        line += fmt::format(",\"lowering\":\"{}\",\"fwd_chunk\":{},\"bwd_chunk\":{}",
                            c->algorithm(*driver), c->forward_chunk(options.batch),
                            c->backward_chunk(options.batch));
        line += fmt::format(",\"workspace_mb\":{:.1f}",
                            c->workspace_bytes(*driver, options.batch) * 1e-6);
      }
      line +=
          fmt::format(",\"fwd_ms\":{:.3f},\"bwd_ms\":{:.3f}", t.forward * 1e3, t.backward * 1e3);
      if (entry.forward_flops > 0.0) {
        const double fwd = entry.forward_flops / t.forward * 1e-9;
        const double bwd = 2.0 * entry.forward_flops / t.backward * 1e-9;
        line += fmt::format(
            ",\"fwd_gflops\":{:.1f},\"bwd_gflops\":{:.1f},\"fwd_ratio_to_peak\":{:.3f},"
            "\"bwd_ratio_to_peak\":{:.3f}",
            fwd, bwd, fwd / peak.gflops, bwd / peak.gflops);
        if (t.weights > 0.0) {
          // The weight gradient alone: as many FLOPs as the forward.
          const double wgrad = entry.forward_flops / t.weights * 1e-9;
          line += fmt::format(
              ",\"wgrad_ms\":{:.3f},\"wgrad_gflops\":{:.1f},\"wgrad_ratio_to_peak\":{:.3f}",
              t.weights * 1e3, wgrad, wgrad / peak.gflops);
        }
      }
      fmt::print("{}}}\n", line);
      std::fflush(stdout);
      std::fprintf(stderr, "layers: %s (%s): forward %.2f ms, backward %.2f ms\n", name.c_str(),
                   lowering_name(compared[k]), t.forward * 1e3, t.backward * 1e3);
      total_forward[k] += t.forward;
      total_backward[k] += t.backward;
      if (type == "Convolution") {
        conv_forward[k] += t.forward;
        conv_backward[k] += t.backward;
        if (k == 0) {
          conv_flops += entry.forward_flops;
          ++convs;
        }
      }
    }
  }
  for (std::size_t k = 0; k < ways; ++k) {
    const std::string lowering =
        ways > 1 ? fmt::format(",\"lowering\":\"{}\"", lowering_name(compared[k])) : "";
    if (convs > 0) {
      const double fwd = conv_flops / conv_forward[k] * 1e-9;
      const double total = 3.0 * conv_flops / (conv_forward[k] + conv_backward[k]) * 1e-9;
      fmt::print(
          "{{\"bench\":\"layer_total\",\"name\":\"conv1..conv{}\"{},\"layers\":{},\"fwd_ms\":{:.3f}"
          ","
          "\"bwd_ms\":{:.3f},\"fwd_gflops\":{:.1f},\"fwd_ratio_to_peak\":{:.3f},"
          "\"fwd_bwd_gflops\":{:.1f},\"fwd_bwd_ratio_to_peak\":{:.3f}}}\n",
          convs, lowering, convs, conv_forward[k] * 1e3, conv_backward[k] * 1e3, fwd,
          fwd / peak.gflops, total, total / peak.gflops);
    }
    fmt::print(
        "{{\"bench\":\"layer_total\",\"name\":\"all\",\"net\":\"{}\"{},\"fwd_ms\":{:.3f},"
        "\"bwd_ms\":{:.3f}}}\n",
        options.net, lowering, total_forward[k] * 1e3, total_backward[k] * 1e3);
  }
  return 0;
}

}  // namespace hn::bench
