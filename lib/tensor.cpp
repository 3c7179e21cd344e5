// Shape, SyncedMemory and Tensor.
#include "hybridnn/tensor.h"

#include <cstring>
#include <utility>

#include "lib/check.h"
#include "lib/transfer.h"

namespace hn {

// ---- Shape -------------------------------------------------------------------------

Shape::Shape(std::initializer_list<index_t> dims) : Shape(std::vector<index_t>(dims)) {}

Shape::Shape(std::vector<index_t> dims) : dims_(std::move(dims)) {
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    HN_CHECK(dims_[i] >= 0, "shape {}: dimension {} is negative", to_string(), i);
  }
}

index_t Shape::count() const {
  return count(0, axes());
}

index_t Shape::count(int begin_axis, int end_axis) const {
  HN_CHECK(0 <= begin_axis && begin_axis <= end_axis && end_axis <= axes(),
           "shape {}: axis range [{}, {}) is out of bounds", to_string(), begin_axis, end_axis);
  index_t product = 1;
  for (int i = begin_axis; i < end_axis; ++i)
    product *= dims_[i];
  return product;
}

index_t Shape::operator[](int axis) const {
  const int resolved = axis < 0 ? axis + axes() : axis;
  HN_CHECK(0 <= resolved && resolved < axes(), "shape {}: axis {} is out of range", to_string(),
           axis);
  return dims_[resolved];
}

std::string Shape::to_string() const {
  if (dims_.empty()) return "(scalar)";
  std::string text;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i > 0) text += 'x';
    text += std::to_string(dims_[i]);
  }
  return text;
}

// ---- SyncedMemory ------------------------------------------------------------------

SyncedMemory::Copy& SyncedMemory::copy_in(MemorySpace space, Driver* driver) {
  for (Copy& copy : copies_) {
    if (copy.space == space) return copy;
  }
  Buffer buffer = driver ? Buffer(*driver, bytes_) : Buffer::host(bytes_);
  copies_.push_back(Copy{space, driver, std::move(buffer), false});
  return copies_.back();
}

void SyncedMemory::refresh(Copy& target) {
  if (target.current) return;
  const Copy* source = nullptr;
  for (const Copy& copy : copies_) {
    if (copy.current && (source == nullptr || copy.space == host_space())) source = &copy;
  }
  if (source != nullptr) {
    detail::transfer(target.driver, target.buffer.address(), source->driver,
                     source->buffer.address(), bytes_);
  } else if (bytes_ > 0) {
    // Never written anywhere: new memory reads as zeros.
    if (target.driver == nullptr) {
      std::memset(target.buffer.address(), 0, bytes_);
    } else if (target.driver->capabilities().elementwise && bytes_ % sizeof(float) == 0) {
      target.driver->fill(static_cast<index_t>(bytes_ / sizeof(float)), 0.0f,
                          target.buffer.as<float>());
    } else {
      Buffer zeros = Buffer::host(bytes_);
      std::memset(zeros.address(), 0, bytes_);
      target.driver->copy_from_host(target.buffer.address(), zeros.address(), bytes_);
    }
  }
  target.current = true;
}

void SyncedMemory::make_exclusive(const Copy& target) {
  for (Copy& copy : copies_)
    copy.current = (&copy == &target);
}

namespace {

// Host-addressable drivers share the host copy.
Driver* copy_owner(Driver& driver) {
  return driver.memory_space() == host_space() ? nullptr : &driver;
}

}  // namespace

const void* SyncedMemory::read(Driver& driver) {
  Copy& copy = copy_in(driver.memory_space(), copy_owner(driver));
  refresh(copy);
  return copy.buffer.address();
}

void* SyncedMemory::write(Driver& driver) {
  Copy& copy = copy_in(driver.memory_space(), copy_owner(driver));
  refresh(copy);
  make_exclusive(copy);
  return copy.buffer.address();
}

void* SyncedMemory::overwrite(Driver& driver) {
  Copy& copy = copy_in(driver.memory_space(), copy_owner(driver));
  make_exclusive(copy);
  return copy.buffer.address();
}

const void* SyncedMemory::host_read() {
  Copy& copy = copy_in(host_space(), nullptr);
  refresh(copy);
  return copy.buffer.address();
}

void* SyncedMemory::host_write() {
  Copy& copy = copy_in(host_space(), nullptr);
  refresh(copy);
  make_exclusive(copy);
  return copy.buffer.address();
}

void* SyncedMemory::host_overwrite() {
  Copy& copy = copy_in(host_space(), nullptr);
  make_exclusive(copy);
  return copy.buffer.address();
}

bool SyncedMemory::current_on(MemorySpace space) const {
  for (const Copy& copy : copies_) {
    if (copy.space == space) return copy.current;
  }
  return false;
}

void SyncedMemory::resize(std::size_t bytes) {
  copies_.clear();
  bytes_ = bytes;
}

// ---- Tensor ------------------------------------------------------------------------

Tensor::Tensor(Shape shape)
    : shape_(std::move(shape)),
      capacity_(static_cast<std::size_t>(shape_.count())),
      data_(capacity_ * sizeof(float)),
      diff_(capacity_ * sizeof(float)) {}

void Tensor::reshape(const Shape& shape) {
  const auto needed = static_cast<std::size_t>(shape.count());
  if (needed > capacity_) {
    capacity_ = needed;
    data_.resize(capacity_ * sizeof(float));
    diff_.resize(capacity_ * sizeof(float));
  }
  shape_ = shape;
}

}  // namespace hn
