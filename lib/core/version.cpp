// The library version, set by CMake from project(VERSION).
#include "lib/core/version.h"

namespace hn {

const char* version() {
  return HYBRIDNN_VERSION;
}

}  // namespace hn
