// `hybridnn test`: Caffe's `caffe test`. Scores trained weights with the TEST phase net:
// every output per batch, then the means over the batches.
#include <fmt/format.h>

#include <set>
#include <string>
#include <vector>

#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

int run_test(const Args& args) {
  const std::string model = args.required_text("model");
  const std::string weights = args.required_text("weights");
  const int iterations = static_cast<int>(args.integer("iterations", 50, 1, 1 << 30));
  const NetOptions options = net_options(args, Phase::test);

  Runtime runtime;
  configure_runtime(runtime, args);
  Net net(model, runtime, chosen_device(args, options.split, options.layer_splits), options);
  print_math_notes(net);
  Driver& driver = net.driver();
  // Layers with weights that no file provided: they test with their initial values.
  std::set<std::string> untouched;
  bool first = true;
  for (const std::string& path : detail::split_commas(weights, detail::EmptyItems::keep)) {
    const std::vector<std::string> missing = net.copy_trained_layers_from(path);
    std::set<std::string> now(missing.begin(), missing.end());
    if (!first) {
      std::set<std::string> both;
      for (const std::string& name : untouched)
        if (now.count(name) > 0) both.insert(name);
      now = std::move(both);
    }
    untouched = std::move(now);
    first = false;
  }
  if (!untouched.empty()) {
    std::string names;
    for (const std::string& name : untouched)
      names += (names.empty() ? "" : ", ") + name;
    fmt::print(stderr,
               "Warning: --weights {} has no weights for layer(s) {}: they keep their "
               "initial values\n",
               weights, names);
  }
  fmt::print("Testing {} on {} for {} iterations (batch {})\n", net.name(), driver.description(),
             iterations, net.batch_size());
  settle_splits(net, args);

  const std::vector<std::pair<std::string, float>> outputs = net.outputs();
  // Summed in double and divided in double, as the Solver's test does, so a reloaded
  // snapshot prints exactly the means printed at the end of training.
  std::vector<double> sums;
  double loss = 0.0;
  for (int i = 0; i < iterations; ++i) {
    loss += net.forward();
    std::size_t index = 0;
    for (const auto& [name, weight] : outputs) {
      const BlobRef blob = net.blob(name);
      const float* values = blob.host_data();
      for (index_t k = 0; k < blob.count(); ++k, ++index) {
        if (i == 0) sums.push_back(0.0);
        sums.at(index) += values[k];
        fmt::print("Batch {}, {} = {}\n", i, name, format_float(values[k]));
      }
    }
  }
  fmt::print("Loss: {}\n", format_float(static_cast<float>(loss / iterations)));
  std::size_t index = 0;
  for (const auto& [name, weight] : outputs) {
    const index_t count = net.blob(name).count();
    for (index_t k = 0; k < count; ++k, ++index) {
      const float mean = static_cast<float>(sums.at(index) / iterations);
      fmt::print("{} = {}{}\n", name, format_float(mean), loss_note(weight, mean));
    }
  }
  return 0;
}

}  // namespace

Command test_command() {
  Command command;
  command.name = "test";
  command.summary = "score a model's TEST phase (Caffe's caffe test)";
  command.synopsis =
      "--model FILE --weights W [--iterations N] [--split SPEC | --split-file FILE] [--data SRC] "
      "[flags]";
  command.details =
      "Prints every output blob per batch (\"Batch I, NAME = V\"), the mean loss and the mean\n"
      "of every output (\"accuracy = V\"). --split cuts every layer's batch among devices\n"
      "(the slices run at the same time; the results equal the unsplit run's within float\n"
      "rounding); --split auto first measures each layer and prints the chosen fractions,\n"
      "which --split-save FILE keeps for --split-file FILE.";
  command.flags = {
      {"model", FlagKind::text, "FILE", "the net prototxt (required)"},
      {"weights", FlagKind::text, "W[,W2]", "trained .caffemodel files (required)"},
      {"iterations", FlagKind::integer, "N", "batches to score (default 50)"},
  };
  for (FlagSpec& flag : tune_flags())
    command.flags.push_back(flag);
  for (FlagSpec& flag : net_flags())
    command.flags.push_back(std::move(flag));
  for (FlagSpec& flag : device_flags())
    command.flags.push_back(std::move(flag));
  command.run = run_test;
  return command;
}

}  // namespace hn::tool
