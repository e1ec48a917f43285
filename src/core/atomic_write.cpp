#include "core/atomic_write.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace lowbit {

void write_atomically(const std::string& path, const std::vector<std::pair<const void*, size_t>>& pieces) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) fail(path, ": cannot write: ", std::strerror(errno));
  bool ok = true;
  for (const auto& [data, size] : pieces) {
    if (size > 0 && std::fwrite(data, 1, size, out) != size) ok = false;
  }
  ok = std::fflush(out) == 0 && ok;
  ok = ::fsync(::fileno(out)) == 0 && ok;
  const int err = errno;
  ok = std::fclose(out) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    std::remove(tmp.c_str());
    fail(path, ": cannot write: ", std::strerror(e));
  }
}

}  // namespace lowbit
