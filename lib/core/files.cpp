#include "lib/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lib/core/check.h"

namespace hn::detail {

void replace_file(const std::string& path, std::string_view bytes, std::string_view who) {
  const std::string temporary = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HN_CHECK(fd >= 0, "{}: cannot open '{}' for writing: {}", who, temporary, std::strerror(errno));
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  const int write_errno = errno;
  const bool synced = written == bytes.size() && ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (written != bytes.size() || !synced || !closed) {
    std::remove(temporary.c_str());
    fail("{}: error while writing {} bytes to '{}': {}", who, bytes.size(), temporary,
         std::strerror(written != bytes.size() ? write_errno : sync_errno));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(temporary.c_str());
    fail("{}: cannot rename '{}' to '{}': {}", who, temporary, path, reason);
  }
}

}  // namespace hn::detail
