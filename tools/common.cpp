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
namespace {

std::optional<Device> try_parse_device(const std::string& text) {
  try {
    return Device::parse(text);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::optional<double> try_parse_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

struct ParsedShare {
  std::string device_text;
  std::optional<double> fraction;
};

// "cuda:0:0.6" -> {"cuda:0", 0.6}; "cpu" -> {"cpu", none}. A suffix after the last ':'
// is a fraction when what precedes it is a device name.
ParsedShare parse_share(const std::string& entry, const std::string& spec) {
  const auto fail = [&](const std::string& why) {
    return UsageError(
        fmt::format("--split '{}': {} (write DEVICE:FRACTION[,DEVICE:FRACTION...], "
                    "e.g. cpu:1 or cuda:0:0.6,cpu:0.4)",
                    spec, why));
  };
  if (const auto eq = entry.find('='); eq != std::string::npos) {
    const auto fraction = try_parse_number(trim(entry.substr(eq + 1)));
    if (!fraction) throw fail(fmt::format("'{}' is not a fraction", entry.substr(eq + 1)));
    return {trim(entry.substr(0, eq)), fraction};
  }
  if (const auto colon = entry.rfind(':'); colon != std::string::npos) {
    const std::string prefix = entry.substr(0, colon);
    const auto fraction = try_parse_number(entry.substr(colon + 1));
    if (fraction && try_parse_device(prefix)) return {prefix, fraction};
  }
  return {entry, std::nullopt};
}

}  // namespace

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

std::vector<SplitShare> parse_split(const std::string& spec) {
  std::vector<std::string> entries = split_commas(spec);
  if (entries.empty()) entries.emplace_back();
  for (std::string& entry : entries)
    entry = trim(entry);
  const auto fail = [&](const std::string& why) {
    return UsageError(fmt::format("--split '{}': {}", spec, why));
  };
  std::vector<SplitShare> shares;
  int unsized = -1;
  double sized_total = 0.0;
  for (const std::string& entry : entries) {
    if (entry.empty()) throw fail("an empty entry");
    ParsedShare parsed = parse_share(entry, spec);
    // A single "cuda:0" or "cpu:2" names a device instance, not a fraction of 0 or 2.
    if (entries.size() == 1 && parsed.fraction && *parsed.fraction != 1.0 &&
        try_parse_device(entry)) {
      parsed = {entry, std::nullopt};
    }
    std::optional<Device> device;
    try {
      device = Device::parse(parsed.device_text);
    } catch (const Error& error) {
      throw fail(error.what());
    }
    for (const SplitShare& share : shares) {
      if (share.device == *device) throw fail(fmt::format("{} appears twice", device->name()));
    }
    if (parsed.fraction) {
      if (!(*parsed.fraction > 0.0 && *parsed.fraction <= 1.0)) {
        throw fail(fmt::format("the fraction of {} must lie in (0, 1], got {}", device->name(),
                               *parsed.fraction));
      }
      sized_total += *parsed.fraction;
    } else if (unsized >= 0) {
      throw fail("only one device may leave out its fraction");
    } else {
      unsized = static_cast<int>(shares.size());
    }
    shares.push_back({*device, parsed.fraction.value_or(0.0)});
  }
  if (unsized >= 0) {
    if (sized_total >= 1.0 - 1e-9) {
      throw fail(fmt::format("{} gets nothing: the other fractions already sum to {}",
                             shares[unsized].device.name(), sized_total));
    }
    shares[unsized].fraction = 1.0 - sized_total;
  } else if (std::abs(sized_total - 1.0) > 1e-6) {
    throw fail(fmt::format("the fractions sum to {}, not 1", sized_total));
  }
  return shares;
}

std::vector<FlagSpec> device_flags() {
  return {
      {"device", FlagKind::text, "D", "run on device D: cpu (default), reference, cuda:N"},
      {"gpu", FlagKind::text, "N", "as Caffe's -gpu: run on cuda:N (one GPU)"},
      {"split", FlagKind::text, "SPEC",
       "split of each batch among devices, DEVICE:FRACTION,... (one device for now)"},
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
    const std::vector<SplitShare> shares = parse_split(spec);
    if (shares.size() > 1) {
      throw UsageError(fmt::format(
          "--split '{}' divides each batch among {} devices; splitting a batch across devices "
          "is not supported yet (hybrid split, issue #5): give one device with fraction 1, "
          "e.g. --split cpu or --split cuda:0:1",
          spec, shares.size()));
    }
    if (device && *device != shares[0].device) {
      throw UsageError(fmt::format("--split '{}' runs on {} but --device/--gpu names {}", spec,
                                   shares[0].device.name(), device->name()));
    }
    device = shares[0].device;
  }
  return device.value_or(Device{DeviceKind::cpu, 0});
}

Driver& add_chosen_driver(Runtime& runtime, const Args& args) {
  DriverOptions options;
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 4096));
  options.blas = args.text("blas");
  return runtime.add(chosen_device(args), options);
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
