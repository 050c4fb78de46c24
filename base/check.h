// WEFT_CHECK: always-on invariant checks that throw InternalError (or a chosen
// error type) with the condition, file, line and a formatted message.
#pragma once

#include <sstream>
#include <string>

#include "base/error.h"

namespace weft::detail {

inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append_all(os, rest...);
}

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  append_all(os, args...);
  return os.str();
}

[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace weft::detail

namespace weft {
// Concatenates any streamable arguments into a string: str("x=", 3).
template <typename... Args>
std::string str(const Args&... args) {
  return detail::concat(args...);
}
}  // namespace weft

#define WEFT_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::weft::detail::check_failed(#cond, __FILE__, __LINE__,                            \
                                   ::weft::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// Throws the given error type (constructible from a string) when cond is false.
#define WEFT_ENSURE(cond, ErrorType, ...)                                           \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      throw ErrorType(::weft::detail::concat("" __VA_OPT__(, ) __VA_ARGS__));       \
  } while (0)
