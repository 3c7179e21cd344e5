// Collectives on host vectors, whatever memory the driver computes on: the values go
// through a Tensor, which copies them to the driver's memory and back when it has its own.
#include <algorithm>
#include <vector>

#include "hybridnn/comm.h"
#include "hybridnn/tensor.h"

namespace hn {

void allreduce_host(Communicator& comm, Driver& driver, std::vector<float>& values, ReduceOp op) {
  if (values.empty()) return;
  Tensor staged(Shape{static_cast<index_t>(values.size())});
  std::copy(values.begin(), values.end(), staged.host_data_mut());
  comm.allreduce(driver, staged.data_write(driver), values.size(), op);
  const float* reduced = staged.host_data();
  values.assign(reduced, reduced + values.size());
}

std::vector<float> allgather_host(Communicator& comm, Driver& driver,
                                  const std::vector<float>& values) {
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  if (values.empty()) return {};
  Tensor sent(Shape{static_cast<index_t>(values.size())});
  std::copy(values.begin(), values.end(), sent.host_data_mut());
  Tensor received(Shape{static_cast<index_t>(values.size() * ranks)});
  comm.allgather(driver, sent.data_read(driver), values.size(), received.data_write(driver));
  const float* all = received.host_data();
  return std::vector<float>(all, all + values.size() * ranks);
}

}  // namespace hn
