// Writing a file so that readers never see a torn one: the bytes go to a temporary file
// beside the target (named after the process, so processes writing the same file at once
// do not share it), are flushed to disk, and the temporary is renamed over the target.
#pragma once

#include <string>
#include <string_view>

namespace hn::detail {

// Replaces `path` with `bytes`. On failure throws hn::Error starting with `who`, naming the
// file and the system's reason, and leaves `path` as it was.
void replace_file(const std::string& path, std::string_view bytes, std::string_view who);

}  // namespace hn::detail
