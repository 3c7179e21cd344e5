// Internal error helpers: HN_CHECK throws hn::Error with a formatted message; HN_ASSERT
// guards internal invariants in debug builds and tests (never user input).
#pragma once

#include <fmt/format.h>

#include <string>

#include "hybridnn/error.h"

namespace hn::detail {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace hn::detail

#define HN_CHECK(condition, ...)       \
  do {                                 \
    if (!(condition)) {                \
      ::hn::detail::fail(__VA_ARGS__); \
    }                                  \
  } while (false)

#ifdef NDEBUG
#define HN_ASSERT(condition) ((void)0)
#else
#define HN_ASSERT(condition)                                                                    \
  do {                                                                                          \
    if (!(condition)) {                                                                         \
      ::hn::detail::fail("internal error: {} failed at {}:{}", #condition, __FILE__, __LINE__); \
    }                                                                                           \
  } while (false)
#endif
