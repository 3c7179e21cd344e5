// The C ABI's tensors (hn_tensor_*): made, wrapped over the caller's arrays, their shapes,
// and their memory reached from the host.
#include "hybridnn/hybridnn_c.h"

#include <fmt/format.h>

#include <memory>
#include <utility>
#include <vector>

#include "lib/capi/capi_internal.h"
#include "lib/core/tensor.h"

namespace {

using hn::index_t;

hn::Shape shape_from(int32_t axes, const int64_t* dims, const char* what) {
  if (axes > 0 && dims == nullptr) {
    fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: NULL dims for {} axes", what, axes));
  }
  if (axes < 0 || axes > HN_MAX_AXES) {
    fail(HN_ERROR_INVALID_ARGUMENT,
         fmt::format("{}: {} axes (0 to {}, with dims)", what, axes, HN_MAX_AXES));
  }
  std::vector<index_t> list;
  for (int32_t i = 0; i < axes; ++i) {
    if (dims[i] < 0) {
      fail(HN_ERROR_INVALID_ARGUMENT, fmt::format("{}: axis {} is {}", what, i, dims[i]));
    }
    list.push_back(static_cast<index_t>(dims[i]));
  }
  return hn::Shape(std::move(list));
}

}  // namespace

// ---- tensors -----------------------------------------------------------------------------

extern "C" {

hn_status hn_tensor_create(int32_t axes, const int64_t* dims, hn_tensor** out) {
  return guarded([&] {
    auto own = std::make_shared<hn::Tensor>(shape_from(axes, dims, "hn_tensor_create"));
    std::unique_ptr<hn_tensor> tensor(tensor_of(nullptr, *own));
    tensor->own = std::move(own);
    set_out(out, std::move(tensor), "hn_tensor_create");
  });
}

hn_status hn_tensor_wrap(int32_t axes, const int64_t* dims, float* data, float* diff,
                         hn_driver* driver, hn_tensor** out) {
  return guarded([&] {
    if (data == nullptr) fail(HN_ERROR_INVALID_ARGUMENT, "hn_tensor_wrap: NULL data");
    auto own = std::make_shared<hn::Tensor>(shape_from(axes, dims, "hn_tensor_wrap"));
    std::unique_ptr<hn_tensor> tensor(tensor_of(nullptr, *own));
    tensor->own = std::move(own);
    tensor->user_data = data;
    tensor->user_diff = diff;
    if (driver != nullptr) {
      tensor->user_driver = driver->driver;
      tensor->user_box = driver->box;
    }
    tensor->adopt_user();
    set_out(out, std::move(tensor), "hn_tensor_wrap");
  });
}

void hn_tensor_destroy(hn_tensor* tensor) {
  delete tensor;
}

int32_t hn_tensor_axes(const hn_tensor* tensor) {
  return tensor != nullptr ? tensor->shape->axes() : 0;
}

hn_status hn_tensor_dims(const hn_tensor* tensor, int64_t* dims, int32_t capacity) {
  return guarded([&] {
    copy_dims(*checked(tensor, "hn_tensor_dims").shape, dims, capacity, "hn_tensor_dims");
  });
}

int64_t hn_tensor_count(const hn_tensor* tensor) {
  return tensor != nullptr ? tensor->shape->count() : 0;
}

}  // extern "C"

namespace {

hn_status host_access(hn_tensor* tensor, int32_t access, float** out, bool diff, const char* what) {
  return guarded([&] {
    hn_tensor& t = checked(tensor, what);
    hn::SyncedMemory* memory = diff ? t.diff : t.data;
    if (memory == nullptr) {
      fail(HN_ERROR,
           fmt::format("{}: this tensor has no gradient (a net that runs no backward)", what));
    }
    if (t.layout != hn::Layout::nchw) {
      fail(HN_ERROR, fmt::format("{}: this blob lies in the {} layout inside the net (net "
                                 "option layout=blocked); name it in keep_blobs to read it",
                                 what, hn::layout_name(t.layout)));
    }
    if (t.check_holds) t.check_holds(diff);
    if (memory->bytes() == 0 && t.shape->count() > 0) {
      fail(HN_ERROR, fmt::format("{}: this blob has no gradient: nothing in the net computes or "
                                 "reads it (e.g. a label or a blob no backward reaches)",
                                 what));
    }
    float* user = diff ? t.user_diff : t.user_data;
    if (user != nullptr) {
      if (t.user_driver != nullptr && t.user_driver->memory_space() != hn::host_space()) {
        fail(HN_ERROR, fmt::format("{}: the tensor wraps memory of {}, not host memory", what,
                                   t.user_driver->name()));
      }
      set_out(out, user, what);
      return;
    }
    void* address = nullptr;
    switch (access) {
      case HN_READ:
        address = const_cast<void*>(memory->host_read());
        break;
      // The caller may keep the pointer and write through it later (a numpy view does).
      case HN_WRITE:
        address = memory->host_write();
        memory->retain();
        break;
      case HN_OVERWRITE:
        address = memory->host_overwrite();
        memory->retain();
        break;
      default:
        fail(HN_ERROR_INVALID_ARGUMENT,
             fmt::format("{}: access {} (HN_READ, HN_WRITE or HN_OVERWRITE)", what, access));
    }
    set_out(out, static_cast<float*>(address), what);
  });
}

}  // namespace

extern "C" {

hn_status hn_tensor_data(hn_tensor* tensor, int32_t access, float** out) {
  return host_access(tensor, access, out, false, "hn_tensor_data");
}

hn_status hn_tensor_diff(hn_tensor* tensor, int32_t access, float** out) {
  return host_access(tensor, access, out, true, "hn_tensor_diff");
}

int32_t hn_tensor_is_blocked(const hn_tensor* tensor) {
  return tensor != nullptr && tensor->layout != hn::Layout::nchw ? 1 : 0;
}

}  // extern "C"
