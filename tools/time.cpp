// `hybridnn time`: Caffe's `caffe time`. A warm-up forward and backward, then per-layer
// forward and backward milliseconds averaged over the iterations, with the driver
// synchronised after each layer so every layer is charged its own work; with a split, also
// each device's share of every layer (rows, busy and waiting time, copies).
#include <fmt/format.h>

#include <chrono>
#include <string>
#include <vector>

#include "hybridnn/net.h"
#include "tools/tool.h"

namespace hn::tool {
namespace {

using Clock = std::chrono::steady_clock;

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

Phase parse_phase(const std::string& text) {
  if (text == "train" || text == "TRAIN") return Phase::train;
  if (text == "test" || text == "TEST") return Phase::test;
  throw UsageError(fmt::format("--phase expects train or test, got '{}'", text));
}

// Per layer and device, from the Net's split profile, averaged over `iterations`.
void print_split_profile(const Net& net, int iterations, bool json) {
  const double n = iterations;
  if (!json) {
    fmt::print("Split per layer and device:\n");
    fmt::print("{:>10}  {:<10} {:>6} {:>15} {:>16} {:>11} {:>9} {:>8}\n", "layer", "device", "rows",
               "forward busy ms", "backward busy ms", "waiting ms", "copy MB", "copy ms");
  }
  for (const LayerProfile& layer : net.profile()) {
    for (const SliceProfile& slice : layer.devices) {
      const double forward_busy = slice.forward_busy * 1e3 / n;
      const double backward_busy = slice.backward_busy * 1e3 / n;
      const double waiting = slice.waiting * 1e3 / n;
      const double copy_bytes = static_cast<double>(slice.copy_bytes) / n;
      const double copy_ms = slice.copy_seconds * 1e3 / n;
      if (json) {
        fmt::print(R"({{"layer":{},"device":{},"rows":{},"forward_busy_ms":{},)"
                   R"("backward_busy_ms":{},"waiting_ms":{},"copy_bytes":{},"copy_ms":{}}})"
                   "\n",
                   json_string(layer.name), json_string(slice.device.name()), slice.rows,
                   json_number(forward_busy), json_number(backward_busy), json_number(waiting),
                   json_number(copy_bytes), json_number(copy_ms));
      } else {
        fmt::print("{:>10}  {:<10} {:>6} {:>15.4f} {:>16.4f} {:>11.4f} {:>9.3f} {:>8.4f}\n",
                   layer.name, slice.device.name(), slice.rows, forward_busy, backward_busy,
                   waiting, copy_bytes / 1e6, copy_ms);
      }
    }
  }
}

int run_time(const Args& args) {
  const std::string model = args.required_text("model");
  const int iterations = static_cast<int>(args.integer("iterations", 50, 1, 1 << 30));
  const bool json = args.boolean("json", false);
  const Phase phase = parse_phase(args.text("phase", "train"));
  NetOptions options = net_options(args, phase);
  options.force_backward = args.boolean("force-backward", true);

  Runtime runtime;
  Driver& driver = add_chosen_driver(runtime, args);
  Net net(model, runtime, driver, options);
  const int layers = net.num_layers();

  if (!json) {
    fmt::print("Timing {} ({} phase, batch {}) on {}\n", net.name(),
               phase == Phase::train ? "TRAIN" : "TEST", net.batch_size(), driver.description());
  }
  settle_splits(net, args, json);
  if (!json) fmt::print("Performing Forward\n");
  const float initial_loss = net.forward();
  if (!json) fmt::print("Initial loss: {}\nPerforming Backward\n", format_float(initial_loss));
  net.backward();
  driver.synchronize();
  net.reset_profile();  // the split profile leaves out the warm-up
  const bool split = splits_chosen(args);

  if (!json) fmt::print("*** Benchmark begins ***\nTesting for {} iterations.\n", iterations);
  std::vector<double> forward_ms(layers, 0.0), backward_ms(layers, 0.0);
  double forward_total = 0.0, backward_total = 0.0;
  const auto all_start = Clock::now();
  for (int it = 0; it < iterations; ++it) {
    const auto iteration_start = Clock::now();
    auto pass_start = Clock::now();
    for (int i = 0; i < layers; ++i) {
      const auto start = Clock::now();
      net.forward_layer(i);
      driver.synchronize();
      forward_ms[i] += milliseconds_since(start);
    }
    forward_total += milliseconds_since(pass_start);
    pass_start = Clock::now();
    for (int i = layers - 1; i >= 0; --i) {
      if (!net.layer_needs_backward(i)) continue;
      const auto start = Clock::now();
      net.backward_layer(i);
      driver.synchronize();
      backward_ms[i] += milliseconds_since(start);
    }
    backward_total += milliseconds_since(pass_start);
    if (!json) {
      fmt::print("Iteration: {} forward-backward time: {:.3f} ms.\n", it + 1,
                 milliseconds_since(iteration_start));
    }
  }
  const double total_ms = milliseconds_since(all_start);

  const double n = iterations;
  if (json) {
    for (int i = 0; i < layers; ++i) {
      fmt::print(R"({{"layer":{},"type":{},"forward_ms":{},"backward_ms":{}}})"
                 "\n",
                 json_string(net.layer_name(i)), json_string(net.layer_type(i)),
                 json_number(forward_ms[i] / n), json_number(backward_ms[i] / n));
    }
    if (split) print_split_profile(net, iterations, json);
    fmt::print(R"({{"total":true,"model":{},"phase":"{}","device":{},"batch":{},"iterations":{},)"
               R"("forward_ms":{},"backward_ms":{},"forward_backward_ms":{}}})"
               "\n",
               json_string(model), phase == Phase::train ? "train" : "test",
               json_string(driver.name()), net.batch_size(), iterations,
               json_number(forward_total / n), json_number(backward_total / n),
               json_number(total_ms / n));
    return 0;
  }
  fmt::print("Average time per layer:\n");
  for (int i = 0; i < layers; ++i) {
    fmt::print("{:>10}\tforward: {:.4f} ms.\n", net.layer_name(i), forward_ms[i] / n);
    fmt::print("{:>10}\tbackward: {:.4f} ms.\n", net.layer_name(i), backward_ms[i] / n);
  }
  if (split) print_split_profile(net, iterations, json);
  fmt::print("Average Forward pass: {:.4f} ms.\n", forward_total / n);
  fmt::print("Average Backward pass: {:.4f} ms.\n", backward_total / n);
  fmt::print("Average Forward-Backward: {:.4f} ms.\n", total_ms / n);
  fmt::print("Total Time: {:.3f} ms.\n*** Benchmark ends ***\n", total_ms);
  return 0;
}

}  // namespace

Command time_command() {
  Command command;
  command.name = "time";
  command.summary = "time a model's layers forward and backward (Caffe's caffe time)";
  command.synopsis =
      "--model FILE [--iterations N] [--split SPEC | --split-file FILE] [--split-save FILE] "
      "[--json] [--data SRC] [--batch N] [flags]";
  command.details =
      "Runs one forward and backward to warm up, then times every layer's forward and\n"
      "backward (the driver synchronised after each) and reports the means per iteration.\n"
      "The backward is complete, data gradients included (Caffe's force_backward), unless\n"
      "--no-force-backward. --json prints one line per layer {\"layer\",\"type\",\n"
      "\"forward_ms\",\"backward_ms\"} and a total line {\"total\":true,...,\"forward_ms\",\n"
      "\"backward_ms\",\"forward_backward_ms\"}.\n"
      "\n"
      "--split cuts every layer's batch among devices; the slices run at the same time.\n"
      "--split auto (or auto:DEVICE,...) first measures each layer on every device and\n"
      "prints the chosen fractions (\"Chosen split:\", a line per layer; --json: lines\n"
      "{\"split\":true,\"layer\",\"split_spec\"}); --split-save FILE keeps them and\n"
      "--split-file FILE runs with them again. With a split, the report adds per layer and\n"
      "device, per iteration: the slice's rows, forward and backward busy ms, ms spent\n"
      "waiting for the other devices, and the MB and ms of copies between devices (--json:\n"
      "lines {\"layer\",\"device\",\"rows\",\"forward_busy_ms\",\"backward_busy_ms\",\n"
      "\"waiting_ms\",\"copy_bytes\",\"copy_ms\"} before the total line).";
  command.flags = {
      {"model", FlagKind::text, "FILE", "the net prototxt (required)"},
      {"iterations", FlagKind::integer, "N", "timed iterations (default 50)"},
      {"phase", FlagKind::text, "train|test", "the net's phase (default train, as Caffe)"},
      {"json", FlagKind::boolean, "", "print JSON lines instead of Caffe's text"},
      {"force-backward", FlagKind::boolean, "",
       "backward into every blob, inputs included (default; --no-force-backward: off)"},
  };
  for (FlagSpec& flag : net_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : device_flags())
    command.flags.push_back(std::move(flag));
  command.run = run_time;
  return command;
}

}  // namespace hn::tool
