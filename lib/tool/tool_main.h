// The tool's entry point (lib/tool/tool_main.cpp): the C ABI exports it as hn_tool_main.
#pragma once

namespace hn::tool {

// What a rank does when its command fails under mpirun: report and return 1, the other
// ranks failing at their next collective's deadline (--comm-timeout), or end every rank at
// once (MPI_Abort), which only a program of its own may do (the hybridnn executable).
enum class OnRankError { report, end_every_rank };

// Runs `argv[1]` (a command, help or --version) with the flags after it, as the hybridnn
// executable: its output on stdout and stderr, and the exit status it would have (0; 1
// for an error, printed; 2 for a usage error, printed with the command's usage). Never
// throws. Registers the built-in drivers first.
int main(int argc, const char* const* argv, OnRankError on_rank_error = OnRankError::report);

}  // namespace hn::tool
