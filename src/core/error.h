// Errors: every failure the user can cause (bad file, bad flag, unsupported model) is a lowbit::Error with a
// one-line message that names the file/tensor and the problem. The CLI prints it and exits non-zero.
#pragma once
#include "lowbit/error.h"
#include <stdexcept>
#include <string>
#include <sstream>

namespace lowbit {

// lowbit::Error is the public API's exception type (include/lowbit/error.h): the library throws the same type.

namespace detail {
inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append_all(os, rest...);
}
}  // namespace detail

// fail("file.gguf: tensor ", name, " extends past end of file") — builds the message and throws.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  detail::append_all(os, args...);
  throw Error(os.str());
}

#define LOWBIT_CHECK(cond, ...)                  \
  do {                                           \
    if (!(cond)) ::lowbit::fail(__VA_ARGS__);    \
  } while (0)

}  // namespace lowbit
