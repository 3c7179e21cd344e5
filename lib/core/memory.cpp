// Buffer, Pointer and View.
#include "lib/core/memory.h"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

#include "lib/core/check.h"
#include "lib/core/runtime.h"
#include "lib/core/transfer.h"

namespace hn {

namespace {

std::atomic<std::size_t> explicit_limit{0};

std::size_t machine_limit() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return std::numeric_limits<std::size_t>::max();
  const long double bytes = (static_cast<long double>(info.totalram) + info.totalswap) *
                            static_cast<long double>(info.mem_unit);
  return bytes >= static_cast<long double>(std::numeric_limits<std::size_t>::max())
             ? std::numeric_limits<std::size_t>::max()
             : static_cast<std::size_t>(bytes);
}

// HYBRIDNN_MEMORY_LIMIT: "8G", "512M", "1048576"; 0 when unset.
std::size_t environment_limit() {
  const char* text = std::getenv("HYBRIDNN_MEMORY_LIMIT");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  long double scale = 1;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K':
      scale = 1024.0L;
      ++end;
      break;
    case 'M':
      scale = 1024.0L * 1024;
      ++end;
      break;
    case 'G':
      scale = 1024.0L * 1024 * 1024;
      ++end;
      break;
    case 'T':
      scale = 1024.0L * 1024 * 1024 * 1024;
      ++end;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  HN_CHECK(end != text && *end == '\0' && std::isfinite(value) && value > 0 &&
               value * scale < static_cast<long double>(std::numeric_limits<std::size_t>::max()),
           "HYBRIDNN_MEMORY_LIMIT='{}' is not a size: write bytes, or a number with K, M, G or T "
           "(e.g. 8G)",
           text);
  return static_cast<std::size_t>(value * scale);
}

}  // namespace

std::size_t host_memory_limit() {
  const std::size_t set = explicit_limit.load(std::memory_order_relaxed);
  if (set != 0) return set;
  static const std::size_t from_environment = environment_limit();
  if (from_environment != 0) return from_environment;
  static const std::size_t machine = machine_limit();
  return machine;
}

void set_host_memory_limit(std::size_t bytes) {
  explicit_limit.store(bytes, std::memory_order_relaxed);
}

std::size_t peak_resident_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0 || usage.ru_maxrss < 0) return 0;
  return static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // Linux counts KiB
}

std::string format_bytes(std::size_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.{}f} {}", value, value < 10 ? 1 : 0, units[unit]);
}

void fail_host_bytes(std::size_t bytes, const std::string& what) {
  const std::size_t limit = host_memory_limit();
  const bool set = explicit_limit.load(std::memory_order_relaxed) != 0 ||
                   std::getenv("HYBRIDNN_MEMORY_LIMIT") != nullptr;
  detail::fail("{} needs {} ({} bytes), more than the host memory limit of {} ({})", what,
               format_bytes(bytes), bytes, format_bytes(limit),
               set ? "set by HYBRIDNN_MEMORY_LIMIT or set_host_memory_limit"
                   : "this machine's memory and swap; HYBRIDNN_MEMORY_LIMIT sets another");
}

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
  check_host_bytes(bytes, [] { return std::string("a host buffer"); });
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
