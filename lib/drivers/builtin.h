// The built-in drivers: the one list of the driver kinds this library builds (builtin.cpp),
// put into the driver registry by an explicit call, not by a static initialiser (DESIGN.md:
// those break static linking, as Caffe's "Unknown layer type" did).
#pragma once

namespace hn {

// Registers the built-in driver kinds (reference, cpu, cuda), in the order device_query
// lists them, once per process: later calls, from any thread, do nothing. Every entry point
// of the C ABI calls it, so programs on the C ABI, hybridnn.hpp and the Python bindings never
// do; a program on the library's C++ API (the tool, the tests, the benchmarks, the fuzzers)
// calls it before naming a device. Without it the registry lists no kinds and naming a
// device is an hn::Error saying so.
void register_builtin_drivers();

}  // namespace hn
