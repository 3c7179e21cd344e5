// `hybridnn device_query`: the devices this machine and build offer (Caffe's
// `caffe device_query`), with each driver's own description, the CPU BLAS choices and the
// versions.
#include <fmt/format.h>
#include <google/protobuf/stubs/common.h>

#include <thread>

#include "lib/capi/hybridnn.h"
#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

int run_device_query(const Args& args) {
  std::vector<Device> devices;
  if (args.has("device") || args.has("gpu") || args.has("split")) {
    NetOptions named;
    set_table_options(named, args, {"split", "split_file"});
    devices.push_back(chosen_device(args, named.split, named.layer_splits));
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
  fmt::print("cpu cores: {}\n", std::thread::hardware_concurrency());
  // Every registered kind: whether this build has it, its devices now, its options.
  for (const DriverKind& kind : driver_kinds()) {
    if (!kind.make) {
      fmt::print("driver {}: not built ({})\n", kind.name, kind.missing);
      continue;
    }
    const int count = kind.count ? kind.count() : 0;
    fmt::print(
        "driver {}: {}; {}\n", kind.name, kind.summary,
        kind.any_index ? "any number of instances" : fmt::format("{} device(s) answering", count));
    for (const DriverOption& option : kind.options) {
      std::string choices;
      for (const std::string& choice : option.choices)
        choices += (choices.empty() ? " [" : ", ") + choice;
      fmt::print("  option {}: {}{}\n", option.name, option.help,
                 choices.empty() ? "" : choices + "]");
    }
  }
  DriverOptions options;
  if (args.has("threads"))
    options.set("threads", static_cast<int>(args.integer("threads", 0, 0, 4096)));
  if (args.has("blas")) options.set("blas", args.text("blas"));
  for (const Device& device : devices) {
    // make_driver throws for a device this machine lacks; the message says why.
    fmt::print("{}\n",
               make_driver(device, options_for(driver_kind(device.kind), options))->description());
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
