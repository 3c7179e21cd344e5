// Shape, SyncedMemory and Tensor.
#include "lib/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <utility>

#include "lib/core/check.h"
#include "lib/core/transfer.h"

namespace hn {

// ---- Shape -------------------------------------------------------------------------

Shape::Shape(std::initializer_list<index_t> dims) : Shape(std::vector<index_t>(dims)) {}

Shape::Shape(std::vector<index_t> dims) : dims_(std::move(dims)) {
  // Every product of dimensions (count over any axis range) stays below 2^60 elements, so
  // element counts and byte sizes (up to 8 bytes per element) never overflow.
  constexpr index_t kMaxElements = index_t{1} << 60;
  index_t product = 1;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    HN_CHECK(dims_[i] >= 0, "shape {}: dimension {} is negative", to_string(), i);
    if (dims_[i] == 0) continue;
    HN_CHECK(dims_[i] <= kMaxElements / product,
             "shape {}: {} elements or more: too large to address (at most 2^60)", to_string(),
             product > kMaxElements / dims_[i] ? kMaxElements : product * dims_[i]);
    product *= dims_[i];
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

namespace {

using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;

// The parts of [begin, end) that `valid` (sorted, disjoint) does not cover.
template <class RangeList>
Ranges uncovered(const RangeList& valid, std::size_t begin, std::size_t end) {
  Ranges gaps;
  std::size_t at = begin;
  for (const auto& range : valid) {
    if (range.end <= at) continue;
    if (range.begin >= end) break;
    if (range.begin > at) gaps.emplace_back(at, range.begin);
    at = std::max(at, range.end);
    if (at >= end) break;
  }
  if (at < end) gaps.emplace_back(at, end);
  return gaps;
}

template <class RangeList>
bool covers(const RangeList& valid, std::size_t begin, std::size_t end) {
  return begin >= end || uncovered(valid, begin, end).empty();
}

// Adds [begin, end) to `valid`, merging touching ranges.
template <class RangeList>
void add_range(RangeList& valid, std::size_t begin, std::size_t end) {
  if (begin >= end) return;
  RangeList merged;
  bool placed = false;
  for (const auto& range : valid) {
    if (range.end < begin) {
      merged.push_back(range);
    } else if (range.begin > end) {
      if (!placed) merged.push_back({begin, end});
      placed = true;
      merged.push_back(range);
    } else {
      begin = std::min(begin, range.begin);
      end = std::max(end, range.end);
    }
  }
  if (!placed) merged.push_back({begin, end});
  valid = std::move(merged);
}

// Removes [begin, end) from `valid`.
template <class RangeList>
void remove_range(RangeList& valid, std::size_t begin, std::size_t end) {
  if (begin >= end) return;
  RangeList kept;
  for (const auto& range : valid) {
    if (range.end <= begin || range.begin >= end) {
      kept.push_back(range);
      continue;
    }
    if (range.begin < begin) kept.push_back({range.begin, begin});
    if (range.end > end) kept.push_back({end, range.end});
  }
  valid = std::move(kept);
}

// Zeros `bytes` at `address` in `driver`'s memory (nullptr: host).
void zero_fill(Driver* driver, void* address, std::size_t bytes) {
  if (bytes == 0) return;
  if (driver == nullptr) {
    std::memset(address, 0, bytes);
  } else if (bytes % sizeof(float) == 0 &&
             reinterpret_cast<std::uintptr_t>(address) % alignof(float) == 0) {
    driver->fill(static_cast<index_t>(bytes / sizeof(float)), 0.0f, static_cast<float*>(address));
  } else {
    Buffer zeros = Buffer::host(bytes);
    std::memset(zeros.address(), 0, bytes);
    driver->copy_from_host(address, zeros.address(), bytes);
  }
}

// Host-addressable drivers share the host copy.
Driver* copy_owner(Driver& driver) {
  return driver.memory_space() == host_space() ? nullptr : &driver;
}

}  // namespace

SyncedMemory::Copy& SyncedMemory::copy_in(MemorySpace space, Driver* driver) {
  for (Copy& copy : copies_) {
    if (copy.space == space) return copy;
  }
  Buffer buffer = driver ? Buffer(*driver, bytes_) : Buffer::host(bytes_);
  copies_.push_back(Copy{space, driver, std::move(buffer), {}});
  return copies_.back();
}

SyncedMemory::Copy& SyncedMemory::copy_for(Driver& driver) {
  return copy_in(driver.memory_space(), copy_owner(driver));
}

void SyncedMemory::copy_range(Copy& target, const Copy& source, std::size_t begin,
                              std::size_t end) {
  if (!detail::transfer(target.driver, target.buffer.as<char>() + begin, source.driver,
                        source.buffer.as<char>() + begin, end - begin)) {
    return;
  }
  // Deferred (the split scheduler's): if it is never made, the bytes are current where they
  // were before, not in the target (a write_range has taken them from the source since).
  detail::DeferredCopies::on_unmade(
      [this, target_space = target.space, source_space = source.space, begin, end] {
        for (Copy& copy : copies_) {
          if (copy.space == target_space) remove_range(copy.valid, begin, end);
          if (copy.space == source_space) add_range(copy.valid, begin, end);
        }
      });
}

void SyncedMemory::refresh(Copy& target, std::size_t begin, std::size_t end) {
  for (const auto& [gap_begin, gap_end] : uncovered(target.valid, begin, end)) {
    // Sources in order of preference: the host copy, then the others in creation order.
    std::vector<const Copy*> sources;
    for (const Copy& copy : copies_) {
      if (&copy != &target && copy.space == host_space()) sources.push_back(&copy);
    }
    for (const Copy& copy : copies_) {
      if (&copy != &target && copy.space != host_space()) sources.push_back(&copy);
    }
    Ranges missing{{gap_begin, gap_end}};
    for (const Copy* source : sources) {
      Ranges still;
      for (const auto& [b, e] : missing) {
        // The pieces of [b, e) that `source` holds are copied; the rest stays missing.
        std::size_t at = b;
        for (const auto& [held_begin, held_end] : uncovered(source->valid, b, e)) {
          if (held_begin > at) copy_range(target, *source, at, held_begin);
          still.emplace_back(held_begin, held_end);
          at = held_end;
        }
        if (at < e) copy_range(target, *source, at, e);
      }
      missing = std::move(still);
      if (missing.empty()) break;
    }
    // Bytes no copy holds were never written: new memory reads as zeros.
    for (const auto& [b, e] : missing)
      zero_fill(target.driver, target.buffer.as<char>() + b, e - b);
  }
  add_range(target.valid, begin, end);
}

std::uint64_t SyncedMemory::next_version() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

void SyncedMemory::make_exclusive(Copy& target, std::size_t begin, std::size_t end) {
  version_ = next_version();
  for (Copy& copy : copies_) {
    if (&copy != &target) remove_range(copy.valid, begin, end);
  }
  add_range(target.valid, begin, end);
}

void SyncedMemory::check_range(std::size_t offset, std::size_t length) const {
  HN_CHECK(offset <= bytes_ && length <= bytes_ - offset,
           "memory range [{}, {}) is outside the {} bytes of the array", offset, offset + length,
           bytes_);
}

const void* SyncedMemory::read_in(Copy& copy, std::size_t offset, std::size_t length) {
  check_range(offset, length);
  refresh(copy, offset, offset + length);
  return copy.buffer.as<char>() + offset;
}

void* SyncedMemory::write_in(Copy& copy, std::size_t offset, std::size_t length) {
  check_range(offset, length);
  refresh(copy, offset, offset + length);
  make_exclusive(copy, offset, offset + length);
  return copy.buffer.as<char>() + offset;
}

void* SyncedMemory::overwrite_in(Copy& copy, std::size_t offset, std::size_t length) {
  check_range(offset, length);
  make_exclusive(copy, offset, offset + length);
  return copy.buffer.as<char>() + offset;
}

const void* SyncedMemory::read(Driver& driver) {
  return read_in(copy_for(driver), 0, bytes_);
}
void* SyncedMemory::write(Driver& driver) {
  return write_in(copy_for(driver), 0, bytes_);
}
void* SyncedMemory::overwrite(Driver& driver) {
  return overwrite_in(copy_for(driver), 0, bytes_);
}

const void* SyncedMemory::read_range(Driver& driver, std::size_t offset, std::size_t length) {
  return read_in(copy_for(driver), offset, length);
}
void* SyncedMemory::write_range(Driver& driver, std::size_t offset, std::size_t length) {
  return write_in(copy_for(driver), offset, length);
}
void* SyncedMemory::overwrite_range(Driver& driver, std::size_t offset, std::size_t length) {
  return overwrite_in(copy_for(driver), offset, length);
}

const void* SyncedMemory::host_read() {
  return read_in(copy_in(host_space(), nullptr), 0, bytes_);
}
void* SyncedMemory::host_write() {
  return write_in(copy_in(host_space(), nullptr), 0, bytes_);
}
void* SyncedMemory::host_overwrite() {
  return overwrite_in(copy_in(host_space(), nullptr), 0, bytes_);
}

void SyncedMemory::adopt(Driver* driver, void* address) {
  Driver* owner = driver != nullptr ? copy_owner(*driver) : nullptr;
  const MemorySpace space = owner != nullptr ? owner->memory_space() : host_space();
  Copy* target = nullptr;
  for (Copy& copy : copies_) {
    if (copy.space == space) target = &copy;
  }
  if (target == nullptr) {
    copies_.push_back(Copy{space, owner, Buffer(), {}});
    target = &copies_.back();
  }
  if (target->buffer.address() != address || target->buffer.bytes() != bytes_) {
    target->buffer = Buffer::borrowed(owner, address, bytes_);
  }
  make_exclusive(*target, 0, bytes_);
  retain();  // the caller's array: written whenever the caller likes
}

bool SyncedMemory::current_on(MemorySpace space) const {
  return current_on(space, 0, bytes_);
}

bool SyncedMemory::current_on(MemorySpace space, std::size_t offset, std::size_t length) const {
  for (const Copy& copy : copies_) {
    if (copy.space == space) return covers(copy.valid, offset, offset + length);
  }
  return false;
}

void SyncedMemory::resize(std::size_t bytes) {
  copies_.clear();
  bytes_ = bytes;
  version_ = next_version();
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
