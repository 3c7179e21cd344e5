// Shape, SyncedMemory (one logical array with copies in several memory spaces and a
// record of which are current) and Tensor (shape + data + diff).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "lib/core/driver.h"
#include "lib/core/memory.h"
#include "lib/core/shapes.h"

namespace hn {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<index_t> dims);
  explicit Shape(std::vector<index_t> dims);

  index_t count() const;  // product of dims; 1 for a scalar (no axes)
  index_t count(int begin_axis, int end_axis) const;
  int axes() const { return static_cast<int>(dims_.size()); }
  index_t operator[](int axis) const;  // negative axes count from the end
  const std::vector<index_t>& dims() const { return dims_; }
  std::string to_string() const;  // "32x3x227x227"

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  std::vector<index_t> dims_;
};

// One logical array that may have a copy in several memory spaces (Caffe's SyncedMemory,
// generalised to any number of devices). Each copy is current or stale; reading on a
// driver whose copy is current copies nothing. New memory reads as zeros. Each copy is
// freed by the driver that allocated it, so drivers must outlive the memory that used them.
class SyncedMemory {
 public:
  explicit SyncedMemory(std::size_t bytes = 0) : bytes_(bytes) {}
  SyncedMemory(SyncedMemory&&) noexcept = default;
  SyncedMemory& operator=(SyncedMemory&&) noexcept = default;

  std::size_t bytes() const { return bytes_; }
  // A current copy in `driver`'s space, refreshed from a current copy elsewhere if stale.
  const void* read(Driver& driver);
  // As read(), then every other copy becomes stale.
  void* write(Driver& driver);
  // The copy in `driver`'s space without refreshing it (the caller overwrites every byte);
  // every other copy becomes stale.
  void* overwrite(Driver& driver);
  // The same three on ordinary host memory.
  const void* host_read();
  void* host_write();
  void* host_overwrite();

  // The same for the byte range [offset, offset + length) only (a batch slice's rows on the
  // driver that computes them): only stale parts of the range are copied, and a write makes
  // only that range stale elsewhere. They return the address of the range's first byte.
  // Currency is tracked per byte range, so slices written on different drivers stay where
  // they are until someone reads them elsewhere.
  const void* read_range(Driver& driver, std::size_t offset, std::size_t length);
  void* write_range(Driver& driver, std::size_t offset, std::size_t length);
  void* overwrite_range(Driver& driver, std::size_t offset, std::size_t length);

  // Makes the caller's `address` (bytes() of memory that `driver` addresses; nullptr:
  // host memory) this array's copy in that memory space, used in place and never freed,
  // and declares it current: every other copy becomes stale, nothing is copied. What the
  // library writes there later is in the caller's memory whenever that copy is current
  // (read() or host_read() on it brings it up to date). Calling it again with the same
  // address only declares the caller's values current again.
  void adopt(Driver* driver, void* address);
  bool current_on(MemorySpace space) const;
  bool current_on(MemorySpace space, std::size_t offset, std::size_t length) const;

  // A number naming the contents: a new one, unique in the process, at every access that
  // may change them (write, overwrite, adopt, resize, in any memory space), so a driver may
  // keep something computed from them (the CPU driver's convolution weights in its own
  // layout) until it changes. 0 once retain() was called: unknown from then on. The
  // library's own code writes through a pointer only right after the access that gave it
  // (a pointer kept across calls must be asked for again).
  std::uint64_t version() const { return retained_ ? 0 : version_; }
  // Someone outside the library may write through a pointer to this memory at any time (a
  // C ABI caller given one for writing, a numpy view, the caller's adopted array): version()
  // is 0 from now on.
  void retain() { retained_ = true; }
  // Releases every copy and sets a new size; the contents read as zeros again.
  void resize(std::size_t bytes);
  // A version no contents have had yet (for memory outside any SyncedMemory whose contents
  // stay the same for a while: the tuner's weights).
  static std::uint64_t next_version();

 private:
  struct Range {
    std::size_t begin, end;
  };
  struct Copy {
    MemorySpace space;
    Driver* driver;  // nullptr for the host copy
    Buffer buffer;
    std::vector<Range> valid;  // sorted, disjoint, non-adjacent: the current bytes
  };
  Copy& copy_in(MemorySpace space, Driver* driver);
  Copy& copy_for(Driver& driver);
  // Makes [begin, end) current in `target`, copying the stale parts from copies that hold
  // them (the host copy first) and zero-filling what was never written anywhere.
  void refresh(Copy& target, std::size_t begin, std::size_t end);
  // Copies [begin, end) from `source` into `target` (refresh's pieces).
  void copy_range(Copy& target, const Copy& source, std::size_t begin, std::size_t end);
  // Marks [begin, end) current in `target` and stale in every other copy.
  void make_exclusive(Copy& target, std::size_t begin, std::size_t end);
  void check_range(std::size_t offset, std::size_t length) const;
  // The three accesses on one copy, for drivers' copies and the host copy alike.
  const void* read_in(Copy& copy, std::size_t offset, std::size_t length);
  void* write_in(Copy& copy, std::size_t offset, std::size_t length);
  void* overwrite_in(Copy& copy, std::size_t offset, std::size_t length);

  std::size_t bytes_;
  std::vector<Copy> copies_;
  std::uint64_t version_ = next_version();
  bool retained_ = false;
};

// An N-d float tensor with data and diff (gradient). Reshape keeps the memory when the new
// count fits, as Caffe's Blob does.
class Tensor {
 public:
  explicit Tensor(Shape shape = {});

  const Shape& shape() const { return shape_; }
  index_t count() const { return shape_.count(); }
  void reshape(const Shape& shape);

  SyncedMemory& data() { return data_; }
  SyncedMemory& diff() { return diff_; }
  const float* data_read(Driver& d) { return static_cast<const float*>(data_.read(d)); }
  float* data_write(Driver& d) { return static_cast<float*>(data_.write(d)); }
  const float* diff_read(Driver& d) { return static_cast<const float*>(diff_.read(d)); }
  float* diff_write(Driver& d) { return static_cast<float*>(diff_.write(d)); }
  const float* host_data() { return static_cast<const float*>(data_.host_read()); }
  float* host_data_mut() { return static_cast<float*>(data_.host_write()); }
  const float* host_diff() { return static_cast<const float*>(diff_.host_read()); }
  float* host_diff_mut() { return static_cast<float*>(diff_.host_write()); }

 private:
  Shape shape_;
  std::size_t capacity_ = 0;  // floats allocated
  SyncedMemory data_, diff_;
};

}  // namespace hn
