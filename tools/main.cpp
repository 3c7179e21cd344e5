// `hybridnn`: the command-line tool, as Caffe's `caffe` (train, test, time, device_query)
// plus convert. Dispatches to a command; library errors exit 1, usage errors exit 2.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "lib/capi/hybridnn.h"
#include "tools/tool.h"

namespace {

// OpenMP's idle threads (libgomp, under oneDNN and the CPU driver's loops) spin about
// 300,000 times before they sleep. On an idle machine that saves a wake-up between the
// small parallel regions of a training step; on a shared one the spinning takes the time a
// competing process, or this process's own other thread, needs: LeNet training beside a
// process that keeps one of 2 cores busy ran at 1,600-2,500 images/s against 3,300-3,400
// with 1,000 spins (7,200 idle either way; docs/benchmarks.md, "Under load"). libgomp
// reads GOMP_SPINCOUNT once, when it is loaded, before main (and an environment set from
// .preinit_array is replaced by libc's own right after): so the tool runs itself again with
// it set. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
void bound_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 0) != 0) return;
  execv("/proc/self/exe", argv);
  // Not reached unless exec failed: run on with OpenMP's default.
}

using hn::tool::Command;

std::vector<Command> commands() {
  return {hn::tool::train_command(), hn::tool::test_command(), hn::tool::time_command(),
          hn::tool::device_query_command(), hn::tool::convert_command()};
}

std::string overview(const std::vector<Command>& all) {
  std::string text = fmt::format(
      "usage: hybridnn <command> [flags]\n\n"
      "hybridnn {}: train and run Caffe nets (prototxt, caffemodel, solverstate) on the\n"
      "reference, cpu and cuda:N drivers.\n\ncommands:\n",
      hn::version());
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

int run(int argc, char** argv, std::string& label) {
  bound_openmp_spinning(argv);
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
    fmt::print("hybridnn {}\n", hn::version());
    return 0;
  }
  const Command* command = find_command(all, first);
  if (command == nullptr) {
    fmt::print(stderr, "hybridnn: unknown command '{}'\n\n{}", first, overview(all));
    return 2;
  }
  label = "hybridnn " + command->name;
  try {
    const hn::tool::Args args = hn::tool::Args::parse(*command, {words.begin() + 1, words.end()});
    if (args.help()) {
      std::fputs(usage(*command).c_str(), stdout);
      return 0;
    }
    return command->run(args);
  } catch (const hn::tool::UsageError& error) {
    fmt::print(stderr, "{}: {}\n\n{}", label, error.what(), usage(*command));
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Progress lines reach a pipe (a test, `tee`) as they are printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  hn::register_builtin_drivers();
  std::string label = "hybridnn";
  try {
    return run(argc, argv, label);
  } catch (const std::exception& error) {  // hn::Error and the standard library's
    std::fflush(stdout);
    hn::Communicator* comm = hn::tool::active_communicator();
    if (comm != nullptr && comm->size() > 1) {
      // The other ranks may be waiting in a collective or computing: end them all now,
      // rather than leave them to their deadlines.
      fmt::print(stderr, "{}: error on rank {} of {}: {}\n", label, comm->rank(), comm->size(),
                 error.what());
      std::fflush(stderr);
      comm->abort(1);
    }
    fmt::print(stderr, "{}: error: {}\n", label, error.what());
  }
  return 1;
}
