// Buffer (owns bytes on one device), Pointer (non-owning {device, address, bytes}) and View
// (a Pointer dereferenced for one driver: the memory itself when that driver can address
// it, a staged copy otherwise).
#pragma once

#include <cstddef>
#include <string>

#include "lib/core/device.h"
#include "lib/core/driver.h"

namespace hn {

class Runtime;

// The most host memory one allocation may ask for: by default this machine's physical memory
// plus swap (more can never succeed), or HYBRIDNN_MEMORY_LIMIT (bytes, or with a K, M, G or
// T suffix), or what set_host_memory_limit() set (0: back to the default). Sizes computed
// from a file or a prototxt are checked against it before anything is allocated, so a net
// too large for the machine fails with the layer and blob named rather than in the
// allocator (or, with overcommit, in the kernel's OOM killer).
std::size_t host_memory_limit();
void set_host_memory_limit(std::size_t bytes);
// Throws hn::Error "<what> needs <bytes>, more than the host memory limit of <limit> (...)"
// when bytes > host_memory_limit(); `what` (a callable returning the string) is only called
// then, so the check costs no formatting on the allocation paths.
[[noreturn]] void fail_host_bytes(std::size_t bytes, const std::string& what);
template <class Describe>
void check_host_bytes(std::size_t bytes, Describe&& what) {
  if (bytes > host_memory_limit()) fail_host_bytes(bytes, what());
}
// "1.5 GiB", "12 MiB", "300 bytes".
std::string format_bytes(std::size_t bytes);
// The most resident memory this process has held so far (the kernel's high-water mark,
// VmHWM; getrusage's ru_maxrss), in bytes; 0 where the system does not say.
std::size_t peak_resident_bytes();

// A non-owning handle to memory on a device. Host memory is named by the device "cpu".
struct Pointer {
  Device device;
  void* address = nullptr;
  std::size_t bytes = 0;

  // The sub-range [offset, offset + length); throws hn::Error when it leaves this range.
  Pointer slice(std::size_t offset, std::size_t length) const;
  template <class T>
  T* as() const {
    return static_cast<T*>(address);
  }
};

// Owns `bytes` of memory allocated by one driver (or, with no driver, 64-byte aligned host
// memory). Freed by the same driver when the Buffer dies, so a driver must outlive its
// Buffers.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Driver& driver, std::size_t bytes);
  static Buffer host(std::size_t bytes);
  // Memory someone else owns (a program's array), used in place and never freed; `driver`
  // is the one that addresses it (nullptr: host memory).
  static Buffer borrowed(Driver* driver, void* address, std::size_t bytes);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* address() const { return address_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(address_);
  }
  std::size_t bytes() const { return bytes_; }
  Driver* driver() const { return driver_; }
  MemorySpace space() const { return driver_ ? driver_->memory_space() : host_space(); }
  Pointer pointer() const;

 private:
  void release() noexcept;

  Driver* driver_ = nullptr;
  void* address_ = nullptr;
  std::size_t bytes_ = 0;
  bool owned_ = true;
};

enum class Access { read, write, read_write };

// A Pointer made local to one driver by Runtime::view. Aliasing views are the source
// memory itself; staged views are a copy in the driver's memory (filled from the source
// unless the access is write-only). Writes to a staged view reach the source only through
// commit(); destroying a view never writes back.
class View {
 public:
  View() = default;
  View(View&&) noexcept = default;
  View& operator=(View&&) noexcept = default;

  void* address() const { return address_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(address_);
  }
  std::size_t bytes() const { return source_.bytes; }
  bool staged() const { return staging_.address() != nullptr; }
  // Copies a staged view back to its source (no-op when aliasing). Throws for read views.
  void commit();

 private:
  friend class Runtime;

  Runtime* runtime_ = nullptr;
  Pointer source_;
  Driver* source_owner_ = nullptr;  // nullptr: the source is host memory
  Driver* driver_ = nullptr;
  Access access_ = Access::read;
  Buffer staging_;
  void* address_ = nullptr;
};

}  // namespace hn
