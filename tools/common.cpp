// What the tool's commands share: device choice from the command line, split specs, and
// number formatting for logs and JSON lines.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <system_error>

#include "hybridnn/error.h"
#include "tools/tool.h"

namespace hn::tool {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::size_t begin = 0;
  while (true) {
    const auto comma = text.find(',', begin);
    items.push_back(text.substr(begin, comma - begin));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

Split parse_split(const std::string& spec) {
  try {
    return Split::parse(spec);
  } catch (const Error& error) {
    throw UsageError(fmt::format("--split '{}': {}", spec, error.what()));
  }
}

std::vector<FlagSpec> device_flags() {
  return {
      {"device", FlagKind::text, "D", "run on device D: cpu (default), reference, cuda:N"},
      {"gpu", FlagKind::text, "N", "as Caffe's -gpu: run on cuda:N (one GPU)"},
      {"split", FlagKind::text, "SPEC",
       "split of each batch among devices, DEVICE:FRACTION,... (e.g. cpu:0.5,reference:0.5)"},
      {"threads", FlagKind::integer, "N", "CPU driver threads (default 0: every core)"},
      {"blas", FlagKind::text, "NAME", "CPU driver GEMM: onednn or openblas (default: build's)"},
  };
}

std::vector<FlagSpec> net_flags() {
  return {
      {"data", FlagKind::text, "SRC",
       "source of every Data layer: LMDB dir, IDX or CIFAR-10 file, synthetic:CxHxW[:classes]"},
      {"mean-file", FlagKind::text, "FILE", "replace every transform_param.mean_file (none: drop)"},
      {"batch", FlagKind::integer, "N", "replace the batch size of Data and Input layers"},
      {"level", FlagKind::integer, "N", "net state level (Caffe's -level)"},
      {"stage", FlagKind::text, "S[,S2]", "net state stages (Caffe's -stage)"},
  };
}

NetOptions net_options(const Args& args, Phase phase) {
  NetOptions options;
  options.state.phase = phase;
  options.state.level = static_cast<int>(args.integer("level", 0, -(1 << 30), 1 << 30));
  options.state.stages = split_commas(args.text("stage"));
  options.data_source = args.text("data");
  options.mean_file = args.text("mean-file");
  options.batch_size = static_cast<int>(args.integer("batch", 0, 1, 1 << 30));
  options.split = chosen_split(args);
  return options;
}

Device chosen_device(const Args& args) {
  std::optional<Device> device;
  const auto parse = [](const std::string& flag, const std::string& text) {
    try {
      return Device::parse(text);
    } catch (const Error& error) {
      throw UsageError(fmt::format("--{}: {}", flag, error.what()));
    }
  };
  if (args.has("device")) device = parse("device", args.text("device"));
  if (args.has("gpu")) {
    const std::string gpu = args.text("gpu");
    if (gpu == "all" || gpu.find(',') != std::string::npos) {
      throw UsageError(fmt::format(
          "--gpu {}: training on several GPUs is not supported yet; give one index", gpu));
    }
    if (device) throw UsageError("give --device or --gpu, not both");
    device = parse("gpu", "cuda:" + gpu);
  }
  if (args.has("split")) {
    const std::string spec = args.text("split");
    const Split split = parse_split(spec);
    if (split.is_automatic()) {
      throw UsageError(fmt::format(
          "--split '{}': measured fractions are not supported yet (hybrid split, issue #5)", spec));
    }
    // The Net's own driver (data, losses, batch statistics): --device, else the split's
    // first device.
    if (!device) device = split.shares()[0].device;
  }
  return device.value_or(Device{DeviceKind::cpu, 0});
}

Split chosen_split(const Args& args) {
  return args.has("split") ? parse_split(args.text("split")) : Split();
}

Driver& add_chosen_driver(Runtime& runtime, const Args& args) {
  DriverOptions options;
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 4096));
  options.blas = args.text("blas");
  Driver& main = runtime.add(chosen_device(args), options);
  // A driver for every other device of the split.
  const Split split = chosen_split(args);
  for (const SplitShare& share : split.shares()) {
    if (runtime.find(share.device) == nullptr) runtime.add(share.device, options);
  }
  return main;
}

std::string format_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", static_cast<float>(value));
}

std::string json_number(double value) {
  return std::isfinite(value) ? format_float(value) : "null";
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string loss_note(float weight, float value) {
  if (weight == 0.0f) return {};
  return fmt::format(" (* {} = {} loss)", format_float(weight), format_float(weight * value));
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long total = std::llround(seconds);
  const long long hours = total / 3600, minutes = total / 60 % 60, secs = total % 60;
  if (hours > 0) return fmt::format("{}h{:02}m{:02}s", hours, minutes, secs);
  if (minutes > 0) return fmt::format("{}m{:02}s", minutes, secs);
  return fmt::format("{}s", secs);
}

void create_parent_directory(const std::string& prefix) {
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  if (parent.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) {
    throw Error(fmt::format("cannot create directory '{}' for '{}': {}", parent.string(), prefix,
                            error.message()));
  }
}

}  // namespace hn::tool
