// The MPI communicators under mpirun (ctest runs this binary with 2, 3 and 4 ranks): exact
// sums against the known answer, ring against MPI_Allreduce, bitwise reproducibility, the
// other collectives. Every rank runs every case; a failure on any rank fails the run.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/runtime.h"

using Catch::Matchers::Contains;
using namespace hn;

namespace {

std::unique_ptr<Communicator> make(const std::string& backend, double timeout = 60.0) {
  CommOptions options;
  options.timeout_seconds = timeout;
  return make_communicator(backend, options);
}

std::unique_ptr<Driver> host_driver() {
  return make_driver(Device::parse("reference"));
}

// Rank r's value at i: an integer small enough that every partial sum is exact in float.
float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 97 + 1));
}

// `count` values uniform in [-1, 1) from `seed`.
std::vector<float> uniform_values(std::size_t count, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& x : values)
    x = uniform(random);
  return values;
}

// comm's allreduce, or its allreduce_bf16 with `bf16`.
void reduce(Communicator& comm, Driver& driver, float* data, std::size_t count, ReduceOp op,
            bool bf16) {
  if (bf16) {
    comm.allreduce_bf16(driver, data, count, op);
  } else {
    comm.allreduce(driver, data, count, op);
  }
}

}  // namespace

TEST_CASE("allreduce of integer-valued floats gives the exact sum for every length", "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  for (const std::string backend : {"ring", "mpi"}) {
    const std::unique_ptr<Communicator> comm = make(backend);
    const int n = comm->size(), r = comm->rank();
    REQUIRE(n >= 2);
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1024},
          (std::size_t{1} << 20) + 3, std::size_t{16} << 20}) {
      INFO(backend << " count " << count << " on rank " << r << " of " << n);
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = value(r, i);
      comm->allreduce(*driver, data.data(), count);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i)
        wrong += data[i] != static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 97 + 1));
      CHECK(wrong == 0);
      // The mean: the sum scaled by 1 / n.
      for (std::size_t i = 0; i < count; ++i)
        data[i] = value(r, i);
      comm->allreduce(*driver, data.data(), count, ReduceOp::average);
      for (std::size_t i = 0; i < std::min<std::size_t>(count, 1000); ++i)
        CHECK(data[i] == Approx((n + 1) / 2.0 * static_cast<double>(i % 97 + 1)).epsilon(1e-6));
    }
  }
}

TEST_CASE("the ring allreduce is bitwise reproducible and agrees with MPI_Allreduce", "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring"), mpi = make("mpi");
  const int r = ring->rank(), n = ring->size();
  for (const std::size_t count : {std::size_t{13}, std::size_t{100003}, std::size_t{3} << 20}) {
    INFO("count " << count << " on rank " << r);
    const std::vector<float> input = uniform_values(count, static_cast<std::uint32_t>(1000 + r));
    std::vector<float> first = input, second = input, reference = input;
    ring->allreduce(*driver, first.data(), count);
    ring->allreduce(*driver, second.data(), count);
    CHECK(std::memcmp(first.data(), second.data(), count * sizeof(float)) == 0);
    mpi->allreduce(*driver, reference.data(), count);
    double worst = 0.0;
    for (std::size_t i = 0; i < count; ++i)
      worst = std::max(worst, static_cast<double>(std::abs(first[i] - reference[i])));
    CHECK(worst <= 1e-5 * n);
    // Every rank holds the same bits: gather a few elements from everyone.
    const std::size_t probe = std::min<std::size_t>(count, 13);
    std::vector<float> gathered(probe * static_cast<std::size_t>(n));
    ring->allgather(*driver, first.data(), probe, gathered.data());
    for (int other = 0; other < n; ++other) {
      CHECK(std::memcmp(gathered.data() + static_cast<std::size_t>(other) * probe, first.data(),
                        probe * sizeof(float)) == 0);
    }
  }
}

namespace {

// BF16 rounded to nearest, ties to even, as a float (the test's own, from the definition).
float bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t lower = bits & 0xffffu, upper = bits & 0xffff0000u;
  std::uint32_t rounded = upper;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 0x10000u) != 0)) rounded += 0x10000u;
  float out;
  std::memcpy(&out, &rounded, sizeof out);
  return out;
}

}  // namespace

TEST_CASE(
    "the ring's BF16 allreduce sums FP32 values sent as BF16 in ring order: the bits of a "
    "simulation of the ring on every rank and run, within BF16's rounding of MPI_Allreduce",
    "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring"), mpi = make("mpi");
  CHECK(ring->compresses());
  CHECK_FALSE(mpi->compresses());
  const int r = ring->rank(), n = ring->size();
  for (const std::size_t count :
       {std::size_t{1}, std::size_t{13}, std::size_t{100003}, (std::size_t{1} << 20) + 5}) {
    INFO("count " << count << " on rank " << r << " of " << n);
    const std::vector<float> input = uniform_values(count, static_cast<std::uint32_t>(2000 + r));
    std::vector<float> all(count * static_cast<std::size_t>(n));
    mpi->allgather(*driver, input.data(), count, all.data());
    // Segment g (n near-equal parts, the first count % n one longer) starts at rank g: each
    // hop adds the next rank's FP32 values to the partial sum received as BF16; the rank
    // that completes it rounds it to BF16.
    std::vector<float> expected(count);
    const std::size_t base = count / static_cast<std::size_t>(n),
                      extra = count % static_cast<std::size_t>(n);
    for (std::size_t g = 0; g < static_cast<std::size_t>(n); ++g) {
      const std::size_t begin = g * base + std::min(g, extra), end = begin + base + (g < extra);
      for (std::size_t i = begin; i < end; ++i) {
        float sum = all[g * count + i];
        for (std::size_t k = 1; k < static_cast<std::size_t>(n); ++k)
          sum = bf16(sum) + all[(g + k) % static_cast<std::size_t>(n) * count + i];
        expected[i] = bf16(sum);
      }
    }
    std::vector<float> first = input, second = input, mean = input, reference = input;
    ring->allreduce_bf16(*driver, first.data(), count);
    ring->allreduce_bf16(*driver, second.data(), count);
    CHECK(std::memcmp(first.data(), expected.data(), count * sizeof(float)) == 0);
    CHECK(std::memcmp(second.data(), expected.data(), count * sizeof(float)) == 0);
    ring->allreduce_bf16(*driver, mean.data(), count, ReduceOp::average);
    std::size_t wrong_mean = 0;
    for (std::size_t i = 0; i < count; ++i)
      wrong_mean += mean[i] != expected[i] * (1.0f / static_cast<float>(n));
    CHECK(wrong_mean == 0);
    // Against the FP32 sum: one BF16 rounding (at most 2^-8 relative: 8 significant bits)
    // per hop, of at most the magnitudes summed so far.
    mpi->allreduce(*driver, reference.data(), count);
    std::size_t outside = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double magnitude = 0.0;
      for (int k = 0; k < n; ++k)
        magnitude += std::abs(all[static_cast<std::size_t>(k) * count + i]);
      outside += std::abs(first[i] - reference[i]) > n * magnitude / 256.0;
    }
    CHECK(outside == 0);
  }
}

TEST_CASE("the ring pipeline gives the same sums with any chunking", "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::size_t count = 10007;
  std::vector<float> expected;
  for (const std::size_t chunk_bytes : {std::size_t{0}, std::size_t{256}, std::size_t{4096}}) {
    for (const int in_flight : {1, 3, 16}) {
      CommOptions options;
      options.chunk_bytes = chunk_bytes;
      options.chunks_in_flight = in_flight;
      options.timeout_seconds = 60.0;
      const std::unique_ptr<Communicator> ring = make_communicator("ring", options);
      INFO("chunk_bytes " << chunk_bytes << " in flight " << in_flight);
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = value(ring->rank(), i) * 0.37f;  // not integers: the order shows
      ring->allreduce(*driver, data.data(), count);
      if (expected.empty()) expected = data;
      // The order of the additions depends on (count, size) only, not on the chunking.
      CHECK(std::memcmp(data.data(), expected.data(), count * sizeof(float)) == 0);
    }
  }
}

TEST_CASE(
    "allreduce in the shared buffer: the bits of the ring by messages, FP32 and BF16, sum "
    "and mean, at any offset, on the ring, hier and auto backends",
    "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> messages = make("ring");
  for (const std::string backend : {"ring", "hier", "auto"}) {
    const std::unique_ptr<Communicator> comm = make(backend);
    const int r = comm->rank(), n = comm->size();
    INFO(backend << " on rank " << r << " of " << n);
    const std::size_t capacity = (std::size_t{1} << 20) + 117;
    float* const shared = comm->shared_buffer(capacity);
    // mpirun starts every rank of these tests on this machine: one node.
    REQUIRE(shared != nullptr);
    CHECK(comm->shared_buffer(capacity) == nullptr);  // the first call only
    const std::pair<std::size_t, std::size_t> ranges[] = {
        {0, 1}, {0, 13}, {5, 100003}, {116, std::size_t{1} << 20}, {capacity - 7, 7}};
    for (const auto& [offset, count] : ranges) {
      const std::vector<float> input = uniform_values(count, static_cast<std::uint32_t>(4000 + r));
      for (const bool bf16 : {false, true}) {
        for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
          INFO("offset " << offset << " count " << count << (bf16 ? " bf16" : " fp32")
                         << (op == ReduceOp::sum ? " sum" : " mean"));
          std::vector<float> expected = input;
          std::copy(input.begin(), input.end(), shared + offset);
          std::fill(shared, shared + offset, -1.0f);  // around the range: untouched
          reduce(*messages, *driver, expected.data(), count, op, bf16);
          reduce(*comm, *driver, shared + offset, count, op, bf16);
          CHECK(std::memcmp(shared + offset, expected.data(), count * sizeof(float)) == 0);
          CHECK(std::count(shared, shared + offset, -1.0f) == static_cast<long>(offset));
        }
      }
    }
    // Ranks that pass different places fail together, naming them, and stay in step.
    std::vector<float> own(8, 1.0f);
    std::fill(shared, shared + 8, 1.0f);
    CHECK_THROWS_WITH(comm->allreduce(*driver, r == 0 ? shared : own.data(), 8),
                      Contains("allreduce") && Contains("places in the shared buffer") &&
                          Contains(fmt::format("rank {} of {}", r, n)));
    comm->allreduce(*driver, shared, 8);
    CHECK(std::vector<float>(shared, shared + 8) == std::vector<float>(8, static_cast<float>(n)));
  }
  // No buffer where some rank asks for none (a driver whose memory the host cannot address).
  const std::unique_ptr<Communicator> comm = make("ring");
  CHECK(comm->shared_buffer(comm->rank() == 0 ? 0 : 100) == nullptr);
  CHECK(make("mpi")->shared_buffer(100) == nullptr);  // a backend without shared buffers
}

namespace {

// The hier backend with the ranks grouped `per_node` at a time into simulated nodes.
std::unique_ptr<Communicator> make_grouped(const std::string& backend, int per_node,
                                           std::size_t chunk_bytes = 0) {
  CommOptions options;
  options.timeout_seconds = 60.0;
  options.ranks_per_node = per_node;
  options.chunk_bytes = chunk_bytes;
  return make_communicator(backend, options);
}

}  // namespace

namespace {

// hier on nodes of `per_node` ranks (0: as MPI finds them) against the flat ring, bit for bit:
// FP32 and BF16, sum and mean, twice, for several lengths, small chunks too (many chunks in
// flight between the nodes).
void check_hier_against_ring(Driver& driver, Communicator& ring, int per_node) {
  const int r = ring.rank(), n = ring.size();
  for (const std::size_t chunk_bytes : {std::size_t{0}, std::size_t{256}}) {
    const std::unique_ptr<Communicator> hier = make_grouped("hier", per_node, chunk_bytes);
    CHECK(hier->name() == "hier");
    CHECK(hier->compresses());
    for (const std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{13},
                                    std::size_t{100003}, (std::size_t{1} << 18) + 5}) {
      if (chunk_bytes != 0 && count > 100003) continue;
      INFO(per_node << " ranks per node, chunk_bytes " << chunk_bytes << ", count " << count
                    << " on rank " << r << " of " << n);
      const std::vector<float> input = uniform_values(count, static_cast<std::uint32_t>(3000 + r));
      for (const bool bf16 : {false, true}) {
        for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
          INFO((bf16 ? "bf16" : "fp32") << (op == ReduceOp::sum ? " sum" : " mean"));
          std::vector<float> flat = input, first = input, second = input;
          reduce(ring, driver, flat.data(), count, op, bf16);
          reduce(*hier, driver, first.data(), count, op, bf16);
          reduce(*hier, driver, second.data(), count, op, bf16);
          std::size_t differ = 0;
          for (std::size_t i = 0; i < count; ++i)
            differ += std::memcmp(&flat[i], &first[i], sizeof(float)) != 0 ||
                      std::memcmp(&flat[i], &second[i], sizeof(float)) != 0;
          CHECK(differ == 0);
        }
      }
    }
  }
}

}  // namespace

// (The tool test mpi_hier_on_two_simulated_nodes runs the [hier_nodes] cases on two nodes.)
TEST_CASE(
    "the hierarchical allreduce gives the flat ring's bits, FP32 and BF16, on the nodes MPI "
    "finds",
    "[mpi][hier][hier_nodes]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring");
  check_hier_against_ring(*driver, *ring, 0);
}

TEST_CASE(
    "the hierarchical allreduce gives the flat ring's bits, FP32 and BF16, on every grouping "
    "of the ranks into nodes simulated on one machine",
    "[mpi][hier]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring");
  // Simulated nodes must lie within the real ones (their ranks share memory).
  for (int per_node = 1; per_node <= ring->size(); ++per_node) {
    if (launched_local_ranks() % per_node == 0) check_hier_against_ring(*driver, *ring, per_node);
  }
}

TEST_CASE(
    "auto runs hier where the nodes hold several ranks each, else the ring, and hier refuses "
    "nodes of different sizes, naming them",
    "[mpi][hier][hier_nodes]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring");
  const int n = ring->size(), r = ring->rank();
  // The nodes as the launcher placed the ranks (one node here), numbered node by node:
  // hier for several ranks a node on several nodes, or at least 3 on one.
  const int local = launched_local_ranks();
  CHECK(make("auto")->name() == (local > 2 || (local > 1 && n > local) ? "hier" : "ring"));
  // One rank per node: nothing to share.
  CHECK(make_grouped("auto", 1)->name() == "ring");
  if (n % 2 == 0) {
    CHECK(make_grouped("auto", 2)->name() == (n > 2 ? "hier" : "ring"));
  } else {
    // Nodes of 2 and 1: not the flat ring's chains node by node.
    CHECK(make_grouped("auto", 2)->name() == "ring");
    CHECK_THROWS_WITH(make_grouped("hier", 2), Contains("communicator hier") &&
                                                   Contains("different numbers of ranks") &&
                                                   Contains("--comm ring"));
  }
  // Whatever it runs, auto sums as the ring does.
  std::vector<float> data(1001);
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = value(r, i) * 0.37f;
  std::vector<float> flat = data;
  ring->allreduce(*driver, flat.data(), flat.size());
  make_grouped("auto", 2)->allreduce(*driver, data.data(), data.size());
  CHECK(std::memcmp(flat.data(), data.data(), data.size() * sizeof(float)) == 0);
}

// Hidden: the tool test mpi_hier_on_two_simulated_nodes runs it with a node whose /dev/shm
// (24 MiB) has no room for the window of 16 MiB a rank.
TEST_CASE(
    "a node without room in /dev/shm for the window fails hier naming it, and auto sums on the "
    "ring",
    "[.hier_shm]") {
  const std::unique_ptr<Driver> driver = host_driver();
  const std::unique_ptr<Communicator> ring = make("ring"), hier = make("hier"),
                                      automatic = make("auto");
  const int r = ring->rank(), n = ring->size();
  const std::size_t count = std::size_t{4} << 20;
  std::vector<float> flat(count), data(count);
  for (std::size_t i = 0; i < count; ++i)
    flat[i] = data[i] = value(r, i) * 0.37f;
  ring->allreduce(*driver, flat.data(), count);
  CHECK_THROWS_WITH(hier->allreduce(*driver, data.data(), count),
                    Contains("communicator hier") && Contains("no room in /dev/shm") &&
                        Contains(fmt::format("rank {} of {}", r, n)) && Contains("--shm-size"));
  for (std::size_t i = 0; i < count; ++i)
    data[i] = value(r, i) * 0.37f;
  automatic->allreduce(*driver, data.data(), count);
  CHECK(std::memcmp(flat.data(), data.data(), count * sizeof(float)) == 0);
}

TEST_CASE("broadcast, allgather and barrier on both MPI backends, device memory too", "[mpi]") {
  Runtime runtime;
  DriverOptions separate;
  separate.set("separate_memory", true);
  Driver& host = runtime.add(Device::parse("reference"));
  Driver& device = runtime.add(Device::parse("reference:1"), separate);
  for (const std::string backend : {"ring", "mpi"}) {
    const std::unique_ptr<Communicator> comm = make(backend);
    const int n = comm->size(), r = comm->rank();
    INFO(backend << " rank " << r);
    for (Driver* driver : {&host, &device}) {
      const std::size_t count = 1001;
      std::vector<float> mine(count);
      for (std::size_t i = 0; i < count; ++i)
        mine[i] = static_cast<float>(r * 10000 + static_cast<int>(i));
      Buffer data(*driver, count * sizeof(float));
      Buffer gathered(*driver, count * sizeof(float) * static_cast<std::size_t>(n));
      driver->copy_from_host(data.address(), mine.data(), count * sizeof(float));
      comm->allgather(*driver, data.as<float>(), count, gathered.as<float>());
      std::vector<float> all(count * static_cast<std::size_t>(n));
      driver->copy_to_host(all.data(), gathered.address(), all.size() * sizeof(float));
      for (int other = 0; other < n; ++other)
        CHECK(all[static_cast<std::size_t>(other) * count + 5] ==
              static_cast<float>(other * 10000 + 5));
      const int root = n - 1;
      comm->broadcast(*driver, data.as<float>(), count, root);
      std::vector<float> back(count);
      driver->copy_to_host(back.data(), data.address(), count * sizeof(float));
      CHECK(back[7] == static_cast<float>(root * 10000 + 7));
      comm->allreduce(*driver, data.as<float>(), count);  // every rank holds root's values
      driver->copy_to_host(back.data(), data.address(), count * sizeof(float));
      CHECK(back[7] == static_cast<float>(n * (root * 10000 + 7)));
      comm->barrier();
    }
    CHECK_THROWS_WITH(comm->broadcast(host, nullptr, 0, n), Contains("broadcast from rank"));
  }
}

// A backend with only the equal-block collectives: allgatherv and reduce_scatterv are
// Communicator's defaults over `inner`'s allgather and allreduce.
class EqualBlocksOnly final : public Communicator {
 public:
  explicit EqualBlocksOnly(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "defaults over " + inner_->name(); }
  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    inner_->allreduce(driver, data, count, op);
  }
  void broadcast(Driver& driver, float* data, std::size_t count, int root) override {
    inner_->broadcast(driver, data, count, root);
  }
  void allgather(Driver& driver, const float* sent, std::size_t count, float* received) override {
    inner_->allgather(driver, sent, count, received);
  }
  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(int exit_code) noexcept override {
    inner_->abort(exit_code);
    std::_Exit(exit_code);  // not reached
  }

 private:
  std::unique_ptr<Communicator> inner_;
};

TEST_CASE("allgatherv and reduce_scatterv of unequal blocks give exact blocks and sums", "[mpi]") {
  Runtime runtime;
  DriverOptions separate;
  separate.set("separate_memory", true);
  Driver& host = runtime.add(Device::parse("reference"));
  Driver& device = runtime.add(Device::parse("reference:1"), separate);
  for (const std::string backend : {"ring", "mpi", "defaults"}) {
    const std::unique_ptr<Communicator> comm =
        backend == "defaults" ? std::make_unique<EqualBlocksOnly>(make("mpi")) : make(backend);
    const int n = comm->size(), r = comm->rank();
    // Rank 1's block is empty; the others differ in length.
    std::vector<std::size_t> counts, offsets;
    std::size_t total = 0;
    for (int other = 0; other < n; ++other) {
      counts.push_back(other == 1 ? 0 : static_cast<std::size_t>(3 * other + 2));
      offsets.push_back(total);
      total += counts.back();
    }
    const std::size_t own = counts[static_cast<std::size_t>(r)];
    for (Driver* driver : {&host, &device}) {
      INFO(comm->name() << " rank " << r << " of " << n << " on " << driver->name());
      std::vector<float> mine(own);
      for (std::size_t i = 0; i < own; ++i)
        mine[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
      Buffer sent(*driver, std::max<std::size_t>(own, 1) * sizeof(float));
      Buffer gathered(*driver, total * sizeof(float));
      driver->copy_from_host(sent.address(), mine.data(), own * sizeof(float));
      comm->allgatherv(*driver, sent.as<float>(), counts, gathered.as<float>());
      std::vector<float> all(total);
      driver->copy_to_host(all.data(), gathered.address(), total * sizeof(float));
      std::vector<float> want;
      for (int other = 0; other < n; ++other)
        for (std::size_t i = 0; i < counts[static_cast<std::size_t>(other)]; ++i)
          want.push_back(static_cast<float>(other * 1000 + static_cast<int>(i)));
      CHECK(all == want);

      std::vector<float> data(total);
      for (std::size_t i = 0; i < total; ++i)
        data[i] = value(r, i);
      Buffer whole(*driver, total * sizeof(float));
      Buffer block(*driver, std::max<std::size_t>(own, 1) * sizeof(float));
      driver->copy_from_host(whole.address(), data.data(), total * sizeof(float));
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        comm->reduce_scatterv(*driver, whole.as<float>(), counts, block.as<float>(), op);
        std::vector<float> got(own), expected(own);
        driver->copy_to_host(got.data(), block.address(), own * sizeof(float));
        for (std::size_t i = 0; i < own; ++i) {
          // Every rank's value at the block's position: (rank + 1) * k, summed over ranks.
          const int k = static_cast<int>((offsets[static_cast<std::size_t>(r)] + i) % 97 + 1);
          const float sum = static_cast<float>(n * (n + 1) / 2 * k);
          expected[i] = op == ReduceOp::sum ? sum : sum * (1.0f / static_cast<float>(n));
        }
        CHECK(got == expected);
      }
    }
    const std::vector<std::size_t> short_counts(static_cast<std::size_t>(n) - 1, 1);
    CHECK_THROWS_WITH(comm->allgatherv(host, nullptr, short_counts, nullptr),
                      Contains("allgatherv") && Contains(fmt::format("{} block counts", n - 1)));
    CHECK_THROWS_WITH(comm->reduce_scatterv(host, nullptr, short_counts, nullptr),
                      Contains("reduce_scatterv") && Contains(fmt::format("for {} ranks", n)));
  }
}

// Unequal counts used to end the job in MPI_ERRORS_ARE_FATAL (MPI_ERR_TRUNCATE) or, where a
// rank receives less than it posted (the ring), leave it wrong sums. Now every rank throws,
// naming the collective and the sizes, and the communicator stays usable.
TEST_CASE("collectives with different sizes on different ranks fail on every rank, naming them",
          "[mpi]") {
  const std::unique_ptr<Driver> driver = host_driver();
  for (const std::string backend : {"ring", "mpi"}) {
    const std::unique_ptr<Communicator> comm = make(backend);
    const int r = comm->rank(), n = comm->size();
    INFO(backend << " rank " << r << " of " << n);
    const std::size_t count = r == 0 ? 10 : 12;
    std::vector<float> data(12, 1.0f);
    CHECK_THROWS_WITH(comm->allreduce(*driver, data.data(), count),
                      Contains("allreduce") && Contains("different sizes") &&
                          Contains(fmt::format("rank {} of {}", r, n)) && Contains("10 to 12"));
    CHECK_THROWS_WITH(comm->broadcast(*driver, data.data(), count, 0), Contains("broadcast"));
    std::vector<float> gathered(12 * static_cast<std::size_t>(n));
    CHECK_THROWS_WITH(comm->allgather(*driver, data.data(), count, gathered.data()),
                      Contains("allgather"));
    std::vector<std::size_t> blocks(static_cast<std::size_t>(n), 1);
    blocks[0] = r == 0 ? 1 : 2;  // the same total on two ranks would not tell them apart
    CHECK_THROWS_WITH(comm->allgatherv(*driver, data.data(), blocks, gathered.data()),
                      Contains("allgatherv") && Contains("different sizes"));
    // Still in step: an equal allreduce afterwards gives the exact sum.
    std::vector<float> ones(5, 1.0f);
    comm->allreduce(*driver, ones.data(), ones.size());
    CHECK(ones == std::vector<float>(5, static_cast<float>(n)));
  }
}

TEST_CASE(
    "a communicator whose collective timed out refuses the next one, naming the first failure",
    "[mpi]") {
  // Rank 0 enters a barrier the others reach only after its deadline. Its request stays
  // pending with the tag the next collective would use, so the next one must fail at once
  // instead of starting. The others then complete that barrier (rank 0's pending request
  // matches theirs), and a fresh communicator brings every rank back in step.
  for (const std::string backend : {"ring", "mpi"}) {
    std::unique_ptr<Communicator> comm = make(backend, 0.5);
    const int r = comm->rank(), n = comm->size();
    INFO(backend << " rank " << r << " of " << n);
    const std::unique_ptr<Driver> driver = host_driver();
    std::vector<float> data(8, 1.0f);
    if (r == 0) {
      CHECK_THROWS_WITH(comm->barrier(), Contains("barrier #1") && Contains("timed out"));
      CHECK_THROWS_WITH(comm->allreduce(*driver, data.data(), data.size()),
                        Contains("no collective after a failed one") && Contains("barrier #1") &&
                            Contains("timed out"));
      CHECK_THROWS_WITH(comm->barrier(), Contains("no collective after a failed one"));
      CHECK(data == std::vector<float>(8, 1.0f));
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      comm->barrier();
    }
    make(backend)->barrier();
  }
}

TEST_CASE("every built backend is listed and an unknown one is an error naming them", "[mpi]") {
  const std::vector<std::string> backends = communicator_backends();
  // nccl too where the build found CUDA and NCCL.
  std::vector<std::string> expected = {"local", "auto", "ring", "hier", "mpi"};
  if (backends.size() == 6) expected.push_back("nccl");
  CHECK(backends == expected);
  CHECK_THROWS_WITH(make_communicator("gloo"), Contains("unknown communicator 'gloo'") &&
                                                   Contains("local, auto, ring, hier, mpi"));
}

TEST_CASE("nccl allreduce of integer-valued floats on GPU memory gives the exact sum",
          "[mpi][nccl]") {
  const std::vector<std::string> backends = communicator_backends();
  const bool built = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  // NCCL wants a GPU of its own per rank.
  if (!built || device_count("cuda") < launched_ranks()) {
    std::fprintf(stderr, "SKIPPED: nccl communicator: %s\n",
                 !built ? "not built (no NCCL)" : "fewer CUDA devices than ranks");
    return;
  }
  const std::unique_ptr<Communicator> comm = make("nccl");
  const int n = comm->size(), r = comm->rank();
  const std::unique_ptr<Driver> gpu = make_driver(Device{"cuda", r % device_count("cuda")});
  const std::unique_ptr<Driver> host = host_driver();
  for (const std::size_t count : {std::size_t{1}, std::size_t{7}, (std::size_t{1} << 20) + 3}) {
    INFO("nccl count " << count << " on rank " << r << " of " << n);
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i)
      values[i] = value(r, i);
    float* device = static_cast<float*>(gpu->allocate(count * sizeof(float)));
    gpu->copy_from_host(device, values.data(), count * sizeof(float));
    comm->allreduce(*gpu, device, count);
    gpu->copy_to_host(values.data(), device, count * sizeof(float));
    gpu->deallocate(device);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i)
      wrong += values[i] != static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 97 + 1));
    CHECK(wrong == 0);
    // Host memory (a CPU driver's) is staged through the GPU.
    for (std::size_t i = 0; i < count; ++i)
      values[i] = value(r, i);
    comm->allreduce(*host, values.data(), count, ReduceOp::average);
    CHECK(values[0] == Approx((n + 1) / 2.0).epsilon(1e-6));
  }
}

TEST_CASE("host vectors reach every rank through a driver with memory of its own", "[mpi]") {
  // The reference driver with separate memory: host pointers handed to it would be wrong.
  DriverOptions separate;
  separate.set("separate_memory", true);
  const std::unique_ptr<Driver> device = make_driver(Device::parse("reference"), separate);
  const std::unique_ptr<Communicator> comm = make("ring");
  const int n = comm->size(), r = comm->rank();
  std::vector<float> values = {static_cast<float>(r + 1), static_cast<float>(2 * (r + 1))};
  allreduce_host(*comm, *device, values);
  CHECK(values == std::vector<float>{n * (n + 1) / 2.0f, static_cast<float>(n * (n + 1))});
  const std::vector<float> all = allgather_host(*comm, *device, {static_cast<float>(r), -1.0f});
  REQUIRE(all.size() == 2 * static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) {
    CHECK(all[2 * k] == static_cast<float>(k));
    CHECK(all[2 * k + 1] == -1.0f);
  }
}
