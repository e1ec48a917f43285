// lowbit::Error: every failure a caller can cause (a missing or malformed file, an option out of range, a width the
// model does not serve, a GPU asked for and absent) is thrown as a lowbit::Error whose what() is one line naming the
// file or option and the problem, e.g. "--temperature must be >= 0 (0 = greedy), got -1". Anything else thrown
// (std::bad_alloc, ...) is not the caller's fault.
//
// The library's own code throws this same type (src/core/error.h includes this header).
#pragma once
#include <stdexcept>
#include <string>

namespace lowbit {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace lowbit
