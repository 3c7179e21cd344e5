// Buffer, Pointer and View.
#include "hybridnn/memory.h"

#include <cstdlib>
#include <utility>

#include "hybridnn/runtime.h"
#include "lib/core/check.h"
#include "lib/core/transfer.h"

namespace hn {

Pointer Pointer::slice(std::size_t offset, std::size_t length) const {
  HN_CHECK(offset <= bytes && length <= bytes - offset,
           "Pointer::slice: [{}, {}) lies outside the {} bytes of this pointer on {}", offset,
           offset + length, bytes, device.name());
  return Pointer{device, static_cast<char*>(address) + offset, length};
}

Buffer::Buffer(Driver& driver, std::size_t bytes)
    : driver_(&driver), address_(driver.allocate(bytes)), bytes_(bytes) {}

Buffer Buffer::host(std::size_t bytes) {
  Buffer buffer;
  if (bytes == 0) return buffer;
  constexpr std::size_t kAlign = 64;
  const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  buffer.address_ = std::aligned_alloc(kAlign, rounded);
  HN_CHECK(buffer.address_ != nullptr, "out of host memory allocating {} bytes", bytes);
  buffer.bytes_ = bytes;
  return buffer;
}

Buffer Buffer::borrowed(Driver* driver, void* address, std::size_t bytes) {
  Buffer buffer;
  buffer.driver_ = driver;
  buffer.address_ = address;
  buffer.bytes_ = bytes;
  buffer.owned_ = false;
  return buffer;
}

Buffer::Buffer(Buffer&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)),
      address_(std::exchange(other.address_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      owned_(std::exchange(other.owned_, true)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    driver_ = std::exchange(other.driver_, nullptr);
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owned_ = std::exchange(other.owned_, true);
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() noexcept {
  if (address_ == nullptr) return;
  if (!owned_) {
    owned_ = true;
  } else if (driver_ != nullptr) {
    driver_->deallocate(address_);
  } else {
    std::free(address_);
  }
  address_ = nullptr;
  bytes_ = 0;
}

Pointer Buffer::pointer() const {
  return Pointer{driver_ ? driver_->device() : Device{"cpu", 0}, address_, bytes_};
}

void View::commit() {
  HN_CHECK(runtime_ != nullptr, "View::commit on an empty view");
  HN_CHECK(access_ != Access::read,
           "View::commit: the view of {} bytes on {} for {} was made read-only", source_.bytes,
           source_.device.name(), driver_->name());
  if (staged()) {
    detail::transfer(source_owner_, source_.address, driver_, staging_.address(), source_.bytes);
  }
}

}  // namespace hn
