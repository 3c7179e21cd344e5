// hn::Error: the one exception type the library throws. Messages name the thing at fault
// (the call and its sizes, the layer and its shapes, the file and its position).
#pragma once

#include <stdexcept>
#include <string>

namespace hn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace hn
