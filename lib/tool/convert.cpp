// `hybridnn convert`: IDX (MNIST, Fashion-MNIST) or CIFAR-10 binary files into an LMDB of
// Caffe Datum records, as Caffe's convert_mnist_data / convert_cifar_data write them; and
// models between Caffe's files and ONNX (issue 37).
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>

#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

// .prototxt (+ .caffemodel) -> .onnx, or .onnx -> .prototxt + .caffemodel.
int convert_model(const Args& args) {
  const std::string model = args.required_text("model");
  const std::string output = args.required_text("output");
  const auto ends_with = [](const std::string& text, const char* suffix) {
    const std::string tail = suffix;
    return text.size() >= tail.size() &&
           text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (detail::is_onnx_path(model)) {
    if (!ends_with(output, ".prototxt"))
      throw UsageError(fmt::format(
          "--output {}: an ONNX model converts to a .prototxt (its weights beside it)", output));
    const std::string caffemodel = args.text("weights_output").empty()
                                       ? output.substr(0, output.size() - 9) + ".caffemodel"
                                       : args.text("weights_output");
    onnx_to_caffe(model, output, caffemodel);
    fmt::print("Wrote {} and its weights {}\n", output, caffemodel);
    return 0;
  }
  if (!detail::is_onnx_path(output))
    throw UsageError(fmt::format("--output {}: a Caffe model converts to an .onnx file", output));
  NetOptions options;
  options.state.phase = Phase::test;
  set_table_options(options, args, {"data", "mean_file", "batch", "level", "stage"});
  Runtime runtime;
  Net net(model, runtime, default_device(), options);
  const std::string weights = args.text("weights");
  if (!weights.empty()) {
    for (const std::string& path : detail::split_commas(weights, detail::EmptyItems::keep)) {
      const std::vector<std::string> missing = net.copy_trained_layers_from(path);
      if (!missing.empty())
        fmt::print(stderr,
                   "Warning: {} has no weights for layer(s) {}: their initial values are written\n",
                   path, fmt::join(missing, ", "));
    }
  }
  net.save_onnx(output);
  if (weights.empty())
    fmt::print(stderr, "Warning: no --weights: {} holds the fillers' initial weights\n", output);
  fmt::print("Wrote {} ({} layers of net '{}')\n", output, net.num_layers(), net.name());
  return 0;
}

int run_convert(const Args& args) {
  if (!args.text("model").empty()) return convert_model(args);
  const std::string source = args.required_text("source");
  const std::string output = args.required_text("output");
  detail::ConvertOptions options;
  options.shuffle = args.boolean("shuffle", false);
  options.seed = static_cast<std::uint64_t>(args.integer("seed", 1, 0, LLONG_MAX));
  options.mean_file = args.text("mean");

  // On a terminal one line is rewritten; into a file or pipe a line per tenth.
  const bool terminal = isatty(fileno(stdout)) != 0;
  std::uint64_t records = 0;
  int last_tenth = -1;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    records = total;
    const int tenth = total == 0 ? 10 : static_cast<int>(done * 10 / total);
    if (terminal) {
      fmt::print("\rconvert: {}/{} records", done, total);
      std::fflush(stdout);
    } else if (tenth != last_tenth) {
      fmt::print("convert: {}/{} records\n", done, total);
    }
    last_tenth = tenth;
  };
  detail::convert_to_lmdb(source, output, options);
  if (terminal) fmt::print("\n");
  fmt::print("Wrote {} records to {}\n", records, output);
  if (!options.mean_file.empty()) fmt::print("Wrote the mean image to {}\n", options.mean_file);
  return 0;
}

}  // namespace

Command convert_command() {
  Command command;
  command.name = "convert";
  command.summary =
      "write IDX or CIFAR-10 files into an LMDB of Caffe Datum records; convert models "
      "between Caffe's files and ONNX";
  command.synopsis =
      "--source SRC[,SRC2] --output DIR [--shuffle] [--seed N] [--mean FILE]\n"
      "       --model NET.prototxt [--weights W.caffemodel] --output NET.onnx\n"
      "       --model NET.onnx --output NET.prototxt [--weights-output W.caffemodel]";
  command.details =
      "SRC is an IDX images file (its labels file beside it is found by name; gzip or raw)\n"
      "or CIFAR-10 binary files, comma-separated. Keys are \"%08d\" as Caffe writes them. An\n"
      "existing non-empty DIR is refused.\n"
      "With --model, a net converts: a Caffe prototxt (the TEST phase; --data, --batch as for\n"
      "test) and its weights to an ONNX model (opset 13, inference graph: losses and\n"
      "accuracies left out), or an ONNX model to a prototxt and a .caffemodel (by default the\n"
      "prototxt's path with .caffemodel). docs/onnx.md lists the layers and operators.";
  command.flags = {
      {"source", FlagKind::text, "SRC", "the images to convert"},
      {"output", FlagKind::text, "PATH",
       "the LMDB directory, .onnx or .prototxt to write (required)"},
      {"model", FlagKind::text, "FILE", "a net to convert (.prototxt or .onnx)"},
      {"weights", FlagKind::text, "W[,W2]", "the prototxt's trained .caffemodel files"},
      {"weights_output", FlagKind::text, "FILE", "where an ONNX model's weights go"},
      {"shuffle", FlagKind::boolean, "", "shuffle the records"},
      {"seed", FlagKind::integer, "N", "shuffle seed (default 1)"},
      {"mean", FlagKind::text, "FILE", "also write the mean image as a .binaryproto"},
  };
  for (const FlagSpec& flag : net_flags())
    command.flags.push_back(flag);
  command.run = run_convert;
  return command;
}

}  // namespace hn::tool
