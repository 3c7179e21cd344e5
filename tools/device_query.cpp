// `hybridnn device_query`: the devices this machine and build offer (Caffe's
// `caffe device_query`), with each driver's own description, the CPU BLAS choices and the
// versions.
#include <fmt/format.h>
#include <google/protobuf/stubs/common.h>

#include <thread>

#include "hybridnn/hybridnn.h"
#include "tools/tool.h"

namespace hn::tool {
namespace {

int run_device_query(const Args& args) {
  std::vector<Device> devices;
  if (args.has("device") || args.has("gpu") || args.has("split")) {
    devices.push_back(chosen_device(args));
  } else {
    devices = available_devices();
  }
  fmt::print("hybridnn {} (protobuf {})\n", version(),
             google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION));
  std::string names;
  for (const Device& device : available_devices()) {
    names += (names.empty() ? "" : ", ") + device.name();
  }
  fmt::print("available devices: {}\n", names);
  std::string backends;
  for (const std::string& blas : cpu_blas_backends()) {
    backends += backends.empty() ? blas + " (default)" : ", " + blas;
  }
  fmt::print("cpu BLAS: {}\n", backends);
  fmt::print("cpu cores: {}\n", std::thread::hardware_concurrency());
  fmt::print("CUDA driver built: {}; GPUs answering: {}\n", cuda_built() ? "yes" : "no",
             cuda_device_count());
  DriverOptions options;
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 4096));
  options.blas = args.text("blas");
  for (const Device& device : devices) {
    // make_driver throws for a device this machine lacks; the message says why.
    fmt::print("{}\n", make_driver(device, options)->description());
  }
  return 0;
}

}  // namespace

Command device_query_command() {
  Command command;
  command.name = "device_query";
  command.summary = "list the devices, the CPU BLAS choices and the versions";
  command.synopsis = "[--device D | --gpu N] [--threads N] [--blas NAME]";
  command.details = "With --device, --gpu or --split, describes only that device.";
  command.flags = device_flags();
  command.run = run_device_query;
  return command;
}

}  // namespace hn::tool
