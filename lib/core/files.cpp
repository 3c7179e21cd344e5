#include "lib/core/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "lib/core/check.h"

namespace hn::detail {

namespace {

std::string kind_name(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::fifo:
      return "a FIFO";
    case std::filesystem::file_type::socket:
      return "a socket";
    case std::filesystem::file_type::block:
    case std::filesystem::file_type::character:
      return "a device";
    default:
      return "not a regular file";
  }
}

}  // namespace

void check_input_path(const std::string& path, std::string_view who, InputKind kind) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) {
    const bool missing = !error || error == std::errc::no_such_file_or_directory;
    fail("{}: cannot read '{}': {}", who, path,
         missing ? "no such file or directory" : error.message());
  }
  if (std::filesystem::is_directory(status)) {
    HN_CHECK(kind != InputKind::file, "{}: '{}' is a directory, not a file", who, path);
    return;
  }
  HN_CHECK(std::filesystem::is_regular_file(status),
           "{}: '{}' is {}, not a {}: reading it could block or never end", who, path,
           kind_name(status.type()), kind == InputKind::directory ? "directory" : "regular file");
  HN_CHECK(kind != InputKind::directory, "{}: '{}' is a file, not a directory", who, path);
}

bool input_exists(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::symlink_status(path, error);
  return !error && std::filesystem::exists(status);
}

std::ifstream open_input_file(const std::string& path, std::string_view who) {
  check_input_path(path, who, InputKind::file);
  std::ifstream file(path, std::ios::binary);
  HN_CHECK(file.is_open(), "{}: cannot open '{}' for reading: {}", who, path, std::strerror(errno));
  return file;
}

std::string special_file_kind(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status) || std::filesystem::is_regular_file(status) ||
      std::filesystem::is_directory(status)) {
    return "";
  }
  return kind_name(status.type());
}

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
