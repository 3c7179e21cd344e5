// Collectives on host vectors, whatever memory the driver computes on: the values go
// through a Tensor, which copies them to the driver's memory and back when it has its own.
#include <algorithm>
#include <string>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/tensor.h"

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

std::string broadcast_text_host(Communicator& comm, Driver& driver, const std::string& text,
                                int root) {
  // The length, then the bytes, each exact as a float.
  Tensor length(Shape{1});
  length.host_data_mut()[0] = static_cast<float>(text.size());
  comm.broadcast(driver, length.data_write(driver), 1, root);
  const auto size = static_cast<std::size_t>(length.host_data()[0]);
  if (size == 0) return "";
  Tensor bytes(Shape{static_cast<index_t>(size)});
  float* out = bytes.host_data_mut();
  for (std::size_t i = 0; i < size; ++i)
    out[i] = i < text.size() ? static_cast<float>(static_cast<unsigned char>(text[i])) : 0.0f;
  comm.broadcast(driver, bytes.data_write(driver), size, root);
  const float* in = bytes.host_data();
  std::string received(size, '\0');
  for (std::size_t i = 0; i < size; ++i)
    received[i] = static_cast<char>(static_cast<unsigned char>(in[i]));
  return received;
}

}  // namespace hn
