// The C ABI's net entry points on fuzzed text: net options from the input's first line
// ("key=value;key=value", through hn_net_options_set: the strings Python's keywords become),
// then hn_net_create_from_text on the rest, in the phase the options say, on the reference
// driver; when it builds, forward, backward and a read of every blob's values and gradient
// (a reused or fused one must fail with a status, never hand out memory that is not its).
// Host memory is limited to 64 MiB. Any status is accepted; a crash, a sanitizer report or
// an abort is a finding.
#include <cstdint>
#include <string>

#include "hybridnn/hybridnn_c.h"

namespace {

struct Setup {
  hn_runtime* runtime = nullptr;
  hn_driver* driver = nullptr;
  Setup() {
    hn_set_host_memory_limit(std::uint64_t{64} << 20);
    hn_runtime_create(&runtime);
    hn_runtime_add_driver(runtime, "reference", nullptr, &driver);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Setup setup;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t newline = input.find('\n');
  const std::string head = newline == std::string::npos ? "" : input.substr(0, newline);
  const std::string text = newline == std::string::npos ? input : input.substr(newline + 1);

  hn_net_options* options = nullptr;
  if (hn_net_options_create(&options) != HN_OK) return 0;
  std::size_t begin = 0;
  while (begin < head.size()) {
    std::size_t end = head.find(';', begin);
    if (end == std::string::npos) end = head.size();
    const std::string item = head.substr(begin, end - begin);
    const std::size_t equals = item.find('=');
    if (equals != std::string::npos) {
      const std::string key = item.substr(0, equals), value = item.substr(equals + 1);
      // A data source or weights from the input would read arbitrary files: not these.
      if (key != "data" && key != "weights" && key != "mean_file")
        hn_net_options_set(options, key.c_str(), value.c_str());
    }
    begin = end + 1;
  }
  hn_net* net = nullptr;
  if (hn_net_create_from_text(setup.runtime, setup.driver, text.c_str(), "fuzz.prototxt", options,
                              &net) == HN_OK) {
    float loss = 0.0f;
    if (hn_net_forward(net, &loss) == HN_OK) hn_net_backward(net);
    const std::string names = hn_net_blob_names(net) != nullptr ? hn_net_blob_names(net) : "";
    std::size_t at = 0;
    while (at <= names.size() && !names.empty()) {
      std::size_t comma = names.find(',', at);
      if (comma == std::string::npos) comma = names.size();
      hn_tensor* blob = nullptr;
      if (hn_net_blob(net, names.substr(at, comma - at).c_str(), &blob) == HN_OK) {
        float* values = nullptr;
        std::int64_t dims[HN_MAX_AXES];
        hn_tensor_dims(blob, dims, HN_MAX_AXES);
        if (hn_tensor_data(blob, HN_READ, &values) == HN_OK && hn_tensor_count(blob) > 0) {
          volatile float last = values[hn_tensor_count(blob) - 1];  // the whole blob is there
          static_cast<void>(last);
        }
        if (hn_tensor_diff(blob, HN_READ, &values) == HN_OK && hn_tensor_count(blob) > 0) {
          volatile float last = values[hn_tensor_count(blob) - 1];
          static_cast<void>(last);
        }
        hn_tensor_destroy(blob);
      }
      at = comma + 1;
    }
    hn_net_destroy(net);
  }
  hn_net_options_destroy(options);
  return 0;
}
