// Runs the test cases the command line selects (Catch::Session, from catch_impl.cpp).
#pragma once

#include <functional>
#include <string>

namespace hn::test {
int run_catch(int argc, char** argv);

// The exit status ctest reads as "skipped" (SKIP_RETURN_CODE).
constexpr int kSkipReturnCode = 77;

// run_catch, unless skip_reason() (asked only when cases would run, not when they are
// listed) says why they cannot: then one line names the number of cases selected and the
// reason, and the status is kSkipReturnCode.
int run_catch_unless(int argc, char** argv, const std::function<std::string()>& skip_reason);
}  // namespace hn::test
