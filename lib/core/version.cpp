// The library version, set by CMake from project(VERSION).
#include "hybridnn/version.h"

namespace hn {

const char* version() {
  return HYBRIDNN_VERSION;
}

}  // namespace hn
