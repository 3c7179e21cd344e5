// `hybridnn convert`: IDX (MNIST, Fashion-MNIST) or CIFAR-10 binary files into an LMDB of
// Caffe Datum records, as Caffe's convert_mnist_data / convert_cifar_data write them.
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>

#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

int run_convert(const Args& args) {
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
  command.summary = "write IDX or CIFAR-10 files into an LMDB of Caffe Datum records";
  command.synopsis = "--source SRC[,SRC2] --output DIR [--shuffle] [--seed N] [--mean FILE]";
  command.details =
      "SRC is an IDX images file (its labels file beside it is found by name; gzip or raw)\n"
      "or CIFAR-10 binary files, comma-separated. Keys are \"%08d\" as Caffe writes them. An\n"
      "existing non-empty DIR is refused.";
  command.flags = {
      {"source", FlagKind::text, "SRC", "the images to convert (required)"},
      {"output", FlagKind::text, "DIR", "the LMDB directory to create (required)"},
      {"shuffle", FlagKind::boolean, "", "shuffle the records"},
      {"seed", FlagKind::integer, "N", "shuffle seed (default 1)"},
      {"mean", FlagKind::text, "FILE", "also write the mean image as a .binaryproto"},
  };
  command.run = run_convert;
  return command;
}

}  // namespace hn::tool
