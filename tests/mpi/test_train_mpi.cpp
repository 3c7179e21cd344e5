// Data-parallel training under mpirun (2, 3 and 4 ranks): N ranks at batch B against one
// process at batch N x B, computed by every rank itself with the local communicator; the
// weights bitwise identical across ranks; the split inside each rank; the start check.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/comm/comm.h"
#include "lib/core/runtime.h"
#include "lib/solver/solver.h"
#include "tests/mpi/mpi_runs.h"
#include "tests/support.h"

using Catch::Matchers::Contains;
using namespace hn;
using test::max_relative_difference;
using test::ring;

namespace {

constexpr int kIterations = 20;

std::string lenet(int batch, int num_output_ip1 = 500, bool norm = false) {
  std::ifstream file(HYBRIDNN_SOURCE_DIR "/examples/fashion_mnist/lenet_train_test.prototxt");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  std::string net = text.str();
  const auto replace = [&net](const std::string& from, const std::string& to) {
    const std::size_t at = net.find(from);
    REQUIRE(at != std::string::npos);
    net.replace(at, from.size(), to);
  };
  replace("batch_size: 64", fmt::format("batch_size: {}", batch));
  replace("num_output: 500", fmt::format("num_output: {}", num_output_ip1));
  if (norm) {
    // conv1 -> BatchNorm (stored statistics: its mean 0 and variance 0 give 1 / sqrt(eps) =
    // 1) -> Scale -> ReLU in place: folded into conv1 (net_fusion.cpp).
    replace("layer {\n  name: \"pool1\"",
            "layer { name: \"bn1\" type: \"BatchNorm\" bottom: \"conv1\" top: \"conv1\"\n"
            "        batch_norm_param { use_global_stats: true eps: 1 } }\n"
            "layer { name: \"scale1\" type: \"Scale\" bottom: \"conv1\" top: \"conv1\"\n"
            "        scale_param { bias_term: true } }\n"
            "layer { name: \"relu0\" type: \"ReLU\" bottom: \"conv1\" top: \"conv1\" }\n"
            "layer {\n  name: \"pool1\"");
  }
  return net;
}

struct Run {
  test::TempDir dir{"hybridnn-train-mpi"};
  Runtime runtime;
  std::unique_ptr<Solver> solver;
  std::vector<float> losses;

  Run(int batch, Communicator* comm, const Split& split = {}, int num_output_ip1 = 500,
      GradCompression compress = GradCompression::none, bool norm = false,
      std::size_t bucket_bytes = std::size_t{25} << 20) {
    const std::string net = dir.write("net.prototxt", lenet(batch, num_output_ip1, norm));
    const std::string solver_file = dir.write(
        "solver.prototxt",
        fmt::format("net: \"{}\"\ntest_iter: 6\ntest_interval: 1000\nbase_lr: 0.01\n"
                    "momentum: 0.9\nweight_decay: 0.0005\nlr_policy: \"inv\"\ngamma: 0.0001\n"
                    "power: 0.75\nmax_iter: {}\nrandom_seed: 1\nsnapshot_after_train: false\n",
                    net, kIterations));
    DriverOptions one_thread;
    one_thread.set("threads", 1);
    Driver& driver = runtime.add(Device::parse("cpu"), one_thread);
    if (!split.empty()) runtime.add(Device::parse("reference"));
    SolverOptions options;
    options.train_data = options.test_data = "synthetic:1x28x28:10";
    options.communicator = comm;
    options.split = split;
    options.grad_compress = compress;
    options.bucket_bytes = bucket_bytes;
    solver = std::make_unique<Solver>(solver_file, runtime, driver, options);
  }
  void train() {
    for (int i = 0; i < kIterations; ++i) {
      solver->step(1);
      losses.push_back(solver->last_loss());
    }
  }
  std::vector<float> weights() const {
    std::vector<float> all;
    for (const NetParam& param : solver->net().learnable_params())
      all.insert(all.end(), param.tensor->host_data(),
                 param.tensor->host_data() + param.tensor->count());
    return all;
  }
};

// Every rank's `values` equal rank 0's, bit for bit.
void check_identical_across_ranks(Communicator& comm, const std::vector<float>& values) {
  const std::unique_ptr<Driver> host = make_driver(Device::parse("reference"));
  std::vector<float> all(values.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(*host, values.data(), values.size(), all.data());
  for (int r = 1; r < comm.size(); ++r) {
    INFO("rank " << r << " against rank 0");
    CHECK(std::memcmp(all.data(), all.data() + r * values.size(), values.size() * sizeof(float)) ==
          0);
  }
}

// The ranks' run trained as `one` process at N times the batch: the same losses, and the
// same weights on every rank, near one's.
void check_trained_as_one(Communicator& comm, const Run& ranks, const Run& one) {
  for (int i = 0; i < kIterations; ++i) {
    INFO("iteration " << i << ", " << comm.size() << " ranks");
    CHECK(std::fabs(ranks.losses[i] - one.losses[i]) <= 1e-4 * std::fabs(one.losses[i]));
  }
  check_identical_across_ranks(comm, ranks.weights());
  // Batch B and N x B run oneDNN kernels that sum in other orders. Without AVX-512 (8-channel
  // blocks, no Winograd) they drift further: clang's ASan build on an AVX2 EPYC ended 20
  // iterations 3.2e-4 apart, with one test image of 600 in another class.
  const bool avx512 = __builtin_cpu_supports("avx512f");
  CHECK(max_relative_difference(ranks.weights(), one.weights()) < (avx512 ? 1e-4 : 2e-3));
}

}  // namespace

TEST_CASE("N ranks at batch B train as one process at batch N x B", "[mpi][train]") {
  const std::unique_ptr<Communicator> comm = ring();
  const int n = comm->size();
  const int batch = 64 / n;  // 32, 21, 16: the global batch stays near 64
  Run one(batch * n, nullptr);
  one.train();
  Run ranks(batch, comm.get());
  ranks.train();
  check_trained_as_one(*comm, ranks, one);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  // Tests cover the whole test set across the ranks: the same means as one process's.
  const auto mine = ranks.solver->test(0), alone = one.solver->test(0);
  REQUIRE(mine.size() == alone.size());
  for (std::size_t k = 0; k < mine.size(); ++k) {
    INFO(mine[k].first);
    CHECK(mine[k].second == Approx(alone[k].second).epsilon(1e-4).margin(avx512 ? 0.0 : 0.005));
  }
}

// A Scale folded into the convolution before it has its gradients only when the
// convolution's backward ends: a bucket per parameter, issued at the Scale's own (empty)
// backward, would send them unfinished (checked: the losses part from the second iteration).
TEST_CASE(
    "N ranks train a net with a BatchNorm and Scale folded into a convolution as one process, "
    "with a gradient bucket per parameter",
    "[mpi][train]") {
  const std::unique_ptr<Communicator> comm = ring();
  const int n = comm->size();
  const int batch = 64 / n;
  Run one(batch * n, nullptr, {}, 500, GradCompression::none, true);
  one.train();
  const Net& net = one.solver->net();
  int conv1 = 0;
  while (conv1 < net.num_layers() && net.layer_name(conv1) != "conv1")
    ++conv1;
  REQUIRE(conv1 < net.num_layers());
  REQUIRE_THAT(net.layer_algorithm(conv1), Catch::Contains("folded: BatchNorm 'bn1'"));
  Run ranks(batch, comm.get(), {}, 500, GradCompression::none, true, sizeof(float));
  ranks.train();
  check_trained_as_one(*comm, ranks, one);
}

TEST_CASE("ranks that split their layers between drivers train as unsplit ranks", "[mpi][train]") {
  const std::unique_ptr<Communicator> comm = ring();
  Run plain(16, comm.get());
  plain.train();
  Run split(16, comm.get(), Split::parse("cpu:0.5,reference:0.5"));
  split.train();
  // Half of each batch runs on the reference driver's plain loops instead of the CPU
  // driver's kernels: other summation orders, whose rounding 20 iterations of training grow
  // to ~1e-5 with GCC's code and ~1e-4 with clang's (the sanitizer build), and to ~7e-4
  // without AVX-512 (oneDNN's AVX2 kernels round further from the plain loops). A slice
  // merged wrongly differs at the first iteration by far more.
  const double bound = __builtin_cpu_supports("avx512f") ? 1e-4 : 3e-3;
  for (int i = 0; i < kIterations; ++i) {
    INFO("iteration " << i);
    CHECK(std::fabs(split.losses[i] - plain.losses[i]) <= bound * std::fabs(plain.losses[i]));
  }
  CHECK(std::fabs(split.losses[0] - plain.losses[0]) <= 1e-6 * std::fabs(plain.losses[0]));
  check_identical_across_ranks(*comm, split.weights());
  // Weights: the largest element-wise relative difference, 6.4e-3 there without AVX-512.
  CHECK(max_relative_difference(split.weights(), plain.weights()) <
        (__builtin_cpu_supports("avx512f") ? 1e-3 : 2e-2));
}

TEST_CASE(
    "ranks that send their gradients as BF16 train in step and stay near FP32 gradients' "
    "training",
    "[mpi][train]") {
  const std::unique_ptr<Communicator> comm = ring();
  Run fp32(16, comm.get());
  fp32.train();
  Run bf16(16, comm.get(), {}, 500, GradCompression::bf16);
  bf16.train();
  // The first loss comes before any update; later ones follow weights updated with
  // gradients rounded to BF16 (2^-8 relative at most) at each hop.
  CHECK(bf16.losses[0] == fp32.losses[0]);
  for (int i = 1; i < kIterations; ++i) {
    INFO("iteration " << i);
    CHECK(std::fabs(bf16.losses[i] - fp32.losses[i]) <= 2e-2 * std::fabs(fp32.losses[i]));
  }
  check_identical_across_ranks(*comm, bf16.weights());
  // Compressed: not FP32's weights, but near them.
  const double apart = max_relative_difference(bf16.weights(), fp32.weights());
  CHECK(apart > 0.0);
  CHECK(apart < 5e-2);
}

namespace {

// A communicator that passes every call on to `inner`, counting the allreduces of ranges of
// its shared buffer.
class Watching final : public Communicator {
 public:
  explicit Watching(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string name() const override { return inner_.name(); }
  float* shared_buffer(std::size_t count) override {
    begin_ = inner_.shared_buffer(count);
    end_ = begin_ != nullptr ? begin_ + count : nullptr;
    return begin_;
  }
  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    if (begin_ != nullptr && data >= begin_ && data + count <= end_) ++in_shared;
    inner_.allreduce(driver, data, count, op);
  }
  void broadcast(Driver& driver, float* data, std::size_t count, int root) override {
    inner_.broadcast(driver, data, count, root);
  }
  void allgather(Driver& driver, const float* sent, std::size_t count, float* received) override {
    inner_.allgather(driver, sent, count, received);
  }
  void barrier() override { inner_.barrier(); }
  [[noreturn]] void abort(int exit_code) noexcept override {
    inner_.abort(exit_code);
    std::abort();  // (inner_.abort does not return)
  }
  int in_shared = 0;

 private:
  Communicator& inner_;
  float* begin_ = nullptr;
  float* end_ = nullptr;
};

}  // namespace

TEST_CASE(
    "ranks whose gradient buckets lie in the communicator's shared buffer train to the bits of "
    "the ring by messages",
    "[mpi][train]") {
  const std::unique_ptr<Communicator> shared = ring(), messages = ring();
  Watching watched(*shared);
  Run in_window(16, &watched);
  in_window.train();
  // Every bucket of every iteration went through the shared buffer.
  CHECK(watched.in_shared >= kIterations);
  REQUIRE(messages->shared_buffer(0) == nullptr);  // asked for none: its buckets go by messages
  Run by_messages(16, messages.get());
  by_messages.train();
  CHECK(in_window.losses == by_messages.losses);
  const std::vector<float> a = in_window.weights(), b = by_messages.weights();
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("ranks with different nets all fail at the start, naming the rank", "[mpi][train]") {
  const std::unique_ptr<Communicator> comm = ring();
  const int odd = comm->size() - 1;  // the last rank has a different ip1
  const int outputs = comm->rank() == odd ? 400 : 500;
  CHECK_THROWS_WITH(Run(8, comm.get(), {}, outputs),
                    Contains(fmt::format("rank {}: parameter shapes differs from rank 0's", odd)) &&
                        Contains("training net prototxt"));
  // The ranks are still in step: a collective after the failure completes.
  comm->barrier();
}
