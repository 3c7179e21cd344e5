// The C ABI (include/hybridnn/hybridnn_c.h) over the C++ library: handles own shared boxes
// of the C++ objects, so a handle keeps alive what it needs (a net its runtime, a blob's
// tensor its net) and handles can be destroyed in any order; every call catches what the
// C++ side throws and turns it into a status and the thread's last error.
//
// This file: the thread's last error, status names, the version and memory limits, and the
// helpers the handle types share; capi_internal.h holds the shared boxes and the error
// capture, capi_runtime/tensor/layer/net/solver.cpp the calls of each handle type.
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/core/memory.h"
#include "lib/core/tune.h"
#include "lib/core/version.h"
#include "lib/scheduler/split.h"

namespace hn::capi {

thread_local std::string last_error;

// A shape into the caller's array of `capacity` entries, or HN_ERROR_CAPACITY writing
// nothing when it does not fit.
void copy_dims(const hn::Shape& shape, int64_t* dims, int32_t capacity, const std::string& what) {
  if (capacity < shape.axes()) {
    fail(HN_ERROR_CAPACITY, fmt::format("{}: the shape {} has {} axes; the array holds {}", what,
                                        shape.to_string(), shape.axes(), capacity));
  }
  if (dims == nullptr && shape.axes() > 0)
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL dims", what));
  for (int i = 0; i < shape.axes(); ++i)
    dims[i] = shape[i];
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names)
    text += (text.empty() ? "" : ",") + name;
  return text;
}

void check_file(const std::string& path, const char* what) {
  std::error_code ignored;
  if (!std::filesystem::exists(path, ignored)) {
    fail(HN_ERROR_NOT_FOUND, fmt::format("{}: no such file '{}'", what, path));
  }
}

// hn::set_option, a malformed value being HN_ERROR_INVALID_ARGUMENT.
template <class Options>
bool set_option_text(Options& options, const std::string& key, const std::string& value) {
  try {
    return hn::set_option(options, key, value);
  } catch (const hn::Error& error) {
    fail(HN_ERROR_INVALID_ARGUMENT, error.what());
  }
}

bool set_option_text(hn::NetOptions& options, const std::string& key, const std::string& value) {
  return set_option_text<hn::NetOptions>(options, key, value);
}

bool set_option_text(hn::SolverOptions& options, const std::string& key, const std::string& value) {
  return set_option_text<hn::SolverOptions>(options, key, value);
}

}  // namespace hn::capi

// ---- status, errors, version ------------------------------------------------------------

extern "C" {

const char* hn_last_error(void) {
  return last_error.c_str();
}

const char* hn_status_name(hn_status status) {
  switch (status) {
    case HN_OK:
      return "ok";
    case HN_ERROR:
      return "error";
    case HN_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case HN_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case HN_ERROR_NOT_FOUND:
      return "not found";
    case HN_ERROR_TIMEOUT:
      return "timeout";
    case HN_ERROR_CAPACITY:
      return "capacity too small";
    default:
      return "unknown status";
  }
}

const char* hn_version(void) {
  return hn::version();
}

int32_t hn_abi_version(void) {
  return HN_ABI_VERSION;
}

uint64_t hn_host_memory_limit(void) {
  return hn::host_memory_limit();
}

void hn_set_host_memory_limit(uint64_t bytes) {
  hn::set_host_memory_limit(
      static_cast<std::size_t>(std::min<uint64_t>(bytes, std::numeric_limits<std::size_t>::max())));
}

uint64_t hn_peak_resident_bytes(void) {
  return hn::peak_resident_bytes();
}

}  // extern "C"
