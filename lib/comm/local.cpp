// The single-process Communicator: rank 0 of a world of one, whose collectives leave the
// data as it is (the sum over one rank is its own data, and so is the mean).
#include <cstdlib>

#include "lib/comm/collectives.h"
#include "lib/comm/comm.h"
#include "lib/core/check.h"
#include "lib/core/driver.h"

namespace hn {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }

  void allreduce(Driver&, float*, std::size_t, ReduceOp) override {}
  void broadcast(Driver&, float*, std::size_t, int root) override {
    HN_CHECK(root == 0, "local communicator: broadcast from rank {}, but the only rank is 0", root);
  }
  void allgather(Driver& driver, const float* sent, std::size_t count, float* received) override {
    if (sent != received) driver.copy(received, sent, count * sizeof(float));
  }
  void allgatherv(Driver& driver, const float* sent, const std::vector<std::size_t>& counts,
                  float* received) override {
    detail::check_block_counts(*this, "allgatherv", counts);
    if (sent != received && counts[0] > 0) driver.copy(received, sent, counts[0] * sizeof(float));
  }
  void reduce_scatterv(Driver& driver, const float* data, const std::vector<std::size_t>& counts,
                       float* received, ReduceOp) override {
    detail::check_block_counts(*this, "reduce_scatterv", counts);
    if (data != received && counts[0] > 0) driver.copy(received, data, counts[0] * sizeof(float));
  }
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) noexcept override { std::_Exit(exit_code); }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace hn
