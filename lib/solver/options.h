// One table of the options of a Net (NetOptions) and a Solver (SolverOptions) as text: each
// option's key, the value it takes and its help, and how its text sets the struct. The C ABI
// (hn_net_options_set, hn_solver_options_set, and through them Python's keywords) takes
// exactly these keys and lists them in its errors and header; the hybridnn tool makes its
// flags for them from the table (the key with '-' for '_', the help, the tool's defaults).
#pragma once

#include <string>
#include <vector>

#include "lib/net/net.h"
#include "lib/solver/solver.h"

namespace hn {

enum OptionUse : unsigned { kNetOption = 1u, kSolverOption = 2u };

struct OptionSpec {
  const char* key;         // "split_file"
  const char* value_name;  // "FILE", "on|off", ...
  const char* help;        // one line, the library's default included
  unsigned use;            // kNetOption, kSolverOption or both
  // Where the hybridnn tool's default differs from the library's (it tunes and blocks by
  // default): its value, set before the flags, and its help line.
  const char* tool_default = nullptr;
  const char* tool_help = nullptr;
};

// Every option, in the order the C ABI's header lists them.
const std::vector<OptionSpec>& option_specs();
// The entry of `key`; an hn::Error when there is none.
const OptionSpec& option_spec(const std::string& key);
// The keys of the options `use` takes, comma-separated ("phase, level, ...").
std::string option_keys(unsigned use);
// Sets option `key` from `value`: false, and nothing set, when the struct's kind has no such
// option; an hn::Error naming the key and what it expects for a malformed value.
bool set_option(NetOptions& options, const std::string& key, const std::string& value);
bool set_option(SolverOptions& options, const std::string& key, const std::string& value);

}  // namespace hn
