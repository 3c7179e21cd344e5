// Communicator: the local one's collectives, and the Solver's use of a communicator in data
// parallelism (weights broadcast from rank 0 before the first iteration, gradients summed
// over the ranks and divided by their number before the update), checked by hand on a
// one-output InnerProduct net with a stand-in for a second rank.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/comm/comm.h"
#include "lib/core/runtime.h"
#include "lib/solver/solver.h"
#include "tests/support.h"

namespace hn {
namespace {

TEST_CASE("the local communicator is rank 0 of 1 and its collectives keep the data", "[comm]") {
  Runtime runtime;
  Driver& driver = runtime.add(Device::parse("reference"));
  const std::unique_ptr<Communicator> local = make_local_communicator();
  CHECK(local->rank() == 0);
  CHECK(local->size() == 1);
  CHECK(local->name() == "local");
  std::vector<float> data{1.5f, -2.0f, 3.25f};
  local->allreduce(driver, data.data(), data.size());
  local->allreduce(driver, data.data(), data.size(), ReduceOp::average);
  local->broadcast(driver, data.data(), data.size(), 0);
  std::vector<float> gathered(3);
  local->allgather(driver, data.data(), data.size(), gathered.data());
  local->barrier();
  CHECK(data == std::vector<float>{1.5f, -2.0f, 3.25f});
  CHECK(gathered == data);
  std::vector<float> blocks(3, 0.0f), block(3, 0.0f);
  local->allgatherv(driver, data.data(), {3}, blocks.data());
  local->reduce_scatterv(driver, data.data(), {3}, block.data(), ReduceOp::average);
  CHECK(blocks == data);
  CHECK(block == data);
  CHECK_THROWS_WITH(local->allgatherv(driver, data.data(), {1, 2}, blocks.data()),
                    Catch::Contains("allgatherv on rank 0 got 2 block counts for 1 ranks"));
  CHECK(communicator_backends().front() == "local");
  CHECK(make_communicator("local")->name() == "local");
  CHECK_THROWS_WITH(
      make_communicator("carrier-pigeon"),
      Catch::Contains("unknown communicator 'carrier-pigeon'") && Catch::Contains("local"));
  CHECK_THROWS_WITH(local->broadcast(driver, data.data(), data.size(), 1),
                    Catch::Contains("broadcast from rank 1"));
}

// Rank 0 of two, the other rank played by fixed values: its gradients (`peer_gradient`,
// one vector per gradient bucket, in the order the solver reduces them), its weights at the
// broadcast (`root_weights`: this process stands for rank 1 when they are given), and the
// same loss, stop flag and start-check fingerprints as this process.
class TwoRanks final : public Communicator {
 public:
  std::vector<std::vector<float>> peer_gradient, root_weights;
  int allreduces = 0, broadcasts = 0, loss_reductions = 0, allgathers = 0;

  int rank() const override { return root_weights.empty() ? 0 : 1; }
  int size() const override { return 2; }
  std::string name() const override { return "two-ranks (test)"; }
  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    if (count == 2) {  // the loss and the stop flag: the peer's are ours, the mean too
      ++loss_reductions;
      return;
    }
    const std::vector<float>& peer = peer_gradient.at(allreduces++ % peer_gradient.size());
    REQUIRE(peer.size() == count);
    std::vector<float> host(count);
    driver.copy_to_host(host.data(), data, count * sizeof(float));
    for (std::size_t i = 0; i < count; ++i) {
      host[i] += peer[i];
      if (op == ReduceOp::average) host[i] *= 0.5f;
    }
    driver.copy_from_host(data, host.data(), count * sizeof(float));
  }
  void broadcast(Driver& driver, float* data, std::size_t count, int root) override {
    REQUIRE(root == 0);
    if (!root_weights.empty()) {
      const std::vector<float>& weights = root_weights.at(broadcasts);
      REQUIRE(weights.size() == count);
      driver.copy_from_host(data, weights.data(), count * sizeof(float));
    }
    ++broadcasts;
  }
  // The peer's weight checksum (the 4-float gathers) differs from ours when set.
  bool peer_weights_differ = false;
  void allgather(Driver& driver, const float* sent, std::size_t count, float* received) override {
    ++allgathers;
    for (std::size_t r = 0; r < 2; ++r)
      driver.copy(received + r * count, sent, count * sizeof(float));
    if (peer_weights_differ && count == 4) {
      std::vector<float> peer(count);
      driver.copy_to_host(peer.data(), received + count, count * sizeof(float));
      peer[0] = peer[0] == 1.0f ? 2.0f : 1.0f;
      driver.copy_from_host(received + count, peer.data(), count * sizeof(float));
    }
  }
  void barrier() override {}
  [[noreturn]] void abort(int) noexcept override { std::abort(); }
};

const char* kTinyNet = R"(
name: "tiny"
layer { name: "in" type: "Input" top: "x" top: "t"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 1 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
)";
const double kX[2][3] = {{1.0, 2.0, 3.0}, {-1.0, 0.5, 2.0}};
const double kT[2] = {1.0, 0.0};

// The gradient of sum((Wx + b - t)^2) / (2N) at (w, b), by hand.
void tiny_gradient(const double w[3], double b, double gw[3], double* gb) {
  gw[0] = gw[1] = gw[2] = *gb = 0.0;
  for (int n = 0; n < 2; ++n) {
    const double r = (w[0] * kX[n][0] + w[1] * kX[n][1] + w[2] * kX[n][2] + b - kT[n]) / 2.0;
    for (int i = 0; i < 3; ++i)
      gw[i] += r * kX[n][i];
    *gb += r;
  }
}

struct TinySolver {
  test::TempDir dir{"hybridnn-comm"};
  Runtime runtime;
  std::unique_ptr<Solver> solver;

  explicit TinySolver(Communicator* communicator,
                      std::size_t bucket_bytes = std::size_t{25} << 20) {
    const std::string net_file = dir.write("tiny.prototxt", kTinyNet);
    const std::string solver_file =
        dir.write("solver.prototxt", fmt::format("net: \"{}\"\nbase_lr: 0.1\nlr_policy: \"fixed\"\n"
                                                 "max_iter: 10\nsnapshot_after_train: false\n",
                                                 net_file));
    SolverOptions options;
    options.communicator = communicator;
    options.bucket_bytes = bucket_bytes;
    solver = std::make_unique<Solver>(solver_file, runtime, runtime.add(Device::parse("reference")),
                                      options);
    Net& net = solver->net();
    float* x = net.blob("x").host_data_mut();
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 3; ++i)
        x[n * 3 + i] = static_cast<float>(kX[n][i]);
    net.blob("t").host_data_mut()[0] = static_cast<float>(kT[0]);
    net.blob("t").host_data_mut()[1] = static_cast<float>(kT[1]);
    float* w = net.learnable_params()[0].tensor->host_data_mut();
    w[0] = 0.2f, w[1] = -0.1f, w[2] = 0.3f;
    net.learnable_params()[1].tensor->host_data_mut()[0] = 0.05f;
  }
  std::vector<float> weights() {
    const auto& params = solver->net().learnable_params();
    std::vector<float> out(params[0].tensor->host_data(), params[0].tensor->host_data() + 3);
    out.push_back(params[1].tensor->host_data()[0]);
    return out;
  }
};

TEST_CASE("the solver updates with the mean gradient over the ranks", "[comm][solver]") {
  // One bucket holds both gradients, in the order backward finishes them: bias, weights.
  TwoRanks ranks;
  ranks.peer_gradient = {{-0.6f, 0.4f, -0.2f, 1.0f}};
  TinySolver tiny(&ranks);
  CHECK(ranks.allgathers == 1);  // the ranks compared their nets at construction
  tiny.solver->step(1);
  CHECK(ranks.allreduces == 1);  // one bucket
  CHECK(ranks.loss_reductions == 1);
  CHECK(ranks.broadcasts == 2);  // before the first iteration, one per parameter

  const double w[3] = {0.2, -0.1, 0.3}, b = 0.05;
  double gw[3], gb;
  tiny_gradient(w, b, gw, &gb);
  const std::vector<float> got = tiny.weights();
  for (int i = 0; i < 3; ++i) {
    CHECK(got[i] ==
          Approx(w[i] - 0.1 * (gw[i] + ranks.peer_gradient[0][1 + i]) / 2.0).epsilon(1e-6));
  }
  CHECK(got[3] == Approx(b - 0.1 * (gb + ranks.peer_gradient[0][0]) / 2.0).epsilon(1e-6));
  tiny.solver->step(1);  // the broadcast happens once per solver, not per step
  CHECK(ranks.broadcasts == 2);
  CHECK(ranks.allreduces == 2);
}

TEST_CASE("ranks whose weights drift apart fail at the weight check, naming the rank",
          "[comm][solver]") {
  TwoRanks ranks;
  ranks.peer_gradient = {{0.0f, 0.0f, 0.0f, 0.0f}};
  ranks.peer_weights_differ = true;
  TinySolver tiny(&ranks);
  tiny.solver->step(1);  // checksum_interval 1000: no check yet
  CHECK_THROWS_WITH(
      tiny.solver->snapshot(),
      Catch::Contains("snapshot at iteration 1: the weights of rank 1 differ from rank "
                      "0's"));
}

TEST_CASE("gradient buckets smaller than a parameter reduce each in place", "[comm][solver]") {
  TwoRanks ranks;
  ranks.peer_gradient = {{-0.6f}, {0.4f, -0.2f, 1.0f}};  // bias, then weights
  TinySolver tiny(&ranks, 4);
  tiny.solver->step(1);
  CHECK(ranks.allreduces == 2);
  const double w[3] = {0.2, -0.1, 0.3}, b = 0.05;
  double gw[3], gb;
  tiny_gradient(w, b, gw, &gb);
  const std::vector<float> got = tiny.weights();
  for (int i = 0; i < 3; ++i)
    CHECK(got[i] == Approx(w[i] - 0.1 * (gw[i] + ranks.peer_gradient[1][i]) / 2.0).epsilon(1e-6));
  CHECK(got[3] == Approx(b - 0.1 * (gb + ranks.peer_gradient[0][0]) / 2.0).epsilon(1e-6));
}

TEST_CASE("a rank other than 0 starts from rank 0's broadcast weights", "[comm][solver]") {
  TwoRanks ranks;
  ranks.root_weights = {{0.5f, 0.25f, -0.75f}, {0.125f}};
  ranks.peer_gradient = {{0.0f, 0.0f, 0.0f, 0.0f}};
  TinySolver tiny(&ranks);
  tiny.solver->step(1);
  const double w[3] = {0.5, 0.25, -0.75}, b = 0.125;
  double gw[3], gb;
  tiny_gradient(w, b, gw, &gb);
  const std::vector<float> got = tiny.weights();
  for (int i = 0; i < 3; ++i)
    CHECK(got[i] == Approx(w[i] - 0.1 * gw[i] / 2.0).epsilon(1e-6));
  CHECK(got[3] == Approx(b - 0.1 * gb / 2.0).epsilon(1e-6));
}

TEST_CASE("a solver without a communicator trains alone, as with the local one", "[comm][solver]") {
  const std::unique_ptr<Communicator> local = make_local_communicator();
  TinySolver alone(nullptr), with_local(local.get());
  alone.solver->step(3);
  with_local.solver->step(3);
  CHECK(alone.weights() == with_local.weights());
  const double w[3] = {0.2, -0.1, 0.3}, b = 0.05;
  double gw[3], gb;
  tiny_gradient(w, b, gw, &gb);
  TinySolver one(nullptr);
  one.solver->step(1);
  CHECK(one.weights()[0] == Approx(w[0] - 0.1 * gw[0]).epsilon(1e-6));
}

}  // namespace
}  // namespace hn
