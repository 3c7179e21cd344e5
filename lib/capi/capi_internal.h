// Internal to the C ABI's files (lib/capi/capi*.cpp): the error capture that turns what the
// C++ side throws into a status, the handles they share and their boxes, and shared helpers.
#pragma once

#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/comm/comm.h"
#include "lib/core/runtime.h"
#include "lib/core/tensor.h"
#include "lib/core/tune.h"
#include "lib/drivers/builtin.h"
#include "lib/net/net.h"
#include "lib/scheduler/split.h"
#include "lib/solver/options.h"

namespace hn::capi {

// The thread's last error (hn_last_error; defined in capi.cpp).
extern thread_local std::string last_error;

// An error the C layer finds itself, with its status.
struct ApiError {
  hn_status status;
  std::string message;
};

[[noreturn]] inline void fail(hn_status status, std::string message) {
  throw ApiError{status, std::move(message)};
}

template <class T>
T& checked(T* handle, const char* what) {
  if (handle == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL handle", what));
  return *handle;
}

inline const char* checked_text(const char* text, const char* what) {
  if (text == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL string", what));
  return text;
}

// Runs `body`, turning whatever it throws into a status and the thread's last error.
template <class Body>
hn_status guarded(const Body& body) noexcept {
  try {
    hn::register_builtin_drivers();  // once per process; the C ABI's callers never do
    body();
    return HN_OK;
  } catch (const ApiError& error) {
    last_error = error.message;
    return error.status;
  } catch (const hn::CommunicatorError& error) {
    last_error = error.what();
    return last_error.find("timed out") != std::string::npos ? HN_ERROR_TIMEOUT : HN_ERROR;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
    return HN_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& error) {
    last_error = error.what();
    return HN_ERROR;
  } catch (...) {
    last_error = "unknown error";
    return HN_ERROR;
  }
}

// For the calls that return a value rather than a status: `fallback` on error.
template <class T, class Body>
T value_or(T fallback, const Body& body) noexcept {
  T result = fallback;
  if (guarded([&] { result = body(); }) != HN_OK) return fallback;
  return result;
}

template <class T>
void set_out(T* out, T value, const char* what) {
  if (out == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL output", what));
  *out = value;
}
// A new handle: freed, not leaked, when `out` is NULL.
template <class T>
std::unique_ptr<T> owned(T* handle) {
  return std::unique_ptr<T>(handle);
}
template <class T>
void set_out(T** out, std::unique_ptr<T> value, const char* what) {
  if (out == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL output", what));
  *out = value.release();
}

// Shared by the handle types' files; defined (and described) in capi.cpp.
void copy_dims(const hn::Shape& shape, int64_t* dims, int32_t capacity, const std::string& what);
std::string joined(const std::vector<std::string>& names);
void check_file(const std::string& path, const char* what);
// hn::set_option (lib/solver/options.h): false for an unknown key; a malformed value is
// HN_ERROR_INVALID_ARGUMENT naming the key.
bool set_option_text(hn::NetOptions& options, const std::string& key, const std::string& value);
bool set_option_text(hn::SolverOptions& options, const std::string& key, const std::string& value);

struct RuntimeBox {
  hn::Runtime runtime;
  std::map<std::string, std::vector<std::string>> options;  // per device: what it was added with
};

struct NetBox {
  std::shared_ptr<void> keep;  // the runtime, or the solver that owns the net
  std::unique_ptr<hn::Net> own;
  hn::Net* net = nullptr;
  std::string name;
  std::map<int32_t, std::string> layer_splits;
  std::string blob_names, input_names, output_names;
};

}  // namespace hn::capi

// The C functions call these unqualified, as when they were file-local.
using namespace hn::capi;  // NOLINT(google-build-using-namespace)

// ---- handles -------------------------------------------------------------------------

struct hn_runtime {
  std::shared_ptr<RuntimeBox> box;
};

struct hn_driver {
  std::shared_ptr<RuntimeBox> box;
  hn::Driver* driver = nullptr;
  std::string name, description;
};

// A tensor: a shape and data/gradient memory the library tracks (hn::SyncedMemory),
// either its own (`own`), a net's or a layer's (kept alive by `keep`), or the caller's
// arrays adopted as that memory's copy (`wrapped`).
struct hn_tensor {
  std::shared_ptr<void> keep;
  std::shared_ptr<hn::Tensor> own;
  const hn::Shape* shape = nullptr;
  hn::SyncedMemory* data = nullptr;
  hn::SyncedMemory* diff = nullptr;
  hn::Layout layout = hn::Layout::nchw;
  // Wrapped: the caller's arrays and the driver that addresses them (nullptr: host).
  float* user_data = nullptr;
  float* user_diff = nullptr;
  hn::Driver* user_driver = nullptr;
  std::shared_ptr<RuntimeBox> user_box;  // keeps user_driver alive
  // A net's blob: throws when the net's memory plan has reused its memory since it was
  // written (argument: the gradient rather than the values).
  std::function<void(bool)> check_holds;

  // The caller's arrays hold the current values (before the library uses the tensor).
  void adopt_user() const {
    if (user_data != nullptr) data->adopt(user_driver, user_data);
    if (user_diff != nullptr) diff->adopt(user_driver, user_diff);
  }
  // The library's results reach the caller's arrays (after it used the tensor).
  void return_user() const {
    const auto back = [&](hn::SyncedMemory* memory) {
      if (user_driver != nullptr) {
        memory->read(*user_driver);
      } else {
        memory->host_read();
      }
    };
    if (user_data != nullptr) back(data);
    if (user_diff != nullptr) back(diff);
  }
};

struct hn_net {
  std::shared_ptr<NetBox> box;
};

namespace hn::capi {

inline hn_tensor* synced_tensor(std::shared_ptr<void> keep, const hn::Shape* shape,
                                hn::SyncedMemory* data, hn::SyncedMemory* diff,
                                hn::Layout layout = hn::Layout::nchw) {
  auto* tensor = new hn_tensor;
  tensor->keep = std::move(keep);
  tensor->shape = shape;
  tensor->data = data;
  tensor->diff = diff;
  tensor->layout = layout;
  return tensor;
}

inline hn_tensor* tensor_of(std::shared_ptr<void> keep, hn::Tensor& tensor) {
  return synced_tensor(std::move(keep), &tensor.shape(), &tensor.data(), &tensor.diff());
}

inline hn_net* net_handle(std::shared_ptr<void> keep, hn::Net& net) {
  auto box = std::make_shared<NetBox>();
  box->keep = std::move(keep);
  box->net = &net;
  box->name = net.name();
  return new hn_net{std::move(box)};
}

}  // namespace hn::capi
