// The single-driver runner (run_forward / run_backward): a layer on whole tensors.
#include "hybridnn/layer.h"

#include <fmt/format.h>

#include "lib/core/check.h"

namespace hn {

namespace {

enum class Want { none, read, write };

// Resolves `tensor` on `driver`: rows [begin, end) when it is batch-major (axis 0 = batch),
// the whole tensor otherwise.
Operand resolve(Tensor& tensor, Driver& driver, index_t batch, index_t begin, index_t end,
                Want data, Want diff) {
  Operand operand;
  operand.shape = tensor.shape();
  const Shape& shape = tensor.shape();
  const bool by_rows = shape.axes() > 0 && shape[0] == batch && batch > 0;
  const index_t row = by_rows ? shape.count() / batch : 0;
  const std::size_t offset = by_rows ? static_cast<std::size_t>(begin * row) * sizeof(float) : 0;
  const std::size_t bytes =
      static_cast<std::size_t>(by_rows ? (end - begin) * row : shape.count()) * sizeof(float);
  auto get = [&](SyncedMemory& memory, Want want) -> Pointer {
    if (want == Want::none) return Pointer{driver.device(), nullptr, 0};
    void* base = want == Want::read ? const_cast<void*>(memory.read(driver)) : memory.write(driver);
    return Pointer{driver.device(), static_cast<char*>(base) + offset, bytes};
  };
  operand.data = get(tensor.data(), data);
  operand.diff = get(tensor.diff(), diff);
  return operand;
}

struct Prepared {
  LayerSlice slice;
  index_t batch = 0;
  Buffer workspace;
};

// The batch is axis 0 of the first input (of the first output for layers without inputs).
Prepared prepare(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, const RunOptions& options) {
  Prepared prepared;
  const Tensor* first = !inputs.empty() ? inputs.front() : nullptr;
  if (first == nullptr && !outputs.empty()) first = outputs.front();
  prepared.batch = first != nullptr && first->shape().axes() > 0 ? first->shape()[0] : 1;
  const index_t batch = prepared.batch;
  const index_t begin = options.begin, end = options.end < 0 ? batch : options.end;
  HN_CHECK(0 <= begin && begin <= end && end <= batch,
           "running layer '{}' ({}): rows [{}, {}) outside the batch of {}", layer.name(),
           layer.type(), begin, end, batch);
  HN_CHECK(layer.splits_by_rows() || (begin == 0 && end == batch),
           "running layer '{}' ({}): it needs the whole batch, not rows [{}, {})", layer.name(),
           layer.type(), begin, end);
  LayerSlice& slice = prepared.slice;
  slice.driver = &driver;
  slice.begin = begin;
  slice.end = end;
  slice.phase = options.phase;
  slice.seed = options.seed;
  prepared.workspace = Buffer(driver, layer.workspace_bytes(driver, end - begin));
  slice.workspace = prepared.workspace.pointer();
  return prepared;
}

}  // namespace

void run_forward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                 const std::vector<Tensor*>& outputs, const RunOptions& options) {
  Prepared p = prepare(layer, driver, inputs, outputs, options);
  LayerSlice& s = p.slice;
  for (Tensor* input : inputs) {
    s.inputs.push_back(resolve(*input, driver, p.batch, s.begin, s.end, Want::read, Want::none));
  }
  for (Tensor* output : outputs) {
    s.outputs.push_back(resolve(*output, driver, p.batch, s.begin, s.end, Want::write, Want::none));
  }
  const Want param_data = layer.updates_params_in_forward() ? Want::write : Want::read;
  for (Tensor& param : layer.params()) {
    s.params.push_back(resolve(param, driver, 0, 0, 0, param_data, Want::none));
  }
  for (Tensor& state : layer.state()) {
    s.state.push_back(resolve(state, driver, p.batch, s.begin, s.end, Want::write, Want::none));
  }
  layer.forward(s);
}

void run_backward(Layer& layer, Driver& driver, const std::vector<Tensor*>& inputs,
                  const std::vector<Tensor*>& outputs, std::vector<bool> propagate_down,
                  const RunOptions& options) {
  if (propagate_down.empty()) {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      propagate_down.push_back(layer.can_propagate_down(static_cast<int>(i)));
    }
  }
  HN_CHECK(propagate_down.size() == inputs.size(),
           "running layer '{}' ({}) backward: {} propagate_down flags for {} inputs", layer.name(),
           layer.type(), propagate_down.size(), inputs.size());
  Prepared p = prepare(layer, driver, inputs, outputs, options);
  LayerSlice& s = p.slice;
  s.propagate_down = propagate_down;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    s.inputs.push_back(resolve(*inputs[i], driver, p.batch, s.begin, s.end, Want::read,
                               propagate_down[i] ? Want::write : Want::none));
  }
  for (Tensor* output : outputs) {
    s.outputs.push_back(resolve(*output, driver, p.batch, s.begin, s.end, Want::read, Want::read));
  }
  for (Tensor& param : layer.params()) {
    s.params.push_back(resolve(param, driver, 0, 0, 0, Want::read, Want::write));
  }
  for (Tensor& state : layer.state()) {
    s.state.push_back(resolve(state, driver, p.batch, s.begin, s.end, Want::read, Want::none));
  }
  layer.backward(s);
}

}  // namespace hn
