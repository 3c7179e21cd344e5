// Solver: single steps of SGD and Adam against hand computations on a one-output
// InnerProduct net, learning-rate policies against their formulas, iter_size against a
// larger batch, exact resume from a snapshot, snapshot files, stop requests, a diverging
// loss, and the errors of bad solver files and solver states.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "hybridnn.pb.h"
#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/net/net.h"
#include "lib/proto/prototxt.h"
#include "lib/solver/solver.h"
#include "tests/recording_driver.h"
#include "tests/support.h"

namespace hn {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using test::error_of;

// A fresh directory per test under the system's temporary directory, removed at its end.
test::TempDir scratch_dir(const std::string& name) {
  return test::TempDir(fmt::format("hybridnn_test_solver_{}", name));
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

struct Fixture {
  Runtime runtime;
  Driver* driver;
  explicit Fixture(const std::string& device = "reference")
      : driver(&runtime.add(Device::parse(device))) {}
};

// ---- a one-output InnerProduct net with a Euclidean loss, inputs set by the test ----------

const char* kTinyNet = R"(
name: "tiny"
layer { name: "in" type: "Input" top: "x" top: "t"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 1 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
)";

const double kX[2][3] = {{1.0, 2.0, 3.0}, {-1.0, 0.5, 2.0}};
const double kT[2] = {1.0, 0.0};

// Sets the inputs and the weights W = (0.2, -0.1, 0.3), b = 0.05.
void set_tiny(Net& net) {
  float* x = net.blob("x").host_data_mut();
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      x[n * 3 + i] = static_cast<float>(kX[n][i]);
  float* t = net.blob("t").host_data_mut();
  t[0] = static_cast<float>(kT[0]);
  t[1] = static_cast<float>(kT[1]);
  const auto& params = net.learnable_params();
  REQUIRE(params.size() == 2);
  float* w = params[0].tensor->host_data_mut();
  w[0] = 0.2f;
  w[1] = -0.1f;
  w[2] = 0.3f;
  params[1].tensor->host_data_mut()[0] = 0.05f;
}

// The Euclidean loss sum((Wx + b - t)^2) / (2N) and its gradient, by hand.
struct Tiny {
  double w[3], b;
  double loss() const {
    double total = 0.0;
    for (int n = 0; n < 2; ++n) {
      const double r = w[0] * kX[n][0] + w[1] * kX[n][1] + w[2] * kX[n][2] + b - kT[n];
      total += r * r;
    }
    return total / 4.0;
  }
  void gradient(double gw[3], double* gb) const {
    gw[0] = gw[1] = gw[2] = *gb = 0.0;
    for (int n = 0; n < 2; ++n) {
      const double r = (w[0] * kX[n][0] + w[1] * kX[n][1] + w[2] * kX[n][2] + b - kT[n]) / 2.0;
      for (int i = 0; i < 3; ++i)
        gw[i] += r * kX[n][i];
      *gb += r;
    }
  }
};

void check_weights(Net& net, const Tiny& want) {
  const auto& params = net.learnable_params();
  const float* w = params[0].tensor->host_data();
  for (int i = 0; i < 3; ++i)
    CHECK(w[i] == Approx(want.w[i]).epsilon(1e-5));
  CHECK(params[1].tensor->host_data()[0] == Approx(want.b).epsilon(1e-5));
}

fs::path write_tiny_solver(const fs::path& dir, const std::string& settings) {
  write_file(dir / "tiny.prototxt", kTinyNet);
  const fs::path solver = dir / "solver.prototxt";
  write_file(solver, fmt::format("net: \"{}\"\n{}\nsnapshot_after_train: false\n",
                                 (dir / "tiny.prototxt").string(), settings));
  return solver;
}

// ---- a net on generated data: Data -> InnerProduct -> ReLU -> Dropout -> InnerProduct ------

std::string data_net(int batch, bool dropout) {
  return fmt::format(R"(
name: "generated"
layer {{ name: "data" type: "Data" top: "data" top: "label"
        transform_param {{ scale: 0.00390625 }}
        data_param {{ source: "synthetic:1x4x4:3" batch_size: {} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param {{ num_output: 8 weight_filler {{ type: "xavier" }}
                              bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "h" top: "h" }}
{}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "logits"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" std: 0.3 }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "logits" bottom: "label" top: "loss" }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "logits" bottom: "label" top: "accuracy"
        include {{ phase: TEST }} }}
)",
                     batch,
                     dropout ? R"(layer { name: "drop" type: "Dropout" bottom: "h" top: "h"
                                  dropout_param { dropout_ratio: 0.5 } })"
                             : "");
}

fs::path write_data_solver(const fs::path& dir, int batch, bool dropout,
                           const std::string& settings) {
  write_file(dir / "net.prototxt", data_net(batch, dropout));
  const fs::path solver = dir / "solver.prototxt";
  write_file(solver, fmt::format("net: \"net.prototxt\"\nsnapshot_prefix: \"{}\"\n{}\n",
                                 (dir / "snap").string(), settings));
  return solver;
}

// The per-iteration losses of a run, from display events (display: 1, average_loss: 1).
struct Recorder {
  std::map<int, float> train_loss;
  std::vector<SolverEvent> tests;
  std::vector<std::string> snapshots;
  void attach(Solver& solver) {
    solver.on_event([this](const SolverEvent& e) {
      if (!e.snapshot.empty()) {
        snapshots.push_back(e.snapshot);
      } else if (e.phase == Phase::test) {
        tests.push_back(e);
      } else {
        train_loss[e.iter] = e.loss;
      }
    });
  }
};

}  // namespace

// ---- single steps against hand computations ----------------------------------------------

TEST_CASE("two SGD steps with momentum and weight decay equal the hand computation") {
  const test::TempDir temp = scratch_dir("sgd");
  const fs::path dir = temp.path();
  const fs::path path = write_tiny_solver(
      dir, "base_lr: 0.1\nlr_policy: \"fixed\"\nmomentum: 0.9\nweight_decay: 0.01\nmax_iter: 2");
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  set_tiny(solver.net());

  Tiny want{{0.2, -0.1, 0.3}, 0.05};
  double hw[3] = {0, 0, 0}, hb = 0.0;
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const double loss = want.loss();
    double gw[3], gb;
    want.gradient(gw, &gb);
    for (int i = 0; i < 3; ++i) {
      hw[i] = 0.9 * hw[i] + 0.1 * (gw[i] + 0.01 * want.w[i]);  // lr_mult 1, decay_mult 1
      want.w[i] -= hw[i];
    }
    hb = 0.9 * hb + 0.2 * gb;  // bias: lr_mult 2, decay_mult 0
    want.b -= hb;
    solver.step(1);
    CHECK(solver.last_loss() == Approx(loss).epsilon(1e-5));
    check_weights(solver.net(), want);
  }
  CHECK(solver.iter() == 2);
}

TEST_CASE("two Adam steps with the bias-corrected rate equal the hand computation") {
  const test::TempDir temp = scratch_dir("adam");
  const fs::path dir = temp.path();
  const fs::path path =
      write_tiny_solver(dir,
                        "type: \"Adam\"\nbase_lr: 0.01\nlr_policy: \"fixed\"\nmomentum: 0.9\n"
                        "momentum2: 0.999\ndelta: 1e-8\nmax_iter: 2");
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  set_tiny(solver.net());

  Tiny want{{0.2, -0.1, 0.3}, 0.05};
  double m[4] = {}, v[4] = {};
  for (int t = 1; t <= 2; ++t) {
    INFO("t " << t);
    double g[4];
    want.gradient(g, &g[3]);
    const double correction = std::sqrt(1.0 - std::pow(0.999, t)) / (1.0 - std::pow(0.9, t));
    double* values[4] = {&want.w[0], &want.w[1], &want.w[2], &want.b};
    for (int i = 0; i < 4; ++i) {
      const double lr = 0.01 * (i == 3 ? 2.0 : 1.0) * correction;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      *values[i] -= lr * m[i] / (std::sqrt(v[i]) + 1e-8);
    }
    solver.step(1);
    check_weights(solver.net(), want);
  }
}

TEST_CASE("the old solver_type enum, L1 regularisation and clip_gradients follow Caffe") {
  const test::TempDir temp = scratch_dir("clip");
  const fs::path dir = temp.path();
  // One SGD step: the raw gradient is clipped to norm 0.1, then L1 decay is added.
  const fs::path path =
      write_tiny_solver(dir,
                        "solver_type: SGD\nbase_lr: 0.5\nlr_policy: \"fixed\"\nweight_decay: 0.02\n"
                        "regularization_type: \"L1\"\nclip_gradients: 0.1\nmax_iter: 1");
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  set_tiny(solver.net());
  Tiny want{{0.2, -0.1, 0.3}, 0.05};
  double g[4];
  want.gradient(g, &g[3]);
  const double norm = std::sqrt(g[0] * g[0] + g[1] * g[1] + g[2] * g[2] + g[3] * g[3]);
  REQUIRE(norm > 0.1);
  const double scale = 0.1 / norm;
  for (int i = 0; i < 3; ++i) {
    const double sign = want.w[i] > 0 ? 1.0 : -1.0;
    want.w[i] -= 0.5 * (g[i] * scale + 0.02 * sign);
  }
  want.b -= 1.0 * g[3] * scale;  // lr_mult 2, decay_mult 0
  solver.step(1);
  check_weights(solver.net(), want);
}

// ---- learning-rate policies -----------------------------------------------------------------

TEST_CASE("learning rate policies give Caffe's formulas at every iteration") {
  struct Case {
    const char* settings;
    double (*formula)(int iter);
  };
  const Case cases[] = {
      {"lr_policy: \"fixed\"", [](int) { return 0.01; }},
      {"lr_policy: \"step\" gamma: 0.5 stepsize: 3",
       [](int i) { return 0.01 * std::pow(0.5, i / 3); }},
      {"lr_policy: \"exp\" gamma: 0.9", [](int i) { return 0.01 * std::pow(0.9, i); }},
      {"lr_policy: \"inv\" gamma: 0.1 power: 0.75",
       [](int i) { return 0.01 * std::pow(1.0 + 0.1 * i, -0.75); }},
      {"lr_policy: \"multistep\" gamma: 0.1 stepvalue: 2 stepvalue: 5",
       [](int i) { return 0.01 * std::pow(0.1, (i >= 2) + (i >= 5)); }},
      {"lr_policy: \"poly\" power: 2", [](int i) { return 0.01 * std::pow(1.0 - i / 8.0, 2.0); }},
      {"lr_policy: \"sigmoid\" gamma: 0.5 stepsize: 4",
       [](int i) { return 0.01 / (1.0 + std::exp(-0.5 * (i - 4))); }},
  };
  for (const Case& c : cases) {
    INFO(c.settings);
    const test::TempDir temp = scratch_dir("lr");
    const fs::path dir = temp.path();
    const fs::path path = write_tiny_solver(
        dir, fmt::format("base_lr: 0.01\nmax_iter: 8\ndisplay: 1\n{}", c.settings));
    Fixture f;
    Solver solver(path.string(), f.runtime, *f.driver);
    set_tiny(solver.net());
    std::map<int, float> displayed;
    solver.on_event([&](const SolverEvent& e) { displayed[e.iter] = e.lr; });
    for (int iter = 0; iter < 8; ++iter) {
      INFO("iter " << iter);
      CHECK(solver.learning_rate() == Approx(c.formula(iter)).epsilon(1e-6));
      solver.step(1);
      CHECK(displayed[iter] == Approx(c.formula(iter)).epsilon(1e-6));
    }
  }
}

// ---- iter_size -----------------------------------------------------------------------------

TEST_CASE("iter_size 2 with batch 4 equals iter_size 1 with batch 8 in losses and weights") {
  std::vector<std::map<int, float>> losses;
  std::vector<std::vector<std::vector<float>>> weights;
  for (const auto& [batch, iter_size] : {std::pair{8, 1}, std::pair{4, 2}}) {
    const test::TempDir temp = scratch_dir(fmt::format("iter_size_{}", iter_size));
    const fs::path dir = temp.path();
    const fs::path path = write_data_solver(
        dir, batch, false,
        fmt::format("base_lr: 0.5\nlr_policy: \"fixed\"\nmomentum: 0.9\nweight_decay: 0.001\n"
                    "iter_size: {}\nmax_iter: 6\ndisplay: 1\nrandom_seed: 5\n"
                    "snapshot_after_train: false",
                    iter_size));
    Fixture f("cpu");
    Solver solver(path.string(), f.runtime, *f.driver);
    Recorder recorder;
    recorder.attach(solver);
    solver.solve();
    losses.push_back(recorder.train_loss);
    std::vector<std::vector<float>> w;
    for (const NetParam& p : solver.net().learnable_params())
      w.emplace_back(p.tensor->host_data(), p.tensor->host_data() + p.tensor->count());
    weights.push_back(w);
  }
  // Iterations 0..5; the closing display at 6 is one forward of a single batch.
  for (int iter = 0; iter < 6; ++iter) {
    INFO("iter " << iter);
    CHECK(losses[1].at(iter) == Approx(losses[0].at(iter)).epsilon(1e-5));
  }
  REQUIRE(weights[0].size() == weights[1].size());
  for (std::size_t p = 0; p < weights[0].size(); ++p) {
    for (std::size_t i = 0; i < weights[0][p].size(); ++i) {
      INFO("param " << p << " element " << i);
      CHECK(weights[1][p][i] == Approx(weights[0][p][i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// ---- recorded iterations (SolverOptions::graphs) --------------------------------------------

// On a driver that records (test::RecordingDriver: the reference driver's calls kept and
// replayed, as a GPU's stream is captured into a CUDA graph), the iterations after the
// first replay one recording of the forward and backward: the same losses and weights as
// call by call, bit for bit, on the next batches in order; a net with Dropout is not
// recorded (its masks' seed would be fixed), and says so.
TEST_CASE(
    "training on a driver that records replays one recorded iteration, with the losses and "
    "weights of training call by call") {
  const bool dropout = GENERATE(false, true);
  const int iter_size = GENERATE(1, 2);
  const std::string type = GENERATE(as<std::string>{}, "SGD", "Adam");
  INFO("dropout " << dropout << ", iter_size " << iter_size << ", " << type);
  struct Run {
    std::map<int, float> losses;
    std::vector<std::vector<float>> weights;
    bool recorded = false;
    std::string why;
    int replayed_calls = 0;
    int recorded_updates = 0;
  };
  const auto train = [&](bool graphs) {
    const test::TempDir temp = scratch_dir(fmt::format("graphs_{}", graphs));
    const fs::path dir = temp.path();
    const fs::path path = write_data_solver(
        dir, 4, dropout,
        fmt::format("base_lr: {}\nlr_policy: \"inv\"\ngamma: 0.1\npower: 0.75\n"
                    "momentum: 0.9\nweight_decay: 0.001\niter_size: {}\nmax_iter: 6\n"
                    "display: 1\nrandom_seed: 5\nsnapshot_after_train: false\ntype: \"{}\"",
                    type == "Adam" ? 0.05 : 0.5, iter_size, type));
    Runtime runtime;
    auto* recorder = static_cast<test::RecordingDriver*>(
        &runtime.add(std::make_unique<test::RecordingDriver>()));
    SolverOptions options;
    options.graphs = graphs;
    Solver solver(path.string(), runtime, *recorder, options);
    Recorder events;
    events.attach(solver);
    solver.solve();
    Run run;
    run.losses = events.train_loss;
    for (const NetParam& p : solver.net().learnable_params())
      run.weights.emplace_back(p.tensor->host_data(), p.tensor->host_data() + p.tensor->count());
    run.recorded = solver.iteration_recorded();
    run.why = solver.unrecorded_why();
    run.replayed_calls = recorder->replayed_calls();
    run.recorded_updates = recorder->recorded("solver_update");
    return run;
  };
  const Run eager = train(false);
  const Run replayed = train(true);
  CHECK_FALSE(eager.recorded);
  CHECK(eager.why.empty());
  CHECK(eager.replayed_calls == 0);
  if (dropout) {
    CHECK_FALSE(replayed.recorded);
    CHECK_THAT(replayed.why, Contains("'drop' (Dropout)") && Contains("seed"));
    CHECK(replayed.replayed_calls == 0);
  } else {
    INFO(replayed.why);
    CHECK(replayed.recorded);
    CHECK(replayed.why.empty());
    // Iterations 1..5, iter_size batches each, replayed.
    CHECK(replayed.replayed_calls > 0);
    // One batch per update: the update is recorded too, one call per parameter (its rate
    // read on the driver, Adam's bias correction folded in); two: the update runs after
    // the second replay.
    CHECK(replayed.recorded_updates == (iter_size == 1 ? 4 : 0));
  }
  REQUIRE(eager.losses.size() == 7);  // iterations 0..5 and the closing display at 6
  CHECK(replayed.losses == eager.losses);
  CHECK(replayed.weights == eager.weights);
}

TEST_CASE(
    "a loss read back inside the iteration leaves it unrecorded, said, and trains as before") {
  // VALID normalization with an ignore_label counts the labels left on the host.
  const test::TempDir temp = scratch_dir("graphs_ignore_label");
  const fs::path dir = temp.path();
  std::string net = data_net(4, false);
  const std::string loss = "top: \"loss\" }";
  const auto at = net.find(loss);
  REQUIRE(at != std::string::npos);
  net.replace(at, loss.size(), "top: \"loss\" loss_param { ignore_label: 2 } }");
  write_file(dir / "net.prototxt", net);
  const fs::path path = dir / "solver.prototxt";
  write_file(path,
             "net: \"net.prototxt\"\nbase_lr: 0.1\nlr_policy: \"fixed\"\nmax_iter: 3\n"
             "display: 1\nsnapshot_after_train: false\n");
  std::vector<std::map<int, float>> losses;
  for (const bool graphs : {false, true}) {
    Runtime runtime;
    Driver& recorder = runtime.add(std::make_unique<test::RecordingDriver>());
    SolverOptions options;
    options.graphs = graphs;
    Solver solver(path.string(), runtime, recorder, options);
    Recorder events;
    events.attach(solver);
    solver.solve();
    CHECK_FALSE(solver.iteration_recorded());
    if (graphs) {
      CHECK_THAT(solver.unrecorded_why(), Contains("'loss'") && Contains("cannot be recorded"));
    }
    losses.push_back(events.train_loss);
  }
  CHECK(losses[1] == losses[0]);
}

// ---- snapshots and resume ------------------------------------------------------------------

TEST_CASE("a run resumed from a mid-run snapshot reproduces the uninterrupted losses exactly") {
  const std::string device = GENERATE(as<std::string>{}, "reference", "cpu");
  const std::string type = GENERATE(as<std::string>{}, "SGD", "Adam");
  DYNAMIC_SECTION(device << " " << type) {
    // Dropout draws per iteration, iter_size 2 reads two batches per iteration, multistep
    // carries a step across the snapshot and a test net runs in between.
    const std::string settings = fmt::format(
        "type: \"{}\"\nbase_lr: 0.05\nlr_policy: \"multistep\"\ngamma: 0.5\nstepvalue: 4\n"
        "stepvalue: 8\nmomentum: 0.9\nweight_decay: 0.0005\niter_size: 2\nmax_iter: 10\n"
        "display: 1\nsnapshot: 3\ntest_iter: 2\ntest_interval: 4\nrandom_seed: 11",
        type);
    const test::TempDir temp = scratch_dir("resume");
    const fs::path dir = temp.path();
    const fs::path path = write_data_solver(dir, 5, true, settings);

    Recorder whole;
    {
      Fixture f(device);
      Solver solver(path.string(), f.runtime, *f.driver);
      whole.attach(solver);
      solver.solve();
      CHECK(solver.iter() == 10);
    }
    REQUIRE(whole.train_loss.size() == 11);  // iterations 0..9 and the closing display

    Recorder resumed;
    Fixture f(device);
    Solver solver(path.string(), f.runtime, *f.driver);
    resumed.attach(solver);
    solver.restore((dir / "snap_iter_6.solverstate").string());
    CHECK(solver.iter() == 6);
    solver.step(4);
    for (int iter = 6; iter < 10; ++iter) {
      INFO("iter " << iter);
      CHECK(resumed.train_loss.at(iter) == whole.train_loss.at(iter));
    }
    // The test pass at iteration 8 sees the same weights.
    REQUIRE(!resumed.tests.empty());
    const SolverEvent& test8 = resumed.tests.front();
    CHECK(test8.iter == 8);
    bool found = false;
    for (const SolverEvent& e : whole.tests) {
      if (e.iter != 8) continue;
      found = true;
      CHECK(e.loss == test8.loss);
      REQUIRE(e.accuracy.has_value());
      CHECK(e.accuracy == test8.accuracy);
    }
    CHECK(found);
  }
}

TEST_CASE("snapshots are written at the interval and at the end, and reload") {
  const test::TempDir temp = scratch_dir("snapshots");
  const fs::path dir = temp.path();
  const fs::path path = write_data_solver(
      dir, 4, false,
      "base_lr: 0.1\nlr_policy: \"fixed\"\nmomentum: 0.9\nmax_iter: 7\nsnapshot: 3\n"
      "test_iter: 1\ntest_interval: 5\ntest_initialization: false");
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  Recorder recorder;
  recorder.attach(solver);
  solver.solve();
  for (const int iter : {3, 6, 7}) {
    INFO("iter " << iter);
    CHECK(fs::exists(dir / fmt::format("snap_iter_{}.caffemodel", iter)));
    CHECK(fs::exists(dir / fmt::format("snap_iter_{}.solverstate", iter)));
  }
  CHECK(recorder.snapshots == std::vector<std::string>{(dir / "snap_iter_3.caffemodel").string(),
                                                       (dir / "snap_iter_6.caffemodel").string(),
                                                       (dir / "snap_iter_7.caffemodel").string()});
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
  // Tests ran at 5 (not at 0: test_initialization false), not at 7.
  REQUIRE(recorder.tests.size() == 1);
  CHECK(recorder.tests[0].iter == 5);
  CHECK(recorder.tests[0].accuracy.has_value());

  // The weights reload into a fresh net; the state restores the iteration.
  Net reloaded((dir / "net.prototxt").string(), f.runtime, *f.driver);
  reloaded.copy_trained_layers_from((dir / "snap_iter_7.caffemodel").string());
  const auto& want = solver.net().learnable_params();
  const auto& got = reloaded.learnable_params();
  REQUIRE(got.size() == want.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    const float* a = got[p].tensor->host_data();
    const float* b = want[p].tensor->host_data();
    CHECK(std::vector<float>(a, a + got[p].tensor->count()) ==
          std::vector<float>(b, b + want[p].tensor->count()));
  }
  // test() starts from the beginning of the test data each time.
  const auto first = solver.test(0), second = solver.test(0);
  CHECK(first == second);
  REQUIRE(first.size() == 2);
  CHECK(first[0].first == "loss");
  CHECK(first[1].first == "accuracy");

  Solver again(path.string(), f.runtime, *f.driver);
  again.restore((dir / "snap_iter_3.solverstate").string());
  CHECK(again.iter() == 3);
  again.solve();  // continues to max_iter
  CHECK(again.iter() == 7);
}

TEST_CASE("a state whose weights moved is restored from the file beside it") {
  const test::TempDir temp = scratch_dir("moved");
  const fs::path dir = temp.path();
  const fs::path path =
      write_data_solver(dir, 4, false, "base_lr: 0.1\nlr_policy: \"fixed\"\nmax_iter: 2");
  Fixture f;
  {
    Solver solver(path.string(), f.runtime, *f.driver);
    solver.solve();
  }
  const fs::path moved = dir / "moved";
  fs::create_directories(moved);
  fs::rename(dir / "snap_iter_2.caffemodel", moved / "snap_iter_2.caffemodel");
  fs::rename(dir / "snap_iter_2.solverstate", moved / "snap_iter_2.solverstate");
  Solver solver(path.string(), f.runtime, *f.driver);
  solver.restore((moved / "snap_iter_2.solverstate").string());
  CHECK(solver.iter() == 2);
}

TEST_CASE("a snapshot_prefix naming a directory puts the solver's name in it") {
  const test::TempDir temp = scratch_dir("prefix_dir");
  const fs::path dir = temp.path();
  const fs::path path =
      write_data_solver(dir, 4, false, "base_lr: 0.1\nlr_policy: \"fixed\"\nmax_iter: 1");
  fs::create_directories(dir / "out");
  Fixture f;
  SolverOptions options;
  options.snapshot_prefix = (dir / "out").string();
  Solver solver(path.string(), f.runtime, *f.driver, options);
  solver.solve();
  CHECK(fs::exists(dir / "out" / "solver_iter_1.caffemodel"));
  CHECK(fs::exists(dir / "out" / "solver_iter_1.solverstate"));
}

TEST_CASE(
    "a snapshot_prefix where nothing can be written fails at the start, not at the first "
    "snapshot") {
  const test::TempDir temp = scratch_dir("prefix_unwritable");
  const fs::path dir = temp.path();
  const fs::path path = write_data_solver(
      dir, 4, false, "base_lr: 0.1\nlr_policy: \"fixed\"\nmax_iter: 100\nsnapshot: 50");
  Fixture f;
  SolverOptions options;
  options.snapshot_prefix = "/proc/hybridnn_snapshot";  // no file can be created in /proc
  Solver solver(path.string(), f.runtime, *f.driver, options);
  CHECK_THAT(error_of([&] { solver.solve(); }), Contains("solver.prototxt") &&
                                                    Contains("cannot write snapshots") &&
                                                    Contains("/proc/hybridnn_snapshot"));
  CHECK(solver.iter() == 0);
  CHECK_THAT(error_of([&] { solver.step(10); }), Contains("cannot write snapshots"));
  CHECK(solver.iter() == 0);
}

TEST_CASE("a stop request ends solve after the current iteration with a snapshot") {
  const test::TempDir temp = scratch_dir("stop");
  const fs::path dir = temp.path();
  const fs::path path = write_data_solver(
      dir, 4, false, "base_lr: 0.1\nlr_policy: \"fixed\"\nmax_iter: 100\ndisplay: 1\nsnapshot: 50");
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  std::vector<double> images_per_s;
  solver.on_event([&](const SolverEvent& e) {
    if (!e.snapshot.empty()) return;
    images_per_s.push_back(e.images_per_s);
    if (e.iter == 4) solver.request_stop();
  });
  solver.solve();
  REQUIRE(images_per_s.size() == 5);
  // The first display of a run is not timed (its iteration pays one-off setup).
  CHECK(images_per_s[0] == 0.0);
  for (std::size_t i = 1; i < images_per_s.size(); ++i)
    CHECK(images_per_s[i] > 0.0);
  CHECK(solver.iter() == 5);
  CHECK(solver.stop_requested());
  CHECK(fs::exists(dir / "snap_iter_5.caffemodel"));
  CHECK(fs::exists(dir / "snap_iter_5.solverstate"));
  // A later step runs normally.
  solver.step(2);
  CHECK(solver.iter() == 7);
}

TEST_CASE("a diverging loss stops training naming the iteration and keeps earlier snapshots") {
  const test::TempDir temp = scratch_dir("nan");
  const fs::path dir = temp.path();
  write_file(dir / "tiny.prototxt", kTinyNet);
  const fs::path path = dir / "solver.prototxt";
  write_file(path, fmt::format("net: \"tiny.prototxt\"\nbase_lr: 1e15\nlr_policy: \"fixed\"\n"
                               "max_iter: 50\nsnapshot: 1\nsnapshot_prefix: \"{}\"\n",
                               (dir / "snap").string()));
  Fixture f;
  Solver solver(path.string(), f.runtime, *f.driver);
  set_tiny(solver.net());
  std::map<std::string, std::string> written;  // file -> bytes when written
  solver.on_event([&](const SolverEvent& e) {
    if (e.snapshot.empty()) return;
    written[e.snapshot] = read_bytes(e.snapshot);
    const std::string state = e.snapshot.substr(0, e.snapshot.size() - 11) + ".solverstate";
    written[state] = read_bytes(state);
  });
  const std::string message = error_of([&] { solver.solve(); });
  const int failed_at = solver.iter();
  INFO(message);
  CHECK_THAT(message, Contains("solver.prototxt") && Contains("training loss is") &&
                          Contains(fmt::format("at iteration {}", failed_at)));
  CHECK(
      (message.find("NaN") != std::string::npos || message.find("infinite") != std::string::npos));
  REQUIRE(failed_at > 0);
  CHECK(written.size() == 2u * static_cast<std::size_t>(failed_at));
  for (const auto& [file, bytes] : written)
    CHECK(read_bytes(file) == bytes);
  CHECK(!fs::exists(dir / fmt::format("snap_iter_{}.caffemodel", failed_at + 1)));
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
}

// A recorded update reads the loss it follows on the driver and updates nothing where it is
// not finite: training stops at the same iteration with the same weights and histories as
// call by call, before the update.
// A recording outlives the run that made it: a state restored into the same Solver (its
// weights and histories written on the host) reaches the driver before the next replay, so
// the run after the restore repeats the losses from the snapshot on.
TEST_CASE(
    "a state restored into a solver whose iteration is recorded replays from the restored "
    "weights and histories") {
  const std::string type = GENERATE(as<std::string>{}, "SGD", "Adam");
  INFO(type);
  const test::TempDir temp = scratch_dir("graphs_restore");
  const fs::path dir = temp.path();
  const fs::path path = write_data_solver(
      dir, 4, false,
      fmt::format("type: \"{}\"\nbase_lr: 0.05\nlr_policy: \"inv\"\ngamma: 0.1\n"
                  "power: 0.75\nmomentum: 0.9\nweight_decay: 0.0005\nmax_iter: 10\n"
                  "display: 1\naverage_loss: 1\nsnapshot: 4\nrandom_seed: 11\n"
                  "snapshot_after_train: false",
                  type));
  Runtime runtime;
  auto& recorder =
      static_cast<test::RecordingDriver&>(runtime.add(std::make_unique<test::RecordingDriver>()));
  Solver solver(path.string(), runtime, recorder);
  Recorder events;
  events.attach(solver);
  solver.step(8);
  REQUIRE(solver.iteration_recorded());
  const std::map<int, float> first = events.train_loss;
  const int recorded = recorder.recorded_calls();
  events.train_loss.clear();
  solver.restore((dir / "snap_iter_4.solverstate").string());
  REQUIRE(solver.iter() == 4);
  solver.step(4);
  CHECK(recorder.recorded_calls() == recorded);  // the same recording, replayed
  for (int iter = 4; iter < 8; ++iter) {
    INFO("iter " << iter);
    CHECK(events.train_loss.at(iter) == first.at(iter));
  }
}

TEST_CASE("a diverging loss in a recorded iteration stops before its recorded update") {
  struct Stop {
    std::string message;
    int iter = 0;
    std::vector<std::vector<float>> weights;
    bool recorded = false;
  };
  const auto diverge = [&](bool graphs) {
    const test::TempDir temp = scratch_dir(fmt::format("nan_graphs_{}", graphs));
    const fs::path dir = temp.path();
    write_file(dir / "tiny.prototxt", kTinyNet);
    const fs::path path = dir / "solver.prototxt";
    write_file(path,
               "net: \"tiny.prototxt\"\nbase_lr: 1e15\nlr_policy: \"fixed\"\n"
               "momentum: 0.5\nmax_iter: 50\nsnapshot_after_train: false\n");
    Runtime runtime;
    Driver& recorder = runtime.add(std::make_unique<test::RecordingDriver>());
    SolverOptions options;
    options.graphs = graphs;
    Solver solver(path.string(), runtime, recorder, options);
    set_tiny(solver.net());
    Stop stop;
    stop.message = error_of([&] { solver.solve(); });
    stop.iter = solver.iter();
    for (const NetParam& p : solver.net().learnable_params())
      stop.weights.emplace_back(p.tensor->host_data(), p.tensor->host_data() + p.tensor->count());
    stop.recorded = solver.iteration_recorded();
    return stop;
  };
  const Stop eager = diverge(false);
  const Stop replayed = diverge(true);
  INFO(eager.message);
  CHECK_THAT(eager.message, Contains("stopping before the update"));
  REQUIRE(eager.iter > 1);  // past the recorded iteration's first replay
  CHECK(replayed.recorded);
  // (The same message but for the solver file's directory.)
  const auto after_path = [](const std::string& m) { return m.substr(m.find("solver.prototxt")); };
  CHECK(after_path(replayed.message) == after_path(eager.message));
  CHECK(replayed.iter == eager.iter);
  CHECK(replayed.weights == eager.weights);
  for (const std::vector<float>& weights : replayed.weights)
    for (const float w : weights)
      CHECK(std::isfinite(w));
}

// ---- errors ----------------------------------------------------------------------------------

TEST_CASE("restoring a wrong, truncated or orphaned solver state fails with a clear error") {
  const test::TempDir temp = scratch_dir("bad_state");
  const fs::path dir = temp.path();
  const fs::path path = write_data_solver(
      dir, 4, false, "base_lr: 0.1\nlr_policy: \"fixed\"\nmomentum: 0.9\nmax_iter: 1");
  Fixture f;
  {
    Solver solver(path.string(), f.runtime, *f.driver);
    solver.solve();
  }
  const fs::path state = dir / "snap_iter_1.solverstate";
  REQUIRE(fs::exists(state));

  SECTION("a state of another solver type") {
    const fs::path adam = dir / "adam.prototxt";
    write_file(adam, "net: \"net.prototxt\"\ntype: \"Adam\"\nbase_lr: 0.1\nlr_policy: \"fixed\"\n");
    Solver solver(adam.string(), f.runtime, *f.driver);
    CHECK_THAT(error_of([&] { solver.restore(state.string()); }),
               Contains(state.string()) && Contains("holds 4 history blobs") && Contains("Adam") &&
                   Contains("keeps 8"));
    CHECK(solver.iter() == 0);
  }
  SECTION("a state of a net with other shapes") {
    std::string text = data_net(4, false);
    text.replace(text.find("num_output: 8"), 13, "num_output: 9");
    write_file(dir / "wider.prototxt", text);
    const fs::path wider = dir / "wider_solver.prototxt";
    write_file(wider, "net: \"wider.prototxt\"\nbase_lr: 0.1\nlr_policy: \"fixed\"\n");
    Solver solver(wider.string(), f.runtime, *f.driver);
    CHECK_THAT(error_of([&] { solver.restore(state.string()); }),
               Contains(state.string()) && Contains("history blob 0 has shape 8x16") &&
                   Contains("ip1") && Contains("9x16"));
  }
  SECTION("a truncated state") {
    const std::string bytes = read_bytes(state);
    const fs::path cut = dir / "cut.solverstate";
    write_file(cut, bytes.substr(0, bytes.size() / 2));
    Solver solver(path.string(), f.runtime, *f.driver);
    CHECK_THAT(error_of([&] { solver.restore(cut.string()); }), Contains(cut.string()));
  }
  SECTION("a state whose weights are gone") {
    fs::remove(dir / "snap_iter_1.caffemodel");
    Solver solver(path.string(), f.runtime, *f.driver);
    CHECK_THAT(
        error_of([&] { solver.restore(state.string()); }),
        Contains(state.string()) && Contains("snap_iter_1.caffemodel") && Contains("do not exist"));
  }
  SECTION("a state whose multistep position is out of range") {
    // Negative, it indexed the stepvalues out of bounds; huge, the rate became 0 silently.
    for (const int step : {-100000000, 100000000, 1}) {
      hybridnn::proto::SolverState edited;
      hn::detail::read_binary_proto(state.string(), edited);
      edited.set_current_step(step);
      const fs::path bad = dir / "step.solverstate";
      hn::detail::write_binary_proto(bad.string(), edited);
      Solver solver(path.string(), f.runtime, *f.driver);  // fixed policy: no stepvalues
      CHECK_THAT(error_of([&] { solver.restore(bad.string()); }),
                 Contains(bad.string()) && Contains(fmt::format("current_step {}", step)) &&
                     Contains("outside [0, 0]"));
      CHECK(solver.iter() == 0);
    }
  }
  SECTION("a missing state") {
    Solver solver(path.string(), f.runtime, *f.driver);
    CHECK_THAT(error_of([&] { solver.restore((dir / "none.solverstate").string()); }),
               Contains("none.solverstate") && Contains("does not exist"));
  }
}

TEST_CASE("bad solver settings are errors naming the solver file and the setting") {
  const test::TempDir temp = scratch_dir("bad_solver");
  const fs::path dir = temp.path();
  write_file(dir / "tiny.prototxt", kTinyNet);
  Fixture f;
  const auto error_for = [&](const std::string& settings) {
    const fs::path path = dir / "solver.prototxt";
    write_file(path, "net: \"tiny.prototxt\"\nbase_lr: 0.1\n" + settings);
    return error_of([&] { Solver solver(path.string(), f.runtime, *f.driver); });
  };
  CHECK_THAT(error_for("lr_policy: \"fixed\"\ntype: \"Adamax\""),
             Contains("solver.prototxt") && Contains("unknown solver type \"Adamax\"") &&
                 Contains("AdaDelta"));
  CHECK_THAT(error_for("lr_policy: \"cosine\""),
             Contains("unknown lr_policy \"cosine\"") && Contains("multistep"));
  CHECK_THAT(error_for(""), Contains("lr_policy is not set"));
  CHECK_THAT(error_for("lr_policy: \"step\""), Contains("needs stepsize > 0"));
  CHECK_THAT(error_for("lr_policy: \"fixed\"\nsnapshot_format: HDF5"),
             Contains("HDF5 is not supported"));
  CHECK_THAT(error_for("lr_policy: \"fixed\"\nregularization_type: \"L3\""),
             Contains("regularization_type \"L3\""));
  CHECK_THAT(error_for("lr_policy: \"fixed\"\ntype: \"SGD\"\nsolver_type: ADAM"),
             Contains("not both"));
  CHECK_THAT(error_for("lr_policy: \"fixed\"\ntest_iter: 1"),
             Contains("test nets need test_interval > 0"));
  CHECK_THAT(error_for("lr_policy: \"fixed\"\ntrain_net: \"tiny.prototxt\""),
             Contains("exactly one training net"));
}

}  // namespace hn
