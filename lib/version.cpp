// The library version, set by CMake from project(VERSION).
#include "hybridnn/hybridnn.h"

namespace hn {

const char* version() {
  return HYBRIDNN_VERSION;
}

}  // namespace hn
