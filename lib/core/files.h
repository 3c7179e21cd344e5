// Files in and out. Reading: every input path goes through check_input_path, so that a
// FIFO, socket or device is refused before anything opens it (opening a FIFO blocks until a
// writer comes) and a symlink loop or a missing file is named as such. Writing a file so
// that readers never see a torn one: the bytes go to a temporary file beside the target
// (named after the process, so processes writing the same file at once do not share it),
// are flushed to disk, and the temporary is renamed over the target.
#pragma once

#include <fstream>
#include <string>
#include <string_view>

namespace hn::detail {

enum class InputKind { file, directory, file_or_directory };

// Throws hn::Error starting with `who` and naming `path` unless it is an existing regular
// file or directory as `kind` allows: missing, a symlink loop, unreadable metadata, a FIFO,
// socket or device each say so.
void check_input_path(const std::string& path, std::string_view who, InputKind kind);
// Whether `path` exists (a symlink loop or a FIFO counts as existing, and is refused by
// check_input_path).
bool input_exists(const std::string& path);
// check_input_path(path, who, InputKind::file), then the file opened for reading (binary).
std::ifstream open_input_file(const std::string& path, std::string_view who);
// What kind of non-regular file `path` is ("a FIFO", "a socket", "a device"), or "" when it
// is a regular file, a directory or does not exist: an output opened there would block or
// go elsewhere.
std::string special_file_kind(const std::string& path);

// Replaces `path` with `bytes`. On failure throws hn::Error starting with `who`, naming the
// file and the system's reason, and leaves `path` as it was.
void replace_file(const std::string& path, std::string_view bytes, std::string_view who);

}  // namespace hn::detail
