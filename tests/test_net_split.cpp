// The hybrid split inside a Net: Caffe's LeNet and CIFAR-10 quick and full, cut between the
// reference driver on host memory and a second reference driver with memory of its own (a
// device), compute the same losses and gradients as the unsplit net; activations stay on the
// device that computed them; the scheduler's threads, profile, per-layer and automatic splits.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/core/worker.h"
#include "lib/net/net.h"
#include "lib/scheduler/scheduler.h"
#include "lib/solver/solver.h"
#include "tests/core_driver.h"
#include "tests/net_runs.h"
#include "tests/support.h"

namespace hn {
namespace {

using test::TwoDrivers;

// Caffe's LeNet (train phase) from ../shared/models.
std::string lenet_path() {
  return fmt::format("{}/mnist_lenet_train_test.prototxt", HYBRIDNN_MODELS_DIR);
}

// LeNet on generated images at `batch`, on the host driver.
// A solver file in `dir` for Caffe's LeNet at `batch` (the prototxt's Data layers otherwise
// as they are), SGD with momentum 0.9 and weight decay 0.0005, then `schedule` (lr_policy,
// max_iter, ...).
std::string lenet_solver(const test::TempDir& dir, int batch, const std::string& schedule) {
  std::ifstream in(lenet_path());
  std::string net((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = net.find("batch_size: 64");
  REQUIRE(at != std::string::npos);
  net.replace(at, 14, "batch_size: " + std::to_string(batch));
  return dir.write("solver.prototxt", "net: \"" + dir.write("lenet.prototxt", net) +
                                          "\"\nbase_lr: 0.01\nmomentum: 0.9\n"
                                          "weight_decay: 0.0005\n" +
                                          schedule);
}

Net lenet(TwoDrivers& d, NetOptions options, int batch = 8) {
  options.data_source = "synthetic:1x28x28";
  options.batch_size = batch;
  return Net(lenet_path(), d.runtime, *d.host, options);
}

// LeNet with its InnerProduct layers cut by their batch (split_axis: BATCH) rather than by
// their outputs, as a split does by default where that moves less memory.
std::unique_ptr<Net> lenet_batch_cut(TwoDrivers& d, NetOptions options, int batch = 8) {
  std::ifstream in(lenet_path());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string name : {"name: \"ip1\"", "name: \"ip2\""}) {
    const auto at = text.find(name);
    REQUIRE(at != std::string::npos);
    text.insert(at + name.size(), "\n  split_axis: BATCH");
  }
  options.data_source = "synthetic:1x28x28";
  options.batch_size = batch;
  return Net::from_text(text, lenet_path(), d.runtime, *d.host, options);
}

TEST_CASE("split nets compute the unsplit losses and gradients", "[split]") {
  TwoDrivers d;
  const std::pair<const char*, const char*> nets[] = {
      {"mnist_lenet_train_test.prototxt", "synthetic:1x28x28"},
      {"cifar10_cifar10_quick_train_test.prototxt", "synthetic:3x32x32"},
      {"cifar10_cifar10_full_train_test.prototxt", "synthetic:3x32x32"}};  // LRN
  for (const auto& [file, source] : nets) {
    for (int batch : {8, 7}) {
      const test::NetGradients whole =
          test::net_gradients(d.runtime, *d.host, file, source, batch, "");
      for (const char* split : {"reference:1.0,reference:1:0.0", "reference:0.0,reference:1:1.0",
                                "reference:0.5,reference:1:0.5", "reference:0.75,reference:1:0.25",
                                "reference:0.125,reference:1:0.875"}) {
        INFO(file << " batch " << batch << " split " << split);
        const test::NetGradients cut =
            test::net_gradients(d.runtime, *d.host, file, source, batch, split);
        CHECK(cut.loss == Approx(whole.loss).epsilon(1e-6));
        REQUIRE(cut.gradients.size() == whole.gradients.size());
        for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
          INFO("gradient " << g);
          CHECK(test::max_scaled_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE(
    "a tuned net measures each convolution on each device of its split, for that device's rows, "
    "and computes the untuned gradients",
    "[split]") {
  TwoDrivers d;
  const test::TempDir dir;
  TuneOptions tune;
  tune.mode = TuneMode::once;
  tune.cache_path = dir.file("tune.txt");
  std::vector<TuneReport> reports;
  tune.on_layer = [&](const TuneReport& report) { reports.push_back(report); };
  const char* file = "mnist_lenet_train_test.prototxt";
  const test::NetGradients plain =
      test::net_gradients(d.runtime, *d.host, file, "synthetic:1x28x28", 8, "");
  const std::string split = "reference:0.75,reference:1:0.25";
  const test::NetGradients tuned =
      test::net_gradients(d.runtime, *d.host, file, "synthetic:1x28x28", 8, split, tune);
  std::vector<std::string> seen;
  for (const TuneReport& r : reports) {
    CHECK(r.measured);
    CHECK(r.warning.empty());
    seen.push_back(r.layer + " " + r.device);
  }
  CHECK(seen == std::vector<std::string>{"conv1 reference", "conv1 reference:1", "conv2 reference",
                                         "conv2 reference:1"});
  // 6 and 2 rows: each device's shapes are cached apart.
  std::ifstream cache(tune.cache_path);
  const std::string text((std::istreambuf_iterator<char>(cache)), std::istreambuf_iterator<char>());
  CHECK_THAT(text,
             Catch::Contains("Convolution 6x1x28x28") && Catch::Contains("Convolution 2x1x28x28"));
  CHECK(tuned.loss == Approx(plain.loss).epsilon(1e-6));
  REQUIRE(tuned.gradients.size() == plain.gradients.size());
  for (std::size_t g = 0; g < plain.gradients.size(); ++g) {
    INFO("gradient " << g);
    CHECK(test::max_scaled_diff(plain.gradients[g], tuned.gradients[g]) <= 1e-5);
  }
}

TEST_CASE("an automatic split tunes a convolution again where the whole-net check cut it otherwise",
          "[split]") {
  TwoDrivers d;
  const test::TempDir dir;
  NetOptions options;
  options.split = Split::automatic({Device::parse("reference"), Device::parse("reference:1")});
  options.force_backward = true;
  options.tune.mode = TuneMode::once;
  options.tune.cache_path = dir.file("tune.txt");
  std::vector<TuneReport> reports;
  options.tune.on_layer = [&](const TuneReport& report) { reports.push_back(report); };
  // Several tries: which cut the check keeps depends on timing, and the case wanted is a
  // convolution whose measured rows it changed.
  int changed = 0;
  for (int attempt = 0; attempt < 6 && changed == 0; ++attempt) {
    const std::unique_ptr<Net> net = lenet_batch_cut(d, options);
    std::map<std::string, Split> measured;
    net->calibrate_splits(
        [&](const std::string& layer, const Split& split) { measured[layer] = split; });
    std::map<std::string, Split> kept;
    for (const auto& [layer, split] : net->layer_splits())
      kept[layer] = split;
    reports.clear();
    net->forward();
    for (const std::string conv : {"conv1", "conv2"}) {
      REQUIRE(measured.count(conv) == 1);
      const Split now = kept.count(conv) == 1 ? kept[conv] : Split();
      const bool moved = now.partition(8) != measured[conv].partition(8);
      changed += moved ? 1 : 0;
      // Tuned again, on each device with rows, exactly where its slices changed.
      std::set<std::string> tuned_on;
      for (const TuneReport& report : reports)
        if (report.layer == conv) tuned_on.insert(report.device);
      std::set<std::string> holding;
      if (now.empty()) {
        holding.insert(net->driver().device().name());
      } else {
        const auto rows = now.partition(8);
        for (std::size_t s = 0; s < rows.size(); ++s)
          if (rows[s].second > rows[s].first) holding.insert(now.shares()[s].device.name());
      }
      INFO(conv << ": measured " << measured[conv].to_string() << ", kept " << now.to_string());
      CHECK(tuned_on == (moved ? holding : std::set<std::string>{}));
    }
  }
  if (changed == 0) WARN("the whole-net check kept every convolution's measured rows six times");
}

TEST_CASE("layers split alike keep their activations on the device that computed them", "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::parse("reference:1");  // every layer that can: on the device
  Net net = lenet(d, options);
  net.forward();  // the first forward also copies the parameters
  d.device->reset_transfer_stats();
  net.forward();
  // Copied: only the new images onto the device (the data layer fills host memory) and ip2's
  // output back to the host, where the loss (which needs the whole batch) runs.
  const TransferStats& stats = d.device->transfer_stats();
  CHECK(stats.to_device_bytes == 8 * 28 * 28 * sizeof(float));
  CHECK(stats.to_host_bytes == 8 * 10 * sizeof(float));
  CHECK(stats.within == 0);
}

TEST_CASE(
    "a blob's gradients from several consumers on the device are summed there, not on the host",
    "[split]") {
  // conv's output feeds a and b: the Net's Split sums their two gradients for conv's backward.
  const char* fan_out = R"(
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "a" type: "Convolution" bottom: "c" top: "a"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "b" type: "Convolution" bottom: "c" top: "b"
        convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
layer { name: "ip" type: "InnerProduct" bottom: "s" top: "out" loss_weight: 1
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
)";
  TwoDrivers d;
  NetOptions on_device;
  on_device.split = Split::parse("reference:1");  // every layer on the device
  auto net = Net::from_text(fan_out, "fan_out.prototxt", d.runtime, *d.host, on_device);
  auto plain = Net::from_text(fan_out, "fan_out.prototxt", d.runtime, *d.host, NetOptions{});
  const std::vector<float> x = test::random_floats(4 * 2 * 6 * 6, 91);
  for (Net* n : {net.get(), plain.get()})
    std::copy(x.begin(), x.end(), n->blob("x").host_data_mut());
  net->forward_backward();  // the first also copies the parameters and their gradients
  net->forward();
  d.device->reset_transfer_stats();
  net->backward();
  // Copied: only the loss weight onto the device (the Net fills out's gradient on the host).
  // Summed on the host, the two gradients of c would come back (2 x 4x3x4x4 floats) and the
  // sum go out again.
  const TransferStats& stats = d.device->transfer_stats();
  CHECK(stats.to_host_bytes == 0);
  CHECK(stats.to_device_bytes == 4 * 2 * sizeof(float));
  // And the gradients are the unsplit net's.
  plain->clear_param_diffs();
  CHECK(net->forward_backward() == Approx(plain->forward_backward()).epsilon(1e-6));
  net->clear_param_diffs();
  net->forward_backward();
  for (std::size_t p = 0; p < plain->learnable_params().size(); ++p) {
    Tensor& a = *plain->learnable_params()[p].tensor;
    Tensor& b = *net->learnable_params()[p].tensor;
    const std::vector<float> want(a.host_diff(), a.host_diff() + a.count());
    const std::vector<float> got(b.host_diff(), b.host_diff() + b.count());
    CHECK(test::max_scaled_diff(want, got) <= 1e-6);
  }
}

TEST_CASE(
    "a split naming a device that has no driver and cannot get one is an error naming the "
    "layer and why",
    "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::parse("reference:0.5,cuda:3:0.5");
  CHECK_THROWS_WITH(lenet(d, options), Catch::Contains("conv1") && Catch::Contains("cuda:3") &&
                                           Catch::Contains("reference:1") &&
                                           Catch::Contains("cannot make drivers: cuda:3"));
}

TEST_CASE(
    "a net's split entries get their drivers from the registry, made at once with the "
    "net's own, the CPU drivers dividing the cores",
    "[split]") {
  Runtime runtime;
  NetOptions options;
  options.split = Split::parse("cpu:0.5,cpu:1:0.5");
  options.batch_size = 4;
  const std::string model = lenet_path();
  options.data_source = "synthetic:1x28x28";
  Net net(model, runtime, Device::parse("cpu"), options);
  REQUIRE(runtime.drivers().size() == 2);
  CHECK(&net.driver() == runtime.find(Device::parse("cpu")));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (Driver* driver : runtime.drivers()) {
    INFO(driver->description());
    const std::string threads = fmt::format(": {} thread", std::max(1, cores / 2));
    CHECK(driver->description().find(threads) != std::string::npos);
  }
  // A driver the program made is kept as it is; the split's other device joins it.
  Runtime mine;
  DriverOptions one;
  one.set("threads", 1);
  Driver& own = mine.add(Device::parse("cpu"), one);
  Net again(model, mine, own, options);
  CHECK(mine.drivers().size() == 2);
  CHECK(own.description().find(": 1 thread") != std::string::npos);
  CHECK(std::isfinite(again.forward()));
}

// 50 SGD iterations of Caffe's LeNet (at batch 16, to keep the reference drivers quick) with
// the batch cut 1:1 between the reference driver and a second one with memory of its own
// track the unsplit run. With the reference drivers' double accumulation the two runs agree
// to the last bit here; the tolerance is the issue's 1e-4 relative. (On the CPU driver the
// two halves use other convolution algorithms than the whole batch, and the rounding
// differences grow chaotically after some 30 iterations.)
TEST_CASE("LeNet training with a 1:1 split tracks the unsplit losses", "[split]") {
  test::TempDir dir("hybridnn-split-solver");
  const std::string solver_path =
      lenet_solver(dir, 16,
                   "lr_policy: \"inv\"\ngamma: 0.0001\npower: 0.75\n"
                   "max_iter: 20\nsnapshot_after_train: false\nrandom_seed: 3\n");
  auto losses = [&](const std::string& split) {
    TwoDrivers d;
    SolverOptions options;
    options.train_data = "synthetic:1x28x28";
    if (!split.empty()) options.split = Split::parse(split);
    Solver solver(solver_path, d.runtime, *d.host, options);
    std::vector<float> result;
    for (int i = 0; i < 20; ++i) {
      solver.step(1);
      result.push_back(solver.last_loss());
    }
    return result;
  };
  const std::vector<float> whole = losses("");
  const std::vector<float> cut = losses("reference:0.5,reference:1:0.5");
  REQUIRE(cut.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    INFO("iteration " << i);
    CHECK(std::fabs(cut[i] - whole[i]) <= 1e-4 * std::max(1.0f, std::fabs(whole[i])));
  }
  // The weights moved (random labels leave nothing to learn in 20 iterations).
  CHECK(std::count(whole.begin(), whole.end(), whole.front()) == 1);
}

// Determinism: two runs of the same split training give bitwise identical losses and
// weights (CPU driver instances, two threads each).
// Issue 35: the memory plan, the scratch and the solver's history are made by the first
// iterations; a steady-state one allocates and frees nothing on any driver (counted by
// Driver::transfer_stats), unsplit or split across two memory spaces.
TEST_CASE("a steady-state training iteration allocates and frees nothing, split or not",
          "[split]") {
  test::TempDir dir("hybridnn-steady-state");
  const std::string solver_path =
      lenet_solver(dir, 8, "lr_policy: \"fixed\"\nmax_iter: 10\nsnapshot_after_train: false\n");
  for (const std::string split : {"", "cpu:0.5,reference:1:0.5"}) {
    INFO("split '" << split << "'");
    Runtime runtime;
    Driver& cpu = runtime.add(Device::parse("cpu"));
    DriverOptions separate;
    separate.set("separate_memory", true);
    Driver& other = runtime.add(Device::parse("reference:1"), separate);
    SolverOptions options;
    options.data = "synthetic:1x28x28";
    if (!split.empty()) options.split = Split::parse(split);
    Solver solver(solver_path, runtime, cpu, options);
    CHECK(cpu.transfer_stats().allocations > 0);  // the nets' memory, counted
    solver.step(2);
    for (Driver* driver : {&cpu, &other})
      driver->reset_transfer_stats();
    solver.step(1);
    for (const Driver* driver : {&cpu, &other}) {
      INFO(driver->name());
      CHECK(driver->transfer_stats().allocations == 0);
      CHECK(driver->transfer_stats().frees == 0);
    }
    if (!split.empty()) CHECK(other.transfer_stats().total() > 0);  // it took part
  }
}

// Issue 36: a device's operand copies (its rows of the input, the weights) are made on its
// own thread just before its slice, so they overlap the other devices' compute; before,
// the calling thread made every copy while all devices waited.
TEST_CASE("a split device copies its operands into its memory on its own thread", "[split]") {
  test::register_core_driver();
  test::TempDir dir("hybridnn-split-copies");
  const std::string solver_path =
      lenet_solver(dir, 8, "lr_policy: \"fixed\"\nmax_iter: 10\nsnapshot_after_train: false\n");
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  DriverOptions separate;
  separate.set("separate_memory", true);
  auto& other = dynamic_cast<test::CoreDriver&>(runtime.add(Device::parse("core:1"), separate));
  SolverOptions options;
  options.data = "synthetic:1x28x28";
  options.split = Split::parse("cpu:0.5,core:1:0.5");
  Solver solver(solver_path, runtime, cpu, options);
  solver.step(2);  // the updated weights are current on the host only
  // The passes' copies only: the solver's update of the layers cut by outputs runs on
  // core:1 from this thread, while every device is idle.
  const std::size_t before = other.copy_from_host_threads().size();
  CHECK(std::isfinite(solver.net().forward_backward()));
  const std::vector<std::thread::id> threads = other.copy_from_host_threads();
  REQUIRE(threads.size() > before + 4);  // the weights and its rows of the batch
  const auto on_caller = std::count(threads.begin() + static_cast<std::ptrdiff_t>(before),
                                    threads.end(), std::this_thread::get_id());
  CHECK(on_caller == 0);
}

// The operand copies a device's thread makes are counted as made when they are listed; when
// the device fails before making them (here: its first layer of a run throws, so it never
// reaches the second), they are undone, and the next forward copies the weights again
// instead of reading stale ones as current.
TEST_CASE("a device that fails before making its copies leaves no stale bytes as current",
          "[split]") {
  test::register_core_driver();
  const char* text = R"(
    layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 6 } } }
    layer { name: "ip1" type: "InnerProduct" bottom: "x" top: "h" split_axis: BATCH
            inner_product_param { num_output: 5 weight_filler { type: "gaussian" } } }
    layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "y" split_axis: BATCH
            inner_product_param { num_output: 3 weight_filler { type: "gaussian" } } })";
  Runtime runtime;
  Driver& home = runtime.add(Device::parse("reference"));
  DriverOptions separate;
  separate.set("separate_memory", true);
  auto& other = dynamic_cast<test::CoreDriver&>(runtime.add(Device::parse("core:1"), separate));
  NetOptions options;
  options.state.phase = Phase::test;
  options.reuse_memory = false;
  options.split = Split::parse("reference:0.5,core:1:0.5");
  const auto net = Net::from_text(text, "two.prototxt", runtime, home, options);
  const auto forward = [&](Net& on) {
    float* x = on.blob("x").host_data_mut();
    for (int i = 0; i < 24; ++i)
      x[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    on.forward();
    const BlobRef y = on.blob("y");
    return std::vector<float>(y.host_data(), y.host_data() + y.count());
  };
  forward(*net);  // core:1 holds both layers' weights now
  REQUIRE(net->layer_runs(false) == std::vector<std::vector<std::string>>{{"ip1", "ip2"}});
  // New weights, current on the host only.
  for (const NetParam& param : net->learnable_params()) {
    float* w = param.tensor->host_data_mut();
    for (index_t i = 0; i < param.tensor->count(); ++i)
      w[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
  }
  other.fail_gemm(1);  // ip1 on core:1 throws; core:1 never reaches ip2's copies
  CHECK_THROWS_WITH(forward(*net), Catch::Contains("injected"));
  other.fail_gemm(0);
  const std::vector<float> got = forward(*net);
  // The same weights on the reference driver alone.
  NetOptions whole = options;
  whole.split = Split();
  const auto unsplit = Net::from_text(text, "two.prototxt", runtime, home, whole);
  for (std::size_t p = 0; p < unsplit->learnable_params().size(); ++p) {
    Tensor& from = *net->learnable_params()[p].tensor;
    std::copy(from.host_data(), from.host_data() + from.count(),
              unsplit->learnable_params()[p].tensor->host_data_mut());
  }
  CHECK(got == forward(*unsplit));
}

TEST_CASE("split training is bitwise reproducible", "[split]") {
  test::TempDir dir("hybridnn-split-repro");
  const std::string solver_path = dir.write(
      "solver.prototxt", "net: \"" + lenet_path() +
                             "\"\n"
                             "base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n"
                             "lr_policy: \"fixed\"\nmax_iter: 10\nsnapshot_after_train: false\n");
  auto train = [&]() {
    Runtime runtime;
    Driver& main = runtime.add(Device::parse("cpu"));
    runtime.add(Device::parse("cpu:1"));
    SolverOptions options;
    options.train_data = "synthetic:1x28x28";
    options.split = Split::parse("cpu:0.7,cpu:1:0.3");
    Solver solver(solver_path, runtime, main, options);
    std::vector<float> result;
    for (int i = 0; i < 10; ++i) {
      solver.step(1);
      result.push_back(solver.last_loss());
    }
    for (const NetParam& param : solver.net().learnable_params()) {
      const float* w = param.tensor->host_data();
      result.insert(result.end(), w, w + param.tensor->count());
    }
    return result;
  };
  const std::vector<float> first = train();
  const std::vector<float> second = train();
  REQUIRE(first.size() == second.size());
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

// The scheduler's threads: one per device, long-lived, running tasks at the same time.
TEST_CASE("a device worker runs every task on one thread of its own", "[split]") {
  detail::DeviceWorker worker;
  std::thread::id first, second;
  worker.submit([&] { first = std::this_thread::get_id(); });
  CHECK_FALSE(worker.wait());
  worker.submit([&] { second = std::this_thread::get_id(); });
  CHECK_FALSE(worker.wait());
  CHECK(first == second);
  CHECK(first != std::this_thread::get_id());
}

TEST_CASE("a runtime keeps one device thread per driver", "[split]") {
  TwoDrivers d;
  detail::DeviceWorker& device = detail::RuntimeThreads::of(d.runtime, *d.device);
  CHECK(&detail::RuntimeThreads::of(d.runtime, *d.device) == &device);
  CHECK(&detail::RuntimeThreads::of(d.runtime, *d.host) != &device);
  // Two nets splitting onto the same device use its one thread.
  NetOptions options;
  options.split = Split::parse("reference:0.5,reference:1:0.5");
  Net first = lenet(d, options, 4);
  Net second = lenet(d, options, 4);
  CHECK(first.forward_backward() == second.forward_backward());
  std::thread::id id;
  device.submit([&] { id = std::this_thread::get_id(); });
  CHECK_FALSE(device.wait());
  CHECK(id != std::this_thread::get_id());
}

TEST_CASE("a device worker hands back what its task threw", "[split]") {
  detail::DeviceWorker worker;
  worker.submit([] { throw Error("slice failed on reference:1"); });
  const std::exception_ptr error = worker.wait();
  REQUIRE(error);
  CHECK_THROWS_WITH(std::rethrow_exception(error), "slice failed on reference:1");
  worker.submit([] {});
  CHECK_FALSE(worker.wait());
}

TEST_CASE("two device workers run their tasks at the same time", "[split]") {
  // Each task waits for the other to have started: they finish only if they overlap (a
  // serial run would give up after the timeout and report it).
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0;
  auto meet = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    ++started;
    changed.notify_all();
    return changed.wait_for(lock, std::chrono::seconds(20), [&] { return started == 2; });
  };
  bool met_a = false, met_b = false;
  detail::DeviceWorker a, b;
  a.submit([&] { met_a = meet(); });
  b.submit([&] { met_b = meet(); });
  CHECK_FALSE(a.wait());
  CHECK_FALSE(b.wait());
  CHECK(met_a);
  CHECK(met_b);
}

const SliceProfile* find_device(const LayerProfile& layer, const std::string& device) {
  for (const SliceProfile& slice : layer.devices)
    if (slice.device.name() == device) return &slice;
  return nullptr;
}

const LayerProfile& find_layer(const std::vector<LayerProfile>& profile, const std::string& name) {
  for (const LayerProfile& layer : profile)
    if (layer.name == name) return layer;
  FAIL("no profile for layer " << name);
  throw;
}

TEST_CASE("the profile reports each device's rows, busy time and copies per layer", "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::parse("reference:0.75,reference:1:0.25");
  Net net = lenet(d, options);
  net.forward_backward();
  net.reset_profile();
  net.forward_backward();
  net.forward_backward();
  const std::vector<LayerProfile> profile = net.profile();
  const LayerProfile& conv1 = find_layer(profile, "conv1");
  CHECK(conv1.forward_calls == 2);
  CHECK(conv1.backward_calls == 2);
  REQUIRE(conv1.devices.size() == 2);
  CHECK(conv1.devices[0].device.name() == "reference");
  CHECK(conv1.devices[0].rows == 6);
  CHECK(conv1.devices[1].device.name() == "reference:1");
  CHECK(conv1.devices[1].rows == 2);
  for (const SliceProfile& slice : conv1.devices) {
    CHECK(slice.forward_busy > 0.0);
    CHECK(slice.backward_busy > 0.0);
    CHECK(slice.forward_busy + slice.backward_busy + slice.waiting <=
          conv1.forward_seconds + conv1.backward_seconds + 1e-9);
  }
  // Per forward: the device's 2 new images (host copies are shared, so the reference
  // driver on host memory copies nothing); per backward: conv1's weight-gradient partial
  // (20x1x5x5 + 20 floats) back to the host, where it is added to the host's.
  CHECK(find_device(conv1, "reference")->copy_bytes == 0);
  CHECK(find_device(conv1, "reference:1")->copy_bytes ==
        2 * (2 * 28 * 28 + 20 * 25 + 20) * sizeof(float));
  // conv2 reads what conv1 left on each device: its copies are only its gradient partial.
  const LayerProfile& conv2 = find_layer(profile, "conv2");
  CHECK(find_device(conv2, "reference:1")->copy_bytes == 2 * (50 * 20 * 25 + 50) * sizeof(float));
  // The loss needs the whole batch: it runs on the Net's driver alone.
  const LayerProfile& loss = find_layer(profile, "loss");
  REQUIRE(loss.devices.size() == 1);
  CHECK(loss.devices[0].device.name() == "reference");
  CHECK(loss.devices[0].rows == 8);
}

TEST_CASE("per-layer splits override the net's and must name layers of the net", "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.layer_splits = {{"conv2", Split::parse("reference:0.5,reference:1:0.5")}};
  Net net = lenet(d, options);
  const LayerSplits splits = net.layer_splits();
  REQUIRE(splits.size() == 1);
  CHECK(splits[0].first == "conv2");
  CHECK(splits[0].second.to_string() == "reference:0.5,reference:1:0.5");
  net.forward();
  // A copy: profile() returns a temporary.
  const LayerProfile conv2 = find_layer(net.profile(), "conv2");
  REQUIRE(conv2.devices.size() == 2);
  CHECK(conv2.devices[1].rows == 4);

  options.layer_splits = {{"conv7", Split::parse("reference:1")}};
  CHECK_THROWS_WITH(lenet(d, options), Catch::Contains("mnist_lenet_train_test.prototxt") &&
                                           Catch::Contains("'conv7'"));
}

TEST_CASE("an automatic split measures every layer and leaves the net's state as it was",
          "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::automatic({Device::parse("reference"), Device::parse("reference:1")});
  options.force_backward = true;
  const std::unique_ptr<Net> cut = lenet_batch_cut(d, options);
  Net& net = *cut;
  NetOptions plain_options;
  plain_options.force_backward = true;
  const std::unique_ptr<Net> unsplit = lenet_batch_cut(d, plain_options);
  Net& plain = *unsplit;
  CHECK(net.needs_split_calibration());
  for (const NetParam& param : net.learnable_params()) {
    float* diff = param.tensor->host_diff_mut();
    for (index_t i = 0; i < param.tensor->count(); ++i)
      diff[i] = 0.5f;
  }
  std::vector<std::vector<float>> before;
  for (const NetParam& param : net.learnable_params()) {
    before.emplace_back(param.tensor->host_data(),
                        param.tensor->host_data() + param.tensor->count());
    before.emplace_back(param.tensor->host_diff(),
                        param.tensor->host_diff() + param.tensor->count());
  }
  std::vector<std::string> heard;
  std::vector<Split> measured;
  net.calibrate_splits([&](const std::string& layer, const Split& split) {
    heard.push_back(layer);
    measured.push_back(split);
    CHECK(split.shares().size() == 2);
  });
  CHECK_FALSE(net.needs_split_calibration());
  CHECK(net.data_position() == 0);
  // Every layer that can be cut by rows was measured, in net order; the loss was not.
  CHECK(heard ==
        std::vector<std::string>{"conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"});
  REQUIRE(measured.size() == heard.size());
  for (std::size_t l = 0; l < measured.size(); ++l) {
    INFO(heard[l] << ": " << measured[l].to_string());
    double total = 0.0;
    for (const SplitShare& share : measured[l].shares())
      total += share.fraction;
    CHECK(total == Approx(1.0).epsilon(1e-9));
  }
  // relu1 computes in place on ip1's output and follows ip1.
  CHECK(measured[5].to_string() == measured[4].to_string());
  // The whole net was timed with the measured splits, with one split for every layer (each
  // device's share of the work) and with one device alone, unless every layer came out on
  // one and the same device; the fastest was kept, a split only when 3 % faster.
  std::set<std::string> holding;  // devices given rows by some layer
  for (const Split& split : measured) {
    const auto rows = split.partition(net.batch_size());
    for (std::size_t s = 0; s < rows.size(); ++s)
      if (rows[s].second > rows[s].first) holding.insert(split.shares()[s].device.name());
  }
  const Net::SplitCheck check = net.split_check();
  CHECK(check.checked == (holding.size() > 1));
  using Kept = Net::SplitCheck::Kept;
  if (check.checked) {
    CHECK(check.measured_seconds > 0.0);
    CHECK(check.uniform_seconds > 0.0);
    CHECK(check.alone_seconds > 0.0);
    CHECK(holding.count(check.alone.name()) == 1);
    // The uniform split gives each device its share of the layers' work (forward flops).
    const auto index_of = [&](const std::string& name) {
      for (int i = 0; i < net.num_layers(); ++i)
        if (net.layer_name(i) == name) return i;
      FAIL("no layer " << name);
      return -1;
    };
    double flops = 0.0, first = 0.0;
    for (std::size_t l = 0; l < measured.size(); ++l) {
      const double f = std::max(1.0, net.layer_forward_flops(index_of(heard[l])));
      flops += f;
      first += f * measured[l].shares()[0].fraction;
    }
    // The search starts there; `uniform` is the fastest split for every layer it timed, or a
    // balanced one near it; no cut of the batch is timed twice.
    REQUIRE_FALSE(check.uniform_tried.empty());
    const Split& start = check.uniform_tried.front().split;
    REQUIRE(start.shares().size() == measured[0].shares().size());
    CHECK(start.shares()[0].fraction == Approx(first / flops).epsilon(1e-9));
    CHECK_FALSE(check.uniform_tried.front().balanced);
    double fastest = check.uniform_tried.front().seconds;
    for (std::size_t t = 0; t < check.uniform_tried.size(); ++t) {
      const Net::SplitCheck::Tried& tried = check.uniform_tried[t];
      INFO(tried.split.to_string() << " " << tried.seconds << " s");
      CHECK(tried.seconds > 0.0);
      fastest = std::min(fastest, tried.seconds);
      for (std::size_t u = 0; u < t; ++u)
        CHECK(check.uniform_tried[u].split.partition(net.batch_size()) !=
              tried.split.partition(net.batch_size()));
    }
    bool found = false;
    for (const Net::SplitCheck::Tried& tried : check.uniform_tried) {
      if (tried.split.to_string() != check.uniform.to_string() ||
          tried.seconds != check.uniform_seconds)
        continue;
      found = true;
      // A balanced cut within 10 % of the fastest moves no more than a row per device from
      // it where it is more than 3 % slower.
      CHECK((tried.seconds == fastest || (tried.balanced && tried.seconds <= 1.1 * fastest)));
      if (tried.seconds <= 1.03 * fastest) continue;
      for (const Net::SplitCheck::Tried& quickest : check.uniform_tried) {
        if (quickest.seconds != fastest) continue;
        const auto rows = tried.split.partition(net.batch_size());
        const auto other = quickest.split.partition(net.batch_size());
        for (std::size_t r = 0; r < rows.size(); ++r)
          CHECK(std::abs((rows[r].second - rows[r].first) - (other[r].second - other[r].first)) <=
                1);
      }
    }
    CHECK(found);
    // The measured splits need to be 3 % faster than the uniform one, a split 3 % faster than
    // the device alone.
    const double split_seconds = check.measured_seconds >= 0.97 * check.uniform_seconds
                                     ? check.uniform_seconds
                                     : check.measured_seconds;
    CHECK((check.kept == Kept::alone) == (split_seconds >= 0.97 * check.alone_seconds));
    if (check.kept == Kept::uniform) CHECK(check.measured_seconds >= 0.97 * check.uniform_seconds);
    if (check.kept == Kept::measured)
      CHECK((check.measured_seconds < 0.97 * check.uniform_seconds ||
             check.measured_seconds == check.uniform_seconds));
  }
  const LayerSplits splits = net.layer_splits();
  if (!check.checked || check.kept == Kept::measured) {
    REQUIRE(splits.size() == heard.size());
    for (std::size_t l = 0; l < splits.size(); ++l)
      CHECK(splits[l].second.to_string() == measured[l].to_string());
  } else if (check.kept == Kept::uniform) {
    REQUIRE(splits.size() == heard.size());
    for (const auto& [layer, split] : splits)
      CHECK(split.to_string() == check.uniform.to_string());
  } else if (check.alone == net.driver().device()) {
    CHECK(splits.empty());  // the Net's own driver alone: the unsplit path
  } else {
    REQUIRE(splits.size() == heard.size());
    for (const auto& [layer, split] : splits) {
      INFO(layer << ": " << split.to_string());
      for (const SplitShare& share : split.shares())
        CHECK(share.fraction == (share.device == check.alone ? 1.0 : 0.0));
    }
  }
  std::size_t k = 0;
  for (const NetParam& param : net.learnable_params()) {
    const float* data = param.tensor->host_data();
    const float* diff = param.tensor->host_diff();
    CHECK(std::equal(before[k].begin(), before[k].end(), data));
    CHECK(std::equal(before[k + 1].begin(), before[k + 1].end(), diff));
    k += 2;
  }
  // The measured split computes what the unsplit net does, starting from batch 0.
  net.clear_param_diffs();
  plain.clear_param_diffs();
  CHECK(net.forward_backward() == Approx(plain.forward_backward()).epsilon(1e-6));
  for (std::size_t p = 0; p < net.learnable_params().size(); ++p) {
    const Tensor& a = *plain.learnable_params()[p].tensor;
    Tensor& b = *net.learnable_params()[p].tensor;
    const std::vector<float> want(const_cast<Tensor&>(a).host_diff(),
                                  const_cast<Tensor&>(a).host_diff() + a.count());
    const std::vector<float> got(b.host_diff(), b.host_diff() + b.count());
    CHECK(test::max_scaled_diff(want, got) <= 1e-5);
  }
}

TEST_CASE("an automatic split is measured by the first forward when not asked before", "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::parse("auto:reference,reference:1");
  const std::unique_ptr<Net> net = lenet_batch_cut(d, options);
  net->forward();
  CHECK_FALSE(net->needs_split_calibration());
  CHECK(net->layer_splits().size() == 7);
}

// The same at every door: the tool's --split auto, the C ABI's split "auto" and this.
TEST_CASE("a bare automatic split measures every available device but the reference driver",
          "[split]") {
  TwoDrivers d;  // two reference drivers, and no cpu driver yet
  NetOptions options;
  options.split = Split::parse("auto");
  std::vector<Device> expected;
  for (const Device& device : available_devices())
    if (device.kind != "reference") expected.push_back(device);
  CHECK(options.split.measured_devices() == expected);
  Net net = lenet(d, options);
  for (const Device& device : expected)
    CHECK(d.runtime.find(device) != nullptr);  // made when the net named them
  net.calibrate_splits();
  const LayerSplits splits = net.layer_splits();
  CHECK(splits.size() == 7);
  for (const auto& [layer, split] : splits) {
    INFO(layer << ": " << split.to_string());
    for (const SplitShare& share : split.shares())
      CHECK(share.device.kind != "reference");
  }
}

namespace {
// A core-only driver that sleeps before every GEMM of inner dimension `k`: one layer's
// slices made slow on one device only.
class SleepingDriver final : public test::CoreDriver {
 public:
  SleepingDriver(int id, index_t k, int milliseconds)
      : CoreDriver(Device{"cpu", id}, false), k_(k), milliseconds_(milliseconds) {}

 protected:
  void do_gemm(Transpose trans_a, Transpose trans_b, index_t m, index_t n, index_t k, float alpha,
               const float* a, index_t lda, const float* b, index_t ldb, float beta, float* c,
               index_t ldc) override {
    if (k == k_) std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds_));
    CoreDriver::do_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

 private:
  const index_t k_;
  const int milliseconds_;
};
}  // namespace

// In a run of layers cut alike, the devices wait only at the run's end. Here cpu:7 is slow
// on conv1 (inner dimension 1x5x5) and cpu:8 on conv2 (20x5x5), so each waits at the end
// for what the other did in a layer where it was quick: that wait belongs to the layers
// where it was short of the wall time, not all to the run's last (where it was a layer's
// busy and waiting adding up to more than the layer's wall time).
TEST_CASE("in a run of layers a device's busy and waiting in a layer never exceed its wall time",
          "[split]") {
  TwoDrivers d;
  d.runtime.add(std::make_unique<SleepingDriver>(7, 25, 200));
  d.runtime.add(std::make_unique<SleepingDriver>(8, 500, 20));
  NetOptions options;
  options.split = Split::parse("cpu:7:0.5,cpu:8:0.5");
  Net net = lenet(d, options);
  net.forward_backward();
  net.reset_profile();
  net.forward_backward();
  const std::vector<LayerProfile> profile = net.profile();
  for (const LayerProfile& layer : profile) {
    for (const SliceProfile& slice : layer.devices) {
      INFO(layer.name << " on " << slice.device.name());
      CHECK(slice.forward_busy + slice.backward_busy + slice.waiting <=
            layer.forward_seconds + layer.backward_seconds + 1e-9);
    }
  }
  // cpu:8 waited for cpu:7's sleep in conv1 (200 ms, less its own 20 in conv2), and the
  // profile says so in conv1.
  CHECK(find_device(find_layer(profile, "conv1"), "cpu:8")->waiting >= 0.03);
}

namespace {
// A core-only driver whose GEMM fails, as a device might mid-run.
class FailingDriver final : public test::CoreDriver {
 public:
  FailingDriver() : CoreDriver(Device{"cpu", 7}, false) {}

 protected:
  void do_gemm(Transpose, Transpose, index_t, index_t, index_t, float, const float*, index_t,
               const float*, index_t, float, float*, index_t) override {
    throw Error("injected gemm failure");
  }
};
}  // namespace

TEST_CASE("an error in a slice on a device thread reaches the caller, naming the device",
          "[split]") {
  TwoDrivers d;
  d.runtime.add(std::make_unique<FailingDriver>());  // cpu:7: its GEMM fails
  NetOptions options;
  options.split = Split::parse("reference:0.5,cpu:7:0.5");
  Net net = lenet(d, options);
  const std::string error = test::error_of([&] { net.forward(); });
  CHECK_THAT(error, Catch::Contains("mnist_lenet_train_test.prototxt: layer 'conv1'") &&
                        Catch::Contains("forward on cpu:7") &&
                        Catch::Contains("injected gemm failure"));
  // The net stays usable: the device threads were all waited for.
  NetOptions plain;
  Net other = lenet(d, plain);
  CHECK(std::isfinite(other.forward()));
}

TEST_CASE("an automatic split over a device without a driver is an error naming the layer",
          "[split]") {
  TwoDrivers d;
  NetOptions options;
  // (A device the runtime can make gets its driver: cpu:3 would be a fourth CPU driver.)
  options.split = Split::parse("auto:reference,cuda:7");
  CHECK_THROWS_WITH(lenet(d, options), Catch::Contains("conv1") && Catch::Contains("cuda:7"));
}

// A driver may be driven by one thread and later by another: here cpu:1 computes a net on
// the calling thread, then the slices of a split net on its device thread, with the same
// convolution shapes (its cached oneDNN primitives were created on the calling thread).
// Both drivers address host memory, so they also share the weight-gradient reduction.
TEST_CASE("a cpu driver computes on its device thread what it set up on the calling thread",
          "[split]") {
  Runtime runtime;
  DriverOptions one_thread;
  one_thread.set("threads", 1);
  Driver& cpu = runtime.add(Device::parse("cpu"), one_thread);
  Driver& cpu1 = runtime.add(Device::parse("cpu:1"), one_thread);
  const std::string model =
      fmt::format("{}/bvlc_reference_caffenet_deploy.prototxt", HYBRIDNN_MODELS_DIR);
  // The output, and every gradient from a fixed output gradient (the deploy net has no loss).
  auto outputs = [&](Driver& main, int batch, const std::string& split) {
    NetOptions options;
    options.batch_size = batch;
    options.force_backward = true;
    if (!split.empty()) options.split = Split::parse(split);
    Net net(model, runtime, main, options);
    const BlobRef data = net.blob("data");
    float* x = data.host_data_mut();
    for (index_t i = 0; i < data.count(); ++i)
      x[i] = static_cast<float>(i % 97) * 0.01f;
    net.forward();
    const BlobRef prob = net.blob("prob");
    std::vector<std::vector<float>> result{
        std::vector<float>(prob.host_data(), prob.host_data() + prob.count())};
    float* dy = static_cast<float*>(prob.diff->host_overwrite());
    for (index_t i = 0; i < prob.count(); ++i)
      dy[i] = static_cast<float>(i % 7) - 3.0f;
    net.clear_param_diffs();
    net.backward();
    result.emplace_back(data.host_diff(), data.host_diff() + data.count());
    for (std::vector<float>& gradient : test::param_gradients(net))
      result.push_back(std::move(gradient));
    return result;
  };
  // At 16 images the primitives' scratchpads are large enough for the old failure (oneDNN's
  // per-thread scratchpad of the creating thread) to crash every time.
  const int half = 16;
  outputs(cpu1, half, "");
  const auto cut = outputs(cpu, 2 * half, "cpu:0.5,cpu:1:0.5");
  const auto whole = outputs(cpu, 2 * half, "");
  REQUIRE(cut.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    INFO("output 0, data gradient 1, parameter gradients from 2: " << i);
    CHECK(test::max_scaled_diff(whole[i], cut[i]) <= 1e-5);
  }
}

// Every kind of layer the nets above lack, cut by rows between the host and a device: a
// split blob (branches), an in-place chain (BatchNorm, Scale, ReLU, Dropout), BatchNorm's
// batch statistics (cut in stages, their sums added on the Net's driver),
// Concat, LRN, TanH, Eltwise (sum and max), AVE pooling, Flatten, Sigmoid and Slice.
constexpr const char* kEveryLayerNet = R"(
name: "every_layer"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 3 dim: 10 dim: 10 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 bias_term: false
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
  scale_param { bias_term: true filler { type: "constant" value: 1.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "drop1" type: "Dropout" bottom: "conv1" top: "conv1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "conv_a" type: "Convolution" bottom: "conv1" top: "conv_a"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "pool_b" type: "Pooling" bottom: "conv1" top: "pool_b"
  pooling_param { pool: MAX kernel_size: 3 stride: 1 pad: 1 } }
layer { name: "concat" type: "Concat" bottom: "conv_a" bottom: "pool_b" top: "concat" }
layer { name: "lrn" type: "LRN" bottom: "concat" top: "lrn" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 } }
layer { name: "tanh" type: "TanH" bottom: "lrn" top: "tanh" }
layer { name: "conv_c" type: "Convolution" bottom: "conv1" top: "conv_c"
  convolution_param { num_output: 10 kernel_size: 1 weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "sum" type: "Eltwise" bottom: "tanh" bottom: "conv_c" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "pool2" type: "Pooling" bottom: "sum" top: "pool2"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "flat" type: "Flatten" bottom: "pool2" top: "flat" }
layer { name: "ip1" type: "InnerProduct" bottom: "flat" top: "ip1"
  inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip1" top: "sig" }
layer { name: "halves" type: "Slice" bottom: "sig" top: "h1" top: "h2"
  slice_param { axis: 1 slice_point: 8 } }
layer { name: "max" type: "Eltwise" bottom: "h1" bottom: "h2" top: "max" eltwise_param { operation: MAX } }
layer { name: "ip2" type: "InnerProduct" bottom: "max" top: "ip2"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
)";

TEST_CASE("a net of every cuttable layer type computes the unsplit loss and gradients split",
          "[split]") {
  TwoDrivers d;
  auto run = [&](int batch, const std::string& split) {
    NetOptions options;
    options.batch_size = batch;
    options.force_backward = true;
    if (!split.empty()) options.split = Split::parse(split);
    const std::unique_ptr<Net> net =
        Net::from_text(kEveryLayerNet, "every_layer", d.runtime, *d.host, options);
    net->clear_param_diffs();
    test::NetGradients result;
    result.loss = net->forward_backward();
    result.gradients = test::param_gradients(*net);  // whole: at 7 rows ip1 is cut by outputs
    return result;
  };
  for (int batch : {8, 7}) {
    const test::NetGradients whole = run(batch, "");
    // conv1 1 (no bias before BatchNorm), bn1 3, scale1 2, conv_a, conv_c, ip1 and ip2 2 each.
    REQUIRE(whole.gradients.size() == 14);
    for (const char* split : {"reference:0.5,reference:1:0.5", "reference:0.75,reference:1:0.25",
                              "reference:0.125,reference:1:0.875"}) {
      INFO("batch " << batch << " split " << split);
      const test::NetGradients cut = run(batch, split);
      CHECK(cut.loss == Approx(whole.loss).epsilon(1e-6));
      for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
        INFO("parameter " << g);
        CHECK(test::max_scaled_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
      }
    }
  }
  // The layers were cut (or not) as they should be.
  NetOptions options;
  options.split = Split::parse("reference:0.5,reference:1:0.5");
  const std::unique_ptr<Net> net =
      Net::from_text(kEveryLayerNet, "every_layer", d.runtime, *d.host, options);
  net->forward();
  for (const LayerProfile& layer : net->profile()) {
    INFO(layer.name);
    const bool whole_batch = layer.name == "loss";
    CHECK(layer.devices.size() == (whole_batch ? 1u : 2u));
  }
}

// BatchNorm's batch statistics cut by rows: each device sums its own rows, the totals are
// added in row order on the Net's driver, so a split computes what the unsplit net does, bit
// for bit on identical drivers: outputs, input gradients and the moving averages.
constexpr const char* kBatchNormNet = R"(
name: "batch_norm"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 7 dim: 5 dim: 3 dim: 4 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "bn"
  batch_norm_param { moving_average_fraction: 0.9 } }
layer { name: "bn_in_place" type: "BatchNorm" bottom: "bn" top: "bn" }
layer { name: "tanh" type: "TanH" bottom: "bn" top: "out" }
)";

TEST_CASE(
    "BatchNorm's batch statistics cut by rows give the unsplit outputs, gradients and moving "
    "averages bitwise",
    "[split]") {
  auto run = [](Runtime& runtime, Driver& main, const std::string& split) {
    NetOptions options;
    options.force_backward = true;
    if (!split.empty()) options.split = Split::parse(split);
    const std::unique_ptr<Net> net =
        Net::from_text(kBatchNormNet, "batch_norm", runtime, main, options);
    std::vector<std::vector<float>> result;
    for (int iteration = 0; iteration < 2; ++iteration) {  // moving averages of two batches
      const BlobRef data = net->blob("data");
      float* x = data.host_data_mut();
      for (index_t i = 0; i < data.count(); ++i)
        x[i] = 3.0f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(iteration)) +
               0.5f * static_cast<float>(i % 5);
      net->forward();
      const BlobRef out = net->blob("out");
      result.emplace_back(out.host_data(), out.host_data() + out.count());
      float* dy = static_cast<float*>(out.diff->host_overwrite());
      for (index_t i = 0; i < out.count(); ++i)
        dy[i] = std::cos(0.11f * static_cast<float>(i));
      net->backward();
      result.emplace_back(data.host_diff(), data.host_diff() + data.count());
    }
    REQUIRE(net->learnable_params().size() == 6);  // each BatchNorm's three statistics
    for (const NetParam& param : net->learnable_params())
      result.emplace_back(param.tensor->host_data(),
                          param.tensor->host_data() + param.tensor->count());
    for (const LayerProfile& layer : net->profile()) {
      INFO(layer.name << " under '" << split << "'");
      if (layer.name.rfind("bn", 0) == 0) CHECK(layer.devices.size() == (split.empty() ? 1u : 2u));
    }
    return result;
  };
  auto compare = [&](Runtime& runtime, Driver& main, const std::vector<std::string>& splits) {
    const auto whole = run(runtime, main, "");
    for (const std::string& split : splits) {
      INFO(split);
      const auto cut = run(runtime, main, split);
      REQUIRE(cut.size() == whole.size());
      for (std::size_t i = 0; i < whole.size(); ++i) {
        INFO("result " << i << " (per iteration: output, input gradient; then statistics)");
        CHECK(cut[i] == whole[i]);
      }
    }
  };
  TwoDrivers d;  // the second with memory of its own
  compare(d.runtime, *d.host,
          {"reference:0.5,reference:1:0.5", "reference:0.75,reference:1:0.25",
           "reference:0.125,reference:1:0.875", "reference:0.0,reference:1:1.0"});
  Runtime runtime;
  Driver& cpu = runtime.add(Device::parse("cpu"));
  runtime.add(Device::parse("cpu:1"));
  compare(runtime, cpu, {"cpu:0.5,cpu:1:0.5", "cpu:0.3,cpu:1:0.7"});
}

// Blocked activations (nChw16c or nChw8c) under a split of two CPU drivers: each image is
// whole in either layout, so the slices are the same rows, and the layers cut by rows keep
// the layout the Net's driver would have alone.
constexpr const char* kBlockedSplitNet = R"(
name: "blocked_split"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 6 dim: 16 dim: 6 dim: 5 } shape { dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "x" top: "c1"
        convolution_param { num_output: 32 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "c1" top: "c1" }
layer { name: "scale1" type: "Scale" bottom: "c1" top: "c1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "c1" top: "c1" }
layer { name: "conv2" type: "Convolution" bottom: "c1" top: "c2"
        convolution_param { num_output: 16 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.2 } } }
layer { name: "pool" type: "Pooling" bottom: "c2" top: "p"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "logits"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }
)";

TEST_CASE(
    "a split of two CPU drivers keeps activations blocked and computes the unsplit loss and "
    "gradients",
    "[split][layout]") {
  Runtime runtime;
  Driver& reference = runtime.add(Device::parse("reference"));
  Driver& cpu = runtime.add(Device::parse("cpu"));
  runtime.add(Device::parse("cpu:1"));
  const bool blocks = cpu.capabilities().blocked_layout;
  auto run = [&](Driver& main, const std::string& split, Layout* c1_layout) {
    NetOptions options;
    options.force_backward = true;
    options.blocked_layout = true;
    if (!split.empty()) options.split = Split::parse(split);
    const std::unique_ptr<Net> net =
        Net::from_text(kBlockedSplitNet, "blocked_split", runtime, main, options);
    const BlobRef x = net->blob("x");
    const std::vector<float> v = test::random_floats(static_cast<std::size_t>(x.count()), 31);
    std::copy(v.begin(), v.end(), x.host_data_mut());
    float* label = net->blob("label").host_data_mut();
    for (int i = 0; i < 6; ++i)
      label[i] = static_cast<float>(i % 3);
    net->clear_param_diffs();
    test::NetGradients result;
    result.loss = net->forward_backward();
    result.gradients = test::param_gradients(*net);
    result.gradients.emplace_back(x.host_diff(), x.host_diff() + x.count());
    if (c1_layout != nullptr) *c1_layout = net->blob("c1").layout;
    return result;
  };
  const test::NetGradients oracle = run(reference, "", nullptr);
  Layout alone = Layout::nchw;
  const test::NetGradients whole = run(cpu, "", &alone);
  CHECK((alone != Layout::nchw) == blocks);
  for (const char* split : {"cpu:0.5,cpu:1:0.5", "cpu:0.34,cpu:1:0.66", "reference:0.5,cpu:0.5"}) {
    INFO(split);
    Layout layout = Layout::nchw;
    const bool with_reference = std::string(split).find("reference") != std::string::npos;
    const test::NetGradients cut = run(with_reference ? reference : cpu, split, &layout);
    // The reference driver has no blocked kernels: a split with it stays NCHW.
    CHECK(layout == (with_reference ? Layout::nchw : alone));
    CHECK(cut.loss == Approx(whole.loss).epsilon(1e-5));
    CHECK(cut.loss == Approx(oracle.loss).epsilon(1e-5));
    REQUIRE(cut.gradients.size() == whole.gradients.size());
    for (std::size_t g = 0; g < whole.gradients.size(); ++g) {
      INFO("gradient " << g << " (parameters, then the input's)");
      CHECK(test::max_scaled_diff(whole.gradients[g], cut.gradients[g]) <= 1e-5);
      CHECK(test::max_scaled_diff(oracle.gradients[g], cut.gradients[g]) <= 1e-4);
    }
  }
}

// Runs of layers cut alike (NetOptions::barrier_per_layer false, the default): each device
// goes through its rows of consecutive layers without waiting for the other in between, with
// each layer's parameter-gradient partials kept apart and added in device order afterwards,
// so the results are bitwise those of a barrier after every layer.
// Two convolutions sharing their weights (Caffe's param names).
constexpr const char* kSharedWeightsNet = R"(
name: "shared_weights"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 8 dim: 4 dim: 6 dim: 6 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "c1" type: "Convolution" bottom: "data" top: "c1" param { name: "w" } param { name: "b" }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "t1" type: "TanH" bottom: "c1" top: "t1" }
layer { name: "c2" type: "Convolution" bottom: "t1" top: "c2" param { name: "w" } param { name: "b" }
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool" type: "Pooling" bottom: "c2" top: "pool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
)";

TEST_CASE(
    "layers cut alike run together without a barrier between them and compute bitwise what a "
    "barrier per layer does",
    "[split]") {
  TwoDrivers d;  // the second with memory of its own: every row it reads is copied
  auto run = [&](const std::function<std::unique_ptr<Net>(const NetOptions&)>& make,
                 bool barrier_per_layer, std::vector<std::vector<std::string>>* runs,
                 bool reuse_memory = true) {
    NetOptions options;
    options.force_backward = true;
    options.reuse_memory = reuse_memory;
    options.split = Split::parse("reference:0.625,reference:1:0.375");
    options.barrier_per_layer = barrier_per_layer;
    const std::unique_ptr<Net> net = make(options);
    net->clear_param_diffs();
    test::NetGradients result;
    result.loss = net->forward_backward();
    result.gradients = test::param_gradients(*net);
    const BlobRef data = net->blob("data");
    result.gradients.emplace_back(data.host_diff(), data.host_diff() + data.count());
    if (runs != nullptr) {
      *runs = net->layer_runs(false);
      const auto backward_runs = net->layer_runs(true);
      runs->insert(runs->end(), backward_runs.begin(), backward_runs.end());
    }
    return result;
  };
  const auto cifar = [&](const NetOptions& given) {
    return test::cifar_quick(d.runtime, *d.host, given, 8);
  };
  const auto every_layer = [&](const NetOptions& given) {
    NetOptions options = given;
    options.batch_size = 8;
    return Net::from_text(kEveryLayerNet, "every_layer", d.runtime, *d.host, options);
  };
  const auto shared_weights = [&](const NetOptions& given) {
    return Net::from_text(kSharedWeightsNet, "shared_weights", d.runtime, *d.host, given);
  };
  using Make = std::function<std::unique_ptr<Net>(const NetOptions&)>;
  for (const auto& [name, make] : {std::make_pair("cifar10 quick", Make(cifar)),
                                   std::make_pair("every layer", Make(every_layer)),
                                   std::make_pair("shared weights", Make(shared_weights))}) {
    INFO(name);
    std::vector<std::vector<std::string>> runs, none;
    const test::NetGradients together = run(make, false, &runs);
    const test::NetGradients apart = run(make, true, &none);
    CHECK(none.empty());
    REQUIRE_FALSE(runs.empty());
    if (std::string(name) == "cifar10 quick") {
      // ip1 is cut by its outputs, the losses need the whole batch: the trunk is one run
      // forward. Backward, gradients whose memory the plan gives to a gradient of other rows
      // later end a run (one device's rows of the one would overlap the other's of the
      // other); without reuse, the trunk is one run backward too. relu2 and relu3 run as
      // the convolutions before them (fuse_layers).
      const std::vector<std::string> trunk{"conv1", "pool1", "relu1", "conv2",
                                           "pool2", "conv3", "pool3"};
      const std::vector<std::string> back(trunk.rbegin(), trunk.rend());
      CHECK(runs.front() == trunk);
      std::vector<std::string> backward_layers;
      for (std::size_t r = 1; r < runs.size(); ++r)
        backward_layers.insert(backward_layers.end(), runs[r].begin(), runs[r].end());
      CHECK(std::includes(back.begin(), back.end(), backward_layers.begin(), backward_layers.end(),
                          [&](const std::string& a, const std::string& b) {
                            return std::find(back.begin(), back.end(), a) <
                                   std::find(back.begin(), back.end(), b);
                          }));
      std::vector<std::vector<std::string>> without_reuse;
      const test::NetGradients plain = run(make, false, &without_reuse, false);
      CHECK(without_reuse == std::vector<std::vector<std::string>>{trunk, back});
      CHECK(plain.loss == apart.loss);
    }
    if (std::string(name) == "shared weights") {
      // Summing a shared weight's gradients in one order with a barrier per layer and in
      // another in a run would differ: the second convolution starts a run of its own.
      for (const std::vector<std::string>& layers : runs) {
        std::string listed;
        for (const std::string& layer : layers)
          listed += layer + " ";
        INFO(listed);
        CHECK_FALSE((std::find(layers.begin(), layers.end(), "c1") != layers.end() &&
                     std::find(layers.begin(), layers.end(), "c2") != layers.end()));
      }
    }
    CHECK(together.loss == apart.loss);
    REQUIRE(together.gradients.size() == apart.gradients.size());
    for (std::size_t g = 0; g < apart.gradients.size(); ++g) {
      INFO("gradient " << g << " (parameters, then the data's)");
      CHECK(together.gradients[g] == apart.gradients[g]);
    }
  }
}

TEST_CASE(
    "in a run of layers cut alike the profile counts each device's idle time at the run's end, "
    "no longer than the run, among the layers where it was quicker",
    "[split]") {
  // A call's slowest slice less a device's own is not time that device waited inside a run:
  // it goes on to its next call. Counted so, one device's jitter read as the other's idle
  // time call after call (ResNet-50's halves on two identical drivers seemed to wait 6-8 %
  // of each iteration at 53 layers, where the runs waited 3-6 % at ten run ends). What a
  // device waited at the run's end is shared among the run's layers: the sum is that wait.
  TwoDrivers d;
  NetOptions options;
  options.force_backward = true;
  options.split = Split::parse("reference:0.625,reference:1:0.375");
  const std::unique_ptr<Net> cut = test::cifar_quick(d.runtime, *d.host, options, 8);
  Net& net = *cut;
  net.forward_backward();
  net.reset_profile();
  const auto start = std::chrono::steady_clock::now();
  net.forward();
  const double forward_wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<std::vector<std::string>> runs = net.layer_runs(false);
  REQUIRE_FALSE(runs.empty());
  const std::vector<std::string>& trunk = runs.front();
  REQUIRE(trunk.size() > 2);
  const std::vector<LayerProfile> profile = net.profile();
  std::map<std::string, double> waited;
  double run_wall = 0.0;  // the run's layers' wall times
  for (const std::string& layer : trunk)
    run_wall += find_layer(profile, layer).forward_seconds;
  for (const char* device : {"reference", "reference:1"}) {
    INFO(device);
    double accounted = 0.0;  // busy, copying and waiting over the run's layers
    for (const std::string& layer : trunk) {
      INFO(layer);
      const SliceProfile* slice = find_device(find_layer(profile, layer), device);
      if (slice == nullptr) continue;  // a layer fused into the one before
      accounted += slice->forward_busy + slice->copy_seconds + slice->waiting;
      waited[device] += slice->waiting;
    }
    CHECK(accounted <= forward_wall);
    CHECK(accounted <= run_wall + 1e-9);
  }
  // One device waits for the other at the run's end (which is a matter of jitter: the
  // thread of either may be the one delayed).
  CHECK(waited["reference"] + waited["reference:1"] > 0.0);
}

// A layer that writes its whole workspace (`floats_per_row` floats a row) with ones, then adds
// the last of them to every input value.
class ScratchWriter final : public Layer {
 public:
  explicit ScratchWriter(index_t floats_per_row)
      : Layer("scratch"), floats_per_row_(floats_per_row) {}
  const char* type() const override { return "ScratchWriter"; }
  std::vector<Shape> setup(const std::vector<Shape>& inputs) override { return {inputs[0]}; }
  std::size_t workspace_bytes(const Driver& driver, index_t rows) const override {
    static_cast<void>(driver);
    return static_cast<std::size_t>(rows * floats_per_row_) * sizeof(float);
  }
  void forward(const LayerSlice& slice) override {
    // (On a device thread: a throw, not a Catch assertion.)
    if (slice.workspace.bytes < workspace_bytes(*slice.driver, slice.rows()))
      throw std::runtime_error("ScratchWriter: a workspace smaller than asked for");
    auto* scratch = static_cast<float*>(slice.workspace.address);
    const index_t count = slice.rows() * floats_per_row_;
    std::fill(scratch, scratch + count, 1.0f);
    const index_t values = slice.inputs[0].shape.count() / slice.inputs[0].shape[0] * slice.rows();
    for (index_t i = 0; i < values; ++i)
      slice.outputs[0].mutable_x()[i] = slice.inputs[0].x()[i] + scratch[count - 1];
  }
  void backward(const LayerSlice& slice) override { static_cast<void>(slice); }

 private:
  index_t floats_per_row_;
};

TEST_CASE(
    "layers run together each keep their workspace while they run: a later layer's larger one "
    "does not free an earlier one's",
    "[split]") {
  // The bug: each call's operands were resolved in turn before any ran, and the second
  // call's larger workspace replaced (freed) the one handed to the first, which then wrote
  // freed memory (AddressSanitizer: heap-use-after-free; a heap corruption in the tool when
  // `--split auto`'s whole-net check gave a device more rows than before).
  TwoDrivers d;
  detail::Scheduler scheduler(&d.runtime, *d.host);
  ScratchWriter small(1 << 14), large(1 << 16);
  const Shape shape{4, 3};
  Tensor x(shape), middle(shape), y(shape);
  for (index_t i = 0; i < shape.count(); ++i)
    x.host_data_mut()[i] = static_cast<float>(i);
  const auto call = [&](ScratchWriter& layer, Tensor& in, Tensor& out) {
    detail::LayerCall c;
    c.layer = &layer;
    c.where = "test: layer 'scratch' (ScratchWriter)";
    c.inputs.push_back(detail::CallTensor{shape, &in.data(), nullptr});
    c.outputs.push_back(detail::CallTensor{shape, &out.data(), nullptr});
    c.split = Split::parse("reference:0.5,reference:1:0.5");
    return c;
  };
  scheduler.run_rows({call(small, x, middle), call(large, middle, y)}, false, {nullptr, nullptr});
  for (index_t i = 0; i < shape.count(); ++i)
    CHECK(y.host_data()[i] == static_cast<float>(i) + 2.0f);
}

TEST_CASE("a solver's per-layer splits apply to its test net built from the same prototxt",
          "[split]") {
  test::TempDir dir("hybridnn-split-solver");
  const std::string solver_path =
      dir.write("solver.prototxt", "net: \"" + lenet_path() +
                                       "\"\n"
                                       "test_iter: 1\ntest_interval: 10\nbase_lr: 0.01\n"
                                       "lr_policy: \"fixed\"\nmax_iter: 1\n");
  TwoDrivers d;
  SolverOptions options;
  options.data = "synthetic:1x28x28";  // both nets' (the prototxt's LMDBs are not here)
  options.layer_splits = {{"conv2", Split::parse("reference:0.5,reference:1:0.5")}};
  Solver solver(solver_path, d.runtime, *d.host, options);
  REQUIRE(solver.num_test_nets() == 1);
  for (Net* net : {&solver.net(), &solver.test_net(0)}) {
    const LayerSplits splits = net->layer_splits();
    REQUIRE(splits.size() == 1);
    CHECK(splits[0].first == "conv2");
  }
}

// Issue 36: the fully connected trick. LeNet's ip1 (500 outputs of 800 inputs) is cut by
// its outputs where rows x (2 x 800 + 500) < 500 x 800 (a batch cut would write and merge
// a whole weight gradient on each device), ip2 (10 outputs) keeps its batch cut.
TEST_CASE("a split cuts an InnerProduct by its outputs where that moves less memory", "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::parse("reference:0.5,reference:1:0.5");
  Net net = lenet(d, options, 8);
  CHECK(net.output_cut("ip1").to_string() == "reference:0.5,reference:1:0.5");
  CHECK(net.output_cut("ip2").empty());
  CHECK(net.output_cut("conv1").empty());
  // Each device holds its 250 rows of ip1's weights and bias; the other layers' are whole.
  std::vector<std::string> ip1;
  for (const NetParam& param : net.learnable_params()) {
    if (param.layer != "ip1") continue;
    ip1.push_back(fmt::format("{} {} {}", param.driver->device().name(),
                              param.tensor->shape().to_string(), param.shard.begin));
  }
  CHECK(ip1 == std::vector<std::string>{"reference 250x800 0", "reference:1 250x800 250",
                                        "reference 250 0", "reference:1 250 250"});
  // split_axis: BATCH keeps the batch cut; at 200 rows (200 x 2100 > 400,000) the batch cut
  // moves less.
  CHECK(lenet_batch_cut(d, options)->output_cut("ip1").empty());
  CHECK(lenet(d, options, 200).output_cut("ip1").empty());
  // The cut computes the unsplit gradients (all of them: test::param_gradients gathers the
  // shards) and is listed among the layer splits, which read back cut alike.
  std::string listed;
  for (const auto& [layer, split] : net.layer_splits())
    listed += layer + " ";
  CHECK(listed == "conv1 pool1 conv2 pool2 ip1 relu1 ip2 loss ");
  NetOptions reread;
  reread.layer_splits = net.layer_splits();
  CHECK(lenet(d, reread, 8).output_cut("ip1").to_string() == "reference:0.5,reference:1:0.5");
}

TEST_CASE(
    "an automatic split times an InnerProduct whole on each device as the net is built, then "
    "cuts its outputs in proportion or keeps it on the fastest",
    "[split]") {
  TwoDrivers d;
  NetOptions options;
  options.split = Split::automatic({Device::parse("reference"), Device::parse("reference:1")});
  options.force_backward = true;
  Net net = lenet(d, options, 8);
  const Split cut = net.output_cut("ip1");
  const bool on_home = cut.empty() && net.layer_splits().size() == 0;
  if (!cut.empty()) {
    REQUIRE(cut.shares().size() == 2);
    CHECK(cut.shares()[0].fraction > 0.0);
    CHECK(cut.shares()[1].fraction > 0.0);
    CHECK(cut.shares()[0].fraction + cut.shares()[1].fraction == Approx(1.0).epsilon(1e-9));
  }
  std::vector<std::string> heard;
  std::vector<Split> reported;
  net.calibrate_splits([&](const std::string& layer, const Split& split) {
    heard.push_back(layer);
    reported.push_back(split);
  });
  // ip1 is reported in its place with its cut (or its device: empty for the Net's driver).
  CHECK(heard ==
        std::vector<std::string>{"conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2"});
  REQUIRE(reported.size() == 7);
  if (!cut.empty()) {
    CHECK(reported[4].to_string() == cut.to_string());
  } else {
    CHECK(reported[4].empty() == on_home);
  }
  // Whatever was chosen computes the unsplit loss and gradients.
  NetOptions plain_options;
  plain_options.force_backward = true;
  Net plain = lenet(d, plain_options, 8);
  net.clear_param_diffs();
  plain.clear_param_diffs();
  CHECK(net.forward_backward() == Approx(plain.forward_backward()).epsilon(1e-6));
  const auto want = test::param_gradients(plain), got = test::param_gradients(net);
  REQUIRE(want.size() == got.size());
  for (std::size_t g = 0; g < want.size(); ++g) {
    INFO("gradient " << g);
    CHECK(test::max_scaled_diff(want[g], got[g]) <= 1e-5);
  }
}

TEST_CASE("a solver's test net is cut by outputs as its training net, whose weights it shares",
          "[split]") {
  test::TempDir dir("hybridnn-split-cut-solver");
  const std::string solver_path = lenet_solver(dir, 8,
                                               "test_iter: 1\ntest_interval: 2\n"
                                               "lr_policy: \"fixed\"\nmax_iter: 2\n");
  TwoDrivers d;
  SolverOptions options;
  options.data = "synthetic:1x28x28";
  // ip1 timed as each net is built: measured apart, the two nets' fractions would differ,
  // and sharing ip1's weights would fail.
  options.split = Split::automatic({Device::parse("reference"), Device::parse("reference:1")});
  Solver solver(solver_path, d.runtime, *d.host, options);
  REQUIRE(solver.num_test_nets() == 1);
  CHECK(solver.test_net(0).output_cut("ip1").to_string() ==
        solver.net().output_cut("ip1").to_string());
  solver.solve();
  CHECK(solver.iter() == 2);
}

}  // namespace
}  // namespace hn
