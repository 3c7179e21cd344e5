// What the tool's commands share: device choice from the command line, split specs and
// split files, measuring automatic splits, and number formatting for logs and JSON lines.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

#include "hybridnn/error.h"
#include "lib/tool/tool.h"

namespace hn::tool {

namespace {

std::string flag_name(const char* key) {
  std::string name = key;
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

FlagSpec table_flag(const char* key) {
  const OptionSpec& spec = option_spec(key);
  return {flag_name(key), std::string(spec.value_name) == "N" ? FlagKind::integer : FlagKind::text,
          spec.value_name, spec.tool_help != nullptr ? spec.tool_help : spec.help};
}

namespace {

template <class Options>
void set_table(Options& options, const Args& args, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const OptionSpec& spec = option_spec(key);
    const std::string flag = flag_name(key);
    if (!args.has(flag) && spec.tool_default == nullptr) continue;
    const std::string value = args.has(flag) ? args.text(flag) : spec.tool_default;
    // The library reads an empty split or split file as none; on the command line the flag
    // is there to name one, so an empty value is a mistake, not "no split".
    const std::string_view name = key;
    if (value.empty() && (name == "split" || name == "split_file"))
      throw UsageError(fmt::format("--{}: an empty entry; give a value", flag));
    try {
      set_option(options, key, value);
    } catch (const Error& error) {
      // A malformed value, "option KEY: expected ...", is the command line's fault:
      // "--FLAG: expected ...". Others (a split file that cannot be read) stay errors.
      std::string message = error.what();
      const std::string prefix = fmt::format("option {}: ", key);
      if (message.rfind(prefix, 0) != 0) throw;
      message.erase(0, prefix.size());
      throw UsageError(fmt::format("--{}: {}", flag, message));
    }
  }
}

}  // namespace

void set_table_options(NetOptions& options, const Args& args,
                       std::initializer_list<const char*> keys) {
  set_table(options, args, keys);
}

void set_table_options(SolverOptions& options, const Args& args,
                       std::initializer_list<const char*> keys) {
  set_table(options, args, keys);
}

std::vector<FlagSpec> device_flags() {
  return {
      {"device", FlagKind::text, "D",
       "run on device D: cpu, reference, cuda:N (default: cpu, or with --split auto its first "
       "GPU)"},
      {"gpu", FlagKind::text, "N", "as Caffe's -gpu: run on cuda:N (one GPU)"},
      table_flag("split"),
      table_flag("split_file"),
      {"split-save", FlagKind::text, "FILE",
       "write the split each layer runs with (the measured fractions for auto) to FILE"},
      {"reference-memory", FlagKind::text, "host|separate",
       "the reference driver's memory: host (default) or separate, a device's own memory "
       "that every access copies to and from (shows a split's copies without a GPU)"},
      {"threads", FlagKind::integer, "N",
       "CPU driver threads (default 0: every core, shared out among the CPU drivers of a split, "
       "less one per GPU in it)"},
      {"cores", FlagKind::text, "LIST|any",
       "the cores CPU drivers run on, as taskset lists them (0-5,8), or any (default: in a "
       "split with a GPU or several CPU drivers, each CPU driver on cores of its own, the last "
       "cores left to the GPUs' driver threads; else any)"},
      {"blas", FlagKind::text, "NAME", "CPU driver GEMM: onednn or openblas (default: build's)"},
      {"denormals", FlagKind::text, "flush|keep",
       "CPU driver: values below the smallest normal float are zero in its calls (flush, the "
       "default: operations on them are ~100x slower on Intel cores) or kept (IEEE)"},
  };
}

namespace {

constexpr std::initializer_list<const char*> kTuneKeys = {"tune", "tune_cache", "layout", "fuse",
                                                          "math"};

// Reports each measured choice on stderr, from rank 0 ("Tuned conv1 on cpu in 0.84 s: ...").
void report_tuning(TuneOptions& tune) {
  tune.on_layer = [](const TuneReport& report) {
    const Communicator* comm = active_communicator();
    if (comm != nullptr && comm->rank() != 0) return;
    if (!report.warning.empty()) {
      fmt::print(stderr, "Warning: tuning cache not written: {}\n", report.warning);
    } else if (report.measured) {
      fmt::print(stderr, "Tuned {} on {} in {:.2f} s: {}\n", report.layer, report.device,
                 report.seconds, report.algorithm);
    }
  };
}

}  // namespace

std::vector<FlagSpec> net_flags() {
  return {table_flag("data"), table_flag("mean_file"), table_flag("batch"), table_flag("level"),
          table_flag("stage")};
}

std::vector<FlagSpec> tune_flags() {
  std::vector<FlagSpec> flags;
  for (const char* key : kTuneKeys)
    flags.push_back(table_flag(key));
  return flags;
}

void apply_tune_flags(SolverOptions& options, const Args& args) {
  set_table_options(options, args, kTuneKeys);
  report_tuning(options.tune);
}

void print_math_notes(const Net& net) {
  const Communicator* comm = active_communicator();
  if (comm != nullptr && comm->rank() != 0) return;
  for (const std::string& note : net.math_notes())
    fmt::print(stderr, "Note: {}\n", note);
}

NetOptions net_options(const Args& args, Phase phase) {
  NetOptions options;
  options.state.phase = phase;
  set_table_options(options, args,
                    {"data", "mean_file", "batch", "level", "stage", "split", "split_file"});
  set_table_options(options, args, kTuneKeys);
  report_tuning(options.tune);
  return options;
}

Device chosen_device(const Args& args, const Split& split, const LayerSplits& layer_splits) {
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
  // The Net's own driver (data, losses, batch statistics): --device, else the split's first
  // device, or an automatic split's first GPU. A GPU that gets the whole batch then runs it
  // as without the split: with the Net on the CPU, cuda:0 alone in an automatic split took
  // ResNet-50 96 ms against 75 (H100, batch 32, forward + backward).
  if (!device) {
    const std::vector<Device> devices = split.devices();
    const auto gpu = std::find_if(devices.begin(), devices.end(), [](const Device& each) {
      return driver_kind(each.kind).accelerator;
    });
    if (split.is_automatic() && gpu != devices.end())
      device = *gpu;
    else if (!devices.empty())
      device = devices[0];
  }
  if (!device && !layer_splits.empty()) device = layer_splits[0].second.devices().at(0);
  return device ? *device : default_device();
}

bool splits_chosen(const Args& args) {
  return args.has("split") || args.has("split-file");
}

void configure_runtime(Runtime& runtime, const Args& args) {
  DriverOptions options;
  if (args.has("threads"))
    options.set("threads", static_cast<int>(args.integer("threads", 0, 0, 4096)));
  if (args.has("cores")) options.set("cores", args.text("cores"));
  if (args.has("blas")) options.set("blas", args.text("blas"));
  if (args.has("denormals")) options.set("denormals", args.text("denormals"));
  const std::string memory = args.text("reference-memory", "host");
  if (memory != "host" && memory != "separate") {
    throw UsageError(fmt::format("--reference-memory expects host or separate, got '{}'", memory));
  }
  options.set("separate_memory", memory == "separate");
  // One set of flags for every device: each driver takes the options its kind reads. The
  // drivers are made when the net names their devices (Runtime::provide), which also shares
  // the cores out among CPU drivers side by side and the ranks on this node.
  runtime.set_driver_options(std::move(options));
  runtime.set_processes_per_host(static_cast<int>(launched_local_ranks()));
}

std::vector<FlagSpec> comm_flags() {
  return {
      {"comm", FlagKind::text, "NAME",
       fmt::format("collectives between ranks, a backend of this build: {} (default: auto when "
                   "mpirun started several ranks, else local; auto runs hier where the nodes "
                   "hold several ranks each, numbered node by node (on one node, at least 3), else "
                   "ring)",
                   fmt::join(communicator_backends(), ", "))},
      {"comm-timeout", FlagKind::text, "SECONDS",
       "how long a collective waits for the other ranks before every rank fails (default 300)"},
      table_flag("bucket_mb"),
      table_flag("grad_compress"),
      table_flag("model_parallel"),
  };
}

namespace {
// Lives until exit, so that main() can still reach it after the command's scope unwound.
std::unique_ptr<Communicator> active;

double positive_number(const Args& args, const std::string& flag, double fallback) {
  if (!args.has(flag)) return fallback;
  const std::string text = args.text(flag);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(value) || value <= 0.0) {
    throw UsageError(fmt::format("--{} expects a positive number, got '{}'", flag, text));
  }
  return value;
}
}  // namespace

Communicator& chosen_communicator(const Args& args) {
  CommOptions options;
  options.timeout_seconds = positive_number(args, "comm-timeout", options.timeout_seconds);
  const std::string name = args.has("comm") ? args.text("comm") : default_communicator();
  active = make_communicator(name, options);
  // Rank 0 alone prints; every rank's errors still reach stderr.
  if (active->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) {
    throw Error(fmt::format("rank {}: cannot quiet stdout", active->rank()));
  }
  return *active;
}

std::size_t chosen_bucket_bytes(const Args& args) {
  SolverOptions options;
  set_table_options(options, args, {"bucket_mb"});
  return options.bucket_bytes;
}

GradCompression chosen_grad_compression(const Args& args) {
  SolverOptions options;
  set_table_options(options, args, {"grad_compress"});
  return options.grad_compress;
}

Communicator* active_communicator() {
  return active.get();
}

void settle_splits(Net& net, const Args& args, bool json) {
  if (net.needs_split_calibration()) {
    std::FILE* progress = json ? stderr : stdout;
    net.calibrate_splits([progress, &net](const std::string& layer, const Split& split) {
      fmt::print(progress, "Measuring the split of {}... {}\n", layer,
                 split.empty()                   ? "whole on " + net.driver().device().name()
                 : net.output_cut(layer).empty() ? split.to_string()
                                                 : split.to_string() + " of its outputs");
      std::fflush(progress);
    });
    if (const Net::SplitCheck check = net.split_check(); check.checked) {
      using Kept = Net::SplitCheck::Kept;
      const std::string uniform = check.uniform.to_string();
      if (check.uniform_tried.size() > 1) {
        std::string tried;
        for (const Net::SplitCheck::Tried& one : check.uniform_tried)
          tried += fmt::format("{}{} {:.1f} ms{}", tried.empty() ? "" : ", ", one.split.to_string(),
                               one.seconds * 1e3, one.balanced ? " (balanced)" : "");
        fmt::print(progress, "One split for every layer, searched: {}\n", tried);
      }
      fmt::print(progress,
                 "Whole net: {:.1f} ms per forward + backward with the measured splits, {:.1f} ms "
                 "with {} for every layer, {:.1f} ms with {} alone; keeping {}\n",
                 check.measured_seconds * 1e3, check.uniform_seconds * 1e3, uniform,
                 check.alone_seconds * 1e3, check.alone.name(),
                 check.kept == Kept::measured  ? "the measured splits"
                 : check.kept == Kept::uniform ? uniform + " for every layer"
                                               : check.alone.name() + " alone");
      std::fflush(progress);
    }
    const LayerSplits chosen = net.layer_splits();
    if (!json && chosen.empty())
      fmt::print("Chosen split: none, every layer on {}\n", net.driver().device().name());
    else if (!json)
      fmt::print("Chosen split:\n");
    for (const auto& [layer, split] : chosen) {
      if (json) {
        fmt::print(R"({{"split":true,"layer":{},"split_spec":{},"axis":"{}"}})"
                   "\n",
                   json_string(layer), json_string(split.to_string()),
                   net.output_cut(layer).empty() ? "batch" : "outputs");
      } else {
        fmt::print("  {} {}{}\n", layer, split.to_string(),
                   net.output_cut(layer).empty() ? "" : " (its outputs)");
      }
    }
  }
  if (args.has("split-save")) {
    const std::string path = args.text("split-save");
    create_parent_directory(path);
    const LayerSplits splits = net.layer_splits();
    write_layer_splits(path, splits);
    fmt::print(json ? stderr : stdout,
               "Saved the splits of {} layers to {} (reuse them with --split-file {})\n",
               splits.size(), path, path);
  }
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

void note_if_fifo(const std::string& flag, const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_fifo(std::filesystem::status(path, error)) && !error) {
    fmt::print(stderr, "hybridnn: {} '{}' is a FIFO: writing waits until a reader opens it\n", flag,
               path);
  }
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
