// The C ABI's layer entry points on fuzzed text: hn_layer_create on a LayerParameter snippet,
// then, when it is a layer, setup on inputs whose shapes the input's first line gives, the
// output shapes through the capacity-checked calls, a split string, forward and backward on
// the reference driver. Every call may fail with a status; a crash, a sanitizer report or an
// abort is a finding. Host memory is limited to 64 MiB, so a snippet asking for more fails
// in the size checks.
//
// Input: "SHAPES\nSNIPPET", SHAPES being up to 3 inputs "2x3x4x4;2x3" (at most 4 axes of at
// most 16 each) and an optional "|SPLIT" (e.g. "|reference:0.5,reference:1:0.5").
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridnn/hybridnn_c.h"

namespace {

struct Setup {
  hn_runtime* runtime = nullptr;
  hn_driver* driver = nullptr;
  hn_driver* second = nullptr;
  Setup() {
    hn_set_host_memory_limit(std::uint64_t{64} << 20);
    hn_runtime_create(&runtime);
    hn_runtime_add_driver(runtime, "reference", nullptr, &driver);
    hn_runtime_add_driver(runtime, "reference:1", nullptr, &second);
  }
};

std::vector<std::vector<std::int64_t>> parse_shapes(const std::string& text) {
  std::vector<std::vector<std::int64_t>> shapes(1);
  std::int64_t value = -1;
  const auto end_dim = [&] {
    if (value >= 0 && shapes.back().size() < 4)
      shapes.back().push_back(std::min<std::int64_t>(value, 16));
    value = -1;
  };
  for (const char c : text) {
    if (c >= '0' && c <= '9') {
      value = std::max<std::int64_t>(value, 0) * 10 + (c - '0');
      value = std::min<std::int64_t>(value, 1000);
    } else if (c == 'x') {
      end_dim();
    } else if (c == ';' && shapes.size() < 3) {
      end_dim();
      shapes.emplace_back();
    }
  }
  end_dim();
  return shapes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Setup setup;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.find('\n');
  std::string head = newline == std::string::npos ? "" : input.substr(0, newline);
  const std::string snippet = newline == std::string::npos ? input : input.substr(newline + 1);
  std::string split;
  if (const std::size_t bar = head.find('|'); bar != std::string::npos) {
    split = head.substr(bar + 1);
    head.resize(bar);
  }

  hn_layer* layer = nullptr;
  if (hn_layer_create(snippet.c_str(), &layer) != HN_OK) return 0;
  std::vector<hn_tensor*> inputs;
  for (const std::vector<std::int64_t>& dims : parse_shapes(head)) {
    hn_tensor* tensor = nullptr;
    if (hn_tensor_create(static_cast<std::int32_t>(dims.size()), dims.data(), &tensor) == HN_OK) {
      float* values = nullptr;
      if (hn_tensor_data(tensor, HN_OVERWRITE, &values) == HN_OK) {
        for (std::int64_t i = 0; i < hn_tensor_count(tensor); ++i)
          values[i] = static_cast<float>(i % 7) - 3.0f;  // labels 0..3 among them
      }
      inputs.push_back(tensor);
    }
  }
  std::int32_t outputs = 0;
  std::vector<hn_tensor*> made;
  if (hn_layer_setup(layer, static_cast<std::int32_t>(inputs.size()), inputs.data(), &outputs) ==
      HN_OK) {
    bool ok = true;
    for (std::int32_t o = 0; o < outputs && ok; ++o) {
      std::int32_t axes = 0;
      ok = hn_layer_output_shape(layer, o, &axes, nullptr, 0) == HN_OK;
      std::vector<std::int64_t> dims(static_cast<std::size_t>(std::max(axes, 0)));
      std::int64_t fixed[HN_MAX_AXES];
      hn_layer_output_dims(layer, o, &axes, fixed);  // HN_ERROR_CAPACITY past 8 axes
      ok = ok && hn_layer_output_shape(layer, o, &axes, dims.data(), axes) == HN_OK;
      hn_tensor* tensor = nullptr;
      ok = ok && hn_tensor_create(axes, dims.data(), &tensor) == HN_OK;
      if (tensor != nullptr) made.push_back(tensor);
    }
    if (!split.empty()) hn_layer_set_split(layer, setup.runtime, split.c_str());
    if (ok && hn_layer_forward(layer, setup.driver, inputs.data(), made.data()) == HN_OK) {
      for (hn_tensor* tensor : made) {
        float* diff = nullptr;
        if (hn_tensor_diff(tensor, HN_OVERWRITE, &diff) == HN_OK) {
          for (std::int64_t i = 0; i < hn_tensor_count(tensor); ++i)
            diff[i] = 0.5f;
        }
      }
      hn_layer_backward(layer, setup.driver, inputs.data(), made.data(), nullptr);
    }
    for (std::int32_t p = 0; p < hn_layer_num_params(layer); ++p) {
      hn_tensor* param = nullptr;
      float* values = nullptr;
      if (hn_layer_param(layer, p, &param) == HN_OK) {
        hn_tensor_data(param, HN_READ, &values);
        hn_tensor_destroy(param);
      }
    }
  }
  for (hn_tensor* tensor : made)
    hn_tensor_destroy(tensor);
  for (hn_tensor* tensor : inputs)
    hn_tensor_destroy(tensor);
  hn_layer_destroy(layer);
  return 0;
}
