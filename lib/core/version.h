// The library's version.
#pragma once

namespace hn {

// "MAJOR.MINOR.PATCH".
const char* version();

}  // namespace hn
