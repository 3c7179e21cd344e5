// Parsing of Caffe-style command-line flags against a command's declared flags.
#include "lib/tool/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace hn::tool {
namespace {

std::string canonical(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

const FlagSpec* find_flag(const Command& command, const std::string& name) {
  for (const FlagSpec& flag : command.flags) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

std::optional<bool> parse_bool(const std::string& text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  return std::nullopt;
}

}  // namespace

Args Args::parse(const Command& command, const std::vector<std::string>& argv) {
  Args args;
  args.command_ = &command;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word.size() < 2 || word[0] != '-' || word == "--") {
      throw UsageError(fmt::format("unexpected argument '{}' (flags start with - or --)", word));
    }
    std::string body = word.substr(word[1] == '-' ? 2 : 1);
    std::optional<std::string> value;
    if (const auto eq = body.find('='); eq != std::string::npos) {
      value = body.substr(eq + 1);
      body.resize(eq);
    }
    std::string name = canonical(body);
    if (name == "help" || name == "h") {
      args.help_ = true;
      continue;
    }
    const FlagSpec* flag = find_flag(command, name);
    bool negated = false;
    if (flag == nullptr && name.rfind("no-", 0) == 0) {
      flag = find_flag(command, name.substr(3));
      negated = flag != nullptr && flag->kind == FlagKind::boolean && !value;
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      throw UsageError(fmt::format("unknown flag '{}' for '{}'", word, command.name));
    }
    if (args.values_.count(flag->name) != 0) {
      throw UsageError(fmt::format("--{} is given twice", flag->name));
    }
    if (flag->kind == FlagKind::boolean) {
      if (negated) {
        value = "false";
      } else if (!value) {
        value = "true";
      } else if (!parse_bool(*value)) {
        throw UsageError(fmt::format("--{} expects true or false, got '{}'", flag->name, *value));
      }
    } else if (!value) {
      if (i + 1 >= argv.size()) {
        throw UsageError(fmt::format("--{} needs a value ({})", flag->name, flag->value_name));
      }
      value = argv[++i];
    }
    args.values_[flag->name] = *value;
  }
  return args;
}

const FlagSpec& Args::spec(const std::string& name) const {
  const FlagSpec* flag = find_flag(*command_, name);
  if (flag == nullptr) {
    // A programming error of the tool itself, not of its user.
    throw std::logic_error(fmt::format("command '{}' has no flag '{}'", command_->name, name));
  }
  return *flag;
}

bool Args::has(const std::string& name) const {
  spec(name);
  return values_.count(name) != 0;
}

std::string Args::text(const std::string& name, const std::string& fallback) const {
  spec(name);
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::required_text(const std::string& name) const {
  const std::string value = text(name);
  if (value.empty()) {
    throw UsageError(
        fmt::format("'{}' needs --{} {}", command_->name, name, spec(name).value_name));
  }
  return value;
}

long long Args::integer(const std::string& name, long long fallback, long long minimum,
                        long long maximum) const {
  spec(name);
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw UsageError(fmt::format("--{} expects an integer, got '{}'", name, text));
  }
  if (value < minimum || value > maximum) {
    throw UsageError(
        fmt::format("--{} must be between {} and {}, got {}", name, minimum, maximum, value));
  }
  return value;
}

bool Args::boolean(const std::string& name, bool fallback) const {
  spec(name);
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : *parse_bool(it->second);
}

std::string usage(const Command& command) {
  std::string text =
      fmt::format("usage: hybridnn {} {}\n\n{}\n", command.name, command.synopsis, command.summary);
  if (!command.flags.empty()) {
    text += "\nflags:\n";
    for (const FlagSpec& flag : command.flags) {
      std::string left = "--" + flag.name;
      if (!flag.value_name.empty()) left += " " + flag.value_name;
      if (left.size() > 24) left += "\n" + std::string(26, ' ');
      text += fmt::format("  {:<24} {}\n", left, flag.help);
    }
  }
  if (!command.details.empty()) text += "\n" + command.details + "\n";
  return text;
}

}  // namespace hn::tool
