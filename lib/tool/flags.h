// Command-line flags of the `hybridnn` tool, spelled as in Caffe's `caffe` tool: `-flag` or
// `--flag`, `=value` or a separate value, `_` and `-` alike inside names, `--no-flag` for a
// boolean. A command declares its flags; parse() checks the command line against them.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace hn::tool {

// A mistake in the command line: the tool prints it with the command's usage, exit code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

enum class FlagKind { text, integer, boolean };

struct FlagSpec {
  std::string name;  // canonical, with '-' between words ("train-data")
  FlagKind kind = FlagKind::text;
  std::string value_name;  // shown in the usage ("FILE"); empty for booleans
  std::string help;
};

class Args;

struct Command {
  std::string name;
  std::string summary;   // one line, for `hybridnn help`
  std::string synopsis;  // the flags in short, after "hybridnn NAME "
  std::string details;   // paragraphs after the flag list (may be empty)
  std::vector<FlagSpec> flags;
  int (*run)(const Args& args) = nullptr;
};

// The flags given to one command, checked against its FlagSpecs.
class Args {
 public:
  // Throws UsageError for an unknown flag, a missing or malformed value, a flag given
  // twice or a positional argument. `help` is set for -h / --help.
  static Args parse(const Command& command, const std::vector<std::string>& argv);

  const Command& command() const { return *command_; }
  bool help() const { return help_; }
  bool has(const std::string& name) const;
  std::string text(const std::string& name, const std::string& fallback = {}) const;
  std::string required_text(const std::string& name) const;
  // Integers in [minimum, maximum]; UsageError names the flag otherwise.
  long long integer(const std::string& name, long long fallback, long long minimum,
                    long long maximum) const;
  bool boolean(const std::string& name, bool fallback) const;

 private:
  const FlagSpec& spec(const std::string& name) const;

  const Command* command_ = nullptr;
  bool help_ = false;
  std::map<std::string, std::string> values_;
};

// The usage text of one command: synopsis, flags with their help, details.
std::string usage(const Command& command);

}  // namespace hn::tool
