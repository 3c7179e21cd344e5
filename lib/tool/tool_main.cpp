// The `hybridnn` tool's commands behind one entry point: hn::tool::main, exported from the C
// ABI as hn_tool_main, which the hybridnn executable (tools/main.cpp) and
// `python3 -m hybridnn` call. Dispatches to a command; library errors return 1, usage
// errors 2; nothing is thrown out of it.
#include "lib/tool/tool_main.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "hybridnn/hybridnn_c.h"
#include "lib/capi/hybridnn.h"
#include "lib/tool/tool.h"

namespace hn::tool {
namespace {

std::vector<Command> commands() {
  return {train_command(), test_command(), time_command(), device_query_command(),
          convert_command()};
}

std::string overview(const std::vector<Command>& all) {
  std::string text = fmt::format(
      "usage: hybridnn <command> [flags]\n\n"
      "hybridnn {}: train and run Caffe nets (prototxt, caffemodel, solverstate) on the\n"
      "reference, cpu and cuda:N drivers.\n\ncommands:\n",
      version());
  for (const Command& command : all) {
    text += fmt::format("  {:<16}{}\n", command.name, command.summary);
  }
  text +=
      "  help [COMMAND]  this text, or a command's flags\n\n"
      "Flags are written as in Caffe's caffe tool: -flag or --flag, then =VALUE or VALUE.\n"
      "Most commands take --device D (cpu, reference, cuda:N), --split SPEC, --threads N\n"
      "and --blas NAME. `hybridnn COMMAND --help` lists a command's flags.\n";
  return text;
}

const Command* find_command(const std::vector<Command>& all, std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  if (name == "devicequery") name = "device_query";
  for (const Command& command : all) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

int run(int argc, const char* const* argv, std::string& label) {
  const std::vector<Command> all = commands();
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty()) {
    std::fputs(overview(all).c_str(), stderr);
    return 2;
  }
  const std::string& first = words[0];
  if (first == "help" || first == "--help" || first == "-help" || first == "-h") {
    if (words.size() == 1) {
      std::fputs(overview(all).c_str(), stdout);
      return 0;
    }
    const Command* command = find_command(all, words[1]);
    if (command == nullptr) {
      fmt::print(stderr, "hybridnn help: unknown command '{}'\n\n{}", words[1], overview(all));
      return 2;
    }
    if (words.size() > 2) {
      fmt::print(stderr, "hybridnn help: takes one command; '{}' after '{}' is extra\n", words[2],
                 words[1]);
      return 2;
    }
    std::fputs(usage(*command).c_str(), stdout);
    return 0;
  }
  if (first == "--version" || first == "-version" || first == "version") {
    fmt::print("hybridnn {}\n", version());
    return 0;
  }
  const Command* command = find_command(all, first);
  if (command == nullptr) {
    fmt::print(stderr, "hybridnn: unknown command '{}'\n\n{}", first, overview(all));
    return 2;
  }
  label = "hybridnn " + command->name;
  try {
    const Args args = Args::parse(*command, {words.begin() + 1, words.end()});
    if (args.help()) {
      std::fputs(usage(*command).c_str(), stdout);
      return 0;
    }
    return command->run(args);
  } catch (const UsageError& error) {
    fmt::print(stderr, "{}: {}\n\n{}", label, error.what(), usage(*command));
    return 2;
  }
}

}  // namespace

int main(int argc, const char* const* argv, OnRankError on_rank_error) {
  std::string label = "hybridnn";
  int status = 1;
  try {
    register_builtin_drivers();
    status = run(argc, argv, label);
  } catch (const std::exception& error) {  // hn::Error and the standard library's
    std::fflush(stdout);
    Communicator* comm = active_communicator();
    if (comm != nullptr && comm->size() > 1) {
      fmt::print(stderr, "{}: error on rank {} of {}: {}\n", label, comm->rank(), comm->size(),
                 error.what());
      std::fflush(stderr);
      // The other ranks may be waiting in a collective or computing: end them all now,
      // rather than leave them to their deadlines.
      if (on_rank_error == OnRankError::end_every_rank) comm->abort(1);
    }
    fmt::print(stderr, "{}: error: {}\n", label, error.what());
  } catch (...) {
    fmt::print(stderr, "{}: error: an unknown exception\n", label);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return status;
}

}  // namespace hn::tool

int hn_tool_main(int argc, const char* const* argv) {
  bool valid = argc >= 1 && argv != nullptr;
  for (int i = 0; valid && i < argc; ++i)
    valid = argv[i] != nullptr;
  if (!valid) {
    std::fprintf(stderr, "hn_tool_main: argv must hold argc >= 1 strings, none null (argc %d)\n",
                 argc);
    return 2;
  }
  return hn::tool::main(argc, argv);
}
