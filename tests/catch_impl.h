// Runs the test cases the command line selects (Catch::Session, from catch_impl.cpp).
#pragma once

namespace hn::test {
int run_catch(int argc, char** argv);
}  // namespace hn::test
