// hybridnn-bench split: CaffeNet forward + full backward through a Net, on each driver alone,
// with a fixed split of the batch and with the measured (automatic) split; the splits'
// throughput as a ratio to the sum of the single drivers', with per-device busy fractions.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "hybridnn/error.h"
#include "lib/core/runtime.h"
#include "lib/core/worker.h"
#include "lib/net/net.h"
#include "lib/scheduler/split.h"

namespace hn::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct SplitOptions {
  std::string model;  // empty: CaffeNet's deploy prototxt from the models directory
  index_t batch = 32;
  std::vector<Device> devices;  // empty: the default (see the usage text)
  std::string split;            // empty: equal fractions over the devices
  int iterations = 3;
  int rounds = 3;       // alternating rounds of `iterations`, each configuration's fastest kept
  int threads = -1;     // -1: every core shared out among the cpu drivers listed
  bool blocked = true;  // activations between CPU layers blocked, as the tool's default
  TuneMode tune = TuneMode::cached;  // the tool's default
  // The splits' CPU drivers each on cores of their own, as the Runtime binds them
  // (Runtime::provide); false: not bound (--cores any). Single devices are never bound.
  bool bind = true;
};

long parse_number(const std::string& option, const std::string& value, long low, long high) {
  char* end = nullptr;
  const long number = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || number < low || number > high) {
    throw UsageError{
        fmt::format("split: {} needs a number in [{}, {}], got '{}'", option, low, high, value)};
  }
  return number;
}

SplitOptions parse_split_options(const std::vector<std::string>& args) {
  SplitOptions options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if ((arg == "--model" || arg == "--batch" || arg == "--devices" || arg == "--split" ||
         arg == "--iterations" || arg == "--rounds" || arg == "--threads" || arg == "--layout" ||
         arg == "--tune" || arg == "--cores") &&
        i + 1 == args.size()) {
      throw UsageError{"split: " + arg + " needs a value"};
    }
    if (arg == "--model") {
      options.model = args[++i];
    } else if (arg == "--batch") {
      options.batch = parse_number(arg, args[++i], 1, 4096);
    } else if (arg == "--iterations") {
      options.iterations = static_cast<int>(parse_number(arg, args[++i], 1, 100000));
    } else if (arg == "--rounds") {
      options.rounds = static_cast<int>(parse_number(arg, args[++i], 1, 1000));
    } else if (arg == "--threads") {
      options.threads = parse_threads("split", args[++i]);
    } else if (arg == "--split") {
      options.split = args[++i];
    } else if (arg == "--tune") {
      try {
        options.tune = parse_tune_mode(args[++i]);
      } catch (const Error& e) {
        throw UsageError{std::string("split: --tune: ") + e.what()};
      }
    } else if (arg == "--layout") {
      const std::string layout = args[++i];
      if (layout != "nchw" && layout != "blocked")
        throw UsageError{"split: --layout takes nchw or blocked, got '" + layout + "'"};
      options.blocked = layout == "blocked";
    } else if (arg == "--cores") {
      const std::string cores = args[++i];
      if (cores != "shared" && cores != "any")
        throw UsageError{"split: --cores takes shared or any, got '" + cores + "'"};
      options.bind = cores == "shared";
    } else if (arg == "--devices") {
      std::istringstream list(args[++i]);
      for (std::string name; std::getline(list, name, ',');) {
        if (name.empty()) continue;
        Device device;
        try {
          device = Device::parse(name);
        } catch (const Error& e) {
          throw UsageError{std::string("split: --devices: ") + e.what()};
        }
        if (std::find(options.devices.begin(), options.devices.end(), device) !=
            options.devices.end()) {
          throw UsageError{"split: --devices lists " + device.name() + " twice"};
        }
        options.devices.push_back(device);
      }
      if (options.devices.empty()) throw UsageError{"split: --devices needs at least one device"};
    } else {
      throw UsageError{"split: unknown option '" + arg + "'"};
    }
  }
  return options;
}

std::string models_dir() {
  if (const char* dir = std::getenv("HYBRIDNN_MODELS_DIR")) return dir;
  return HYBRIDNN_MODELS_DIR;
}

std::string device_list(const std::vector<Device>& devices) {
  std::string text;
  for (const Device& d : devices)
    text += (text.empty() ? "" : ",") + d.name();
  return text;
}

// {"cpu":0.93,"cpu:1":0.91}, in `devices` order.
std::string json_map(const std::vector<Device>& devices,
                     const std::map<std::string, double>& values, int decimals) {
  std::string text = "{";
  for (const Device& d : devices) {
    const auto it = values.find(d.name());
    if (it == values.end()) continue;
    text += fmt::format("{}\"{}\":", text.size() > 1 ? "," : "", d.name());
    text += fmt::format("{:.{}f}", it->second, decimals);
  }
  return text + "}";
}

// What one configuration measured over its timed iterations.
struct Measurement {
  double wall = 0.0;  // seconds of all timed iterations
  double images_per_s = 0.0;
  double in_layers = 0.0;  // seconds inside the profiled layers
  // Of those, the seconds between the first and the last slice of a layer to finish, and
  // the seconds no slice ran (operand copies, hand-offs, the parameter-gradient reduction).
  double imbalance = 0.0, outside_slices = 0.0;
  std::map<std::string, double> busy, waiting;    // seconds, by device name
  std::map<std::string, double> copy_s, copy_mb;  // seconds and megabytes
};

// What an automatic split's calibration took and chose.
struct Calibration {
  double calibration_s = 0.0;
  LayerSplits layer_splits;
  std::string kept = "unchecked";  // what the whole-net check kept: measured, uniform, alone
};

// Fresh drivers for every configuration: nothing one leaves behind (cached primitives,
// memory) carries over to the next. Made by Runtime::provide, as the tool's are: a split's
// CPU drivers (`bind`) on cores of their own, the last left to the GPUs' driver threads.
void add_drivers(Runtime& runtime, const SplitOptions& options, int threads, bool bind) {
  DriverOptions driver_options;  // each kind takes those it reads
  driver_options.set("threads", threads);
  // The reference driver stands in for a device with its own memory, as a GPU would be.
  driver_options.set("separate_memory", true);
  if (!options.bind || !bind) driver_options.set("cores", "any");
  runtime.set_driver_options(std::move(driver_options));
  runtime.provide(options.devices);
}

// One configuration: its own drivers and a Net on `main` with `split`, the input filled once
// and automatic splits measured (untimed) at construction, then timed in rounds.
class Configuration {
 public:
  Configuration(const Device& main, const Split& split, const SplitOptions& options, int threads,
                bool barrier_per_layer)
      : iterations_(options.iterations) {
    add_drivers(runtime_, options, threads, split.devices().size() > 1);
    NetOptions net_options;
    net_options.batch_size = options.batch;
    net_options.force_backward = true;
    net_options.blocked_layout = options.blocked;
    net_options.barrier_per_layer = barrier_per_layer;
    net_options.split = split;
    net_options.tune.mode = options.tune;
    net_ = std::make_unique<Net>(options.model, runtime_, runtime_.driver(main), net_options);
    fill_inputs(*net_);
    if (net_->needs_split_calibration()) {
      const auto start = Clock::now();
      net_->calibrate_splits([](const std::string& layer, const Split& chosen) {
        std::fprintf(stderr, "split:   %-8s %s\n", layer.c_str(), chosen.to_string().c_str());
      });
      calibration_.calibration_s = std::chrono::duration<double>(Clock::now() - start).count();
      calibration_.layer_splits = net_->layer_splits();
      if (const Net::SplitCheck check = net_->split_check(); check.checked) {
        using Kept = Net::SplitCheck::Kept;
        for (const Net::SplitCheck::Tried& tried : check.uniform_tried)
          std::fprintf(stderr, "split: whole net, %s for every layer: %.1f ms%s\n",
                       tried.split.to_string().c_str(), tried.seconds * 1e3,
                       tried.balanced ? " (balanced)" : "");
        calibration_.kept = check.kept == Kept::measured  ? "measured"
                            : check.kept == Kept::uniform ? "uniform"
                                                          : "alone";
        std::fprintf(stderr,
                     "split: whole net, measured splits %.1f ms, %s alone %.1f ms: keeping %s\n",
                     check.measured_seconds * 1e3, check.alone.name().c_str(),
                     check.alone_seconds * 1e3, calibration_.kept.c_str());
      }
    }
    iteration();  // warm-up
  }

  // `iterations` timed iterations.
  Measurement time_round() {
    net_->reset_profile();
    const auto start = Clock::now();
    for (int i = 0; i < iterations_; ++i)
      iteration();
    Measurement m;
    m.wall = std::chrono::duration<double>(Clock::now() - start).count();
    m.images_per_s = static_cast<double>(net_->batch_size()) * iterations_ / m.wall;
    for (const LayerProfile& layer : net_->profile()) {
      m.in_layers += layer.forward_seconds + layer.backward_seconds;
      double fastest_forward = 1e30, slowest_forward = 0.0;
      double fastest_backward = 1e30, slowest_backward = 0.0;
      for (const SliceProfile& slice : layer.devices) {
        const std::string name = slice.device.name();
        m.busy[name] += slice.forward_busy + slice.backward_busy;
        m.waiting[name] += slice.waiting;
        m.copy_s[name] += slice.copy_seconds;
        m.copy_mb[name] += slice.copy_bytes * 1e-6;
        fastest_forward = std::min(fastest_forward, slice.forward_busy);
        slowest_forward = std::max(slowest_forward, slice.forward_busy);
        fastest_backward = std::min(fastest_backward, slice.backward_busy);
        slowest_backward = std::max(slowest_backward, slice.backward_busy);
      }
      if (!layer.devices.empty()) {
        m.imbalance += slowest_forward - fastest_forward + slowest_backward - fastest_backward;
        m.outside_slices += std::max(0.0, layer.forward_seconds - slowest_forward) +
                            std::max(0.0, layer.backward_seconds - slowest_backward);
      }
    }
    return m;
  }

  const Calibration& calibration() const { return calibration_; }

 private:
  void iteration() {
    net_->forward();
    net_->backward();
    for (Driver* driver : runtime_.drivers())
      driver->synchronize();
  }

  Runtime runtime_;
  std::unique_ptr<Net> net_;  // after runtime_: destroyed first
  int iterations_;
  Calibration calibration_;  // an automatic split's
};

// Each device of a split on its own rows of the batch, all at the same time, each with a Net
// of its own (no split: nothing cut, copied, merged or waited for between layers): what
// the machine gives the devices side by side at those batch sizes, the ceiling of a split
// with the same rows. Their drivers are bound to cores as the split's are.
class SideBySide {
 public:
  SideBySide(const Split& split, const SplitOptions& options, int threads)
      : iterations_(options.iterations) {
    add_drivers(runtime_, options, threads, true);
    const auto rows = split.partition(options.batch);
    for (std::size_t s = 0; s < rows.size(); ++s) {
      const index_t held = rows[s].second - rows[s].first;
      if (held <= 0) continue;
      NetOptions net_options;
      net_options.batch_size = held;
      net_options.force_backward = true;
      net_options.blocked_layout = options.blocked;
      net_options.tune.mode = options.tune;
      Driver& driver = runtime_.driver(split.shares()[s].device);
      parts_.push_back(
          {&driver, std::make_unique<Net>(options.model, runtime_, driver, net_options)});
      fill_inputs(*parts_.back().net);
    }
    iteration();  // warm-up
  }

  Measurement time_round() {
    for (Part& part : parts_)
      part.busy = 0.0;
    const auto start = Clock::now();
    for (int i = 0; i < iterations_; ++i)
      iteration();
    Measurement m;
    m.wall = std::chrono::duration<double>(Clock::now() - start).count();
    index_t images = 0;
    for (const Part& part : parts_) {
      images += part.net->batch_size();
      const std::string name = part.driver->name();
      m.busy[name] = part.busy;
      m.waiting[name] = std::max(0.0, m.wall - part.busy);
      m.copy_s[name] = 0.0;
      m.copy_mb[name] = 0.0;
    }
    m.images_per_s = static_cast<double>(images) * iterations_ / m.wall;
    return m;
  }

 private:
  struct Part {
    Driver* driver;
    std::unique_ptr<Net> net;
    double busy = 0.0;  // seconds of forward and backward this round
  };

  // Every part but the first on its driver's device thread, the first on this one.
  void iteration() {
    const auto run = [](Part& part) {
      const auto start = Clock::now();
      part.net->forward();
      part.net->backward();
      part.driver->synchronize();
      part.busy += std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (std::size_t p = 1; p < parts_.size(); ++p) {
      Part& part = parts_[p];
      detail::RuntimeThreads::of(runtime_, *part.driver).submit([&run, &part] { run(part); });
    }
    std::exception_ptr failed;
    try {
      run(parts_.front());
    } catch (...) {
      failed = std::current_exception();
    }
    for (std::size_t p = 1; p < parts_.size(); ++p) {
      std::exception_ptr thrown = detail::RuntimeThreads::of(runtime_, *parts_[p].driver).wait();
      if (thrown && !failed) failed = thrown;
    }
    if (failed) std::rethrow_exception(failed);
  }

  Runtime runtime_;
  std::vector<Part> parts_;  // after runtime_: destroyed first
  int iterations_;
};

// The fastest of a configuration's rounds.
void keep_fastest(std::optional<Measurement>& best, Measurement m) {
  if (!best || m.wall < best->wall) best = std::move(m);
}

// The fields every configuration prints after its own: time, the busy and waiting
// fractions of the wall time, and the copies.
std::string common_fields(const std::vector<Device>& devices, const Measurement& m,
                          const SplitOptions& options) {
  std::map<std::string, double> busy, waiting;
  for (const auto& [name, seconds] : m.busy)
    busy[name] = seconds / m.wall;
  for (const auto& [name, seconds] : m.waiting)
    waiting[name] = seconds / m.wall;
  return fmt::format(
      ",\"iterations\":{},\"ms_per_iteration\":{:.1f},\"images_per_s\":{:.2f},"
      "\"in_layers\":{:.3f},\"imbalance\":{:.3f},\"outside_slices\":{:.3f},\"busy\":{},"
      "\"waiting\":{},\"copy_s\":{},\"copy_mb\":{}",
      options.iterations, m.wall / options.iterations * 1e3, m.images_per_s, m.in_layers / m.wall,
      m.imbalance / m.wall, m.outside_slices / m.wall, json_map(devices, busy, 3),
      json_map(devices, waiting, 3), json_map(devices, m.copy_s, 3),
      json_map(devices, m.copy_mb, 1));
}

void report_busy(const char* config, const std::vector<Device>& devices, const Measurement& m) {
  for (const Device& d : devices) {
    const auto busy = m.busy.find(d.name());
    if (busy == m.busy.end()) continue;
    std::fprintf(stderr, "split: %s: %s busy %.0f %%, waiting %.0f %% of the wall time\n", config,
                 d.name().c_str(), 100.0 * busy->second / m.wall,
                 100.0 * m.waiting.at(d.name()) / m.wall);
  }
}

}  // namespace

int run_split(const std::vector<std::string>& args) {
  SplitOptions options = parse_split_options(args);
  const bool default_model = options.model.empty();
  if (default_model) options.model = models_dir() + "/bvlc_reference_caffenet_deploy.prototxt";

  // Default devices: the CPU and every GPU; without a GPU two single-threaded CPU drivers,
  // which on a 2-core machine shows how close the scheduler gets to running two drivers
  // side by side.
  bool two_cpus = false;
  if (options.devices.empty()) {
    options.devices.push_back(Device{"cpu", 0});
    for (const Device& d : available_devices()) {
      if (d.kind == "cuda") options.devices.push_back(d);
    }
    if (options.devices.size() == 1) {
      options.devices.push_back(Device{"cpu", 1});
      two_cpus = true;
    }
  }
  const int cpu_drivers =
      static_cast<int>(std::count_if(options.devices.begin(), options.devices.end(),
                                     [](const Device& d) { return d.kind == "cpu"; }));
  int threads = options.threads;
  if (two_cpus && threads < 0) threads = 1;
  if (threads <= 0) threads = std::max(1, resolve_threads(0) / std::max(1, cpu_drivers));

  Split fixed;
  if (options.split.empty()) {
    std::vector<SplitShare> shares;
    for (const Device& d : options.devices)
      shares.push_back({d, 1.0 / static_cast<double>(options.devices.size())});
    fixed = Split(std::move(shares));
  } else {
    try {
      fixed = Split::parse(options.split);
    } catch (const Error& e) {
      throw UsageError{std::string("split: --split: ") + e.what()};
    }
    if (fixed.is_automatic()) {
      throw UsageError{"split: --split takes fractions; the automatic split always runs"};
    }
    for (const SplitShare& share : fixed.shares()) {
      if (std::find(options.devices.begin(), options.devices.end(), share.device) ==
          options.devices.end()) {
        throw UsageError{"split: --split names " + share.device.name() + ", which --devices (" +
                         device_list(options.devices) + ") lacks"};
      }
    }
  }

  for (const Device& d : options.devices) {
    if (d.kind == "reference") {
      std::fprintf(stderr,
                   "split: warning: %s is the naive reference driver: CaffeNet takes minutes per "
                   "iteration on it\n",
                   d.name().c_str());
    }
  }
  std::string net_label = "caffenet";
  if (!default_model) {
    net_label = options.model.substr(options.model.find_last_of('/') + 1);
    net_label = net_label.substr(0, net_label.rfind(".prototxt"));
  }
  std::fprintf(stderr, "split: %s at batch %ld, devices %s, %d thread(s) per cpu driver\n",
               options.model.c_str(), static_cast<long>(options.batch),
               device_list(options.devices).c_str(), threads);
  const std::string head = fmt::format(
      "{{\"bench\":\"split\",\"net\":\"{}\",\"batch\":{},\"threads\":{},\"layout\":\"{}\","
      "\"tune\":\"{}\",\"cores\":\"{}\"",
      net_label, options.batch, threads, options.blocked ? "blocked" : "nchw",
      tune_mode_name(options.tune), options.bind ? "shared" : "any");

  // Timed in alternating rounds, each configuration keeping its fastest: compared in the same
  // moments of a machine whose speed drifts. The automatic split is calibrated once and kept
  // for every round; the others are built anew in each (one Net at a time beside it, so the
  // memory is two configurations', not five).
  const Split automatic = Split::automatic(options.devices);
  std::fprintf(stderr, "split: %s: calibrating ...\n", automatic.to_string().c_str());
  Configuration automatic_run(options.devices[0], automatic, options, threads, false);
  std::fprintf(stderr, "split: calibration took %.2f s\n",
               automatic_run.calibration().calibration_s);
  std::vector<std::optional<Measurement>> singles(options.devices.size());
  std::optional<Measurement> fixed_best, barrier_best, automatic_best, side_best;
  for (int round = 1; round <= options.rounds; ++round) {
    std::fprintf(stderr, "split: round %d of %d ...\n", round, options.rounds);
    for (std::size_t i = 0; i < options.devices.size(); ++i) {
      const Device& d = options.devices[i];
      keep_fastest(singles[i],
                   Configuration(d, Split::single(d), options, threads, false).time_round());
    }
    // The Net's own driver (whole-batch layers) is the first device of the split.
    keep_fastest(
        fixed_best,
        Configuration(fixed.shares()[0].device, fixed, options, threads, false).time_round());
    // The same split with a barrier after every layer (NetOptions::barrier_per_layer), as
    // before runs of layers cut alike.
    keep_fastest(
        barrier_best,
        Configuration(fixed.shares()[0].device, fixed, options, threads, true).time_round());
    keep_fastest(automatic_best, automatic_run.time_round());
    keep_fastest(side_best, SideBySide(fixed, options, threads).time_round());
  }

  const Measurement& f = *fixed_best;
  const Measurement& b = *barrier_best;
  const Measurement& a = *automatic_best;
  const Measurement& side = *side_best;
  const Calibration& calibration = automatic_run.calibration();
  double fastest = 0.0, sum = 0.0;
  for (const auto& single : singles) {
    fastest = std::max(fastest, single->images_per_s);
    sum += single->images_per_s;
  }
  for (std::size_t i = 0; i < options.devices.size(); ++i) {
    const Device& d = options.devices[i];
    const Measurement& m = *singles[i];
    std::fprintf(stderr, "split: single %s: %.2f images/s\n", d.name().c_str(), m.images_per_s);
    report_busy("single", {d}, m);
    fmt::print(
        "{},\"config\":\"single\",\"devices\":\"{}\",\"ratio_to_fastest_single\":{:.3f}{}}}\n",
        head, d.name(), m.images_per_s / fastest, common_fields({d}, m, options));
  }
  const auto ratios = [&](const Measurement& m) {
    return fmt::format(
        ",\"efficiency\":{:.3f},\"sum_single_images_per_s\":{:.2f},"
        "\"ratio_to_fastest_single\":{:.3f},\"ratio_to_side_by_side\":{:.3f}",
        m.images_per_s / sum, sum, m.images_per_s / fastest, m.images_per_s / side.images_per_s);
  };
  std::fprintf(stderr,
               "split: side by side (each device on its rows of %s, a Net each, at the same "
               "time): %.2f images/s, efficiency %.3f\n",
               fixed.to_string().c_str(), side.images_per_s, side.images_per_s / sum);
  report_busy("side by side", options.devices, side);
  fmt::print("{},\"config\":\"side_by_side\",\"devices\":\"{}\",\"split\":\"{}\"{}{}}}\n", head,
             device_list(options.devices), fixed.to_string(), ratios(side),
             common_fields(options.devices, side, options));
  std::fprintf(stderr, "split: fixed: %.2f images/s, efficiency %.3f\n", f.images_per_s,
               f.images_per_s / sum);
  report_busy("fixed", options.devices, f);
  fmt::print("{},\"config\":\"fixed\",\"devices\":\"{}\",\"split\":\"{}\"{}{}}}\n", head,
             device_list(options.devices), fixed.to_string(), ratios(f),
             common_fields(options.devices, f, options));

  std::fprintf(stderr, "split: fixed, a barrier per layer: %.2f images/s, efficiency %.3f\n",
               b.images_per_s, b.images_per_s / sum);
  fmt::print(
      "{},\"config\":\"fixed_barrier_per_layer\",\"devices\":\"{}\",\"split\":\"{}\","
      "\"runs_speedup\":{:.3f}{}{}}}\n",
      head, device_list(options.devices), fixed.to_string(), f.images_per_s / b.images_per_s,
      ratios(b), common_fields(options.devices, b, options));

  std::fprintf(stderr, "split: auto: %.2f images/s, efficiency %.3f (calibration %.2f s)\n",
               a.images_per_s, a.images_per_s / sum, calibration.calibration_s);
  report_busy("auto", options.devices, a);
  std::string layers = "{";
  for (const auto& [layer, split] : calibration.layer_splits) {
    layers +=
        fmt::format("{}\"{}\":\"{}\"", layers.size() > 1 ? "," : "", layer, split.to_string());
  }
  layers += "}";
  fmt::print(
      "{},\"config\":\"auto\",\"devices\":\"{}\",\"split\":\"{}\",\"layer_splits\":{},"
      "\"kept\":\"{}\",\"calibration_s\":{:.2f}{}{}}}\n",
      head, device_list(options.devices), automatic.to_string(), layers, calibration.kept,
      calibration.calibration_s, ratios(a), common_fields(options.devices, a, options));
  return 0;
}

}  // namespace hn::bench
